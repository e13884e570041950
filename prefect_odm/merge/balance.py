"""Colour balancing and vertical DEM offsets, solved jointly over all overlaps (pure core).

Colour balancing solves one gain and one offset per band and submodel jointly over all overlaps
by linear least squares (mean and standard deviation matching in each overlap; cf. Brown & Lowe,
"Automatic Panoramic Image Stitching using Invariant Features", IJCV 2007, section 6, which solves
gains jointly the same way), with the mean gain fixed to 1 and the mean offset to 0 (or one
reference submodel fixed). Vertical DEM offsets are solved the same way from the median height
differences in the overlaps.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray


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
        """No correction: gain 1 and offset 0 in each of ``bands`` bands."""
        return GainOffset(gain=(1.0,) * bands, offset=(0.0,) * bands)


def overlap_stats(
    a: str, b: str, values_a: NDArray[np.floating], values_b: NDArray[np.floating]
) -> OverlapStats:
    """Statistics of two co-located pixel sets.

    Args:
        a, b: the two submodel ids.
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


class _Equations:
    """Rows and right-hand sides of one least-squares system over ``unknowns`` unknowns."""

    def __init__(self, unknowns: int) -> None:
        self.unknowns = unknowns
        self.rows: list[NDArray[np.float64]] = []
        self.rhs: list[float] = []

    def add(self, coefficients: dict[int, float], value: float) -> None:
        """One equation ``sum(coefficients[i] * x_i) = value``."""
        row = np.zeros(self.unknowns)
        for i, c in coefficients.items():
            row[i] = c
        self.rows.append(row)
        self.rhs.append(value)

    def add_row(self, row: NDArray[np.float64], value: float) -> None:
        """One equation given as a full row."""
        self.rows.append(row)
        self.rhs.append(value)

    def solve(self) -> NDArray[np.float64]:
        """The least-squares solution (:func:`numpy.linalg.lstsq`)."""
        sol, *_ = np.linalg.lstsq(np.vstack(self.rows), np.asarray(self.rhs), rcond=None)
        return np.asarray(sol, dtype=np.float64)


def _overlap_equations(
    eq: _Equations, used: Sequence[OverlapStats], index: dict[str, int], band: int
) -> float:
    """Std and mean matching of every overlap in one band (unknowns: k gains then k offsets).

    Returns:
        The scale of the system (largest weighted mean, at least 1), for the constraint weights.
    """
    k = len(index)
    scale = 1.0
    for s in used:
        w = float(np.sqrt(s.pixels))
        scale = max(scale, w * max(s.mean_a[band], s.mean_b[band], 1.0))
        ia, ib = index[s.a], index[s.b]
        eq.add({ia: w * s.std_a[band], ib: -w * s.std_b[band]}, 0.0)
        eq.add({ia: w * s.mean_a[band], ib: -w * s.mean_b[band], k + ia: w, k + ib: -w}, 0.0)
    return scale


def _reference_equations(eq: _Equations, k: int, big: float, reference: int | None) -> None:
    """``mean(g) = 1, mean(o) = 0`` (reference None) or ``g_ref = 1, o_ref = 0``, weighted big."""
    if reference is None:
        gains = np.zeros(2 * k)
        gains[:k] = big
        eq.add_row(gains, big * k)
        offsets = np.zeros(2 * k)
        offsets[k:] = big
        eq.add_row(offsets, 0.0)
    else:
        eq.add({reference: big}, big)
        eq.add({k + reference: big}, 0.0)


def _prior_equations(eq: _Equations, k: int, small: float) -> None:
    """The weak prior ``g = 1, o = 0`` of every submodel (keeps isolated ones unchanged)."""
    for i in range(k):
        eq.add({i: small * 100.0}, small * 100.0)
        eq.add({k + i: small}, 0.0)


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
        eq = _Equations(2 * k)
        scale = _overlap_equations(eq, used, index, band)
        _reference_equations(eq, k, 1e3 * scale, None if reference is None else index[reference])
        _prior_equations(eq, k, 1e-3 * scale / 100.0)
        sol = eq.solve()
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
    eq = _Equations(k)
    top = 1.0
    for a, b, diff, n in used:
        w = float(np.sqrt(n))
        top = max(top, w)
        eq.add({index[a]: w, index[b]: -w}, w * diff)
    big = 1e3 * top
    fix = np.zeros(k)
    if reference is None:
        fix[:] = big
    else:
        fix[index[reference]] = big
    eq.add_row(fix, 0.0)
    for i in range(k):
        eq.add({i: 1e-6 * top}, 0.0)
    sol = eq.solve()
    return {sid: float(sol[i]) for i, sid in enumerate(ids)}


