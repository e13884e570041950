"""A similarity in the plane per submodel (shift, turn about the vertical, scale) from the
horizontal offsets neighbours show in their overlaps (pure core: numpy and scipy).

Each overlap gives offsets ``dxy_k`` of the second submodel's products against the first's at
positions ``xy_k`` (orthophoto feature matches, or phase-correlation tiles at their centres;
plan CRS metres). Submodel ``i`` gets the correction ``x' = x + t_i + M_i (x - c_i)`` with
``M_i = [[s_i, -w_i], [w_i, s_i]]`` about its centre ``c_i``: a similarity for any ``s_i, w_i``
(scale ``|1 + s_i + i w_i|``, turn ``atan2(w_i, 1 + s_i)``), so the problem
``C_second(x_k) - C_first(x_k) = -dxy_k`` is linear. A shift alone per submodel cannot close a
loop of overlaps whose offsets do not sum to zero; with 8-image submodels (brighton ``--split 6``)
their scales differ by up to 2 % and the offsets along a seam change by 0.4 m over 10 m, which
the turn and scale take out. The robust loss, outlier rounds and gauge are those of
:mod:`.height_tilt`: per connected block the sample-weighted mean scale, turn and shift are
zero (a common similarity of the whole block, which no overlap sees, is taken out), so the
block keeps its GPS placement.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray
from scipy.optimize import least_squares
from scipy.sparse import csr_matrix, diags, vstack
from scipy.sparse.csgraph import connected_components

from prefect_odm.align.options import AlignmentOptions
from prefect_odm.align.report import AlignmentResult, OverlapResidual, SubmodelTransform
from prefect_odm.align.residuals import submodel_residuals

FloatArray = NDArray[np.float64]
RIDGE = 1e-2
"""Weight of a ridge towards zero (on whitened rows): it fixes the gauge's free directions
(fixed exactly afterwards) and holds turn and scale where an overlap's offsets do not spread."""


@dataclass(frozen=True)
class HorizontalOffsets:
    """The second submodel's horizontal offsets against the first in one overlap.

    Attributes:
        first, second: submodel ids.
        xy: ``(n, 2)`` positions where they were measured, plan CRS metres.
        dxy: ``(n, 2)`` where a feature lies in the second's products minus where it lies in
            the first's, metres (east, north).
    """

    first: str
    second: str
    xy: FloatArray
    dxy: FloatArray


def robust_linear(
    a: csr_matrix,
    b: FloatArray,
    sigma: float,
    options: AlignmentOptions,
    prior: FloatArray | None = None,
) -> FloatArray:
    """Robust ``a @ x ~ b`` (``options.loss``, rows whitened by ``sigma``) with a vanishing
    ridge (:data:`RIDGE`), or with ``prior``: per column the weight (1 / sigma, on whitened
    rows) of a pseudo-observation ``x_k = 0``."""
    n = a.shape[1]
    ridge = RIDGE * np.ones(n) if prior is None else np.asarray(prior, dtype=np.float64)

    def fun(x: FloatArray) -> FloatArray:
        return np.concatenate([(a @ x - b) / sigma, ridge * x])

    stacked = csr_matrix(vstack([a / sigma, diags(ridge)]))

    def jac(x: FloatArray) -> csr_matrix:
        return stacked.copy()  # least_squares rescales it in place for the robust loss

    # with a prior, lsmr's default tolerances (1e-6) leave steps too rough for the 1e-12 stops
    # (brighton's zero-overlap refinement: 800 evaluations unconverged; 9 with 1e-14)
    inner: dict[str, float] = {} if prior is None else {"atol": 1e-14, "btol": 1e-14}
    fit = least_squares(
        fun, np.zeros(n), jac=jac, loss=options.loss, f_scale=options.loss_threshold_sigmas,
        tr_solver="lsmr", method="trf", xtol=1e-12, ftol=1e-12, gtol=1e-12, tr_options=inner,
    )  # fmt: skip
    return np.asarray(fit.x, dtype=np.float64)


