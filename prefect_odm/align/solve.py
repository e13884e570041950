"""One similarity per submodel, solved jointly over all overlaps (pure core: numpy and scipy).

The unknowns are, per submodel ``i``, a rotation vector ``w_i`` (radians), ``log s_i`` and a
shift ``t_i`` (metres) about the centroid ``c_i`` of its cameras:
``T_i(X) = c_i + t_i + s_i R(w_i) (X - c_i)``. The residuals, each whitened by its sigma, are

* for every image two submodels share: ``T_i(X_ik) - T_j(X_jk)`` (``camera_sigma_m``), and, when
  both gave orientations, the angle between ``R_ik R_i^T`` and ``R_jk R_j^T``
  (``orientation_sigma_deg``);
* with the ``gps`` gauge, for every camera with a GPS position ``G_k``: ``T_i(X_ik) - G_k``
  (``gps_sigma_horizontal_m``, ``gps_sigma_vertical_m``), as OpenSfM's ``align_reconstructions``
  does with its absolute position constraints;
* with the ``mean`` gauge, a vanishing prior towards identity; afterwards one common similarity
  per connected block puts back the mean camera position, the (camera-weighted) mean rotation and
  mean log-scale, so the block keeps its GPS average exactly: no drift, no flattening.

``scipy.optimize.least_squares`` (trust region reflective with LSMR steps, the analytic sparse
Jacobian, plain least squares first and then a ``soft_l1`` loss by default) solves it; shared cameras whose aligned centres disagree by more
than ``max(outlier_min_m, outlier_mad_factor * 1.4826 * MAD)`` are rejected, reported, and the
problem solved again (at most three rounds).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
from numpy.typing import NDArray
from scipy.optimize import least_squares
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import connected_components
from scipy.spatial.transform import Rotation

from prefect_odm.align.cameras import CameraTable, Correspondence, shared_cameras
from prefect_odm.align.report import AlignmentOptions, AlignmentResult, OutlierCamera
from prefect_odm.align.residuals import (
    camera_gps_residuals,
    overlap_residuals,
    submodel_residuals,
    transform_record,
)
from prefect_odm.align.similarity import Similarity

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.intp]
GpsPositions = Mapping[str, tuple[float, float, float]]

MAX_ROUNDS = 3
# Tight LSMR steps: the block's slow bending modes are weakly determined, and LSMR's default
# tolerance (1e-6) leaves 400 submodels short of convergence after 100 evaluations; 1e-8 converges
# (8 s for 400 submodels here) where 1e-10 costs more per step than it saves in steps.
LSMR_OPTIONS = {"atol": 1e-8, "btol": 1e-8}
# Weight of the prior towards identity (whitened by camera_sigma_m): with the mean gauge it only
# fixes the 7 free directions (fixed exactly afterwards); with the gps gauge it is 10x smaller
# so it does not pull a correction towards zero.
PRIOR_WEIGHT = {"mean": 1e-2, "gps": 1e-3}


@dataclass
class _Pairs:
    """Stacked shared-camera observations: row ``r`` is image ``names[r]`` in ``a[r]`` and ``b[r]``."""

    a: IntArray
    b: IntArray
    xa: FloatArray
    xb: FloatArray
    ra: FloatArray | None
    rb: FloatArray | None
    overlap: IntArray
    names: list[str]
    active: NDArray[np.bool_] = field(init=False)

    def __post_init__(self) -> None:
        self.active = np.ones(len(self.a), dtype=bool)


def _stack_pairs(pairs: Sequence[Correspondence], index: Mapping[str, int]) -> _Pairs:
    counts = [len(p.names) for p in pairs]
    rep = np.repeat(np.arange(len(pairs)), counts)
    with_rot = bool(pairs) and all(p.first_rotations is not None for p in pairs)
    ra = rb = None
    if with_rot:
        ra = np.concatenate([p.first_rotations for p in pairs if p.first_rotations is not None])
        rb = np.concatenate([p.second_rotations for p in pairs if p.second_rotations is not None])
    empty = np.zeros((0, 3))
    return _Pairs(
        a=np.array([index[pairs[k].first] for k in rep.tolist()], dtype=np.intp),
        b=np.array([index[pairs[k].second] for k in rep.tolist()], dtype=np.intp),
        xa=np.concatenate([p.first_centres for p in pairs]) if pairs else empty,
        xb=np.concatenate([p.second_centres for p in pairs]) if pairs else empty,
        ra=ra,
        rb=rb,
        overlap=rep.astype(np.intp),
        names=[n for p in pairs for n in p.names],
    )


@dataclass
class _Problem:
    """The whitened residuals of the joint solve and their Jacobian sparsity."""

    centres: FloatArray  # (N, 3) per-submodel centroids
    pairs: _Pairs
    options: AlignmentOptions
    gps_sub: IntArray  # (g,) submodel of each GPS-tied camera
    gps_x: FloatArray  # (g, 3) its reconstructed centre
    gps_g: FloatArray  # (g, 3) its GPS position
    length_m: float  # block radius: rotation (rad) and log-scale are solved times it, in metres

    @property
    def prior_weight(self) -> float:
        return PRIOR_WEIGHT["gps" if len(self.gps_sub) else "mean"]

    @property
    def n(self) -> int:
        return len(self.centres)

    def _transform(self, params: FloatArray, sub: IntArray, xyz: FloatArray) -> FloatArray:
        p = params.reshape(self.n, 7)
        rot = Rotation.from_rotvec(p[:, :3] / self.length_m).as_matrix()
        scale = np.exp(p[:, 3] / self.length_m)
        c = self.centres[sub]
        moved = np.einsum("nij,nj->ni", rot[sub], xyz - c)
        out: FloatArray = c + p[sub, 4:] + scale[sub, None] * moved
        return out

    def residuals(self, params: FloatArray) -> FloatArray:
        o, pr = self.options, self.pairs
        act = pr.active
        parts = [
            (
                self._transform(params, pr.a[act], pr.xa[act])
                - self._transform(params, pr.b[act], pr.xb[act])
            ).ravel()
            / o.camera_sigma_m
        ]
        if pr.ra is not None and pr.rb is not None and o.orientation_sigma_deg is not None:
            rot = Rotation.from_rotvec(params.reshape(self.n, 7)[:, :3] / self.length_m).as_matrix()
            ca = pr.ra[act] @ rot[pr.a[act]].transpose(0, 2, 1)
            cb = pr.rb[act] @ rot[pr.b[act]].transpose(0, 2, 1)
            err = Rotation.from_matrix(ca @ cb.transpose(0, 2, 1)).as_rotvec()
            parts.append(err.ravel() / np.radians(o.orientation_sigma_deg))
        if len(self.gps_sub):
            sig = np.array(
                [o.gps_sigma_horizontal_m, o.gps_sigma_horizontal_m, o.gps_sigma_vertical_m]
            )
            parts.append(
                ((self._transform(params, self.gps_sub, self.gps_x) - self.gps_g) / sig).ravel()
            )
        parts.append(self.prior_weight * params / o.camera_sigma_m)
        return np.concatenate(parts)

    def _blocks(self, params: FloatArray, sub: IntArray, xyz: FloatArray) -> FloatArray:
        """``d T_sub(xyz) / d params_sub``, shape ``(m, 3, 7)`` (rotation by the left Jacobian)."""
        p = params.reshape(self.n, 7)
        w = p[sub, :3] / self.length_m
        rot = Rotation.from_rotvec(w).as_matrix()
        scale = np.exp(p[sub, 3] / self.length_m)
        rd = scale[:, None] * np.einsum("nij,nj->ni", rot, xyz - self.centres[sub])
        out = np.zeros((len(sub), 3, 7))
        out[:, :, :3] = -_skew(rd) @ _left_jacobian(w) / self.length_m
        out[:, :, 3] = rd / self.length_m
        out[:, :, 4:] = np.eye(3)
        return out

    def _orientation_blocks(
        self, params: FloatArray, act: IntArray
    ) -> tuple[FloatArray, FloatArray]:
        """``d rotvec(E) / d params_a`` ``(m, 3, 7)`` and ``b``'s left Jacobians (exact at E = I)."""
        pr = self.pairs
        assert pr.ra is not None
        w = params.reshape(self.n, 7)[pr.a[act], :3] / self.length_m
        ra = Rotation.from_rotvec(w).as_matrix()
        m = pr.ra[act] @ ra.transpose(0, 2, 1)
        out = np.zeros((len(act), 3, 7))
        out[:, :, :3] = -m @ _left_jacobian(w) / self.length_m
        wb = params.reshape(self.n, 7)[pr.b[act], :3] / self.length_m
        return out, _left_jacobian(wb)

    def jacobian(self, params: FloatArray) -> csr_matrix:
        """The exact Jacobian of :meth:`residuals` (orientation rows: exact at zero residual)."""
        o, pr = self.options, self.pairs
        act = np.flatnonzero(pr.active)
        vals: list[FloatArray] = []
        subs: list[IntArray] = []
        ja = self._blocks(params, pr.a[act], pr.xa[act]) / o.camera_sigma_m
        jb = -self._blocks(params, pr.b[act], pr.xb[act]) / o.camera_sigma_m
        vals.append(np.concatenate([ja, jb], axis=2))
        subs.append(np.stack([pr.a[act], pr.b[act]], axis=1))
        if pr.ra is not None and o.orientation_sigma_deg is not None:
            oa, jl_b = self._orientation_blocks(params, act)
            ob = np.zeros_like(oa)
            w = params.reshape(self.n, 7)[pr.a[act], :3] / self.length_m
            m = pr.ra[act] @ Rotation.from_rotvec(w).as_matrix().transpose(0, 2, 1)
            ob[:, :, :3] = m @ jl_b / self.length_m
            sig = np.radians(o.orientation_sigma_deg)
            vals.append(np.concatenate([oa, ob], axis=2) / sig)
            subs.append(np.stack([pr.a[act], pr.b[act]], axis=1))
        if len(self.gps_sub):
            sig3 = np.array(
                [o.gps_sigma_horizontal_m, o.gps_sigma_horizontal_m, o.gps_sigma_vertical_m]
            )
            vals.append(self._blocks(params, self.gps_sub, self.gps_x) / sig3[None, :, None])
            subs.append(self.gps_sub[:, None])
        return self._assemble(vals, subs, self.prior_weight / o.camera_sigma_m)

    def _assemble(self, vals: list[FloatArray], subs: list[IntArray], prior: float) -> csr_matrix:
        """Stack ``(m, 3, 7k)`` blocks (observation rows against ``k`` submodels) and the prior."""
        rows: list[IntArray] = []
        cols: list[IntArray] = []
        data: list[FloatArray] = []
        start = 0
        for v, sub in zip(vals, subs, strict=True):
            m, k = sub.shape
            r = start + np.arange(3 * m).reshape(m, 3, 1)
            c = (7 * sub[:, None, :, None] + np.arange(7)).reshape(m, 1, 7 * k)
            r, c = np.broadcast_arrays(r, c)
            rows.append(r.ravel())
            cols.append(c.ravel())
            data.append(v.ravel())
            start += 3 * m
        rows.append(start + np.arange(7 * self.n))
        cols.append(np.arange(7 * self.n))
        data.append(np.full(7 * self.n, prior))
        shape = (start + 7 * self.n, 7 * self.n)
        return csr_matrix(
            (np.concatenate(data), (np.concatenate(rows), np.concatenate(cols))), shape=shape
        )


