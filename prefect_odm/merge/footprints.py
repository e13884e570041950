"""Ownership from the inputs' own footprints, for merges without a split plan (adapter: rasterio).

Each input is represented by the centroid of its valid pixels (on a decimated copy), so the
seams are the perpendicular bisectors of those centres (:func:`.seams.ownership_from_centres`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
from rasterio.enums import Resampling

from prefect_odm.errors import MergeError
from prefect_odm.merge.seams import ownership_from_centres
from prefect_odm.merge.sources import GridPlan, SourceReader, plan_grid
from prefect_odm.ownership import Ownership

_FOOTPRINT_MAX_SIDE_PX = 512
"""Longest side of the decimated masks used to find footprint centres."""


def footprint_centres(plan: GridPlan) -> dict[str, tuple[float, float]]:
    """Centroid of each source's valid pixels (decimated), in the output CRS.

    Raises:
        MergeError: a source without any valid pixel.
    """
    reader = SourceReader(plan, Resampling.nearest)
    centres: dict[str, tuple[float, float]] = {}
    res = plan.grid.resolution_m
    try:
        for src in plan.sources:
            factor = max(1, -(-max(src.height, src.width) // _FOOTPRINT_MAX_SIDE_PX))
            shape = (max(1, src.height // factor), max(1, src.width // factor))
            _, valid = reader.read(src, src.window, out_shape=shape)
            reader.close_sources([src.submodel_id])  # read once: not every input held open
            rows, cols = np.nonzero(valid)
            if rows.size == 0:
                raise MergeError(f"input {src.submodel_id} ({src.path}) holds no data")
            sy = src.height / shape[0]
            sx = src.width / shape[1]
            x = plan.grid.left + (src.col_off + (cols.mean() + 0.5) * sx) * res
            y = plan.grid.top - (src.row_off + (rows.mean() + 0.5) * sy) * res
            centres[src.submodel_id] = (float(x), float(y))
    finally:
        reader.close()
    return centres


def ownership_from_rasters(inputs: Mapping[str, Path], *, crs_epsg: int | None = None) -> Ownership:
    """An ownership for outputs merged without a split plan, from their rasters' footprints.

    One pseudo-camera per input at the centroid of its valid pixels (decimated), in ``crs_epsg``
    (None: the CRS of the first input by sorted id). Pass the result to all three merges so the
    orthophoto, DEM and point cloud agree on the seams.

    Raises:
        MergeError: no inputs, an unreadable input, or an input without data.
    """
    plan = plan_grid(inputs, resolution_m=None, crs_epsg=crs_epsg, value_bands=None)
    return ownership_from_centres(footprint_centres(plan))


def resolve_ownership(plan: GridPlan, ownership: Ownership | None) -> Ownership:
    """The given ownership checked against the inputs, or one derived from footprint centres.

    Raises:
        MergeError: an input that the ownership does not know, or (deriving) one without data.
    """
    if ownership is None:
        return ownership_from_centres(footprint_centres(plan))
    unknown = sorted(set(plan.submodel_ids) - set(ownership.submodel_ids))
    if unknown:
        raise MergeError(f"inputs {unknown} own no camera in the ownership rule")
    return ownership