def _design(
    offsets: Sequence[HorizontalOffsets],
    index: dict[str, int],
    centres: FloatArray,
    length_m: float,
) -> csr_matrix:
    """Rows ``C_second(x) - C_first(x)`` (east rows, then north rows, per overlap) over
    ``(tx, ty, s * length_m, w * length_m)`` per submodel."""
    rows, cols, vals = [], [], []
    start = 0
    for ov in offsets:
        n = len(ov.xy)
        east, north = start + np.arange(n), start + n + np.arange(n)
        for sign, sid in ((1.0, ov.second), (-1.0, ov.first)):
            i = index[sid]
            rx, ry = (ov.xy - centres[i]).T / length_m
            one, zero = np.ones(n), np.zeros(n)
            # east: tx + s rx - w ry; north: ty + s ry + w rx
            for k, (ve, vn) in enumerate(((one, zero), (zero, one), (rx, ry), (-ry, rx))):
                rows += [east, north]
                cols += [np.full(n, 4 * i + k)] * 2
                vals += [sign * ve, sign * vn]
        start += 2 * n
    return csr_matrix(
        (np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))),
        shape=(start, 4 * len(index)),
    )


def solve_rejecting(
    a: csr_matrix, b: FloatArray, opts: AlignmentOptions, prior: FloatArray | None = None
) -> tuple[FloatArray, NDArray[np.bool_]]:
    """:func:`robust_linear` (with ``prior``), then again without the rows far off the rest
    (beyond ``outlier_mad_factor`` MADs and ``outlier_min_m``; at most 3 rounds): the planar and
    the height refinements' one rejection rule. Returns the solution and the mask of the rows
    kept."""
    keep = np.ones(len(b), dtype=bool)
    for _ in range(3):
        p = robust_linear(csr_matrix(a[keep]), b[keep], opts.camera_sigma_m, opts, prior)
        err = np.abs(a @ p - b)
        med = float(np.median(err[keep]))
        mad = float(np.median(np.abs(err[keep] - med)))
        limit = max(opts.outlier_min_m, med + opts.outlier_mad_factor * 1.4826 * mad)
        if np.array_equal(keep, err <= limit):
            break
        keep = err <= limit
    return p, keep


def _median_shifts(
    a: csr_matrix,
    left: FloatArray,
    keep: NDArray[np.bool_],
    live: Sequence[HorizontalOffsets],
    opts: AlignmentOptions,
) -> FloatArray:
    """Shifts alone (the turns and scales kept) that take out each overlap's median offset
    left after the fit (``left``: ``b - a @ p``; each overlap's median over its rows kept,
    standing for each of its offsets), as the parameter step to add.

    The fit is least squares over the offsets; its medians per overlap are what a seam shows
    (brighton's Quickstart overlap: 0.03 m after the fit, 0.006 m after these shifts), and
    where the overlaps form no loop, shifts alone take every median out."""
    rows, start = np.zeros_like(left), 0
    for ov in live:
        k = len(ov.xy)
        for axis in (0, 1):
            sl = slice(start + axis * k, start + (axis + 1) * k)
            part = left[sl][keep[sl]]
            rows[sl] = float(np.median(part)) if len(part) else 0.0
        start += 2 * k
    n = a.shape[1] // 4
    shifts = np.concatenate([4 * np.arange(n), 4 * np.arange(n) + 1])
    step = np.zeros(a.shape[1])
    step[shifts] = robust_linear(csr_matrix(a[:, shifts]), rows, opts.camera_sigma_m, opts)
    return step


