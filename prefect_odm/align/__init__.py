"""Alignment between submodels (pure core: numpy, scipy and pydantic only).

Every pair of neighbouring submodels reconstructs the images their overlap shares. From those
shared cameras (:mod:`.cameras`, read from each submodel's ``shots.geojson``) :func:`align_submodels`
solves one 3-D similarity per submodel jointly over all overlaps, robustly, keeping the block on its
GPS average (:mod:`.solve`); without cameras, :func:`align_heights` solves height, tilt and shift
from DSM (and orthophoto) differences in the overlaps (:mod:`.height_tilt`). The residuals and the
quality gates are pydantic records (:mod:`.report`) for the manifest and report; a transform applies
to points and, as an affine plus a height plane, to rasters (:mod:`.similarity`).

The names below are imported on first use (PEP 562), so that importing one module of the
package (``prefect_odm.models`` reads :mod:`.report`) does not load SciPy: the command line
refuses a missing images folder before those imports.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from prefect_odm.align.cameras import (
        CameraTable,
        Correspondence,
        read_shots_geojson,
        shared_cameras,
    )
    from prefect_odm.align.height_tilt import (
        DemOverlap,
        align_heights,
    )
    from prefect_odm.align.options import AlignmentOptions
    from prefect_odm.align.report import (
        AlignmentError,
        AlignmentReport,
        AlignmentResult,
        CameraGpsResidual,
        GateFailure,
        OutlierCamera,
        OverlapResidual,
        SubmodelResidual,
        SubmodelTransform,
        check_alignment,
        check_report,
        is_identity,
        raise_for_failures,
    )
    from prefect_odm.align.similarity import (
        RasterCorrection,
        Similarity,
        umeyama,
    )
    from prefect_odm.align.solve import (
        align_submodels,
    )

_MODULE_OF = {
    "CameraTable": "prefect_odm.align.cameras",
    "Correspondence": "prefect_odm.align.cameras",
    "read_shots_geojson": "prefect_odm.align.cameras",
    "shared_cameras": "prefect_odm.align.cameras",
    "DemOverlap": "prefect_odm.align.height_tilt",
    "align_heights": "prefect_odm.align.height_tilt",
    "AlignmentError": "prefect_odm.align.report",
    "AlignmentOptions": "prefect_odm.align.options",
    "AlignmentReport": "prefect_odm.align.report",
    "AlignmentResult": "prefect_odm.align.report",
    "CameraGpsResidual": "prefect_odm.align.report",
    "GateFailure": "prefect_odm.align.report",
    "OutlierCamera": "prefect_odm.align.report",
    "OverlapResidual": "prefect_odm.align.report",
    "SubmodelResidual": "prefect_odm.align.report",
    "SubmodelTransform": "prefect_odm.align.report",
    "check_alignment": "prefect_odm.align.report",
    "check_report": "prefect_odm.align.report",
    "is_identity": "prefect_odm.align.report",
    "raise_for_failures": "prefect_odm.align.report",
    "RasterCorrection": "prefect_odm.align.similarity",
    "Similarity": "prefect_odm.align.similarity",
    "umeyama": "prefect_odm.align.similarity",
    "align_submodels": "prefect_odm.align.solve",
}

__all__ = [
    "AlignmentError",
    "AlignmentOptions",
    "AlignmentReport",
    "AlignmentResult",
    "CameraGpsResidual",
    "CameraTable",
    "Correspondence",
    "DemOverlap",
    "GateFailure",
    "OutlierCamera",
    "OverlapResidual",
    "RasterCorrection",
    "Similarity",
    "SubmodelResidual",
    "SubmodelTransform",
    "align_heights",
    "align_submodels",
    "check_alignment",
    "check_report",
    "is_identity",
    "raise_for_failures",
    "read_shots_geojson",
    "shared_cameras",
    "umeyama",
]


def __getattr__(name: str) -> Any:
    """The exported ``name``, imported from its module on first use."""
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
