"""Gates on one reconstructed block, before dense matching: levelness and the camera-vs-GPS fit.

A block oriented by bad GPS altitudes (a drift along the capture sequence) comes out of
structure from motion with a good relative geometry but tilted: brighton with its GPS altitude
drifting +1.7 m per image gave a DSM tilted 19 degrees, and the run exited 0 (issue 31). The
images themselves say which way is down: a mapping flight looks straight down, and DJI records
the gimbal's pitch. Two figures are measured on every block, whatever the split:

* **level_deg**: the angle between the mean optical axis of the reconstructed cameras and the
  mean axis the images record (DJI ``GimbalPitchDegree`` and ``GimbalYawDegree`` in XMP; nadir,
  pitch -90 degrees, when absent: a mapping flight). A block tilted as a whole turns every
  camera's axis the same way, so the mean shows the block's tilt while per-image attitude noise
  averages out. This is the constraint OpenSfM uses to orient a block whose GPS cannot
  (``align.py``, ``align_orientation_prior`` "vertical": the cameras' mean axis is the down
  direction).
* **gps_rms_m**: the root mean square of the distances between the camera centres and their GPS
  positions after the final similarity fit, metres.

Each has a gate (:data:`MAX_LEVEL_DEG`, :data:`MAX_GPS_RMS_M`); a failed gate stops the task
with one line naming the figure, before the expensive dense stage.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from prefect_odm.engine.camera import CameraPose, ImageMeta
from prefect_odm.errors import ProcessingFailedError

MAX_LEVEL_DEG = 2.0
"""Largest angle between the block's mean camera axis and the one its gimbal records, degrees."""

MAX_ASSUMED_NADIR_LEVEL_DEG = 5.0
"""The same gate where no image records its attitude and nadir is assumed, degrees: a camera
without a gimbal hangs with the airframe's pitch and roll. seneca (a Canon PowerShot, no
attitude in its images) gives blocks of 1.4-2.3 deg against nadir when each calibrates itself
and up to 3.3 deg on the survey's shared calibration, all true geometry; brighton with its GPS
altitude drifting +1.7 m per image comes out 21.6 deg off."""

MAX_GPS_RMS_M = 15.0
"""Largest rms distance of the camera centres from their GPS positions, metres (five times
ODM's default ``gps-accuracy`` of 3 m)."""

NADIR_PITCH_DEG = -90.0
"""Gimbal pitch of a camera looking straight down (DJI's convention)."""


@dataclass(frozen=True)
class BlockFigures:
    """What the gates judge, for one reconstructed block.

    Attributes:
        level_deg: angle between the mean reconstructed optical axis and the mean recorded one.
        gps_rms_m: rms camera-centre-to-GPS distance, metres (None when no GPS is compared).
        attitude_source: ``"gimbal pitch"`` when every image records one, else ``"nadir"``
            (the images without a pitch are taken as looking straight down).
    """

    level_deg: float
    gps_rms_m: float | None
    attitude_source: str

    def as_stats(self) -> dict[str, float]:
        """The figures as ``Scene.stats`` entries (engine report)."""
        out = {"block_level_deg": round(self.level_deg, 3)}
        if self.gps_rms_m is not None:
            out["gps_rms_m"] = round(self.gps_rms_m, 3)
        return out


def optical_axis(camera: CameraPose) -> NDArray[np.float64]:
    """The camera's optical axis in the world frame (x east, y north, z up), unit, shape (3,)."""
    axis = camera.rotation_matrix.T @ np.array([0.0, 0.0, 1.0])
    return np.asarray(axis / np.linalg.norm(axis), dtype=np.float64)


