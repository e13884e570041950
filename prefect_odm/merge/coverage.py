"""Coverage and completeness of a merged orthophoto (adapter: rasterio).

Every raster is sampled by nearest neighbour onto one decimated grid (same CRS as the merged
orthophoto, cells ``factor`` merged pixels wide, the longer side at most ``max_side_px``) through
:class:`rasterio.vrt.WarpedVRT`, so inputs in another CRS or grid are compared at the same
ground positions. Areas are cell counts times the cell area.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import rasterio
from numpy.typing import NDArray
from rasterio.crs import CRS
from rasterio.enums import ColorInterp, Resampling
from rasterio.features import rasterize
from rasterio.transform import Affine
from rasterio.vrt import WarpedVRT

from prefect_odm.align.similarity import RasterCorrection
from prefect_odm.errors import MergeError
from prefect_odm.geo import GeoJSONGeometry
from prefect_odm.grid import Bounds, Grid, snap_grid
from prefect_odm.merge.rasterio_options import WarpOptions
from prefect_odm.merge.reports import CoverageReport, SubmodelCoverage

MIN_COVERAGE_OF_UNION = 0.995
"""Merged covered area / union of the inputs' covered areas below which a merge fails (the
block merges check their own pixels against it too, :func:`.blocks.check_union_coverage`)."""

MIN_COVERAGE_OF_PLANNED = 0.5
"""Merged covered area inside the planned footprint / the footprint's area below which the
merge fails. The footprint is an estimate from camera positions and heights, and engines rarely
cover it to its very edge, so only a gross shortfall (half empty) is an error; the figure is
reported."""


def _mask_on(
    path: Path, crs: CRS, grid: Grid, fix: RasterCorrection | None = None
) -> NDArray[np.bool_]:
    """Valid-data mask of a raster sampled (nearest) at the centres of ``grid`` (placed with
    its alignment correction ``fix`` when given, as the merges place it)."""
    with rasterio.open(path) as ds:
        if ds.crs is None:
            raise MergeError(f"{path} has no CRS")
        alpha = next((i + 1 for i, c in enumerate(ds.colorinterp) if c == ColorInterp.alpha), None)
        kwargs: WarpOptions = {
            "crs": crs,
            "transform": Affine(*grid.transform),
            "width": grid.width,
            "height": grid.height,
            "resampling": Resampling.nearest,
        }
        if fix is not None:
            t = ds.transform
            kwargs["src_transform"] = Affine(
                *fix.corrected_geotransform((t.a, t.b, t.c, t.d, t.e, t.f))
            )
        if alpha:
            kwargs.update({"src_alpha": alpha, "dst_alpha": alpha})
        elif ds.nodata is not None:
            kwargs["nodata"] = ds.nodata
        else:
            kwargs["add_alpha"] = True
        with WarpedVRT(ds, **kwargs) as vrt:
            if alpha:
                return np.asarray(vrt.read(alpha) > 0)
            return np.asarray(vrt.dataset_mask() > 0)


def _comparison_grid(
    merged: Path, planned_footprint: GeoJSONGeometry | None, max_side_px: int
) -> tuple[CRS, Grid, Bounds]:
    """The merged raster's CRS, its bounds and the decimated grid every mask is sampled on
    (anchored on the merged grid's origin, extended to cover the footprint unless it lies apart,
    its longer side at most about ``max_side_px`` cells)."""
    with rasterio.open(merged) as ds:
        if ds.crs is None:
            raise MergeError(f"{merged} has no CRS")
        crs = ds.crs
        res = abs(ds.transform.a)
        bounds: Bounds = tuple(ds.bounds)
    fine = snap_grid([bounds], res)
    boxes = [bounds]
    if planned_footprint is not None and not _apart(bounds, planned_footprint):
        from shapely.geometry import shape

        x0, y0, x1, y1 = shape(dict(planned_footprint)).bounds
        boxes.append((x0, y0, x1, y1))
    # decimated over everything it covers: decimating the merged raster alone and extending
    # the grid to a footprint far from it gave 11,539,955 x 7,953,272 cells (83.5 TiB per
    # mask) for products lying in another UTM zone than their plan
    factor, _ = snap_grid(boxes, res).decimated(max_side_px)
    cell = res * factor
    left = min(b[0] for b in boxes)
    top = max(b[3] for b in boxes)
    col0 = int(np.floor((left - fine.left) / cell))
    row0 = int(np.floor((fine.top - top) / cell))
    right = max(b[2] for b in boxes)
    bottom = min(b[1] for b in boxes)
    grid = Grid(
        left=fine.left + col0 * cell,
        top=fine.top - row0 * cell,
        resolution_m=cell,
        width=max(1, int(np.ceil((right - (fine.left + col0 * cell)) / cell))),
        height=max(1, int(np.ceil(((fine.top - row0 * cell) - bottom) / cell))),
    )
    return crs, grid, bounds


def _apart(bounds: Bounds, planned_footprint: GeoJSONGeometry) -> bool:
    """Whether the footprint lies wholly outside the merged raster's bounds (then nothing of
    it is covered, and the comparison grid need not reach it)."""
    from shapely.geometry import box, shape

    return not shape(dict(planned_footprint)).intersects(box(*bounds))


def _planned(
    planned_footprint: GeoJSONGeometry, grid: Grid, merged: NDArray[np.bool_], bounds: Bounds
) -> tuple[float | None, float | None]:
    """``(planned area, covered fraction of it)`` on ``grid``; Nones for an empty footprint.
    A footprint apart from the merged ``bounds`` is not on ``grid``: its own area, 0 covered."""
    if _apart(bounds, planned_footprint):
        from shapely.geometry import shape

        area = float(shape(dict(planned_footprint)).area)
        return (area, 0.0) if area > 0 else (None, None)
    planned = rasterize(
        [(planned_footprint, 1)],
        out_shape=(grid.height, grid.width),
        transform=Affine(*grid.transform),
        fill=0,
        dtype="uint8",
    ).astype(bool)
    planned_n = int(planned.sum())
    if not planned_n:
        return None, None
    return planned_n * grid.pixel_area_m2, float((merged & planned).sum() / planned_n)


def _check(
    merged: Path, report: CoverageReport, min_of_union: float, min_of_planned: float
) -> None:
    if report.coverage_of_union < min_of_union:
        raise MergeError(
            f"{merged}: covers {report.coverage_of_union:.1%} of the submodels' union "
            f"(minimum {min_of_union:.1%})"
        )
    planned = report.coverage_of_planned
    if planned is not None and planned < min_of_planned:
        raise MergeError(
            f"{merged}: covers {planned:.1%} of the planned footprint "
            f"(minimum {min_of_planned:.1%})"
        )


def coverage_report(
    merged_orthophoto: Path,
    inputs: Mapping[str, Path],
    planned_footprint: GeoJSONGeometry | None = None,
    *,
    max_side_px: int = 2048,
    min_coverage_of_union: float = MIN_COVERAGE_OF_UNION,
    min_coverage_of_planned: float = MIN_COVERAGE_OF_PLANNED,
    corrections: Mapping[str, RasterCorrection] | None = None,
) -> CoverageReport:
    """Compare a merged raster's covered area with its inputs' and the planned footprint.

    Args:
        merged_orthophoto: the merged raster (RGBA, or with nodata/mask; a DEM works too).
        inputs: submodel id -> the rasters that were merged (any CRS).
        planned_footprint: GeoJSON Polygon/MultiPolygon dict in the merged raster's CRS.
        max_side_px: longest side of the decimated comparison grid.
        min_coverage_of_union: below this ``coverage_of_union`` raise.
        min_coverage_of_planned: below this ``coverage_of_planned`` raise.
        corrections: the alignment's corrections: each input is compared where the merge put it.

    Returns:
        A :class:`CoverageReport`.

    Raises:
        MergeError: the merged raster is empty, covers less than ``min_coverage_of_union`` of
            the inputs' union, or less than ``min_coverage_of_planned`` of the footprint.
    """
    started = time.perf_counter()
    merged_path = Path(merged_orthophoto)
    crs, grid, merged_bounds = _comparison_grid(merged_path, planned_footprint, max_side_px)
    cell_area = grid.pixel_area_m2
    merged = _mask_on(merged_path, crs, grid)
    union = np.zeros_like(merged)
    per = []
    for sid in sorted(inputs):
        mask = _mask_on(Path(inputs[sid]), crs, grid, (corrections or {}).get(sid))
        union |= mask
        n = int(mask.sum())
        fraction = float((mask & merged).sum() / n) if n else 0.0
        per.append(
            SubmodelCoverage(
                submodel_id=sid, covered_area_m2=n * cell_area, covered_by_merged_fraction=fraction
            )
        )
    merged_n = int(merged.sum())
    union_n = int(union.sum())
    if merged_n == 0:
        raise MergeError(f"{merged_orthophoto}: the merged result is empty")
    planned_area, of_planned = (
        _planned(planned_footprint, grid, merged, merged_bounds)
        if planned_footprint is not None
        else (None, None)
    )
    report = CoverageReport(
        merged_area_m2=merged_n * cell_area,
        union_area_m2=union_n * cell_area,
        coverage_of_union=float((merged & union).sum() / union_n) if union_n else 0.0,
        planned_area_m2=planned_area,
        coverage_of_planned=of_planned,
        per_submodel=tuple(per),
        cell_size_m=grid.resolution_m,
        elapsed_seconds=time.perf_counter() - started,
    )
    _check(merged_path, report, min_coverage_of_union, min_coverage_of_planned)
    return report
