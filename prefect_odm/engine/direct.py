"""Direct georeferencing: camera poses from GPS and attitude, no structure from motion.

Every image is treated as a pinhole camera (focal length from EXIF, no distortion) at its GPS
position, looking at a horizontal ground plane:

* **ground**: each image that carries its height above the ground below (XMP
  ``Camera:AboveGroundAltitude``) gives a ground height, ``altitude - AboveGroundAltitude``; the
  surface through them (:mod:`prefect_odm.engine.terrain`) is the DSM, the DTM and the surface
  the orthophoto is projected on, so the products follow a slope. The **ground plane**, used
  where nothing better is known (and by the heading check), is the median of those heights; else
  the median of ``altitude - RelativeAltitude`` over the images that carry DJI's
  ``RelativeAltitude`` (metres above the take-off point, so this is the take-off elevation, not
  the ground under each camera); else ``min(altitude) - DEFAULT_FLIGHT_HEIGHT_M``.
* **heading check** (when the image files are given): attitude tags can be wrong by a half or
  quarter turn (brighton_beach_1600's return line reports a gimbal yaw of -132 degrees while its
  images point at +45 degrees, like the other lines; a camera on a fixed-wing may be mounted
  sideways to the track). For each flight line (consecutive nadir images of similar heading) the
  rotations of the images about their optical axis by 0, 180 (and 90, 270 when the yaw came from the
  track) degrees are scored by how well consecutive images agree on the ground plane (normalised
  cross-correlation of 1/32-scale grey images warped through the plane); a turn replaces the
  metadata heading only when it beats it by ``HEADING_MIN_NCC_GAIN``. This works on a single line:
  two images each turned by 180 degrees about their own centres disagree by twice their baseline.
* **attitude**: yaw from DJI ``GimbalYawDegree`` (else ``FlightYawDegree``), pitch from
  ``GimbalPitchDegree`` (nadir, -90 degrees, when absent), no roll. Without any yaw tag the yaw is
  the flight direction, from the positions of the previous and next image in capture-time order,
  with the top of the image assumed to point forwards.

Fast (only 1/32-scale previews are read, for the heading check) and as accurate as the GPS and
attitude sensors: a few metres with a gimbal (brighton), much worse on a fixed-wing without one
(seneca: the airframe's bank and crab are not in the metadata). The DSM is the terrain through
the cameras' ground heights, as accurate as those (see :mod:`prefect_odm.engine.terrain`: GPS
altitude error plus that of the height above ground), or a plane without them (brighton and
seneca carry no height above ground); trees and buildings are missing either way (brighton:
median 3.6 m below ODM's surface, whose trees reach 11 m).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
from numpy.typing import NDArray
from PIL import Image

from prefect_odm.engine.camera import (
    CameraPose,
    ImageMeta,
    Scene,
    rotation_tuple,
    utm_positions,
)
from prefect_odm.engine.terrain import camera_ground_points
from prefect_odm.errors import InputError

logger = logging.getLogger(__name__)

DEFAULT_FLIGHT_HEIGHT_M = 60.0
"""Assumed height of the lowest image above ground when no image carries a relative altitude.
(A typical mapping flight height; seneca_1200 flew ~63 m above ground.)"""

NADIR_PITCH_DEG = -90.0

GROUND_PLANE_SOURCES = ("above-ground-heights", "take-off-plane", "assumed-plane")
"""Where the ground plane came from (:func:`estimate_ground_z_m`'s order), as the values of
:data:`prefect_odm.registry.DSM_SURFACE_TAG`; the scene's ``stats["ground_plane_source"]`` is
the index in this tuple."""

HEADING_SCALE = 32
"""Reduction of the images compared by the heading check (pixels of ~1-2 m: insensitive to the
few metres that attitude and GPS errors misplace images by, sensitive to a half turn)."""

HEADING_MIN_NCC_GAIN = 0.1
"""A turned heading must beat the metadata one by this mean correlation to replace it."""

LINE_MAX_HEADING_CHANGE_DEG = 30.0
"""Consecutive images whose headings differ more than this start a new flight line."""

NADIR_MAX_TILT_DEG = 15.0
"""Only images looking within this angle of straight down are checked."""


def nadir_rotation(yaw_deg: float, pitch_deg: float = NADIR_PITCH_DEG) -> NDArray[np.float64]:
    """World-to-camera rotation of a camera with heading ``yaw_deg`` and gimbal ``pitch_deg``.

    World axes: east, north, up. Yaw is clockwise from north and is the direction the top of
    the image points to; pitch -90 looks straight down, 0 looks at the horizon.

    Returns:
        ``R`` with rows = camera x (image right), y (image down), z (optical axis) in world axes.
    """
    yaw, pitch = math.radians(yaw_deg), math.radians(pitch_deg)
    forward = np.array([math.sin(yaw), math.cos(yaw), 0.0])
    right = np.array([math.cos(yaw), -math.sin(yaw), 0.0])
    up = np.array([0.0, 0.0, 1.0])
    axis = math.cos(pitch) * forward + math.sin(pitch) * up
    down = np.cross(axis, right)
    return np.vstack([right, down, axis])


def track_yaw_deg(xy_m: NDArray[np.float64], order: Sequence[int]) -> NDArray[np.float64]:
    """Heading of the flight track at each image, degrees clockwise from north.

    Args:
        xy_m: positions in metres, shape ``(n, 2)``.
        order: image indices in capture order.

    Returns:
        Shape ``(n,)``: the direction from the previous to the next image in ``order`` (one-sided
        at the ends); 0 when there is only one image.
    """
    n = len(order)
    yaw = np.zeros(len(xy_m))
    for rank, index in enumerate(order):
        before = order[max(rank - 1, 0)]
        after = order[min(rank + 1, n - 1)]
        dx, dy = xy_m[after] - xy_m[before]
        if math.hypot(dx, dy) > 1e-6:
            yaw[index] = math.degrees(math.atan2(dx, dy)) % 360.0
    return yaw


def estimate_ground_z_m(images: Sequence[ImageMeta]) -> tuple[float, str]:
    """Ground elevation for the plane (metres, EXIF altitude datum) and how it was found.

    Raises:
        InputError: no image carries an altitude.
    """
    heights_above: tuple[tuple[Callable[[ImageMeta], float | None], str], ...] = (
        (lambda m: m.above_ground_altitude_m, "median of altitude - AboveGroundAltitude"),
        (lambda m: m.relative_altitude_m, "altitude - RelativeAltitude"),
    )
    for height_above, how in heights_above:  # the height above the ground, else the take-off
        ground = [
            m.altitude_m - above
            for m in images
            if m.altitude_m is not None and (above := height_above(m)) is not None
        ]
        if ground:
            return float(np.median(ground)), how
    altitudes = [m.altitude_m for m in images if m.altitude_m is not None]
    if not altitudes:
        raise InputError("direct georeferencing needs GPS altitudes; no image has one")
    return (
        float(min(altitudes)) - DEFAULT_FLIGHT_HEIGHT_M,
        f"lowest altitude - {DEFAULT_FLIGHT_HEIGHT_M:g} m default flight height",
    )


def _heading_deg(camera: CameraPose) -> float:
    """Direction (clockwise from north) the top of the image points to."""
    return math.degrees(math.atan2(-camera.rotation[1][0], -camera.rotation[1][1])) % 360.0


def _turned(camera: CameraPose, turn_deg: int) -> CameraPose:
    """The camera rotated by ``turn_deg`` (a multiple of 90) about its optical axis."""
    if turn_deg % 360 == 0:
        return camera
    c, s = {90: (0, 1), 180: (-1, 0), 270: (0, -1)}[turn_deg % 360]
    about_axis = np.array([[c, -s, 0], [s, c, 0], [0, 0, 1]], dtype=np.float64)
    return replace(camera, rotation=rotation_tuple(about_axis @ camera.rotation_matrix))


def _grey_small(path: Path, scale: int) -> NDArray[np.float32]:
    """The image in grey at 1/``scale`` size (JPEG DCT scaling, then a box filter)."""
    try:
        with Image.open(path) as image:
            size = (max(2, image.width // scale), max(2, image.height // scale))
            image.draft("L", (size[0] * 4, size[1] * 4))
            small = image.convert("L").resize(size, Image.Resampling.BOX)
            return np.asarray(small, dtype=np.float32)
    except (OSError, SyntaxError, ValueError) as exc:  # Pillow's errors never name the file
        raise OSError(f"{path.name}: cannot decode the image ({exc})") from exc


def _pair_ncc(
    ca: CameraPose,
    cb: CameraPose,
    img_a: NDArray[np.float32],
    img_b: NDArray[np.float32],
    ground_z_m: float,
) -> float | None:
    """Correlation of image A with image B warped through the plane ``z = ground_z_m``.

    Returns None when fewer than 30 pixels of A land inside B.
    """
    rows, cols = np.mgrid[0 : img_a.shape[0], 0 : img_a.shape[1]]
    ua = (cols.ravel() + 0.5) * ca.width / img_a.shape[1]
    va = (rows.ravel() + 0.5) * ca.height / img_a.shape[0]
    rays = ca.rotation_matrix.T @ np.vstack(
        [(ua - ca.cx) / ca.focal_px, (va - ca.cy) / ca.focal_px, np.ones_like(ua)]
    )
    down = rays[2] < -1e-6
    t = (ground_z_m - ca.center[2]) / np.where(down, rays[2], -1.0)
    x = ca.center[0] + t * rays[0]
    y = ca.center[1] + t * rays[1]
    ub, vb, depth = cb.project(x, y, np.full_like(x, ground_z_m))
    col_b = ub * img_b.shape[1] / cb.width - 0.5
    row_b = vb * img_b.shape[0] / cb.height - 0.5
    inside = (
        down
        & (depth > 0)
        & (col_b >= 0)
        & (col_b <= img_b.shape[1] - 1)
        & (row_b >= 0)
        & (row_b <= img_b.shape[0] - 1)
    )
    if inside.sum() < 30:
        return None
    a = img_a.ravel()[inside]
    b = img_b[np.rint(row_b[inside]).astype(np.intp), np.rint(col_b[inside]).astype(np.intp)]
    a = a - a.mean()
    b = b - b.mean()
    denom = math.sqrt(float(a @ a) * float(b @ b))
    return float(a @ b) / denom if denom > 0 else None


def check_headings(
    cameras: Sequence[CameraPose],
    order: Sequence[int],
    image_dir: Path,
    ground_z_m: float | Sequence[float],
    turns_deg: Sequence[int],
    *,
    log: Callable[[str], None] = logger.info,
) -> list[CameraPose]:
    """Correct half (or quarter) turns of whole flight lines (see the module docstring).

    Args:
        cameras: posed cameras.
        order: camera indices in capture order.
        image_dir: folder of the image files.
        ground_z_m: the ground plane, or the ground height under each camera (metres, one per
            camera): a pair is compared on the plane at the mean of its two heights.
        turns_deg: the rotations about the optical axis to try besides 0 (e.g. ``(180,)``).
        log: progress line sink.

    Returns:
        The cameras, with the lines whose turned heading agrees clearly better turned.
    """
    result = list(cameras)
    heights = np.broadcast_to(np.asarray(ground_z_m, dtype=np.float64), (len(cameras),))
    lines: list[list[int]] = []
    for index in order:
        camera = cameras[index]
        if math.degrees(math.acos(min(1.0, -camera.rotation[2][2]))) > NADIR_MAX_TILT_DEG:
            lines.append([])
            continue
        if lines and lines[-1]:
            previous = cameras[lines[-1][-1]]
            change = abs((_heading_deg(camera) - _heading_deg(previous) + 180.0) % 360.0 - 180.0)
            if change <= LINE_MAX_HEADING_CHANGE_DEG:
                lines[-1].append(index)
                continue
        lines.append([index])
    small: dict[int, NDArray[np.float32]] = {}
    for line in lines:
        if len(line) < 2:
            continue
        for index in line:
            if index not in small:
                small[index] = _grey_small(image_dir / cameras[index].name, HEADING_SCALE)
        scores: dict[int, float] = {}
        for turn in (0, *turns_deg):
            values = [
                _pair_ncc(
                    _turned(cameras[a], turn),
                    _turned(cameras[b], turn),
                    small[a],
                    small[b],
                    float(heights[a] + heights[b]) / 2.0,
                )
                for a, b in zip(line[:-1], line[1:], strict=True)
            ]
            found = [v for v in values if v is not None]
            scores[turn] = float(np.mean(found)) if found else -1.0
        best = max(scores, key=lambda turn: scores[turn])
        names = f"{cameras[line[0]].name}..{cameras[line[-1]].name}"
        if best != 0 and scores[best] - scores[0] >= HEADING_MIN_NCC_GAIN:
            log(
                f"Heading of line {names} turned by {best} degrees "
                f"(image agreement {scores[0]:.2f} -> {scores[best]:.2f})"
            )
            for index in line:
                result[index] = _turned(cameras[index], best)
    return result


def _ground_heights(
    images: Sequence[ImageMeta],
    positions: NDArray[np.float64],
    plane: tuple[float, str],
    log: Callable[[str], None],
) -> tuple[NDArray[np.float64], list[float], dict[str, float]]:
    """The ground points of the cameras that know their height above ground (``(m, 3)``, see
    :func:`~prefect_odm.engine.terrain.camera_ground_points`), the ground height under every
    camera (the ground plane ``plane = (z, how it was found)`` where unknown) and the scene's
    stats on them (``ground_z_m``, ``ground_points``, ``ground_plane_source``: the index in
    :data:`GROUND_PLANE_SOURCES`)."""
    ground_z_m, how = plane
    log(f"Ground plane at {ground_z_m:.2f} m ({how})")
    ground_xyz = camera_ground_points(images, positions)
    under = [
        m.altitude_m - m.above_ground_altitude_m
        if m.altitude_m is not None and m.above_ground_altitude_m is not None
        else ground_z_m
        for m in images
    ]
    if len(ground_xyz):
        low, high = float(ground_xyz[:, 2].min()), float(ground_xyz[:, 2].max())
        log(
            f"Ground heights under {len(ground_xyz)}/{len(images)} cameras "
            f"(altitude - AboveGroundAltitude): {low:.2f} to {high:.2f} m"
        )
    stats = {
        "ground_z_m": ground_z_m,
        "ground_points": float(len(ground_xyz)),
        "ground_plane_source": float(_plane_source(how)),
    }
    return ground_xyz, under, stats


def _plane_source(how: str) -> int:
    """The index in :data:`GROUND_PLANE_SOURCES` of the ground plane found ``how``."""
    if "AboveGroundAltitude" in how:
        return 0
    return 1 if "RelativeAltitude" in how else 2


def dsm_surface_of(scene: Scene) -> str:
    """What the direct scene's DSM is (a :data:`GROUND_PLANE_SOURCES` value): the terrain
    through the cameras' ground heights when there are enough of them, else the plane found as
    ``stats["ground_plane_source"]`` says (an older scene without it: the take-off plane)."""
    from prefect_odm.engine.terrain import MIN_GROUND_POINTS

    if len(scene.ground_xyz) >= MIN_GROUND_POINTS:
        return GROUND_PLANE_SOURCES[0]
    source = int(scene.stats.get("ground_plane_source", 1))
    return GROUND_PLANE_SOURCES[max(1, min(source, 2))]


def reconstruct_direct(
    images: Sequence[ImageMeta],
    epsg: int,
    *,
    image_dir: Path | None = None,
    log: Callable[[str], None] = logger.info,
) -> Scene:
    """Pose every image from its metadata (see the module docstring).

    Args:
        images: all images of the task.
        epsg: the survey's UTM EPSG code.
        image_dir: folder of the image files; when given, the headings of flight lines are
            checked against the images (:func:`check_headings`).
        log: progress line sink.

    Returns:
        A :class:`Scene` with method ``"direct"``, every image posed, no points,
        ``ground_z_m`` and ``ground_xyz`` (the cameras' ground heights) set.

    Raises:
        InputError: no image has an altitude.
    """
    ground_z, how = estimate_ground_z_m(images)
    positions = utm_positions(images, epsg)
    has_yaw = [m.gimbal_yaw_deg is not None or m.flight_yaw_deg is not None for m in images]
    track = None
    order = sorted(
        range(len(images)),
        key=lambda i: (images[i].capture_time is None, images[i].capture_time or 0, images[i].name),
    )
    if not all(has_yaw):
        track = track_yaw_deg(positions[:, :2], order)
        log("No yaw in the metadata of some images: using the flight track direction")
    cameras = []
    for index, meta in enumerate(images):
        if meta.gimbal_yaw_deg is not None:
            yaw = meta.gimbal_yaw_deg
        elif meta.flight_yaw_deg is not None:
            yaw = meta.flight_yaw_deg
        else:
            assert track is not None
            yaw = float(track[index])
        pitch = meta.gimbal_pitch_deg if meta.gimbal_pitch_deg is not None else NADIR_PITCH_DEG
        z = meta.altitude_m if meta.altitude_m is not None else ground_z + DEFAULT_FLIGHT_HEIGHT_M
        rotation = nadir_rotation(yaw, pitch)
        cameras.append(
            CameraPose(
                name=meta.name,
                width=meta.width,
                height=meta.height,
                focal_px=meta.focal_length_px,
                cx=meta.width / 2.0,
                cy=meta.height / 2.0,
                k1=0.0,
                k2=0.0,
                rotation=rotation_tuple(rotation),
                center=(float(positions[index, 0]), float(positions[index, 1]), float(z)),
            )
        )
    ground_xyz, under, stats = _ground_heights(images, positions, (ground_z, how), log)
    if image_dir is not None:
        turns = (90, 180, 270) if track is not None else (180,)
        checked = check_headings(cameras, order, image_dir, under, turns, log=log)
        stats["turned_images"] = float(
            sum(a is not b for a, b in zip(cameras, checked, strict=True))
        )
        cameras = checked
    return Scene(
        method="direct",
        epsg=epsg,
        cameras=tuple(cameras),
        points_xyz=np.zeros((0, 3)),
        points_rgb=np.zeros((0, 3), dtype=np.uint8),
        images=len(images),
        ground_z_m=ground_z,
        stats=stats,
        ground_xyz=ground_xyz,
    )
