"""Raster algorithms of the dense DEMs: gap interpolation, small-gap filling, the ground filter.

All functions take north-up rasters on one grid (``(rows, cols)`` float32, metres, NaN = no
height) and the cell size in metres; they are pure (no I/O).

* :func:`push_pull`: fills every unknown cell from the known ones by a pyramid of 2x2 sums
  (the "push-pull" scattered-data interpolation of Gortler et al., "The Lumigraph",
  SIGGRAPH 1996), each level's gaps filled from the coarser level upsampled bilinearly, O(cells);
  smoothed in the filled cells only.
* :func:`fill_small_gaps`: ODM's ``dem-gapfill-steps``: the holes that a morphological closing
  of the measured cells with a disk of radius ``2**steps`` cells fills (gaps narrower than about
  ``2 * res * 2**steps`` metres, without growing the outer edge) are interpolated; larger holes
  stay nodata.
* :func:`smrf_ground`: the Simple Morphological Filter (Pingel, Clarke and McBride, "An improved
  simple morphological filter for the terrain classification of airborne LIDAR data", ISPRS J.
  2013) as PDAL's ``filters.smrf`` runs it for ODM's DTM, with ODM's ``smrf-*`` options: the
  minimum surface on cells of ``SMRF_CELL_M`` (PDAL's ``cell``), opened with radii growing one
  cell at a time up to ``window_m`` (a radius); a cell whose height drops between successive
  openings by more than ``slope x radius`` is an object; a provisional ground surface is
  interpolated under the objects; a DSM cell is ground when it lies within
  ``threshold_m + scalar x local slope`` of that surface (above or below).
* :func:`dtm_from_ground`: the DTM: DSM heights of ground cells, interpolated elsewhere, never
  above the DSM, nodata where the DSM is.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

SMRF_SLOPE = 0.15
"""ODM's ``smrf-slope`` default: rise over run that terrain does not exceed."""

SMRF_WINDOW_M = 18.0
"""ODM's ``smrf-window`` default: the radius of the largest opening, metres (objects up to about
twice this across are removed)."""

SMRF_CELL_M = 1.0
"""Cell of the filter's minimum surface, metres: PDAL's ``filters.smrf`` default ``cell``, which
ODM's DTM uses (``opendm/dem/pdal.py``)."""

SMRF_THRESHOLD_M = 0.5
"""ODM's ``smrf-threshold`` default: height above the provisional ground still ground, metres."""

SMRF_SCALAR = 1.25
"""ODM's ``smrf-scalar`` default: extra threshold per unit of local ground slope, metres."""

SMOOTHING_CELLS = 2.0
"""Gaussian standard deviation (cells) applied to interpolated cells only."""

Raster = NDArray[np.float32]


