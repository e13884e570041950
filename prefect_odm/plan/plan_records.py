"""The records a plan writes: rounded GeoJSON geometry, camera positions, the plan fingerprint
(pure core).

Coordinates are written to millimetres (:data:`COORD_DECIMALS`), so that a plan is identical byte
for byte for shuffled input.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import shapely
from numpy.typing import NDArray
from shapely.geometry import mapping
from shapely.geometry.base import BaseGeometry

from prefect_odm.fingerprints import fingerprint
from prefect_odm.models import CameraPosition, ImageRecord, SplitPlan

#: Decimal places of coordinates written to the plan (millimetres).
COORD_DECIMALS = 3


def round_geometry(geom: BaseGeometry) -> dict[str, Any]:
    """``geom`` as a GeoJSON dict, coordinates rounded to :data:`COORD_DECIMALS` (an empty
    geometry: an empty Polygon)."""
    if geom.is_empty:
        return {"type": "Polygon", "coordinates": []}
    rounded = shapely.set_precision(geom, 10.0**-COORD_DECIMALS)
    gj = mapping(rounded)

    def _clean(obj: Any) -> Any:
        if isinstance(obj, (list, tuple)):
            if obj and isinstance(obj[0], float):
                return [round(float(v), COORD_DECIMALS) for v in obj]
            return [_clean(o) for o in obj]
        return obj

    return {"type": gj["type"], "coordinates": _clean(gj["coordinates"])}


def camera_positions(
    images: Sequence[ImageRecord],
    x: NDArray[np.float64],
    y: NDArray[np.float64],
    labels: NDArray[np.int32],
    ids: Sequence[str],
) -> list[CameraPosition]:
    """Every camera's plan position (millimetres) and core submodel, sorted by image name.

    Args:
        images: the planned images; ``x``, ``y`` (plan CRS metres) and ``labels`` (core part)
            in the same order, shape ``(n,)``; ``ids``: the submodel id of each part.
    """
    cameras = [
        CameraPosition(
            name=im.name,
            x_m=round(float(x[i]), COORD_DECIMALS),
            y_m=round(float(y[i]), COORD_DECIMALS),
            z_m=None if im.altitude_m is None else round(float(im.altitude_m), COORD_DECIMALS),
            submodel_id=ids[int(labels[i])],
        )
        for i, im in enumerate(images)
    ]
    cameras.sort(key=lambda c: c.name)
    return cameras


def plan_fingerprint(plan: SplitPlan, images: Sequence[ImageRecord]) -> str:
    """The plan's identity: its partition of image *contents*.

    File names (and so renaming the inputs) do not enter it; the submodel fingerprints already
    cover images and options.
    """
    identity = {im.name: im.identity for im in images}
    content = plan.model_dump(
        mode="json",
        exclude={
            "fingerprint": True,
            "gps_warnings": True,
            "neighbours": True,
            "split_overlap_asked_m": True,
            "cameras": True,
            "submodels": {"__all__": {"image_names", "core_image_names"}},
        },
    )
    content["cameras"] = sorted(
        (identity[c.name], c.x_m, c.y_m, c.z_m, c.submodel_id) for c in plan.cameras
    )
    content["core_images"] = {
        sm.id: sorted(identity[n] for n in sm.core_image_names) for sm in plan.submodels
    }
    return fingerprint(content)
