"""Coverage and completeness of a merged orthophoto (adapter: rasterio).

Every raster is sampled by nearest neighbour onto one decimated grid (same CRS as the merged
orthophoto, cells ``factor`` merged pixels wide, the longer side at most ``max_side_px``) through
:class:`rasterio.vrt.WarpedVRT`, so inputs in another CRS or grid are compared at the same
ground positions. Areas are cell counts times the cell area.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import rasterio
from numpy.typing import NDArray
from rasterio.crs import CRS
from rasterio.enums import ColorInterp, Resampling
from rasterio.features import rasterize
from rasterio.transform import Affine
from rasterio.vrt import WarpedVRT

from prefect_odm.errors import MergeError
from prefect_odm.merge.grid import Grid, snap_grid

MIN_COVERAGE_OF_UNION = 0.995
"""Merged covered area / union of the inputs' covered areas below which the merge fails."""

MIN_COVERAGE_OF_PLANNED = 0.75
"""Merged covered area inside the planned footprint / the footprint's area below which the
merge fails ("half empty"). Engines rarely cover a planned footprint to its very edge, hence
the margin; callers merging a partial run (``allow_partial``) pass a lower value."""


@dataclass(frozen=True)
class SubmodelCoverage:
    """One input's covered area and how much of it the merged product covers."""

    submodel_id: str
    covered_area_m2: float
    covered_by_merged_fraction: float


@dataclass(frozen=True)
class CoverageReport:
    """Covered areas of a merged orthophoto against its inputs and the planned footprint.

    Attributes:
        merged_area_m2: area where the merged orthophoto has data, square CRS units.
        union_area_m2: area where at least one input has data.
        coverage_of_union: ``|merged ∩ union| / |union|``.
        planned_area_m2, coverage_of_planned: the footprint's area and ``|merged ∩ planned| /
            |planned|``, None without a footprint.
        cell_size_m: side of the decimated cells the areas were counted on.
    """

    merged_area_m2: float
    union_area_m2: float
    coverage_of_union: float
    planned_area_m2: float | None
    coverage_of_planned: float | None
    per_submodel: tuple[SubmodelCoverage, ...]
    cell_size_m: float
    elapsed_seconds: float

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict."""
        return asdict(self)


def _mask_on(path: Path, crs: CRS, grid: Grid) -> NDArray[np.bool_]:
    """Valid-data mask of a raster sampled (nearest) at the centres of ``grid``."""
    with rasterio.open(path) as ds:
        if ds.crs is None:
            raise MergeError(f"{path} has no CRS")
        alpha = next((i + 1 for i, c in enumerate(ds.colorinterp) if c == ColorInterp.alpha), None)
        kwargs: dict[str, Any] = {
            "crs": crs,
            "transform": Affine(*grid.transform),
            "width": grid.width,
            "height": grid.height,
            "resampling": Resampling.nearest,
        }
        if alpha:
            kwargs.update(src_alpha=alpha, dst_alpha=alpha)
        elif ds.nodata is not None:
            kwargs.update(nodata=ds.nodata)
        else:
            kwargs.update(add_alpha=True)
        with WarpedVRT(ds, **kwargs) as vrt:
            if alpha:
                return np.asarray(vrt.read(alpha) > 0)
            return np.asarray(vrt.dataset_mask() > 0)


def coverage_report(
    merged_orthophoto: Path,
    inputs: Mapping[str, Path],
    planned_footprint: dict[str, Any] | None = None,
    *,
    max_side_px: int = 2048,
    min_coverage_of_union: float = MIN_COVERAGE_OF_UNION,
    min_coverage_of_planned: float = MIN_COVERAGE_OF_PLANNED,
) -> CoverageReport:
    """Compare a merged raster's covered area with its inputs' and the planned footprint.

    Args:
        merged_orthophoto: the merged raster (RGBA, or with nodata/mask; a DEM works too).
        inputs: submodel id -> the rasters that were merged (any CRS).
        planned_footprint: GeoJSON Polygon/MultiPolygon dict in the merged raster's CRS.
        max_side_px: longest side of the decimated comparison grid.
        min_coverage_of_union: below this ``coverage_of_union`` raise.
        min_coverage_of_planned: below this ``coverage_of_planned`` raise.

    Returns:
        A :class:`CoverageReport`.

    Raises:
        MergeError: the merged raster is empty, covers less than ``min_coverage_of_union`` of
            the inputs' union, or less than ``min_coverage_of_planned`` of the footprint.
    """
    started = time.perf_counter()
    with rasterio.open(merged_orthophoto) as ds:
        if ds.crs is None:
            raise MergeError(f"{merged_orthophoto} has no CRS")
        crs = ds.crs
        res = abs(ds.transform.a)
        bounds = [tuple(ds.bounds)]
    fine = snap_grid(bounds, res)
    factor, _ = fine.decimated(max_side_px)
    cell = res * factor
    boxes = list(bounds)
    if planned_footprint is not None:
        from shapely.geometry import shape

        boxes.append(tuple(shape(planned_footprint).bounds))
    # Anchor the coarse grid on the merged grid's origin, extended to cover the footprint.
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
    cell_area = cell * cell
    merged = _mask_on(Path(merged_orthophoto), crs, grid)
    union = np.zeros_like(merged)
    per = []
    for sid in sorted(inputs):
        mask = _mask_on(Path(inputs[sid]), crs, grid)
        union |= mask
        n = int(mask.sum())
        per.append(
            SubmodelCoverage(sid, n * cell_area, float((mask & merged).sum() / n) if n else 0.0)
        )
    merged_n = int(merged.sum())
    union_n = int(union.sum())
    if merged_n == 0:
        raise MergeError(f"{merged_orthophoto}: the merged result is empty")
    of_union = float((merged & union).sum() / union_n) if union_n else 0.0
    planned_area = None
    of_planned = None
    if planned_footprint is not None:
        planned = rasterize(
            [(planned_footprint, 1)],
            out_shape=(grid.height, grid.width),
            transform=Affine(*grid.transform),
            fill=0,
            dtype="uint8",
        ).astype(bool)
        planned_n = int(planned.sum())
        if planned_n:
            planned_area = planned_n * cell_area
            of_planned = float((merged & planned).sum() / planned_n)
    report = CoverageReport(
        merged_area_m2=merged_n * cell_area,
        union_area_m2=union_n * cell_area,
        coverage_of_union=of_union,
        planned_area_m2=planned_area,
        coverage_of_planned=of_planned,
        per_submodel=tuple(per),
        cell_size_m=cell,
        elapsed_seconds=time.perf_counter() - started,
    )
    if of_union < min_coverage_of_union:
        raise MergeError(
            f"{merged_orthophoto}: covers {of_union:.1%} of the submodels' union "
            f"(minimum {min_coverage_of_union:.1%})"
        )
    if of_planned is not None and of_planned < min_coverage_of_planned:
        raise MergeError(
            f"{merged_orthophoto}: covers {of_planned:.1%} of the planned footprint "
            f"(minimum {min_coverage_of_planned:.1%})"
        )
    return report
