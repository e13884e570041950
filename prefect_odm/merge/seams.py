"""Seams, feathering, colour balancing and vertical offsets (pure core: numpy and scipy).

Seams follow the ownership rule of :mod:`prefect_odm.ownership` (nearest core camera). For each
submodel ``k`` and ground position ``p`` let ``d_k(p)`` be the distance from ``p`` to the nearest
core camera of ``k`` and ``d(p) = min_k d_k(p)``. The *seam distance*

    ``e_k(p) = (d_k(p) - d(p)) / 2``   (metres)

is zero for the owner of ``p``, zero for ``k`` on the seam between ``k`` and the owner, and grows
by one metre per metre walked into the owner's cell along the line joining the two cameras (it
is the exact distance to the bisector there and a lower bound elsewhere). Feathering gives
submodel ``k`` the weight ``max(0, 1 - 2 e_k / feather_m)``: the owner weighs 1, a neighbour
fades linearly to 0 within ``feather_m / 2`` of the seam, so blending happens only in a band
``feather_m`` wide around each seam. Where no submodel with data has a weight (the owner has a
hole far from any seam), the submodel with data and the smallest ``e_k`` is taken, so there is no
hole wherever any submodel has data.

``d_k`` is evaluated exactly on a lattice of every ``lattice_step_px``-th pixel centre anchored at
the grid origin and interpolated bilinearly in between. The lattice and the per-pixel arithmetic
do not depend on the block layout, so any block size or worker count gives identical pixels.

Colour balancing solves one gain and one offset per band and submodel jointly over all overlaps
by linear least squares (mean and standard deviation matching in each overlap; cf. Brown & Lowe,
"Automatic Panoramic Image Stitching using Invariant Features", IJCV 2007, section 6, which solves
gains jointly the same way), with the mean gain fixed to 1 and the mean offset to 0 (or one
reference submodel fixed). Vertical DEM offsets are solved the same way from the median height
differences in the overlaps.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray
from scipy.spatial import cKDTree

from prefect_odm.merge.grid import Block, Grid
from prefect_odm.ownership import Ownership


@dataclass(frozen=True)
class SeamField:
    """Seam distances ``e_k`` of every submodel of an :class:`Ownership` over a grid.

    Args:
        ownership: the ownership rule (its cameras in the grid's CRS, metres).
        grid: the output grid.
        lattice_step_px: distance between exact evaluations, pixels (>= 1).
    """

    ownership: Ownership
    grid: Grid
    lattice_step_px: int = 8
    _trees: dict[str, cKDTree] = field(init=False, repr=False)
    _all: cKDTree = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.lattice_step_px < 1:
            raise ValueError("lattice_step_px must be >= 1")
        xy = np.column_stack([self.ownership.x_m, self.ownership.y_m]).astype(np.float64)
        owners = np.asarray(self.ownership.camera_submodel)
        trees = {sid: cKDTree(xy[owners == sid]) for sid in self.ownership.submodel_ids}
        object.__setattr__(self, "_trees", trees)
        object.__setattr__(self, "_all", cKDTree(xy))

    def seam_distance(self, block: Block, submodel_ids: Sequence[str]) -> NDArray[np.float32]:
        """``e_k`` for each requested submodel over one block.

        Args:
            block: the window of :attr:`grid`.
            submodel_ids: submodels to evaluate; each must be an owner in the ownership.

        Returns:
            ``(len(submodel_ids), block.height, block.width)`` float32, metres.

        Raises:
            KeyError: a submodel id the ownership does not know.
        """
        s = self.lattice_step_px
        res = self.grid.resolution_m
        i0 = block.row_off // s
        i1 = (block.row_off + block.height - 1) // s + 1
        j0 = block.col_off // s
        j1 = (block.col_off + block.width - 1) // s + 1
        lat_rows = np.arange(i0, i1 + 1, dtype=np.float64) * s
        lat_cols = np.arange(j0, j1 + 1, dtype=np.float64) * s
        ly = self.grid.top - (lat_rows + 0.5) * res
        lx = self.grid.left + (lat_cols + 0.5) * res
        gx, gy = np.meshgrid(lx, ly)
        pts = np.column_stack([gx.ravel(), gy.ravel()])
        d_min, _ = self._all.query(pts, k=1)
        rows = np.arange(block.row_off, block.row_off + block.height)
        cols = np.arange(block.col_off, block.col_off + block.width)
        ri = rows // s - i0
        rf = ((rows % s) / s).astype(np.float64)[:, None]
        ci = cols // s - j0
        cf = ((cols % s) / s).astype(np.float64)[None, :]

        def interp(values: NDArray[np.float64]) -> NDArray[np.float64]:
            lat = values.reshape(gx.shape)
            tmp = (1.0 - rf) * lat[ri, :] + rf * lat[ri + 1, :]
            val: NDArray[np.float64] = (1.0 - cf) * tmp[:, ci] + cf * tmp[:, ci + 1]
            return val

        base = interp(d_min)
        out = np.empty((len(submodel_ids), block.height, block.width), dtype=np.float32)
        for n, sid in enumerate(submodel_ids):
            d_k, _ = self._trees[sid].query(pts, k=1)
            out[n] = (0.5 * (interp(d_k) - base)).astype(np.float32)
        return out


def blend_weights(
    seam_distance_m: NDArray[np.float32], valid: NDArray[np.bool_], feather_m: float
) -> NDArray[np.float32]:
    """Normalised blending weights from seam distances and data masks.

    Args:
        seam_distance_m: ``(k, rows, cols)`` ``e_k`` in metres (see module docstring).
        valid: ``(k, rows, cols)`` True where submodel ``k`` has data.
        feather_m: width of the blending band around each seam, metres (0: hard seam).

    Returns:
        ``(k, rows, cols)`` float32 weights summing to 1 wherever any submodel is valid and to 0
        elsewhere. Ties go to the first submodel (callers pass submodels in sorted id order).
    """
    e = seam_distance_m
    if feather_m > 1e-6:
        w = np.clip(1.0 - (2.0 / feather_m) * e, 0.0, 1.0).astype(np.float32)
        w *= valid
        total = w.sum(axis=0)
    else:
        w = np.zeros(e.shape, dtype=np.float32)
        total = np.zeros(e.shape[1:], dtype=np.float32)
    missing = (total <= 0) & valid.any(axis=0)
    if missing.any():
        masked = np.where(valid, e, np.float32(np.inf))
        pick = np.argmin(masked, axis=0)
        for k in range(e.shape[0]):
            sel = missing & (pick == k)
            w[k][sel] = 1.0
        total = w.sum(axis=0)
    np.divide(w, total, out=w, where=total > 0)
    weights: NDArray[np.float32] = w
    return weights


@dataclass(frozen=True)
class OverlapStats:
    """Per-band statistics of two submodels over the pixels where both have data.

    Attributes:
        a, b: submodel ids.
        pixels: number of common pixels (at whatever decimation they were sampled).
        mean_a, std_a, mean_b, std_b: per band, digital numbers, shape ``(bands,)``.
    """

    a: str
    b: str
    pixels: int
    mean_a: tuple[float, ...]
    std_a: tuple[float, ...]
    mean_b: tuple[float, ...]
    std_b: tuple[float, ...]


@dataclass(frozen=True)
class GainOffset:
    """Per-band linear colour correction ``value * gain + offset`` of one submodel."""

    gain: tuple[float, ...]
    offset: tuple[float, ...]

    @staticmethod
    def identity(bands: int) -> GainOffset:
        return GainOffset(gain=(1.0,) * bands, offset=(0.0,) * bands)


def overlap_stats(
    a: str, b: str, values_a: NDArray[np.floating], values_b: NDArray[np.floating]
) -> OverlapStats:
    """Statistics of two co-located pixel sets.

    Args:
        values_a, values_b: ``(bands, n)`` values of the same ``n`` ground positions.
    """
    va = np.asarray(values_a, dtype=np.float64)
    vb = np.asarray(values_b, dtype=np.float64)
    return OverlapStats(
        a=a,
        b=b,
        pixels=int(va.shape[1]),
        mean_a=tuple(float(v) for v in va.mean(axis=1)),
        std_a=tuple(float(v) for v in va.std(axis=1)),
        mean_b=tuple(float(v) for v in vb.mean(axis=1)),
        std_b=tuple(float(v) for v in vb.std(axis=1)),
    )


def solve_gain_offset(
    submodel_ids: Sequence[str],
    stats: Sequence[OverlapStats],
    bands: int,
    reference: str | None = None,
) -> dict[str, GainOffset]:
    """Gain and offset per band and submodel, solved jointly over all overlaps.

    For each overlap ``(a, b)`` and band the equations ``g_a * std_a = g_b * std_b`` and
    ``g_a * mean_a + o_a = g_b * mean_b + o_b`` are weighted by the square root of the number of
    common pixels; ``mean(g) = 1`` and ``mean(o) = 0`` (or ``g_ref = 1, o_ref = 0``) fix the
    reference; a weak prior ``g = 1, o = 0`` keeps submodels without overlaps unchanged.

    Args:
        submodel_ids: all submodels, sorted.
        stats: overlap statistics (pairs with zero pixels are ignored).
        bands: number of colour bands.
        reference: a submodel held fixed, or None to hold the mean fixed.

    Returns:
        submodel id -> :class:`GainOffset`.
    """
    ids = list(submodel_ids)
    index = {sid: i for i, sid in enumerate(ids)}
    k = len(ids)
    used = [s for s in stats if s.pixels > 0 and s.a in index and s.b in index]
    if k < 2 or not used:
        return {sid: GainOffset.identity(bands) for sid in ids}
    gains = np.ones((k, bands))
    offsets = np.zeros((k, bands))
    for band in range(bands):
        rows: list[NDArray[np.float64]] = []
        rhs: list[float] = []
        scale = 1.0
        for s in used:
            w = float(np.sqrt(s.pixels))
            scale = max(scale, w * max(s.mean_a[band], s.mean_b[band], 1.0))
            ia, ib = index[s.a], index[s.b]
            r = np.zeros(2 * k)
            r[ia], r[ib] = w * s.std_a[band], -w * s.std_b[band]
            rows.append(r)
            rhs.append(0.0)
            r = np.zeros(2 * k)
            r[ia], r[ib] = w * s.mean_a[band], -w * s.mean_b[band]
            r[k + ia], r[k + ib] = w, -w
            rows.append(r)
            rhs.append(0.0)
        big = 1e3 * scale
        small = 1e-3 * scale / 100.0
        if reference is None:
            r = np.zeros(2 * k)
            r[:k] = big
            rows.append(r)
            rhs.append(big * k)
            r = np.zeros(2 * k)
            r[k:] = big
            rows.append(r)
            rhs.append(0.0)
        else:
            ir = index[reference]
            r = np.zeros(2 * k)
            r[ir] = big
            rows.append(r)
            rhs.append(big)
            r = np.zeros(2 * k)
            r[k + ir] = big
            rows.append(r)
            rhs.append(0.0)
        for i in range(k):
            r = np.zeros(2 * k)
            r[i] = small * 100.0
            rows.append(r)
            rhs.append(small * 100.0)
            r = np.zeros(2 * k)
            r[k + i] = small
            rows.append(r)
            rhs.append(0.0)
        sol, *_ = np.linalg.lstsq(np.vstack(rows), np.asarray(rhs), rcond=None)
        gains[:, band] = sol[:k]
        offsets[:, band] = sol[k:]
    return {
        sid: GainOffset(
            gain=tuple(float(v) for v in gains[i]), offset=tuple(float(v) for v in offsets[i])
        )
        for i, sid in enumerate(ids)
    }


def solve_vertical_offsets(
    submodel_ids: Sequence[str],
    differences: Sequence[tuple[str, str, float, int]],
    reference: str | None = None,
) -> dict[str, float]:
    """Vertical offset of each submodel, solved jointly from pairwise overlap differences.

    Args:
        submodel_ids: all submodels, sorted.
        differences: ``(a, b, median(z_a - z_b) in metres, common pixel count)`` per overlap.
        reference: a submodel held at offset 0, or None to hold the mean offset at 0.

    Returns:
        submodel id -> offset in metres; subtract it from that submodel's heights.
    """
    ids = list(submodel_ids)
    index = {sid: i for i, sid in enumerate(ids)}
    k = len(ids)
    used = [d for d in differences if d[3] > 0 and d[0] in index and d[1] in index]
    if k < 2 or not used:
        return {sid: 0.0 for sid in ids}
    rows: list[NDArray[np.float64]] = []
    rhs: list[float] = []
    top = 1.0
    for a, b, diff, n in used:
        w = float(np.sqrt(n))
        top = max(top, w)
        r = np.zeros(k)
        r[index[a]], r[index[b]] = w, -w
        rows.append(r)
        rhs.append(w * diff)
    big = 1e3 * top
    r = np.zeros(k)
    if reference is None:
        r[:] = big
    else:
        r[index[reference]] = big
    rows.append(r)
    rhs.append(0.0)
    for i in range(k):
        r = np.zeros(k)
        r[i] = 1e-6 * top
        rows.append(r)
        rhs.append(0.0)
    sol, *_ = np.linalg.lstsq(np.vstack(rows), np.asarray(rhs), rcond=None)
    return {sid: float(sol[i]) for i, sid in enumerate(ids)}


def ownership_from_centres(centres: Mapping[str, tuple[float, float]]) -> Ownership:
    """An ownership for inputs without a split plan: one pseudo-camera per input.

    Each input is represented by the centre of its own data footprint (the centroid of its valid
    pixels, or of its points' bounding box), so the seams are the perpendicular bisectors of the
    centres (a Voronoi partition), which for inputs of similar size run through the middle of
    their overlaps.

    Raises:
        ValueError: no centres.
    """
    if not centres:
        raise ValueError("no input to derive an ownership from")
    ids = sorted(centres)
    return Ownership.from_cameras([(centres[s][0], centres[s][1], s) for s in ids])