def _skew(v: FloatArray) -> FloatArray:
    """``[v]x`` for each row of ``v`` ``(m, 3)``: ``(m, 3, 3)``."""
    out = np.zeros((len(v), 3, 3))
    out[:, 0, 1], out[:, 0, 2], out[:, 1, 2] = -v[:, 2], v[:, 1], -v[:, 0]
    out[:, 1, 0], out[:, 2, 0], out[:, 2, 1] = v[:, 2], -v[:, 1], v[:, 0]
    return out


def _left_jacobian(w: FloatArray) -> FloatArray:
    """SO(3) left Jacobian of rotation vectors ``(m, 3)``: ``exp(w + d) ~ exp(J d) exp(w)``."""
    theta = np.linalg.norm(w, axis=1)[:, None, None]
    k = _skew(w)
    small = theta < 1e-8
    t = np.where(small, 1.0, theta)
    a = np.where(small, 0.5, (1.0 - np.cos(t)) / t**2)
    b = np.where(small, 1.0 / 6.0, (t - np.sin(t)) / t**3)
    out: FloatArray = np.eye(3) + a * k + b * (k @ k)
    return out


def _mean_gauge(
    transforms: list[Similarity], tables: Sequence[CameraTable], labels: IntArray
) -> list[Similarity]:
    """Per connected block, compose every transform with the one similarity restoring the gauge.

    After it, over the block's cameras (each submodel weighted by its camera count) the mean
    displacement is zero, the mean rotation is identity and the mean log-scale is zero.
    """
    out = list(transforms)
    for comp in np.unique(labels):
        members = np.flatnonzero(labels == comp).tolist()
        weights = np.array([len(tables[i].names) for i in members], dtype=np.float64)
        rots = Rotation.from_matrix(np.stack([transforms[i].rotation_matrix for i in members]))
        mean_rot = rots.mean(weights=weights)
        log_s = float(np.average([np.log(transforms[i].scale) for i in members], weights=weights))
        all_x = np.concatenate([tables[i].centres for i in members])
        centre = all_x.mean(axis=0)
        fix = Similarity.from_parameters(-mean_rot.as_rotvec(), -log_s, np.zeros(3), centre)
        moved = [transforms[i].then(fix) for i in members]
        after = np.concatenate(
            [m.apply(tables[i].centres) for m, i in zip(moved, members, strict=True)]
        )
        dx, dy, dz = (float(v) for v in all_x.mean(axis=0) - after.mean(axis=0))
        shift = Similarity(translation=(dx, dy, dz))
        for m, i in zip(moved, members, strict=True):
            out[i] = m.then(shift).recentred(tables[i].centres.mean(axis=0))
    return out


