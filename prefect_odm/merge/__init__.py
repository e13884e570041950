"""Merging per-submodel outputs: orthophotos, DEMs (DSM/DTM), point clouds, coverage checks.

Pure mathematics lives in :mod:`.grid` and :mod:`.seams`; :mod:`.ortho`, :mod:`.dem`,
:mod:`.pointcloud`, :mod:`.coverage` and :mod:`.existing` are the adapters over rasterio,
laspy and fsspec. The public names below are imported lazily so that importing the pure
modules does not import rasterio or laspy.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "merge_orthophotos": "ortho",
    "ownership_from_rasters": "ortho",
    "OrthoMergeReport": "ortho",
    "SeamQuality": "ortho",
    "merge_dems": "dem",
    "DemMergeReport": "dem",
    "DEM_NODATA": "dem",
    "merge_point_clouds": "pointcloud",
    "PointCloudMergeReport": "pointcloud",
    "SubmodelPoints": "pointcloud",
    "coverage_report": "coverage",
    "CoverageReport": "coverage",
    "SubmodelCoverage": "coverage",
    "find_existing_outputs": "existing",
    "ExistingOutput": "existing",
    "extract_products": "existing",
    "GainOffset": "seams",
    "ownership_from_centres": "seams",
    "Grid": "grid",
    "snap_grid": "grid",
}

__all__ = [
    "CoverageReport",
    "DEM_NODATA",
    "DemMergeReport",
    "ExistingOutput",
    "GainOffset",
    "Grid",
    "OrthoMergeReport",
    "PointCloudMergeReport",
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
    "snap_grid",
]

if TYPE_CHECKING:
    from prefect_odm.merge.coverage import CoverageReport, SubmodelCoverage, coverage_report
    from prefect_odm.merge.dem import DEM_NODATA, DemMergeReport, merge_dems
    from prefect_odm.merge.existing import (
        ExistingOutput,
        extract_products,
        find_existing_outputs,
    )
    from prefect_odm.merge.grid import Grid, snap_grid
    from prefect_odm.merge.ortho import (
        OrthoMergeReport,
        SeamQuality,
        merge_orthophotos,
        ownership_from_rasters,
    )
    from prefect_odm.merge.pointcloud import (
        PointCloudMergeReport,
        SubmodelPoints,
        merge_point_clouds,
    )
    from prefect_odm.merge.seams import GainOffset, ownership_from_centres


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