def push_pull(values: Raster, known: NDArray[np.bool_]) -> Raster:
    """Interpolate ``values`` at the cells not ``known`` (every cell gets a value).

    Args:
        values: heights, shape ``(rows, cols)``; only ``known`` cells are read.
        known: cells whose value is given; at least one.

    Returns:
        float32, same shape: the known cells unchanged, the others interpolated.

    Raises:
        ValueError: no cell is known.
    """
    from scipy.ndimage import gaussian_filter

    if not known.any():
        raise ValueError("push_pull: no known cell")
    sums = [np.where(known, values, 0.0).astype(np.float64)]
    weights = [known.astype(np.float64)]
    while min(sums[-1].shape) > 1 and not (weights[-1] > 0).all():
        s, w = sums[-1], weights[-1]
        rows, cols = (s.shape[0] + 1) // 2 * 2, (s.shape[1] + 1) // 2 * 2
        s = np.pad(s, ((0, rows - s.shape[0]), (0, cols - s.shape[1])))
        w = np.pad(w, ((0, rows - w.shape[0]), (0, cols - w.shape[1])))
        sums.append(s.reshape(rows // 2, 2, cols // 2, 2).sum(axis=(1, 3)))
        weights.append(w.reshape(rows // 2, 2, cols // 2, 2).sum(axis=(1, 3)))
    with np.errstate(invalid="ignore", divide="ignore"):
        estimate = np.where(weights[-1] > 0, sums[-1] / weights[-1], 0.0)
        if not (weights[-1] > 0).all():  # a 1-cell-wide pyramid top: the mean of what is known
            estimate[:] = sums[-1].sum() / weights[-1].sum()
        for s, w in zip(reversed(sums[:-1]), reversed(weights[:-1]), strict=True):
            estimate = np.where(w > 0, s / w, _upsample_bilinear(estimate, s.shape))
    smooth = gaussian_filter(estimate, SMOOTHING_CELLS, mode="nearest")
    return np.where(known, values, smooth).astype(np.float32)


def _upsample_bilinear(coarse: NDArray[np.float64], shape: tuple[int, ...]) -> NDArray[np.float64]:
    """``coarse`` at twice its resolution, bilinear between cell centres (edges held), cut to
    ``shape``. Nearest-cell upsampling (each value repeated over its 2x2 cells) left the filled
    areas in flat terraces with steps at the pyramid's block edges, up to 2**levels cells wide,
    which the orthophoto projected onto as straight smears."""
    import cv2

    rows, cols = coarse.shape
    up = cv2.resize(coarse, (2 * cols, 2 * rows), interpolation=cv2.INTER_LINEAR)
    return np.asarray(up, dtype=np.float64)[: shape[0], : shape[1]]


def fill_small_gaps(
    dem: Raster, res_m: float, steps: int, inside: NDArray[np.bool_] | None = None
) -> Raster:
    """Fill gaps of ``dem`` narrower than about ``2 * res_m * 2**steps``; larger ones stay NaN.

    Args:
        dem: heights with NaN holes, shape ``(rows, cols)``.
        res_m: cell size, metres.
        steps: ODM's ``dem-gapfill-steps`` (0: no filling).
        inside: cells that may be filled (e.g. the cameras' coverage); default all.

    Returns:
        float32, same shape: measured cells unchanged, the cells the closing adds (and
        ``inside``) interpolated, the rest NaN.
    """
    from scipy.ndimage import binary_closing

    measured = np.isfinite(dem)
    if steps <= 0 or measured.all() or not measured.any():
        return dem.astype(np.float32, copy=True)
    radius = max(1, int(round(2.0**steps)))
    yy, xx = np.mgrid[-radius : radius + 1, -radius : radius + 1]
    disk = (yy * yy + xx * xx) <= radius * radius
    pad = radius + 1  # closing near the border must not see outside as measured
    closed = binary_closing(np.pad(measured, pad), structure=disk)[pad:-pad, pad:-pad]
    reach = closed & ~measured
    if inside is not None:
        reach &= inside
    filled = push_pull(dem, measured)
    return np.where(measured | reach, filled, np.nan).astype(np.float32)


def _minimum_surface(dsm: Raster, factor: int) -> NDArray[np.float64]:
    """The lowest valid height in each ``factor`` x ``factor`` block of ``dsm`` (NaN if none)."""
    rows = -(-dsm.shape[0] // factor) * factor
    cols = -(-dsm.shape[1] // factor) * factor
    padded = np.full((rows, cols), np.inf)
    padded[: dsm.shape[0], : dsm.shape[1]] = np.where(np.isfinite(dsm), dsm, np.inf)
    blocks = padded.reshape(rows // factor, factor, cols // factor, factor).min(axis=(1, 3))
    return np.where(np.isfinite(blocks), blocks, np.nan)


def _bilinear_upsample(
    coarse: NDArray[np.float64], factor: int, shape: tuple[int, int]
) -> NDArray[np.float64]:
    """``coarse`` (cells of ``factor`` fine cells) bilinearly at the centres of a ``shape`` grid,
    edges clamped; separable, so no coordinate grid of the fine size is built."""

    def axis(
        n_fine: int, n_coarse: int
    ) -> tuple[NDArray[np.intp], NDArray[np.intp], NDArray[np.float64]]:
        u = np.clip((np.arange(n_fine) + 0.5) / factor - 0.5, 0.0, n_coarse - 1)
        low = np.floor(u).astype(np.intp)
        return low, np.minimum(low + 1, n_coarse - 1), u - low

    r0, r1, wr = axis(shape[0], coarse.shape[0])
    c0, c1, wc = axis(shape[1], coarse.shape[1])
    across = coarse[:, c0] * (1.0 - wc) + coarse[:, c1] * wc
    return np.asarray(across[r0] * (1.0 - wr)[:, None] + across[r1] * wr[:, None])


def smrf_ground(
    dsm: Raster,
    res_m: float,
    *,
    slope: float = SMRF_SLOPE,
    window_m: float = SMRF_WINDOW_M,
    threshold_m: float = SMRF_THRESHOLD_M,
    scalar: float = SMRF_SCALAR,
    cell_m: float = SMRF_CELL_M,
) -> NDArray[np.bool_]:
    """Ground cells of a DSM by the Simple Morphological Filter (see the module docstring).

    The steps follow Pingel et al. (2013) and PDAL's ``SMRFilter``: the threshold of each
    opening is ``slope x radius`` (the drop a ground slope can cause at that radius), not the
    radius' increment, so sloped or undulating ground is not taken for objects. The filter runs
    on blocks of about ``cell_m`` (never finer than ``res_m``); each DSM cell is then compared
    with the provisional ground interpolated bilinearly at its centre.

    Args:
        dsm: heights, NaN = nodata, shape ``(rows, cols)``; at least one valid cell.
        res_m: cell size, metres.
        slope, window_m, threshold_m, scalar: ODM's ``smrf-slope``, ``smrf-window`` (a radius,
            metres), ``smrf-threshold`` (metres), ``smrf-scalar``.
        cell_m: cell of the minimum surface, metres (PDAL's ``cell``).

    Returns:
        bool, same shape: True on ground cells (never on nodata).

    Raises:
        ValueError: the DSM has no valid cell.
    """
    from scipy.ndimage import maximum_filter, minimum_filter

    valid = np.isfinite(dsm)
    if not valid.any():
        raise ValueError("smrf_ground: the DSM has no valid cell")
    factor = max(1, int(round(cell_m / res_m)))
    coarse_m = factor * res_m
    lowest = _minimum_surface(dsm, factor)
    known = np.isfinite(lowest)
    surface = push_pull(lowest.astype(np.float32), known).astype(np.float64)
    objects = np.zeros(surface.shape, dtype=bool)
    previous, erosion = surface, surface
    for radius in range(1, max(1, int(np.ceil(window_m / coarse_m))) + 1):
        erosion = minimum_filter(erosion, size=3, mode="nearest")  # a square of radius `radius`
        opened = maximum_filter(erosion, size=2 * radius + 1, mode="nearest")
        objects |= (previous - opened) > slope * radius * coarse_m
        previous = opened
    ground_known = known & ~objects
    provisional = push_pull(
        surface.astype(np.float32), ground_known if ground_known.any() else known
    ).astype(np.float64)
    gy, gx = np.gradient(provisional, coarse_m)
    allowed = threshold_m + scalar * np.hypot(gx, gy)
    ground_z = _bilinear_upsample(provisional, factor, dsm.shape)
    tolerance = _bilinear_upsample(allowed, factor, dsm.shape)
    with np.errstate(invalid="ignore"):
        return np.asarray(valid & (np.abs(dsm - ground_z) <= tolerance), dtype=bool)


def dtm_from_ground(dsm: Raster, ground: NDArray[np.bool_]) -> Raster:
    """The DTM: DSM heights on ``ground`` cells, interpolated under objects, clipped to the DSM.

    Returns:
        float32, same shape, NaN where the DSM is NaN (also everywhere when no cell is ground).
    """
    valid = np.isfinite(dsm)
    if not ground.any():
        return np.full(dsm.shape, np.nan, dtype=np.float32)
    terrain = push_pull(dsm, ground & valid)
    return np.where(valid, np.minimum(terrain, dsm), np.nan).astype(np.float32)