def _reject(problem: _Problem, params: FloatArray, options: AlignmentOptions) -> int:
    """Deactivate shared cameras whose aligned centres disagree too much; returns how many."""
    pr = problem.pairs
    err = np.linalg.norm(
        problem._transform(params, pr.a, pr.xa) - problem._transform(params, pr.b, pr.xb), axis=1
    )
    live = err[pr.active]
    if not len(live):
        return 0
    mad = float(np.median(np.abs(live - np.median(live))))
    limit = max(
        options.outlier_min_m, options.outlier_mad_factor * 1.4826 * mad + float(np.median(live))
    )
    bad = pr.active & (err > limit)
    pr.active &= ~bad
    return int(bad.sum())


def _gps_rows(
    tables: Sequence[CameraTable], gps: GpsPositions | None
) -> tuple[IntArray, FloatArray, FloatArray]:
    sub: list[int] = []
    xs: list[FloatArray] = []
    gs: list[tuple[float, float, float]] = []
    for i, table in enumerate(tables):
        for row, name in enumerate(table.names):
            if gps is not None and name in gps:
                sub.append(i)
                xs.append(table.centres[row])
                gs.append(gps[name])
    if not sub:
        return np.zeros(0, dtype=np.intp), np.zeros((0, 3)), np.zeros((0, 3))
    return np.array(sub, dtype=np.intp), np.stack(xs), np.asarray(gs, dtype=np.float64)


