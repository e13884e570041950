"""Are a node's products of the images it was sent? One check for every path that takes them.

A node answering the NodeODM API may return products of another survey: NodeODM in test mode
returns the same canned folder for every task, and a misconfigured or broken node can hand back
another task's results. Its GeoTIFFs then open and carry a CRS, so nothing downstream notices
until the merge (or never, when they lie near). Two files tell it at once:

- ``odm_report/shots.geojson``: one feature per reconstructed camera, its ``filename`` property
  the image's file name. A camera of an image the task was not sent is proof of another
  survey (ODM may drop cameras it cannot reconstruct, never add ones).
- ``cameras.json``: OpenSfM's camera models keyed by OpenSfM's camera id (``exif.camera_id``:
  ``"[v2 ]make model width height projection focal"``, lower case, the make taken out of the
  model when the make is known; ODM's ``opendm/camera.py`` drops the ``v2``). A calibration none
  of whose ids names a camera of the survey (make, model and image size; the projection and the
  focal prior are OpenSfM's guesses and may differ) is of another camera.

Used by the submodel runner as soon as a task's products are downloaded
(:func:`prefect_odm.nodes.stored.fetch_products`), by the camera calibration
(:mod:`prefect_odm.nodes.calibration`) and by ``merge --plan``
(:func:`prefect_odm.merge.existing.match_plan`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping

from prefect_odm.models import CaptureMetadata


def shot_names(raw: bytes) -> set[str]:
    """Image names of the cameras in a ``shots.geojson`` text (its features' ``filename``).

    Raises:
        ValueError: the text is not JSON or not a GeoJSON feature collection.
    """
    shots = json.loads(raw)
    if not isinstance(shots, dict) or not isinstance(shots.get("features", []), list):
        raise ValueError("not a GeoJSON feature collection")
    features = shots.get("features", [])
    names = {
        str((f.get("properties") or {}).get("filename", ""))
        for f in features
        if isinstance(f, dict)
    }
    return names - {""}


def base_names(image_names: Iterable[str]) -> set[str]:
    """Image names (paths under the survey) as a node receives them: file names."""
    return {name.rsplit("/", 1)[-1] for name in image_names}


def foreign_images(returned: Iterable[str], sent: Iterable[str]) -> list[str]:
    """The returned camera names that are not among the images sent, sorted."""
    return sorted(set(returned) - base_names(sent))


def listed(names: list[str], limit: int = 3) -> str:
    """``"A, B, C, ..."``: the first ``limit`` names, ``...`` when there are more."""
    return ", ".join(names[:limit]) + (", ..." if len(names) > limit else "")


def foreign_products_message(submodel_id: str, node_url: str, uuid: str, foreign: list[str]) -> str:
    """The one line refusing a submodel whose node returned cameras of images it was not sent."""
    return (
        f"{submodel_id} on {node_url} (task {uuid}) returned cameras of {len(foreign)} images "
        f"it was not sent ({listed(foreign)}): the node's products are of another survey"
    )


def survey_camera_ids(images: Iterable[CaptureMetadata], *, turned: bool = False) -> set[str]:
    """The ``"make model width height"`` part of OpenSfM's camera id of each image's camera;
    with ``turned``, also with width and height swapped (OpenSfM reads the size after the EXIF
    orientation), and also with the model whole: OpenSfM takes the make out of the model
    (``"canon canon powershot ..."`` -> ``"canon powershot ..."``), the built-in engine's ids
    (:func:`prefect_odm.engine.camera_calibration.odm_camera_id`) keep it."""
    out = set()
    for image in images:
        make = (image.make or "unknown").strip()
        whole = (image.model or "unknown").strip()
        models = {whole}
        if make != "unknown":  # OpenSfM exif.camera_id_: the make taken out of the model
            models.add(whole.replace(make, "").strip())
        sizes = [(image.width, image.height)] + [(image.height, image.width)] * turned
        for model in models:
            for width, height in sizes:
                out.add(f"{make} {model} {int(width)} {int(height)}".lower())
    return out


def camera_id_prefix(camera_id: str) -> str:
    """A ``cameras.json`` key without ``v2``, its projection and its focal prior (the last two
    words): ``"dji fc300s 4000 2250 perspective 0.5555"`` -> ``"dji fc300s 4000 2250"``."""
    words = camera_id.strip().lower().removeprefix("v2 ").split()
    return " ".join(words[:-2])


def foreign_cameras(cameras: Mapping[str, object], images: Iterable[CaptureMetadata]) -> list[str]:
    """The ids of ``cameras`` (a ``cameras.json`` object) when none of them is a camera of
    ``images``; empty when at least one is."""
    survey = survey_camera_ids(images, turned=True)
    if any(camera_id_prefix(str(key)) in survey for key in cameras):
        return []
    return sorted(str(key) for key in cameras)


def camera_mismatch(
    cameras: Mapping[str, object], images: Iterable[CaptureMetadata]
) -> tuple[str, str] | None:
    """``(the ids of cameras, the survey's ids)`` as listed in a refusal when no id of
    ``cameras`` (a ``cameras.json`` object) is a camera of ``images``; ``None`` when one is."""
    images = list(images)
    foreign = foreign_cameras(cameras, images)
    if not foreign:
        return None
    return listed(foreign), listed(sorted(survey_camera_ids(images)))