def _gauge(
    p: FloatArray, centres: FloatArray, counts: FloatArray, labels: NDArray[np.intp]
) -> None:
    """Per connected block, take out (in place) the common similarity no overlap sees: the
    count-weighted mean scale and turn (as one similarity of the whole block about its mean
    centre) and then the mean shift."""
    for comp in np.unique(labels):
        m = labels == comp
        w = counts[m] if counts[m].sum() > 0 else np.ones(int(m.sum()))
        s, turn = np.average(p[m, 2], weights=w), np.average(p[m, 3], weights=w)
        r = centres[m] - np.average(centres[m], axis=0, weights=w)
        # the block's similarity moves submodel i's centre by [[s, -w], [w, s]] r_i
        p[m, 0] -= s * r[:, 0] - turn * r[:, 1]
        p[m, 1] -= s * r[:, 1] + turn * r[:, 0]
        p[m, 2] -= s
        p[m, 3] -= turn
        p[m, :2] -= np.average(p[m, :2], axis=0, weights=w)


def align_planar(
    submodel_ids: Sequence[str],
    centres: FloatArray,
    offsets: Sequence[HorizontalOffsets],
    options: AlignmentOptions | None = None,
) -> tuple[FloatArray, list[NDArray[np.bool_]]]:
    """Shift, scale and turn per submodel, solved jointly and robustly over all overlaps.

    Args:
        submodel_ids: every submodel, length ``N``.
        centres: each submodel's centre ``(N, 2)`` (or ``(N, 3)``), plan CRS metres: the point
            its turn and scale are about.
        offsets: the offsets measured in each overlap.
        options: robust loss and outlier rule; ``camera_sigma_m`` is one offset's sigma.

    Returns:
        ``(N, 4)`` rows ``(tx, ty, s, w)``: submodel ``i`` moves ``x`` to
        ``x + (tx, ty) + [[s, -w], [w, s]] (x - c_i)`` (metres; ``s``, ``w`` dimensionless); and
        per overlap of ``offsets`` the mask of the offsets kept (``(n,)``, an offset kept when
        both its east and north rows are).
    """
    opts = options or AlignmentOptions()
    index = {sid: i for i, sid in enumerate(submodel_ids)}
    c = np.asarray(centres, dtype=np.float64)[:, :2]
    n = len(submodel_ids)
    live = [ov for ov in offsets if len(ov.xy)]
    if not live:
        return np.zeros((n, 4)), [np.zeros(len(ov.xy), dtype=bool) for ov in offsets]
    xy = np.concatenate([ov.xy for ov in live])
    length = float(max(xy.std(axis=0).max(), 1.0))
    a = _design(live, index, c, length)
    b = np.concatenate([-np.concatenate([ov.dxy[:, 0], ov.dxy[:, 1]]) for ov in live])
    p, keep = solve_rejecting(a, b, opts)
    p = p + _median_shifts(a, b - a @ p, keep, live, opts)
    p = p.reshape(n, 4) / [1.0, 1.0, length, length]
    counts, adj = np.zeros(n), np.zeros((n, n))
    for ov in live:
        counts[[index[ov.first], index[ov.second]]] += len(ov.xy)
        adj[index[ov.first], index[ov.second]] = 1
    _, labels = connected_components(adj, directed=False)
    _gauge(p, c, counts, labels.astype(np.intp))
    kept, start = {}, 0
    for ov in live:
        k = len(ov.xy)
        kept[id(ov)] = keep[start : start + k] & keep[start + k : start + 2 * k]
        start += 2 * k
    return p, [kept.get(id(ov), np.zeros(0, dtype=bool)) for ov in offsets]


