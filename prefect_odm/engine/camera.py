"""Image metadata, camera intrinsics and camera poses for the built-in engine.

:class:`ImageMeta` is what the engine needs from each image: EXIF GPS position and altitude,
capture time, focal length (mm, 35 mm equivalent, focal-plane resolution), pixel size, and DJI XMP
attitude (``drone-dji:RelativeAltitude``, ``GimbalYawDegree``, ``FlightYawDegree``,
``GimbalPitchDegree``). It is read by the project's EXIF/XMP reader, :mod:`prefect_odm.survey.exif`.

World frame of every pose here: the survey's WGS 84 / UTM zone, x = easting (m), y = northing (m),
z = the EXIF GPS altitude datum (m). Camera frame: COLMAP/OpenCV convention, +x right, +y down
in the image, +z along the optical axis.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from prefect_odm.errors import InputError, NoImagesError
from prefect_odm.models import ImageMetadata
from prefect_odm.survey.exif import read_local_metadata

logger = logging.getLogger(__name__)

IMAGE_SUFFIXES: frozenset[str] = frozenset({".jpg", ".jpeg", ".tif", ".tiff"})
"""File name suffixes (lower case) the engine reads as images."""

DEFAULT_FOCAL_RATIO = 1.2
"""Focal length / long image side used when EXIF gives no focal length (COLMAP's default)."""

FULL_FRAME_WIDTH_MM = 36.0
"""Width of the 36 x 24 mm frame. ODM and OpenSfM turn a 35 mm-equivalent focal length into a
focal ratio on it (``focal_35 / 36``, times the long image side; ODM ``opendm/photo.py``,
OpenSfM ``exif.compute_focal``)."""

DISTORTION_VALID_RADIUS = 1.3
"""Points whose undistorted radius exceeds this many half image diagonals are not projected."""


class ImageMeta(ImageMetadata):
    """What the engine knows about one image before reconstruction.

    The header's :class:`~prefect_odm.models.ImageMetadata` (EXIF GPS, camera, focal lengths,
    DJI XMP attitude; sizes in pixels as stored, EXIF orientation NOT applied: drone images are
    stored upright), for a file that has a GPS position, plus its name.

    Attributes:
        name: file name inside the task's ``images`` folder.
        latitude, longitude: WGS 84 degrees from EXIF GPS (always present).
    """

    name: str
    latitude: float
    longitude: float

    @property
    def latitude_deg(self) -> float:
        """WGS 84 latitude, degrees."""
        return self.latitude

    @property
    def longitude_deg(self) -> float:
        """WGS 84 longitude, degrees."""
        return self.longitude

    @property
    def camera(self) -> str:
        """``"make model"`` (for grouping images that share intrinsics); empty when unknown."""
        return " ".join(part for part in (self.make, self.model) if part)

    @property
    def focal_length_px(self) -> float:
        """Focal length in pixels of the stored image: the prior structure from motion starts
        from and, on a constant-height nadir flight, keeps (see :mod:`.sfm`).

        Order of preference: ``FocalLength`` x ``FocalPlaneXResolution`` (physical pixel pitch;
        ODM's sensor-width route gives the same for landscape images); else the 35 mm equivalent
        focal length over the 36 mm frame width, times the long image side, as ODM and OpenSfM
        take it (:data:`FULL_FRAME_WIDTH_MM`); else 1.2 x the long side (COLMAP's default prior).

        On a constant-height nadir flight this prior sets the ground height (see :mod:`.sfm`
        for what each choice gives on brighton against ODM's cloud).
        """
        if self.focal_length_mm and self.focal_plane_x_resolution_px_per_mm:
            return self.focal_length_mm * self.focal_plane_x_resolution_px_per_mm
        if self.focal_length_35mm:
            return self.focal_length_35mm / FULL_FRAME_WIDTH_MM * max(self.width, self.height)
        return DEFAULT_FOCAL_RATIO * max(self.width, self.height)

    @property
    def camera_key(self) -> str:
        """Images with the same key share one set of intrinsics in structure from motion."""
        return f"{self.camera}|{self.width}x{self.height}|{self.focal_length_px:.1f}"

    def to_json(self) -> dict[str, Any]:
        """JSON-ready dict (datetimes as ISO text)."""
        return self.model_dump(mode="json")

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ImageMeta:
        """Inverse of :meth:`to_json`."""
        return cls.model_validate(data)


def read_image_meta(path: Path) -> ImageMeta:
    """Read one image's EXIF and DJI XMP with :func:`prefect_odm.survey.exif.read_metadata`.

    Only the header is read; whether the pixel data is complete is not checked here (decoding
    the image later fails on a truncated file).

    Args:
        path: a JPEG or TIFF file.

    Raises:
        InputError: the file does not open as an image, or has no EXIF GPS latitude/longitude;
            the message starts with the file name.
    """
    try:
        meta, _ = read_local_metadata(path, check_complete=False)
    except (OSError, InputError) as exc:
        raise InputError(f"{path.name}: cannot read image metadata ({exc})") from exc
    if meta.latitude is None or meta.longitude is None:
        raise InputError(f"{path.name}: no GPS position in EXIF")
    # A zero focal length is no focal length.
    fields = meta.model_dump() | {"focal_length_mm": meta.focal_length_mm or None}
    return ImageMeta(name=path.name, **fields)


def read_images(folder: Path) -> list[ImageMeta]:
    """Read every image of a folder, sorted by file name.

    Raises:
        NoImagesError: the folder holds no JPEG/TIFF file.
        InputError: an image cannot be read or has no GPS (the engine needs a position for
            every image: it georeferences from GPS).
    """
    paths = sorted(
        p for p in Path(folder).iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES
    )
    if not paths:
        raise NoImagesError(f"no JPEG or TIFF image in {folder}")
    return [read_image_meta(p) for p in paths]


# -- poses -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class CameraPose:
    """A calibrated, posed camera in the survey's UTM CRS.

    Projection (COLMAP's RADIAL model, SIMPLE_RADIAL when ``k2 == 0``):
    ``p = R (X - C)``, ``(x, y) = p[:2] / p[2]``, ``d = 1 + k1 r^2 + k2 r^4``,
    ``u = f x d + cx``, ``v = f y d + cy`` (pixel centres at integer + 0.5 as in COLMAP).

    Attributes:
        name: image file name.
        width, height: image size in pixels.
        focal_px, cx, cy, k1, k2: intrinsics.
        rotation: world-to-camera rotation ``R``, shape ``(3, 3)``.
        center: projection centre ``C`` in UTM metres, shape ``(3,)``.
    """

    name: str
    width: int
    height: int
    focal_px: float
    cx: float
    cy: float
    k1: float
    k2: float
    rotation: tuple[tuple[float, float, float], ...]
    center: tuple[float, float, float]

    @property
    def rotation_matrix(self) -> NDArray[np.float64]:
        """The world-to-camera rotation, shape (3, 3)."""
        return np.asarray(self.rotation, dtype=np.float64)

    @property
    def center_array(self) -> NDArray[np.float64]:
        """The camera centre, shape (3,), UTM metres."""
        return np.asarray(self.center, dtype=np.float64)

    def project(
        self, x: NDArray[np.floating], y: NDArray[np.floating], z: NDArray[np.floating]
    ) -> tuple[NDArray[np.floating], NDArray[np.floating], NDArray[np.floating]]:
        """Project world points (UTM metres, any equal shapes) to pixels.

        Returns:
            ``(u, v, depth)``: pixel column, row (continuous, COLMAP convention: the top-left
            pixel covers 0..1) and depth along the optical axis in metres (<= 0 behind, or -1
            far outside the image where the lens distortion model is not valid).
        """
        cx0, cy0, cz0 = self.center
        return self.project_offsets(x - cx0, y - cy0, z - cz0)

    def project_offsets(
        self, dx: NDArray[np.floating], dy: NDArray[np.floating], dz: NDArray[np.floating]
    ) -> tuple[NDArray[np.floating], NDArray[np.floating], NDArray[np.floating]]:
        """Like :meth:`project` for points given relative to the camera centre (metres).

        Offsets may be float32 (millimetre precision within kilometres), which halves the work
        on large grids; the result has the offsets' precision.
        """
        dtype = np.result_type(dx, dy, dz)
        r = self.rotation_matrix.astype(dtype)
        px = r[0, 0] * dx + r[0, 1] * dy + r[0, 2] * dz
        py = r[1, 0] * dx + r[1, 1] * dy + r[1, 2] * dz
        depth = r[2, 0] * dx + r[2, 1] * dy + r[2, 2] * dz
        inv = np.where(depth > 1e-6, 1.0 / np.maximum(depth, 1e-6), 0.0).astype(dtype)
        xn = px * inv
        yn = py * inv
        if self.k1 or self.k2:
            r2 = xn * xn + yn * yn
            scale = (1.0 + self.k1 * r2 + self.k2 * r2 * r2) * dtype.type(self.focal_px)
            # far outside the image the distortion polynomial folds back into it: mark such
            # rays as behind the camera (depth -1) so that no caller samples them
            r2_max = (
                DISTORTION_VALID_RADIUS * math.hypot(self.width, self.height) / 2 / self.focal_px
            ) ** 2
            depth = np.where(r2 <= r2_max, depth, dtype.type(-1.0))
        else:
            scale = dtype.type(self.focal_px)
        return xn * scale + dtype.type(self.cx), yn * scale + dtype.type(self.cy), depth

    def ray_ground_xy(self, u: float, v: float, ground_z_m: float) -> tuple[float, float] | None:
        """Where the (undistorted) ray through pixel ``(u, v)`` meets the plane ``z = ground_z_m``.

        Returns None when the ray does not reach the plane in front of the camera.
        """
        ray_cam = np.array([(u - self.cx) / self.focal_px, (v - self.cy) / self.focal_px, 1.0])
        ray = self.rotation_matrix.T @ ray_cam
        if ray[2] >= -1e-9:
            return None
        t = (ground_z_m - self.center[2]) / ray[2]
        if t <= 0:
            return None
        return self.center[0] + t * ray[0], self.center[1] + t * ray[1]

    def footprint(self, ground_z_m: float) -> NDArray[np.float64] | None:
        """The image outline projected on the plane ``z = ground_z_m``: ``(4, 2)`` UTM metres.

        Returns None when a corner ray misses the plane (camera looking above the horizon).
        """
        corners = [(0, 0), (self.width, 0), (self.width, self.height), (0, self.height)]
        points = [self.ray_ground_xy(u, v, ground_z_m) for u, v in corners]
        if any(p is None for p in points):
            return None
        return np.asarray(points, dtype=np.float64)

    def to_json(self) -> dict[str, Any]:
        """The pose as JSON values (read back by :meth:`from_json`)."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CameraPose:
        """A pose from :meth:`to_json`'s values (tuples made again from JSON lists)."""
        values = dict(data)
        values["rotation"] = tuple(tuple(float(v) for v in row) for row in values["rotation"])
        values["center"] = tuple(float(v) for v in values["center"])
        return cls(**values)


@dataclass(frozen=True)
class Scene:
    """The result of the reconstruction stage: posed cameras and (maybe) 3D points.

    Attributes:
        method: ``"sfm"`` or ``"direct"``.
        epsg: the WGS 84 / UTM EPSG code of every coordinate.
        cameras: the registered (posed) cameras.
        points_xyz: reconstructed points, UTM metres, shape ``(n, 3)`` (``n == 0`` for direct).
        points_rgb: their colours, uint8, shape ``(n, 3)``.
        ground_z_m: the ground plane elevation of the direct method (None for sfm).
        ground_xyz: the direct method's ground heights under the cameras that know theirs
            (x, y of the camera, z = GPS altitude - height above ground), UTM metres, shape
            ``(m, 3)``; ``m == 0`` for sfm and for images without a height above ground.
        images: number of input images.
        stats: free-form numbers for the report (e.g. GPS residual of the alignment).
    """

    method: str
    epsg: int
    cameras: tuple[CameraPose, ...]
    points_xyz: NDArray[np.float64]
    points_rgb: NDArray[np.uint8]
    images: int
    ground_z_m: float | None = None
    stats: dict[str, float] = field(default_factory=dict)
    ground_xyz: NDArray[np.float64] = field(default_factory=lambda: np.zeros((0, 3)))

    def save(self, folder: Path) -> None:
        """Write ``scene.json`` and ``scene_points.npz`` into ``folder``."""
        folder.mkdir(parents=True, exist_ok=True)
        np.savez(
            folder / "scene_points.npz",
            xyz=np.asarray(self.points_xyz, dtype=np.float64).reshape(-1, 3),
            rgb=np.asarray(self.points_rgb, dtype=np.uint8).reshape(-1, 3),
            ground=np.asarray(self.ground_xyz, dtype=np.float64).reshape(-1, 3),
        )
        meta = {
            "method": self.method,
            "epsg": self.epsg,
            "images": self.images,
            "ground_z_m": self.ground_z_m,
            "stats": self.stats,
            "cameras": [c.to_json() for c in self.cameras],
        }
        tmp = folder / "scene.json.tmp"
        tmp.write_text(json.dumps(meta, indent=1))
        tmp.replace(folder / "scene.json")

    @classmethod
    def load(cls, folder: Path) -> Scene:
        """Read what :meth:`save` wrote.

        Raises:
            FileNotFoundError: the scene files are missing.
        """
        meta = json.loads((folder / "scene.json").read_text())
        with np.load(folder / "scene_points.npz") as data:
            xyz, rgb = data["xyz"], data["rgb"]
            ground = data["ground"] if "ground" in data.files else np.zeros((0, 3))
        return cls(
            method=meta["method"],
            epsg=int(meta["epsg"]),
            cameras=tuple(CameraPose.from_json(c) for c in meta["cameras"]),
            points_xyz=xyz,
            points_rgb=rgb,
            images=int(meta["images"]),
            ground_z_m=meta.get("ground_z_m"),
            stats=dict(meta.get("stats") or {}),
            ground_xyz=ground,
        )


def rotation_tuple(matrix: Any) -> tuple[tuple[float, float, float], ...]:
    """A 3x3 rotation matrix (array-like) as the nested float tuple :class:`CameraPose` keeps."""
    return tuple((float(row[0]), float(row[1]), float(row[2])) for row in np.asarray(matrix))


def utm_positions(images: Sequence[ImageMeta], epsg: int) -> NDArray[np.float64]:
    """GPS positions of ``images`` in the UTM CRS ``epsg``: shape ``(n, 3)`` metres.

    A missing altitude becomes 0 (callers that need heights check ``altitude_m`` themselves).
    """
    from pyproj import Transformer

    transformer = Transformer.from_crs(4326, epsg, always_xy=True)
    lon = np.array([m.longitude_deg for m in images], dtype=np.float64)
    lat = np.array([m.latitude_deg for m in images], dtype=np.float64)
    x, y = transformer.transform(lon, lat)
    z = np.array([m.altitude_m if m.altitude_m is not None else 0.0 for m in images])
    return np.column_stack([x, y, z])
