"""DEMs of the built-in engine: the surface under the cameras (DSM) and the ground (DTM).

Algorithms:

* **DSM (sfm)**: outliers removed from the sparse points (height against the median of their
  nearest neighbours, robust MAD threshold), Delaunay-linear interpolation
  (``scipy.interpolate.griddata``) inside the points' convex hull, a NaN-aware Gaussian smoothing
  of ``DSM_SMOOTHING_M``, nodata outside the hull and outside every camera's view.
* **DSM (dense)**: the mean height of the fused dense points per cell
  (:func:`mean_height_per_cell`; the fusion, :mod:`.dense_fusion`, already kept only points that
  two pairs agree on), then ODM's ``dem-gapfill-steps``: holes within growing radii filled
  (:func:`.ground.fill_small_gaps`), the remaining ones inside every camera's view (the
  orthophoto's footprint) interpolated as ODM's last step does (:func:`fill_to_footprint`);
  nodata outside.
  Which cells were measured is kept apart (:data:`MEASURED_BAND`).
* **DSM (direct)**: the ground plane over the area seen by at least one camera.
* **DTM**: the DSM's ground cells by the simple morphological filter
  (:func:`.ground.smrf_ground`), interpolated under objects (:func:`.ground.dtm_from_ground`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple, cast

import numpy as np
from numpy.typing import NDArray

from prefect_odm.engine.camera import Scene
from prefect_odm.engine.footprints import FloatArray
from prefect_odm.errors import ProcessingFailedError
from prefect_odm.grid import Grid
from prefect_odm.registry import DSM_MEASURED_BAND, DSM_MEASURED_DESCRIPTION

HeightSampler = Callable[[NDArray[np.integer[Any]], NDArray[np.integer[Any]]], FloatArray]
"""``(rows, cols) -> z``: surface heights (metres) of grid cells."""

DSM_NODATA = -9999.0
"""Nodata value of the DSM and DTM (as ODM writes them)."""

MEASURED_BAND = DSM_MEASURED_BAND
"""The dense DSM's second band: 1 where the cell's height was measured (dense points in it),
0 where ``dem-gapfill-steps`` filled it, nodata outside the footprint. A band of the DSM itself
rather than a sidecar file, so every path that carries ``dsm.tif`` (NodeODM's ``all.zip``, S3,
the merge) carries it; not GDAL's internal mask, which means "invalid" and would hide the filled
heights. Band 1 stays the heights, as ODM writes them."""

MEASURED_DESCRIPTION = DSM_MEASURED_DESCRIPTION
"""The description (GDAL band name) of :data:`MEASURED_BAND`."""

DSM_SMOOTHING_M = 0.5
"""Standard deviation in metres of the Gaussian smoothing of the interpolated DSM."""

OUTLIER_NEIGHBOURS = 12
OUTLIER_MAD_FACTOR = 5.0
OUTLIER_MIN_M = 1.0


def filter_point_outliers(xyz: FloatArray) -> NDArray[np.bool_]:
    """Keep-mask of points whose height agrees with their horizontal neighbours.

    A point is dropped when ``|z - median(z of its OUTLIER_NEIGHBOURS nearest)|`` exceeds
    ``max(OUTLIER_MIN_M, OUTLIER_MAD_FACTOR * 1.4826 * MAD)`` of that residual over all points.
    """
    from scipy.spatial import cKDTree

    n = len(xyz)
    if n <= OUTLIER_NEIGHBOURS:
        return np.ones(n, dtype=bool)
    _, found = cKDTree(xyz[:, :2]).query(xyz[:, :2], k=OUTLIER_NEIGHBOURS + 1)
    index = cast(NDArray[np.intp], found)
    residual = xyz[:, 2] - np.median(xyz[index[:, 1:], 2], axis=1)
    mad = float(np.median(np.abs(residual - np.median(residual))))
    limit = max(OUTLIER_MIN_M, OUTLIER_MAD_FACTOR * 1.4826 * mad)
    return np.asarray(np.abs(residual) <= limit, dtype=bool)


def _nan_gaussian(data: NDArray[np.float32], sigma_cells: float) -> NDArray[np.float32]:
    from scipy.ndimage import gaussian_filter

    if sigma_cells < 0.3:
        return data
    valid = np.isfinite(data)
    filled = np.where(valid, data, 0.0).astype(np.float32)
    num = gaussian_filter(filled, sigma_cells, mode="nearest")
    den = gaussian_filter(valid.astype(np.float32), sigma_cells, mode="nearest")
    with np.errstate(invalid="ignore", divide="ignore"):
        out = num / den
    return np.where(valid, out, np.nan).astype(np.float32)


def surface_from_points(xyz: FloatArray, grid: Grid) -> NDArray[np.float32]:
    """Interpolate point heights onto ``grid``: NaN outside the points' convex hull.

    Args:
        xyz: UTM metres, shape ``(n, 3)``, n >= 3 (outliers already removed).

    Returns:
        Heights in metres, float32, shape ``(grid.height, grid.width)``.

    Raises:
        ProcessingFailedError: fewer than 3 points.
    """
    from scipy.interpolate import griddata

    if len(xyz) < 3:
        raise ProcessingFailedError(f"{len(xyz)} points are too few for a surface")
    xs, ys = np.meshgrid(grid.xs(), grid.ys())
    # interpolate in local coordinates: Delaunay on 5e6-sized numbers loses precision
    ox, oy = grid.left, grid.top
    heights = griddata(
        (xyz[:, 0] - ox, xyz[:, 1] - oy), xyz[:, 2], (xs - ox, ys - oy), method="linear"
    ).astype(np.float32)
    return _nan_gaussian(heights, DSM_SMOOTHING_M / grid.resolution_m)


def fill_nearest(data: NDArray[np.float32]) -> NDArray[np.float32]:
    """Replace NaN cells by the value of the nearest valid cell.

    Raises:
        ProcessingFailedError: no cell is valid.
    """
    from scipy.ndimage import distance_transform_edt

    invalid = ~np.isfinite(data)
    if not invalid.any():
        return data
    if invalid.all():
        raise ProcessingFailedError("surface has no valid cell")
    _, (rows, cols) = distance_transform_edt(invalid, return_indices=True)
    return np.asarray(data[rows, cols], dtype=np.float32)


def fill_to_footprint(
    dsm: NDArray[np.float32], footprint: NDArray[np.bool_]
) -> NDArray[np.float32]:
    """ODM's last gap-filling step: the ``footprint`` cells still without a height are
    interpolated from the heights around them.

    ODM (``opendm/dem/commands.create_dem``) fills what the growing radii left with
    ``gdal_fillnodata`` on a copy at 10 % of the size, merged back bilinearly: a smooth
    interpolation (its documentation calls the step nearest neighbour). Here the push-pull
    pyramid (:func:`.ground.push_pull`: Gaussian-weighted means, coarser levels upsampled
    bilinearly) does the same in one pass; a plain nearest-height fill left cliffs along the
    Voronoi edges between far-apart heights (brighton's forest and lake in the hillshade). Each
    filled height is a weighted mean of heights the DSM has, so none lies outside their range.

    Args:
        dsm: heights, NaN = no height, shape ``(rows, cols)``.
        footprint: the cells that must have a height (the orthophoto's footprint), same shape.

    Returns:
        float32, same shape: ``dsm`` where it has a height, interpolated elsewhere in
        ``footprint``, NaN outside it (also everywhere when ``dsm`` has no height).
    """
    from prefect_odm.engine import ground

    valid = np.isfinite(dsm)
    if not valid.any():
        return np.full(dsm.shape, np.nan, dtype=np.float32)
    filled = ground.push_pull(dsm, valid)
    return np.where(valid, dsm, np.where(footprint, filled, np.nan)).astype(np.float32)


def mean_height_per_cell(xyz: FloatArray, grid: Grid) -> NDArray[np.float32]:
    """Mean height of the points in each cell of ``grid`` (NaN where a cell has none).

    Args:
        xyz: UTM metres, shape ``(n, 3)``.

    Returns:
        float32, shape ``(grid.height, grid.width)``, metres.
    """
    col = np.floor((xyz[:, 0] - grid.left) / grid.resolution_m).astype(np.int64)
    row = np.floor((grid.top - xyz[:, 1]) / grid.resolution_m).astype(np.int64)
    inside = (col >= 0) & (col < grid.width) & (row >= 0) & (row < grid.height)
    index = row[inside] * grid.width + col[inside]
    size = grid.width * grid.height
    sums = np.bincount(index, weights=xyz[inside, 2], minlength=size)
    counts = np.bincount(index, minlength=size)
    with np.errstate(invalid="ignore", divide="ignore"):
        means = np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)
    return means.reshape(grid.height, grid.width).astype(np.float32)


class DenseDsm(NamedTuple):
    """What :func:`dense_dsm` makes, on the DEM grid (float32 heights, NaN = nodata).

    Attributes:
        surface: the gap-free surface the orthophoto is draped on.
        dsm: the DSM, filled to the footprint when ``dem-gapfill-steps`` > 0.
        ground_input: the DSM with the growing radii's filling only, for the ground filter (the
            large holes, forest and water, would be ground to SMRF).
        measured: bool, the cells whose height comes from dense points in them.
        counts: ``points_used``, ``coverage_cells``, ``measured_cells``, ``filled_cells`` (the
            DSM's cells without a measured height).
    """

    surface: NDArray[np.float32]
    dsm: NDArray[np.float32]
    ground_input: NDArray[np.float32]
    measured: NDArray[np.bool_]
    counts: dict[str, int]


def dense_dsm(xyz: FloatArray, scene: Scene, grid: Grid, gapfill_steps: int) -> DenseDsm:
    """The DSM of a dense cloud on ``grid`` (see the module docstring).

    Args:
        xyz: the fused dense points, UTM metres, ``(n, 3)``.
        scene: the cameras (for the coverage, the orthophoto's footprint).
        grid: the DEM grid.
        gapfill_steps: ODM's ``dem-gapfill-steps`` (0: no filling, holes stay nodata).

    Returns:
        A :class:`DenseDsm`.

    Raises:
        ProcessingFailedError: no point lies on the grid.
    """
    from prefect_odm.engine import footprints, ground

    measured = mean_height_per_cell(xyz, grid)
    if not np.isfinite(measured).any():
        raise ProcessingFailedError("the DSM is empty: no dense point lies on the DEM grid")
    surface = ground.push_pull(measured, np.isfinite(measured))
    seen = footprints.coverage_mask(scene, grid, surface)
    measured = np.where(seen, measured, np.nan).astype(np.float32)
    small = ground.fill_small_gaps(measured, grid.resolution_m, gapfill_steps, seen)
    dsm = fill_to_footprint(small, seen) if gapfill_steps > 0 else small
    counts = {
        "points_used": len(xyz),
        "coverage_cells": int(seen.sum()),
        "measured_cells": int(np.isfinite(measured).sum()),
        "filled_cells": int(np.isfinite(dsm).sum() - np.isfinite(measured).sum()),
    }
    return DenseDsm(surface, dsm, small, np.isfinite(measured), counts)


def smrf_dtm(
    dsm: NDArray[np.float32], res_m: float, smrf: dict[str, float]
) -> tuple[NDArray[np.float32], float]:
    """``(DTM, share of the DSM's cells that are ground)`` by the SMRF ground filter.

    Args:
        dsm: heights, NaN = nodata (at least one valid cell).
        res_m: cell size, metres.
        smrf: ODM's ``smrf-slope``, ``-window``, ``-threshold``, ``-scalar`` by suffix.
    """
    from prefect_odm.engine import ground

    cells = ground.smrf_ground(
        dsm,
        res_m,
        slope=smrf["slope"],
        window_m=smrf["window"],
        threshold_m=smrf["threshold"],
        scalar=smrf["scalar"],
    )
    share = float(cells.sum() / max(1, int(np.isfinite(dsm).sum())))
    return ground.dtm_from_ground(dsm, cells), share


def surface_sampler(surface: NDArray[np.float32], surface_grid: Grid, grid: Grid) -> HeightSampler:
    """``(rows, cols) -> z`` for cells of ``grid``, bilinear in a gap-free ``surface`` on
    ``surface_grid`` (edges clamped)."""
    from scipy.ndimage import map_coordinates

    data = surface.astype(np.float64)

    def height_at(rows: NDArray[np.integer[Any]], cols: NDArray[np.integer[Any]]) -> FloatArray:
        y = grid.top - (rows + 0.5) * grid.resolution_m
        x = grid.left + (cols + 0.5) * grid.resolution_m
        srow = (surface_grid.top - y) / surface_grid.resolution_m - 0.5
        scol = (x - surface_grid.left) / surface_grid.resolution_m - 0.5
        return np.asarray(map_coordinates(data, [srow, scol], order=1, mode="nearest"))

    return height_at