def _record(sid: str, p: FloatArray, centre: FloatArray, xy: FloatArray) -> SubmodelTransform:
    """One submodel's ``height_tilt`` transform (no height change) from its ``(tx, ty, s, w)``;
    ``xy``: its offsets' positions (for the largest move)."""
    tx, ty, s, w = (float(v) for v in p)
    turn = float(np.arctan2(w, 1.0 + s))
    r = (np.cos(turn), -np.sin(turn), 0.0, np.sin(turn), np.cos(turn), 0.0, 0.0, 0.0, 1.0)
    if len(xy):
        rel = xy - centre
        moves = np.hypot(tx + s * rel[:, 0] - w * rel[:, 1], ty + s * rel[:, 1] + w * rel[:, 0])
        max_move = float(moves.max())
    else:
        max_move = float(np.hypot(tx, ty))
    return SubmodelTransform(
        submodel_id=sid, kind="height_tilt", rotation=tuple(float(v) for v in r),
        translation_m=(tx, ty, 0.0), centre_m=(float(centre[0]), float(centre[1]), 0.0),
        height_plane=(0.0, 0.0, 0.0), horizontal=(1.0 + s, -w, w, 1.0 + s),
        rotation_deg=abs(float(np.degrees(turn))), tilt_deg=0.0,
        scale_change=float(np.hypot(1.0 + s, w)) - 1.0, max_correction_m=max_move,
        n_samples=len(xy),
    )  # fmt: skip


def _residual(ov: HorizontalOffsets, index: dict[str, int], p: FloatArray, c: FloatArray,
              keep: NDArray[np.bool_]) -> OverlapResidual:  # fmt: skip
    """Before and after (over the offsets kept) disagreement of one overlap, metres."""
    after = ov.dxy.copy()
    for sign, sid in ((1.0, ov.second), (-1.0, ov.first)):
        tx, ty, s, w = p[index[sid]]
        rel = ov.xy - c[index[sid]]
        after[:, 0] += sign * (tx + s * rel[:, 0] - w * rel[:, 1])
        after[:, 1] += sign * (ty + s * rel[:, 1] + w * rel[:, 0])
    before_sq, after_sq = (ov.dxy**2).sum(axis=1), (after**2).sum(axis=1)[keep]
    return OverlapResidual(
        overlap=f"{ov.first}|{ov.second}", first=ov.first, second=ov.second,
        n_shared=len(ov.xy), n_used=int(keep.sum()),
        rms_before_m=float(np.sqrt(before_sq.mean())),
        rms_after_m=float(np.sqrt(after_sq.mean())) if len(after_sq) else 0.0,
        max_after_m=float(np.sqrt(after_sq.max())) if len(after_sq) else 0.0,
    )  # fmt: skip


def align_horizontal(
    submodel_ids: Sequence[str],
    centres: FloatArray,
    offsets: Sequence[HorizontalOffsets],
    options: AlignmentOptions | None = None,
) -> AlignmentResult:
    """:func:`align_planar` as an alignment result: one ``height_tilt`` transform per submodel
    that moves it in the plane only (``horizontal``: its turn and scale; no height change).

    Args:
        submodel_ids, centres, offsets, options: as :func:`align_planar`.

    Returns:
        an :class:`AlignmentResult` (``method='dem'``); per overlap its offsets' rms before and
        after (``n_shared``: the offsets).
    """
    started = time.perf_counter()
    index = {sid: i for i, sid in enumerate(submodel_ids)}
    c = np.asarray(centres, dtype=np.float64)[:, :2]
    p, kept = align_planar(submodel_ids, c, offsets, options)
    live = [(ov, k) for ov, k in zip(offsets, kept, strict=True) if len(ov.xy)]
    overlaps = [_residual(ov, index, p, c, k) for ov, k in live]
    transforms = []
    for i, sid in enumerate(submodel_ids):
        mine = [ov.xy for ov, _ in live if sid in (ov.first, ov.second)]
        xy = np.concatenate(mine) if mine else np.zeros((0, 2))
        transforms.append(_record(sid, p[i], c[i], xy))
    return AlignmentResult(
        method="dem", gauge="mean", transforms=transforms, overlaps=overlaps,
        submodels=submodel_residuals(list(submodel_ids), overlaps),
        solve_seconds=time.perf_counter() - started, iterations=1,
    )  # fmt: skip