@dataclass(frozen=True)
class CoarseOffset:
    """An additive colour correction field of one submodel over a crop of a coarse grid.

    Attributes:
        row_off, col_off: the crop's offset in the coarse grid, cells.
        values: ``(bands, rows, cols)`` float32 offsets, DN.
    """

    row_off: int
    col_off: int
    values: NDArray[np.float32]


def _low_pass_difference(
    diff: NDArray[np.float64], weight: NDArray[np.bool_], sigma_cells: float
) -> NDArray[np.float64]:
    """Normalised Gaussian convolution of ``diff`` over ``weight`` cells, outliers clipped
    at 3 robust standard deviations (1.4826 MAD) per band; 0 where no cell is near."""
    from scipy import ndimage

    out = np.zeros_like(diff)
    den = ndimage.gaussian_filter(weight.astype(np.float64), sigma_cells)
    for c in range(diff.shape[0]):
        vals = diff[c][weight]
        med = float(np.median(vals))
        mad = 1.4826 * float(np.median(np.abs(vals - med))) + 1e-6
        clipped = np.where(weight, np.clip(diff[c], med - 3 * mad, med + 3 * mad), 0.0)
        num = ndimage.gaussian_filter(clipped, sigma_cells)
        out[c] = np.where(den > 1e-3, num / np.maximum(den, 1e-3), 0.0)
    return out


def seam_colour_offsets(
    labels: NDArray[np.integer],
    rgb: Sequence[NDArray[np.float32] | None],
    cell_m: float,
    *,
    smooth_m: float = 5.0,
    fade_m: float = 20.0,
) -> list[CoarseOffset | None]:
    """Additive colour offsets that close the low-frequency colour step along every seam.

    For each pair ``(a, b)`` whose labelled areas touch, the difference ``D = rgb_b - rgb_a``
    where both have data is low-passed (normalised Gaussian convolution, ``sigma = smooth_m``,
    outliers clipped); ``a`` gets ``+D t / 2`` and ``b`` gets ``-D t / 2`` with the taper
    ``t = max(0, 1 - distance to the a|b seam / fade_m)``. At the seam the two then differ only
    by the high frequencies of their difference (texture, misregistration), which feathering
    hides; vignetting and tone steps are spread over ``2 fade_m``. This is the low band of a
    two-band blend (Burt & Adelson, "A multiresolution spline with application to image
    mosaics", ACM TOG 1983), computed once per merge on the coarse grid.

    Args:
        labels: ``(rows, cols)`` owner index per coarse cell (-1: no owner).
        rgb: per owner index ``(bands, rows, cols)`` colours on the same cells (NaN without data),
            or None for an owner without colour.
        cell_m: cell size, metres.
        smooth_m: standard deviation of the low pass, metres.
        fade_m: distance from the seam over which the correction fades to 0, metres.

    Returns:
        Per owner index its offsets (cropped to where they are non-zero), or None.
    """
    from scipy import ndimage

    k = len(rgb)
    total: list[NDArray[np.float64] | None] = [None] * k
    for i in range(k):
        for j in range(i + 1, k):
            ra, rb = rgb[i], rgb[j]
            if ra is None or rb is None or not _touch(labels, i, j):
                continue
            to_b = ndimage.distance_transform_edt(labels != j) * cell_m
            to_a = ndimage.distance_transform_edt(labels != i) * cell_m
            dist = np.where(labels == i, to_b, np.where(labels == j, to_a, np.inf))
            taper = np.clip(1.0 - dist / fade_m, 0.0, 1.0)
            both = np.isfinite(ra).all(axis=0) & np.isfinite(rb).all(axis=0) & (taper > 0)
            if not both.any():
                continue
            diff = np.where(both, rb.astype(np.float64) - ra, 0.0)
            half = 0.5 * _low_pass_difference(diff, both, smooth_m / cell_m) * taper
            for n, sign in ((i, 1.0), (j, -1.0)):
                prev = total[n]
                total[n] = sign * half if prev is None else prev + sign * half
    return [None if t is None else _crop(t) for t in total]


def _touch(labels: NDArray[np.integer], i: int, j: int) -> bool:
    for p, q in ((labels[:, :-1], labels[:, 1:]), (labels[:-1, :], labels[1:, :])):
        if np.any(((p == i) & (q == j)) | ((p == j) & (q == i))):
            return True
    return False


def _crop(values: NDArray[np.float64]) -> CoarseOffset | None:
    rows, cols = np.nonzero(np.any(values != 0, axis=0))
    if rows.size == 0:
        return None
    r0, r1, c0, c1 = rows.min(), rows.max() + 1, cols.min(), cols.max() + 1
    return CoarseOffset(int(r0), int(c0), values[:, r0:r1, c0:c1].astype(np.float32))
