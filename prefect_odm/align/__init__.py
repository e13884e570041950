"""Alignment between submodels (pure core: numpy, scipy and pydantic only).

Every pair of neighbouring submodels reconstructs the images their overlap shares. From those
shared cameras (:mod:`.cameras`, read from each submodel's ``shots.geojson``) :func:`align_submodels`
solves one 3-D similarity per submodel jointly over all overlaps, robustly, keeping the block on its
GPS average (:mod:`.solve`); without cameras, :func:`align_heights` solves height, tilt and shift
from DSM (and orthophoto) differences in the overlaps (:mod:`.height_tilt`). The residuals and the
quality gates are pydantic records (:mod:`.report`) for the manifest and report; a transform applies
to points and, as an affine plus a height plane, to rasters (:mod:`.similarity`).
"""

from prefect_odm.align.cameras import (
    CameraTable,
    Correspondence,
    read_shots_geojson,
    shared_cameras,
)
from prefect_odm.align.height_tilt import DemOverlap, align_heights
from prefect_odm.align.report import (
    AlignmentError,
    AlignmentOptions,
    AlignmentReport,
    AlignmentResult,
    CameraGpsResidual,
    GateFailure,
    OutlierCamera,
    OverlapResidual,
    SubmodelResidual,
    SubmodelTransform,
    check_alignment,
    is_identity,
    raise_for_failures,
)
from prefect_odm.align.similarity import RasterCorrection, Similarity, umeyama
from prefect_odm.align.solve import align_submodels

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
    "is_identity",
    "raise_for_failures",
    "read_shots_geojson",
    "shared_cameras",
    "umeyama",
]
