"""Merging per-submodel outputs: orthophotos, DEMs (DSM/DTM), point clouds, coverage checks.

Pure core: :mod:`.grid` (the snapped pixel grid), :mod:`.seams` (seam distances, the
:class:`.seams.SeamMethod` strategies chosen by name), :mod:`.balance` (colour and vertical
solves), :mod:`.blend` (per-block blending) and :mod:`.reports` (the typed merge reports).
Adapters over rasterio, laspy and fsspec: :mod:`.sources` (inputs placed on the grid and read),
:mod:`.footprints` (ownership without a plan), :mod:`.blocks` (block iteration), :mod:`.cog`
(COG writing), :mod:`.ortho`, :mod:`.dem`, :mod:`.pointcloud` (the three merges),
:mod:`.coverage` and :mod:`.existing` (ODM outputs made elsewhere). The public names below are
imported lazily so that importing the pure modules does not import rasterio or laspy.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "merge_orthophotos": "ortho",
    "ownership_from_rasters": "footprints",
    "OrthoMergeReport": "reports",
    "SeamQuality": "reports",
    "merge_dems": "dem",
    "DemMergeReport": "reports",
    "DEM_NODATA": "dem",
    "merge_point_clouds": "pointcloud",
    "PointCloudMergeReport": "reports",
    "SubmodelPoints": "reports",
    "coverage_report": "coverage",
    "CoverageReport": "reports",
    "SubmodelCoverage": "reports",
    "MergeReports": "reports",
    "MIN_COVERAGE_OF_PLANNED": "coverage",
    "SeamMethod": "seams",
    "seam_method": "seam_methods",
    "find_existing_outputs": "existing",
    "ExistingOutput": "existing",
    "extract_products": "existing",
    "GainOffset": "balance",
    "ownership_from_centres": "seams",
    "Grid": "prefect_odm.grid",
    "snap_grid": "prefect_odm.grid",
}

__all__ = [
    "CoverageReport",
    "DEM_NODATA",
    "DemMergeReport",
    "ExistingOutput",
    "GainOffset",
    "Grid",
    "MIN_COVERAGE_OF_PLANNED",
    "MergeReports",
    "OrthoMergeReport",
    "PointCloudMergeReport",
    "SeamMethod",
    "SeamQuality",
    "SubmodelCoverage",
    "SubmodelPoints",
    "coverage_report",
    "extract_products",
    "find_existing_outputs",
    "merge_dems",
    "merge_orthophotos",
    "merge_point_clouds",
    "ownership_from_centres",
    "ownership_from_rasters",
    "seam_method",
    "snap_grid",
]

if TYPE_CHECKING:
    from prefect_odm.grid import Grid, snap_grid
    from prefect_odm.merge.balance import GainOffset
    from prefect_odm.merge.coverage import MIN_COVERAGE_OF_PLANNED, coverage_report
    from prefect_odm.merge.dem import DEM_NODATA, merge_dems
    from prefect_odm.merge.existing import (
        ExistingOutput,
        extract_products,
        find_existing_outputs,
    )
    from prefect_odm.merge.footprints import ownership_from_rasters
    from prefect_odm.merge.ortho import merge_orthophotos
    from prefect_odm.merge.pointcloud import merge_point_clouds
    from prefect_odm.merge.reports import (
        CoverageReport,
        DemMergeReport,
        MergeReports,
        OrthoMergeReport,
        PointCloudMergeReport,
        SeamQuality,
        SubmodelCoverage,
        SubmodelPoints,
    )
    from prefect_odm.merge.seam_methods import seam_method
    from prefect_odm.merge.seams import SeamMethod, ownership_from_centres


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    path = module if module.startswith("prefect_odm.") else f"{__name__}.{module}"
    value = getattr(importlib.import_module(path), name)
    globals()[name] = value
    return value
