"""The block gates (levelness, camera-vs-GPS fit) on brighton's own image metadata."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from prefect_odm.engine.block_checks import block_figures, check_block
from prefect_odm.engine.camera import CameraPose, ImageMeta, read_images, rotation_tuple
from prefect_odm.errors import ProcessingFailedError

BRIGHTON = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "brighton_beach_1600"

NADIR = np.diag([1.0, -1.0, -1.0])  # world-to-camera: image x east, image y south, axis down


def _about_x(deg: float) -> np.ndarray:
    c, s = math.cos(math.radians(deg)), math.sin(math.radians(deg))
    return np.array([[1.0, 0.0, 0.0], [0.0, c, -s], [0.0, s, c]])


def _cameras(images: list[ImageMeta], tilt_deg: float, noise_deg: float) -> list[CameraPose]:
    rng = np.random.default_rng(0)
    out = []
    for meta in images:
        world_tilt = _about_x(tilt_deg) @ _about_x(float(rng.normal(0.0, noise_deg)))
        out.append(
            CameraPose(
                name=meta.name,
                width=meta.width,
                height=meta.height,
                focal_px=meta.focal_length_px,
                cx=meta.width / 2.0,
                cy=meta.height / 2.0,
                k1=0.0,
                k2=0.0,
                rotation=rotation_tuple(NADIR @ world_tilt.T),
                center=(0.0, 0.0, 100.0),
            )
        )
    return out


@pytest.fixture(scope="module")
def images() -> list[ImageMeta]:
    return read_images(BRIGHTON / "images")


def test_level_block_passes_with_attitude_noise(images: list[ImageMeta]) -> None:
    figures = block_figures(_cameras(images, 0.0, 1.0), images, [2.0, 3.0])
    print(f"level {figures.level_deg:.3f} deg ({figures.attitude_source}), rms {figures.gps_rms_m}")
    assert figures.attitude_source == "gimbal pitch"
    assert figures.level_deg < 0.6
    assert figures.gps_rms_m == pytest.approx(math.sqrt(6.5))
    check_block(figures)


@pytest.mark.parametrize("tilt_deg", [5.0, -19.0])
def test_tilted_block_stops_naming_the_figure(images: list[ImageMeta], tilt_deg: float) -> None:
    figures = block_figures(_cameras(images, tilt_deg, 0.5), images)
    assert figures.level_deg == pytest.approx(abs(tilt_deg), abs=0.5)
    with pytest.raises(ProcessingFailedError, match=r"block not level: .* deg off"):
        check_block(figures)


def test_cameras_far_from_gps_stop(images: list[ImageMeta]) -> None:
    figures = block_figures(_cameras(images, 0.0, 0.0), images, [40.0] * len(images))
    with pytest.raises(ProcessingFailedError, match=r"40\.0 m rms"):
        check_block(figures)


def test_camera_without_metadata_is_named(images: list[ImageMeta]) -> None:
    cameras = _cameras(images, 0.0, 0.0)
    with pytest.raises(ProcessingFailedError, match=cameras[0].name):
        block_figures(cameras, images[1:])


def test_an_assumed_nadir_gets_the_wider_gate(images: list[ImageMeta]) -> None:
    """Without a recorded gimbal pitch nadir is only assumed: seneca's real blocks lie 1.4-3.3 deg
    off it (a camera hanging with the airframe), so the gate is 5 deg there and 2 deg where the
    gimbal records the attitude; a drifting-altitude block (21.6 deg) fails either."""
    unrecorded = [m.model_copy(update={"gimbal_pitch_deg": None}) for m in images]
    tilted = block_figures(_cameras(unrecorded, 3.3, 0.5), unrecorded)
    assert tilted.attitude_source == "nadir"
    assert tilted.level_deg == pytest.approx(3.3, abs=0.5)
    check_block(tilted)  # within MAX_ASSUMED_NADIR_LEVEL_DEG
    with pytest.raises(ProcessingFailedError, match=r"\(gimbal pitch; gate 2 deg\)"):
        check_block(block_figures(_cameras(images, 3.3, 0.5), images))
    with pytest.raises(ProcessingFailedError, match=r"\(nadir; gate 5 deg\)"):
        check_block(block_figures(_cameras(unrecorded, 21.6, 0.5), unrecorded))
