"""Camera calibrations as ODM hands them over: ``cameras.json`` and the ``cameras`` option.

ODM writes each reconstruction's camera models to ``cameras.json`` (OpenSfM's cameras, keyed by
OpenSfM's camera id without ``v2``; ``opendm/camera.py`` ``get_cameras_from_opensfm``) and takes
such a file back with ``--cameras`` (a path or the JSON text itself, ``path_or_json_string`` in
``opendm/config.py``), turning it into OpenSfM's ``camera_models_overrides.json``. The built-in
engine writes the same file (:func:`.writers.write_cameras_json`) and honours the ``cameras``
option (:func:`calibrated_cameras`): a camera found there keeps its intrinsics fixed in structure
from motion, so every submodel of a survey uses one calibration (DESIGN.md, "One camera
calibration for the survey").

Values in the file are OpenSfM's normalised ones for the ``brown``/``perspective`` projections:
``focal`` or ``focal_x`` (focal length over the long image side), ``c_x``, ``c_y`` (principal
point offset from the image centre over the long side), ``k1``, ``k2`` (radial terms on
normalised image coordinates, the same in COLMAP's ``RADIAL``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from prefect_odm.engine.camera import ImageMeta
from prefect_odm.errors import InputError

PROJECTIONS: frozenset[str] = frozenset({"brown", "perspective"})
"""OpenSfM projection types the engine's radial camera can take over (tangential and ``k3``
terms, which ``brown`` also has, must be zero)."""


@dataclass(frozen=True)
class Intrinsics:
    """A camera's intrinsics in pixels of the stored image (COLMAP's ``RADIAL``).

    Attributes:
        focal_px: focal length, pixels.
        cx, cy: principal point, pixels (COLMAP convention: the image centre is width / 2).
        k1, k2: radial distortion terms on normalised image coordinates.
    """

    focal_px: float
    cx: float
    cy: float
    k1: float
    k2: float

    def colmap_params(self) -> str:
        """COLMAP ``RADIAL`` parameters as its image reader takes them: ``f,cx,cy,k1,k2``."""
        return ",".join(repr(float(v)) for v in (self.focal_px, self.cx, self.cy, self.k1, self.k2))


def odm_camera_id(meta: ImageMeta, projection: str = "brown") -> str:
    """The camera id ODM keys ``cameras.json`` by, for one image.

    OpenSfM's id without ``v2``: ``"make model width height projection focal"``, lower case,
    the focal prior as a ratio of the long side cut to 6 characters (OpenSfM
    ``exif.camera_id``; ODM ``opendm/camera.py``).
    """
    make, model = (meta.make or "unknown").strip(), (meta.model or "unknown").strip()
    key = " ".join((make, model, str(meta.width), str(meta.height), projection)).lower()
    ratio = meta.focal_length_px / float(max(meta.width, meta.height))
    return f"{key} {str(float(ratio))[:6]}"


def parse_cameras(text: str) -> dict[str, dict[str, Any]]:
    """The camera entries of a ``cameras.json`` text (the ``cameras`` option's value).

    Raises:
        InputError: the text is not a JSON object of objects.
    """
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"option cameras: not JSON ({exc})") from exc
    if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
        raise InputError("option cameras: expected an object of camera objects (cameras.json)")
    return {str(k).removeprefix("v2 ").strip(): v for k, v in data.items()}


def _intrinsics(camera_id: str, entry: Mapping[str, Any], width: int, height: int) -> Intrinsics:
    """One ``cameras.json`` entry in pixels of a ``width`` x ``height`` image.

    Raises:
        InputError: another projection, another image size, or a missing or non-numeric term.
    """
    where = f"option cameras: {camera_id}"
    projection = str(entry.get("projection_type", "perspective"))
    if projection not in PROJECTIONS:
        raise InputError(f"{where}: projection {projection!r} is not brown or perspective")
    if int(entry.get("width", width)) != width or int(entry.get("height", height)) != height:
        raise InputError(f"{where}: calibrated for another image size")
    try:
        focal = float(entry.get("focal_x", entry.get("focal")))
        terms = {k: float(entry.get(k, 0.0)) for k in ("c_x", "c_y", "k1", "k2", "p1", "p2", "k3")}
    except (TypeError, ValueError) as exc:
        raise InputError(f"{where}: a term is missing or not a number ({exc})") from exc
    if not focal > 0:
        raise InputError(f"{where}: focal length {focal} is not positive")
    if any(terms[k] for k in ("p1", "p2", "k3")):
        raise InputError(f"{where}: tangential or k3 terms the engine's camera cannot hold")
    size = float(max(width, height))
    return Intrinsics(
        focal_px=focal * size,
        cx=width / 2.0 + terms["c_x"] * size,
        cy=height / 2.0 + terms["c_y"] * size,
        k1=terms["k1"],
        k2=terms["k2"],
    )


def calibrated_cameras(images: Sequence[ImageMeta], text: str) -> dict[str, Intrinsics]:
    """The fixed intrinsics per camera key (:attr:`ImageMeta.camera_key`) that ``text`` gives.

    A camera whose ODM id (:func:`odm_camera_id`, ``brown`` or ``perspective``) is not in the
    file is left out: it is calibrated by structure from motion as without the option, as
    OpenSfM overrides only the cameras it finds.

    Args:
        images: the task's images.
        text: the ``cameras`` option's value (``cameras.json`` text; empty: none).

    Raises:
        InputError: the text is not ``cameras.json``, or an entry for one of the images'
            cameras does not fit it (another image size or projection).
    """
    if not text.strip():
        return {}
    entries = parse_cameras(text)
    out: dict[str, Intrinsics] = {}
    for meta in images:
        if meta.camera_key in out:
            continue
        for projection in ("brown", "perspective"):
            camera_id = odm_camera_id(meta, projection)
            if camera_id in entries:
                out[meta.camera_key] = _intrinsics(
                    camera_id, entries[camera_id], meta.width, meta.height
                )
                break
    return out