def recorded_axis(meta: ImageMeta) -> NDArray[np.float64]:
    """The optical axis the image's attitude records (nadir without a gimbal pitch), shape (3,).

    Yaw (DJI ``GimbalYawDegree``, else ``FlightYawDegree``, as the direct pipeline takes it) is
    clockwise from north; grid convergence of the UTM zone (under 3 degrees) only
    turns the horizontal part, which is zero at nadir.
    """
    pitch = math.radians(
        meta.gimbal_pitch_deg if meta.gimbal_pitch_deg is not None else NADIR_PITCH_DEG
    )
    yaw_deg = meta.gimbal_yaw_deg if meta.gimbal_yaw_deg is not None else meta.flight_yaw_deg
    yaw = math.radians(yaw_deg or 0.0)
    return np.array(
        [math.cos(pitch) * math.sin(yaw), math.cos(pitch) * math.cos(yaw), math.sin(pitch)]
    )


def _angle_deg(a: NDArray[np.float64], b: NDArray[np.float64]) -> float:
    cos = float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))
    return math.degrees(math.acos(max(-1.0, min(1.0, cos))))


def block_figures(
    cameras: Sequence[CameraPose],
    images: Sequence[ImageMeta],
    gps_residuals_m: Sequence[float] | None = None,
) -> BlockFigures:
    """Measure a block's levelness and camera-vs-GPS fit.

    Args:
        cameras: the reconstructed cameras (UTM poses).
        images: the metadata of the images, any order; matched to ``cameras`` by name.
        gps_residuals_m: camera-centre-to-GPS distances, metres, one per camera (None: no fit).

    Returns:
        The figures.

    Raises:
        ProcessingFailedError: no camera, or a camera with no image metadata.
    """
    if not cameras:
        raise ProcessingFailedError("no reconstructed camera to check the block on")
    by_name = {m.name: m for m in images}
    missing = [c.name for c in cameras if c.name not in by_name]
    if missing:
        raise ProcessingFailedError(f"{missing[0]}: a reconstructed camera with no image metadata")
    axes = np.array([optical_axis(c) for c in cameras])
    wanted = np.array([recorded_axis(by_name[c.name]) for c in cameras])
    every_pitch = all(by_name[c.name].gimbal_pitch_deg is not None for c in cameras)
    rms = None
    if gps_residuals_m is not None and len(gps_residuals_m):
        rms = float(np.sqrt(np.mean(np.square(np.asarray(gps_residuals_m, dtype=np.float64)))))
    return BlockFigures(
        level_deg=_angle_deg(axes.mean(axis=0), wanted.mean(axis=0)),
        gps_rms_m=rms,
        attitude_source="gimbal pitch" if every_pitch else "nadir",
    )


def check_block(
    figures: BlockFigures,
    *,
    max_level_deg: float | None = None,
    max_gps_rms_m: float = MAX_GPS_RMS_M,
) -> None:
    """Stop a block that fails a gate, with one line naming the figure.

    Args:
        figures: the block's figures (:func:`block_figures`).
        max_level_deg: the levelness gate; None: :data:`MAX_LEVEL_DEG` against a recorded
            gimbal pitch, :data:`MAX_ASSUMED_NADIR_LEVEL_DEG` against an assumed nadir.
        max_gps_rms_m: the camera-vs-GPS gate, metres.

    Raises:
        ProcessingFailedError: the block is tilted beyond ``max_level_deg`` or its cameras lie
            farther than ``max_gps_rms_m`` (rms) from their GPS.
    """
    if max_level_deg is None:
        recorded = figures.attitude_source == "gimbal pitch"
        max_level_deg = MAX_LEVEL_DEG if recorded else MAX_ASSUMED_NADIR_LEVEL_DEG
    if figures.level_deg > max_level_deg:
        raise ProcessingFailedError(
            f"block not level: the cameras' mean axis is {figures.level_deg:.1f} deg off the "
            f"attitude the images record ({figures.attitude_source}; gate {max_level_deg:g} deg); "
            "the GPS altitudes probably drift: check the plan's GPS warnings"
        )
    if figures.gps_rms_m is not None and figures.gps_rms_m > max_gps_rms_m:
        raise ProcessingFailedError(
            f"cameras do not fit their GPS: {figures.gps_rms_m:.1f} m rms after alignment "
            f"(gate {max_gps_rms_m:g} m)"
        )
