"""The records a plan writes: submodel records, rounded GeoJSON geometry, camera positions, the
plan fingerprint (pure core).

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

from prefect_odm.errors import PlanningError
from prefect_odm.fingerprints import fingerprint, submodel_fingerprint
from prefect_odm.models import CameraPosition, ImageRecord, ProcessingOptions, SplitPlan, Submodel
from prefect_odm.plan.core_areas import camera_hulls, multipoint
from prefect_odm.plan.memory import MemoryModel, estimate_peak_memory_gib
from prefect_odm.plan.position_plan import PositionPlan

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
            "altitude_correction": True,  # its heights enter through the cameras
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


def submodel_records(
    images: list[ImageRecord],
    x: NDArray[np.float64],
    y: NDArray[np.float64],
    pplan: PositionPlan,
    ids: Sequence[str],
    half_fp: float,
    options: ProcessingOptions,
    engine_identity: str,
    node_memory_gib: Sequence[float],
    memory_model: MemoryModel,
) -> list[Submodel]:
    """The :class:`Submodel` records of a position plan, with memory estimates and fingerprints.

    Args:
        images: the planned images, in the plan's canonical order (indices of ``pplan``).
        x: image positions ``(n,)``, plan CRS metres.
        y: image positions ``(n,)``, plan CRS metres.
        pplan: the position plan (its core areas set).
        ids: the submodel ids, one per part.
        half_fp: half an image's ground footprint, metres.
        options: processing options (fingerprints, memory estimate).
        engine_identity: engine name/version, part of each fingerprint.
        node_memory_gib: memory of each available node, GiB (none: no limit).
        memory_model: the memory anchor table.

    Raises:
        PlanningError: a submodel needs more memory than the largest of ``node_memory_gib``.
    """
    assert pplan.core_areas is not None
    node_options = options.to_nodeodm()
    submodels: list[Submodel] = []
    largest_node = max(node_memory_gib) if node_memory_gib else None
    # The survey's image footprint: what ``area_m2`` counts of a core area (the core areas reach
    # out to the clip buffer, far beyond the images, so that ownership covers every pixel).
    survey_footprint = shapely.buffer(
        multipoint(np.column_stack([x, y])).convex_hull, half_fp, quad_segs=8
    )
    footprints = shapely.buffer(
        camera_hulls(np.column_stack([x, y]), pplan.members), half_fp, quad_segs=8
    )
    for part, members in enumerate(pplan.members):
        member_images = [images[i] for i in members]
        core_images = [images[i] for i in np.flatnonzero(pplan.labels == part)]
        mp = float(np.mean([im.width * im.height / 1e6 for im in member_images]))
        memory = estimate_peak_memory_gib(len(member_images), mp, node_options, model=memory_model)
        if largest_node is not None and memory > largest_node:
            overlap = len(member_images) - len(core_images)
            raise PlanningError(
                f"{ids[part]} needs an estimated {memory:.1f} GiB for {len(member_images)} images "
                f"({overlap} of them overlap), more than the largest node ({largest_node:g} GiB); "
                "lower the split (--split) or the split overlap (--split-overlap-m)"
            )
        footprint = footprints[part]
        area = pplan.core_areas[part]
        submodels.append(
            Submodel(
                id=ids[part],
                image_names=sorted(im.name for im in member_images),
                core_image_names=sorted(im.name for im in core_images),
                overlap_image_count=len(member_images) - len(core_images),
                core_area=round_geometry(area),
                footprint=round_geometry(footprint),
                area_m2=round(float(shapely.intersection(area, survey_footprint).area), 2),
                estimated_memory_gib=memory,
                fingerprint=submodel_fingerprint(
                    [im.identity for im in member_images], node_options, engine_identity
                ),
            )
        )
    return submodels


def with_altitudes(
    plan: SplitPlan, images: Sequence[ImageRecord], altitudes_m: dict[str, float]
) -> SplitPlan:
    """``plan`` with its cameras at ``altitudes_m`` (image name -> metres) and every submodel's
    fingerprint over the altitudes of its images (the ``geo.txt`` its node gets)."""
    identity = {im.name: im.identity for im in images}
    node_options = plan.options.to_nodeodm()
    cameras = [
        c.model_copy(update={"z_m": round(altitudes_m[c.name], COORD_DECIMALS)})
        if c.name in altitudes_m
        else c
        for c in plan.cameras
    ]
    submodels = [
        sm.model_copy(
            update={
                "fingerprint": submodel_fingerprint(
                    [identity[n] for n in sm.image_names],
                    node_options,
                    plan.engine_identity,
                    {identity[n]: altitudes_m[n] for n in sm.image_names if n in altitudes_m},
                )
            }
        )
        for sm in plan.submodels
    ]
    return plan.model_copy(update={"cameras": cameras, "submodels": submodels})
