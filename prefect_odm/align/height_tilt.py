"""Height and tilt (and optionally a horizontal shift) per submodel from DSM differences.

For inputs without cameras (orthophotos and DEMs made elsewhere). Each overlap gives samples
``(x, y, dz)`` with ``dz = z_second(x, y) - z_first(x, y)`` (plan CRS, metres), and optionally
``(dx, dy)``, the second's horizontal offset against the first from orthophoto matching. Each
submodel gets a plane ``p_i(x, y) = h_i + gx_i (x - cx_i) + gy_i (y - cy_i)`` added to its heights
and a shift ``(dx_i, dy_i)``, solved jointly and robustly so that ``p_first - p_second = dz`` and
``shift_second - shift_first = -(dx, dy)``. With ``AlignmentOptions.refine_bowl`` the plane gets
a bowl, ``+ b_i ((x - cx_i)^2 + (y - cy_i)^2)``: the doming a nadir block's radial distortion
leaves (James and Robson, "Mitigating systematic error in topographic models derived from UAV
and ground-based image networks", ESPL 2014). A bowl common to every submodel changes each
overlap only by a plane, so it is the gauge's too: the block's mean bowl is held at zero (and
the tilts that stand for it are moved with it). The problem is linear; the robust loss is as in
:mod:`prefect_odm.align.solve`. The gauge (:mod:`prefect_odm.align.observability`): per connected
block the sample-weighted mean tilt, mean height change at the submodels' own centres and mean
shift are zero, so the block keeps its average slope (a survey on a slope keeps its relief) and
its height where its submodels are. An overlap whose samples spread less than
``min_tilt_spread_m`` across is solved as samples on its centre line, and tilts and bowls the
overlaps leave free are held at zero by a prior; :attr:`AlignmentResult.unsolved` says which.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
from numpy.typing import NDArray
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import connected_components
from scipy.spatial.transform import Rotation

from prefect_odm.align.observability import observed_positions, own_height_gauge, prior_weights
from prefect_odm.align.planar import robust_linear, solve_rejecting
from prefect_odm.align.report import (
    AlignmentOptions,
    AlignmentResult,
    OverlapResidual,
    SubmodelTransform,
)
from prefect_odm.align.residuals import submodel_residuals

FloatArray = NDArray[np.float64]


@dataclass(frozen=True)
class DemOverlap:
    """DSM (and optionally orthophoto) differences sampled in one overlap.

    Attributes:
        first, second: submodel ids.
        x, y: sample positions, shape ``(n,)``, plan CRS metres.
        dz: ``z_second - z_first`` at the samples, metres, shape ``(n,)``.
        dxy: the second's horizontal offset against the first, ``(n, 2)`` metres, or ``None``.
    """

    first: str
    second: str
    x: FloatArray
    y: FloatArray
    dz: FloatArray
    dxy: FloatArray | None = None


def _design(
    overlaps: Sequence[DemOverlap],
    index: dict[str, int],
    centres: FloatArray,
    length_m: float,
    terms: int = 3,
) -> csr_matrix:
    """Rows ``p_first - p_second`` over ``(h, gx * length_m, gy * length_m)`` per submodel, and
    ``b * length_m^2`` when ``terms`` is 4.

    The slopes (and the bowl) are solved times powers of ``length_m`` (metres of height change
    over it), so every column has the size of a height and the trust region is well conditioned.
    """
    rows, cols, vals = [], [], []
    start = 0
    for ov in overlaps:
        n = len(ov.x)
        r = start + np.arange(n)
        for sign, sid in ((1.0, ov.first), (-1.0, ov.second)):
            i = index[sid]
            dx, dy = (ov.x - centres[i, 0]) / length_m, (ov.y - centres[i, 1]) / length_m
            for k, v in enumerate((np.ones(n), dx, dy, dx * dx + dy * dy)[:terms]):
                rows.append(r)
                cols.append(np.full(n, terms * i + k))
                vals.append(sign * v)
        start += n
    return csr_matrix(
        (np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))),
        shape=(start, terms * len(index)),
    )


def _planes_global(p: FloatArray, centres: FloatArray) -> FloatArray:
    """``(N, 3)`` planes ``(p0, px, py)`` with ``z += p0 + px*x + py*y`` in plan coordinates."""
    h, gx, gy = p[:, 0], p[:, 1], p[:, 2]
    return np.stack([h - gx * centres[:, 0] - gy * centres[:, 1], gx, gy], axis=1)


def align_heights(
    submodel_ids: Sequence[str],
    centres: FloatArray,
    overlaps: Sequence[DemOverlap],
    options: AlignmentOptions | None = None,
) -> AlignmentResult:
    """Height, tilt and (with ``dxy``) shift per submodel, solved jointly over all overlaps.

    Args:
        submodel_ids: every submodel, length ``N``.
        centres: each submodel's centre ``(N, 2)`` (or ``(N, 3)``), plan CRS metres.
        overlaps: the samples in each overlap.
        options: robust loss and gate thresholds; ``camera_sigma_m`` is the sample sigma here.

    Returns:
        an :class:`AlignmentResult` with ``method='dem'``, ``kind='height_tilt'`` transforms.
    """
    opts = options or AlignmentOptions()
    started = time.perf_counter()
    index = {sid: i for i, sid in enumerate(submodel_ids)}
    c = np.asarray(centres, dtype=np.float64)[:, :2]
    live = [ov for ov in overlaps if len(ov.x)]
    n = len(submodel_ids)
    terms = 4 if opts.refine_bowl else 3
    seen, unsolved = _observed(live, opts.min_tilt_spread_m)
    if live:
        xy = np.concatenate([np.stack([ov.x, ov.y], axis=1) for ov in live])
        length = float(max(xy.std(axis=0).max(), 1.0))
        a = _design(seen, index, c, length, terms)
        prior = prior_weights(n, terms, length, float(np.tan(np.radians(opts.max_rotation_deg))))
        p, keep = solve_rejecting(a, np.concatenate([ov.dz for ov in live]), opts, prior)
        p = p.reshape(n, terms) / [1.0, length, length, length * length][:terms]
    else:
        p, keep = np.zeros((n, terms)), np.zeros(0, dtype=bool)
    p = p.reshape(n, terms)
    planes = _planes_global(p[:, :3], c)
    bowls = p[:, 3].copy() if terms == 4 else np.zeros(n)
    shifts = _shifts(live, index, n, opts)
    counts = np.zeros(n)
    adj = np.zeros((n, n))
    for ov in live:
        counts[[index[ov.first], index[ov.second]]] += len(ov.x)
        adj[index[ov.first], index[ov.second]] = 1
    _, labels = connected_components(adj, directed=False)
    for comp in np.unique(labels):  # gauge: mean bowl, tilt, own-centre height, shift are zero
        m = labels == comp
        w = counts[m] if counts[m].sum() > 0 else np.ones(int(m.sum()))
        mean_bowl = float(np.average(bowls[m], weights=w))
        # b |p - c|^2 = b |p|^2 + b (|c|^2 - 2 p.c): a bowl common to all differs from the plane
        # b (|c|^2, -2 cx, -2 cy) of each by the same b |p|^2, which no overlap sees
        bowls[m] -= mean_bowl
        planes[m] += mean_bowl * np.stack(
            [c[m, 0] ** 2 + c[m, 1] ** 2, -2.0 * c[m, 0], -2.0 * c[m, 1]], axis=1
        )
        own_height_gauge(planes, c, counts if counts[m].sum() > 0 else np.ones(n), m)
        shifts[m] -= np.average(shifts[m], axis=0, weights=w)
    splits = np.cumsum([len(ov.x) for ov in live])[:-1]
    kept = np.split(keep, splits) if live else []  # no sample (planes, nothing measured): none
    overlaps_out = _overlap_records(live, index, planes, bowls, c, shifts, kept)
    transforms = [
        _record(
            sid, planes[i], bowls[i] if terms == 4 else None, shifts[i], c[i], live, int(counts[i])
        )  # fmt: skip
        for i, sid in enumerate(submodel_ids)
    ]
    return AlignmentResult(
        method="dem",
        gauge="mean",
        transforms=transforms,
        overlaps=overlaps_out,
        submodels=submodel_residuals(list(submodel_ids), overlaps_out),
        solve_seconds=time.perf_counter() - started,
        iterations=1,
        unsolved=unsolved,
    )


def _observed(
    live: Sequence[DemOverlap], min_spread_m: float
) -> tuple[list[DemOverlap], list[str]]:
    """The overlaps with their samples where the solve is to see them
    (:func:`~prefect_odm.align.observability.observed_positions`), and what each leaves
    unsolved (``'first|second: ...'``)."""
    seen, unsolved = [], []
    for ov in live:
        x, y, notes = observed_positions(ov.x, ov.y, min_spread_m)
        seen.append(replace(ov, x=x, y=y))
        unsolved += [f"{ov.first}|{ov.second}: {note}: held at zero" for note in notes]
    return seen, unsolved


def _shifts(
    live: Sequence[DemOverlap], index: dict[str, int], n: int, opts: AlignmentOptions
) -> FloatArray:
    """Per-submodel ``(dx, dy)`` from the orthophoto offsets: ``shift_first - shift_second = dxy``."""
    with_xy = [ov for ov in live if ov.dxy is not None]
    if not with_xy:
        return np.zeros((n, 2))
    out = np.zeros((n, 2))
    for axis in range(2):
        rows, cols, vals = [], [], []
        for r, ov in enumerate(o for o in with_xy for _ in range(len(o.x))):
            rows += [r, r]
            cols += [index[ov.first], index[ov.second]]
            vals += [1.0, -1.0]
        a = csr_matrix((vals, (rows, cols)), shape=(len(rows) // 2, n))
        b = np.concatenate([ov.dxy[:, axis] for ov in with_xy if ov.dxy is not None])
        out[:, axis] = robust_linear(a, b, opts.camera_sigma_m, opts)
    return out


def _height_change(
    plane: FloatArray, bowl: float, centre: FloatArray, x: FloatArray, y: FloatArray
) -> FloatArray:
    """Height correction (metres) of a plane and a bowl at ``x, y``."""
    out: FloatArray = plane[0] + plane[1] * x + plane[2] * y
    out = out + bowl * ((x - centre[0]) ** 2 + (y - centre[1]) ** 2)
    return out


def _overlap_records(
    live: Sequence[DemOverlap],
    index: dict[str, int],
    planes: FloatArray,
    bowls: FloatArray,
    centres: FloatArray,
    shifts: FloatArray,
    kept: Sequence[NDArray[np.bool_]],
) -> list[OverlapResidual]:
    """Before (all samples) and after (the samples kept) disagreement of each overlap."""
    out = []
    for ov, keep in zip(live, kept, strict=True):
        i, j = index[ov.first], index[ov.second]
        pi = _height_change(planes[i], float(bowls[i]), centres[i], ov.x, ov.y)
        pj = _height_change(planes[j], float(bowls[j]), centres[j], ov.x, ov.y)
        after = ov.dz + pj - pi
        before_sq, after_sq = ov.dz**2, after**2
        if ov.dxy is not None:
            before_sq = before_sq + (ov.dxy**2).sum(axis=1)
            after_sq = after_sq + ((ov.dxy - (shifts[i] - shifts[j])) ** 2).sum(axis=1)
        out.append(
            OverlapResidual(
                overlap=f"{ov.first}|{ov.second}",
                first=ov.first,
                second=ov.second,
                n_shared=len(ov.x),
                n_used=int(keep.sum()),
                rms_before_m=float(np.sqrt(before_sq.mean())),
                rms_after_m=float(np.sqrt(after_sq[keep].mean())) if keep.any() else 0.0,
                max_after_m=float(np.sqrt(after_sq[keep].max())) if keep.any() else 0.0,
            )
        )
    return out


def _record(
    sid: str, plane: FloatArray, bowl: float | None, shift: FloatArray, centre: FloatArray,
    live: Sequence[DemOverlap], n_samples: int,
) -> SubmodelTransform:  # fmt: skip
    p0, px, py = (float(v) for v in plane)
    xs = [ov.x for ov in live if sid in (ov.first, ov.second)]
    ys = [ov.y for ov in live if sid in (ov.first, ov.second)]
    if xs:
        x, y = np.concatenate(xs), np.concatenate(ys)
        dz = _height_change(plane, bowl or 0.0, centre, x, y)
        moves = np.sqrt(dz**2 + float(shift @ shift))
        max_move = float(moves.max())
    else:
        max_move = float(np.hypot(*shift))
    tilt = float(np.degrees(np.arctan(np.hypot(px, py))))
    # The tilt as a rotation (z' - z = wx*y - wy*x), for reports: wx = py, wy = -px.
    rot = Rotation.from_rotvec([np.arctan(py), -np.arctan(px), 0.0]).as_matrix()
    return SubmodelTransform(
        submodel_id=sid,
        kind="height_tilt",
        rotation=tuple(float(v) for v in rot.ravel()),
        translation_m=(float(shift[0]), float(shift[1]), p0 + px * centre[0] + py * centre[1]),
        centre_m=(float(centre[0]), float(centre[1]), 0.0),
        height_plane=(p0, px, py),
        height_bowl=None if bowl is None else (float(bowl), float(centre[0]), float(centre[1])),
        rotation_deg=tilt,
        tilt_deg=tilt,
        scale_change=0.0,
        max_correction_m=max_move,
        n_samples=n_samples,
    )


def after_shifts(shifts: AlignmentResult, refined: AlignmentResult) -> AlignmentResult:
    """``refined`` (solved on products already moved by ``shifts``) written as one correction
    from the products before ``shifts``: ``x' = H2(H1(x))``, the height plane and bowl of
    ``refined`` taken back through ``H1``.

    Args:
        shifts: a ``height_tilt`` result that only moves in the plane (a shift, and a turn and
            scale when its transforms have ``horizontal``; no height plane, no bowl).
        refined: a ``height_tilt`` result with the same submodels.

    Returns:
        ``refined`` with composed transforms (``max_correction_m``: its own plus the first
        step's, an upper bound); each overlap's residuals combine (``hypot``) those ``refined``
        measured with those of ``shifts`` in the same overlap.

    Raises:
        ValueError: ``shifts`` changes heights.
    """
    first = {t.submodel_id: t for t in shifts.transforms}
    out = [_composed(first[t.submodel_id], t) for t in refined.transforms]
    step = {o.overlap: o for o in shifts.overlaps}
    overlaps = [_hypot(o, step.get(o.overlap)) for o in refined.overlaps]
    return refined.model_copy(update={"transforms": out, "overlaps": overlaps,
                                      "submodels": submodel_residuals(
                                          [t.submodel_id for t in out], overlaps)})  # fmt: skip


def _hypot(o: OverlapResidual, h: OverlapResidual | None) -> OverlapResidual:
    if h is None:
        return o
    return o.model_copy(update={
        "rms_before_m": float(np.hypot(o.rms_before_m, h.rms_before_m)),
        "rms_after_m": float(np.hypot(o.rms_after_m, h.rms_after_m)),
        "max_after_m": float(np.hypot(o.max_after_m, h.max_after_m)),
    })  # fmt: skip


def _composed(s: SubmodelTransform, t: SubmodelTransform) -> SubmodelTransform:
    """``t`` after ``s`` (``s`` in the plane only) as one ``height_tilt`` transform."""
    bowl_first = s.height_bowl[0] if s.height_bowl is not None else 0.0
    if any(abs(v) > 1e-9 for v in s.height_plane or ()) or bowl_first != 0.0:
        raise ValueError(f"{t.submodel_id}: the first step changes heights, not a shift")
    h1 = np.array([*s.horizontal_affine(), (0.0, 0.0, 1.0)])
    h = np.array([*t.horizontal_affine(), (0.0, 0.0, 1.0)]) @ h1
    (a, b, c), (d, e, f) = h1[:2]
    q0, qx, qy = t.height_plane or (0.0, 0.0, 0.0)
    plane = (q0 + qx * c + qy * f, qx * a + qy * d, qx * b + qy * e)
    bowl = None
    if t.height_bowl is not None:
        k, bx, by = t.height_bowl
        back = np.linalg.solve(h1, [bx, by, 1.0])
        bowl = (k * abs(float(np.linalg.det(h1[:2, :2]))), float(back[0]), float(back[1]))
    cx, cy, _ = t.centre_m
    moved = h @ [cx, cy, 1.0]
    lin = h[:2, :2]
    turn = float(np.arctan2(lin[1, 0], lin[0, 0]))
    tilt = Rotation.from_matrix(np.reshape(t.rotation, (3, 3))).as_rotvec()
    rot = Rotation.from_rotvec([tilt[0], tilt[1], turn])
    return t.model_copy(
        update={
            "translation_m": (
                float(moved[0] - cx),
                float(moved[1] - cy),
                plane[0] + plane[1] * cx + plane[2] * cy,
            ),
            "height_plane": plane,
            "height_bowl": bowl,
            "horizontal": None
            if np.allclose(lin, np.eye(2), atol=1e-15)
            else (float(lin[0, 0]), float(lin[0, 1]), float(lin[1, 0]), float(lin[1, 1])),
            "rotation": tuple(float(v) for v in rot.as_matrix().ravel()),
            "rotation_deg": float(np.degrees(rot.magnitude())),
            "scale_change": float(np.sqrt(abs(np.linalg.det(lin)))) - 1.0,
            "max_correction_m": t.max_correction_m + s.max_correction_m,
        }
    )