def _solve(problem: _Problem, x0: FloatArray) -> tuple[FloatArray, int]:
    """Plain least squares from ``x0``, then the robust loss from there; returns ``(x, nfev)``.

    Started cold, the robust loss creeps (100 evaluations for 100 submodels); from the least
    squares answer it needs 3-5 more.
    """
    o = problem.options
    x, nfev = x0, 0
    for loss in ("linear", o.loss) if o.loss != "linear" else ("linear",):
        fit = least_squares(
            problem.residuals,
            x,
            jac=problem.jacobian,
            loss=loss,
            f_scale=o.loss_threshold_sigmas,
            x_scale=1.0,
            tr_solver="lsmr",
            tr_options=LSMR_OPTIONS,
            method="trf",
            xtol=1e-8,
            ftol=1e-8,
            gtol=1e-8,
            max_nfev=100,
        )
        x, nfev = np.asarray(fit.x, dtype=np.float64), nfev + int(fit.nfev)
    return x, nfev


def align_submodels(
    tables: Sequence[CameraTable],
    options: AlignmentOptions | None = None,
    gps: GpsPositions | None = None,
) -> AlignmentResult:
    """One similarity per submodel from the cameras neighbours share, solved jointly and robustly.

    Args:
        tables: each submodel's reconstructed cameras (:func:`read_shots_geojson`), plan CRS.
        options: solver settings and gate thresholds (defaults when ``None``).
        gps: image name -> GPS position ``(x, y, z)`` in the plan CRS (metres; the plan's camera
            positions). Used for the camera-vs-GPS residuals and, with the ``gps`` or ``auto``
            gauge, to hold the block.

    Returns:
        transforms, residuals per overlap and per submodel, camera-vs-GPS residuals (with ``gps``),
        and the rejected cameras. Check it with :func:`check_alignment`.

    Raises:
        ValueError: no tables, or a submodel without cameras.
    """
    opts = options or AlignmentOptions()
    if not tables or any(len(t.names) == 0 for t in tables):
        raise ValueError("alignment needs at least one submodel, each with cameras")
    started = time.perf_counter()
    gauge: Literal["mean", "gps"] = (
        "gps" if opts.gauge == "gps" or (opts.gauge == "auto" and gps) else "mean"
    )
    index = {t.submodel_id: i for i, t in enumerate(tables)}
    pairs = shared_cameras(tables, min_shared=opts.min_shared_cameras)
    centres = np.stack([t.centres.mean(axis=0) for t in tables])
    all_x = np.concatenate([t.centres for t in tables])
    length = float(max(np.sqrt(((all_x - all_x.mean(axis=0)) ** 2).sum(axis=1).mean()), 1.0))
    # Solved in a frame about the block's mean: UTM magnitudes would drown the residuals' last digits.
    origin = all_x.mean(axis=0)
    stacked = _stack_pairs(pairs, index)
    stacked.xa, stacked.xb = stacked.xa - origin, stacked.xb - origin
    sub, gx, gg = _gps_rows(tables, gps if gauge == "gps" else None)
    problem = _Problem(centres - origin, stacked, opts, sub, gx - origin, gg - origin, length)
    params, nfev = np.zeros(7 * len(tables)), 0
    for _ in range(MAX_ROUNDS):
        params, used = _solve(problem, params)
        nfev += used
        if not _reject(problem, params, opts):
            break
    p = params.reshape(-1, 7).copy()
    p[:, :4] /= length
    sims = [
        Similarity.from_parameters(p[i, :3], p[i, 3], p[i, 4:], centres[i])
        for i in range(len(tables))
    ]
    if gauge == "mean":
        adj = np.zeros((len(tables), len(tables)))
        for c in pairs:
            adj[index[c.first], index[c.second]] = 1
        _, labels = connected_components(adj, directed=False)
        sims = _mean_gauge(sims, tables, labels.astype(np.intp))
    by_id = dict(zip((t.submodel_id for t in tables), sims, strict=True))
    pr = problem.pairs
    rejected = [
        OutlierCamera(overlap=pairs[pr.overlap[r]].key, image=pr.names[r], residual_m=float(e))
        for r, e in _rejected_rows(pr, by_id, pairs, origin)
    ]
    overlaps = overlap_residuals(pairs, by_id, pr.active, pr.overlap, rejected)
    return AlignmentResult(
        method="cameras",
        gauge=gauge,
        transforms=[
            transform_record(t.submodel_id, by_id[t.submodel_id], t.centres) for t in tables
        ],
        overlaps=overlaps,
        submodels=submodel_residuals([t.submodel_id for t in tables], overlaps),
        camera_gps=camera_gps_residuals(tables, by_id, gps) if gps else [],
        rejected=rejected,
        solve_seconds=time.perf_counter() - started,
        iterations=nfev,
    )


def _rejected_rows(
    pr: _Pairs,
    by_id: Mapping[str, Similarity],
    pairs: Sequence[Correspondence],
    origin: FloatArray,
) -> list[tuple[int, float]]:
    """``(row, metres between the two corrected positions)`` of each rejected camera; the rows'
    positions are about ``origin``, the similarities in the plan CRS."""
    out = []
    for r in np.flatnonzero(~pr.active):
        c = pairs[pr.overlap[r]]
        xa = by_id[c.first].apply(pr.xa[r : r + 1] + origin)
        xb = by_id[c.second].apply(pr.xb[r : r + 1] + origin)
        out.append((int(r), float(np.linalg.norm(xa - xb))))
    return out
