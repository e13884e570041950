"""Issue 31: what the engine takes besides the images: ODM's ``cameras`` option (a calibration
held fixed) and ``geo.txt`` (camera positions replacing the EXIF GPS)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from prefect_odm.engine import pipeline
from prefect_odm.engine.camera import read_images
from prefect_odm.engine.camera_calibration import calibrated_cameras, odm_camera_id
from prefect_odm.engine.geo_file import apply_geo_file, read_geo_file
from prefect_odm.errors import InputError

from .test_pipeline import BRIGHTON, make_task

BRIGHTON_CAMERA = "dji fc300s 1600 900 brown 0.5555"
CALIBRATION = {
    BRIGHTON_CAMERA: {
        "projection_type": "brown",
        "width": 1600,
        "height": 900,
        "focal_x": 0.56,
        "focal_y": 0.56,
        "c_x": -0.0048,
        "c_y": 0.0032,
        "k1": 0.0006,
        "k2": 0.0114,
        "p1": 0.0,
        "p2": 0.0,
        "k3": 0.0,
    }
}
"""A calibration of brighton's camera, its values off the engine's own starting values (focal
ratio 20/36 = 0.5556, principal point at the centre, no distortion), so a held value shows."""


def test_cameras_json_in_pixels_by_odm_camera_id() -> None:
    images = read_images(BRIGHTON / "images")
    assert odm_camera_id(images[0]) == BRIGHTON_CAMERA
    given = calibrated_cameras(images, json.dumps(CALIBRATION))
    assert list(given) == [images[0].camera_key]  # one camera, every image
    camera = given[images[0].camera_key]
    assert camera.focal_px == pytest.approx(0.56 * 1600)
    assert (camera.cx, camera.cy) == pytest.approx((800 - 0.0048 * 1600, 450 + 0.0032 * 1600))
    assert (camera.k1, camera.k2) == (0.0006, 0.0114)
    # OpenSfM's "v2 " prefix is accepted, another camera is left to structure from motion
    assert calibrated_cameras(
        images, json.dumps({f"v2 {BRIGHTON_CAMERA}": CALIBRATION[BRIGHTON_CAMERA]})
    )
    assert calibrated_cameras(images, json.dumps({"other cam 10 10 brown 0.5": {}})) == {}
    assert calibrated_cameras(images, "{}") == calibrated_cameras(images, "") == {}


@pytest.mark.parametrize(
    ("entry", "says"),
    [
        ({"width": 800, "height": 450, "focal_x": 0.5}, "another image size"),
        ({"projection_type": "fisheye", "focal": 0.5}, "fisheye"),
        ({"focal_x": 0.5, "p1": 0.001}, "tangential"),
        ({"c_x": 0.0}, "not a number"),
    ],
)
def test_a_calibration_that_does_not_fit_is_refused(entry: dict[str, object], says: str) -> None:
    images = read_images(BRIGHTON / "images")
    with pytest.raises(InputError, match=says):
        calibrated_cameras(images, json.dumps({BRIGHTON_CAMERA: entry}))
    with pytest.raises(InputError, match="not JSON"):
        calibrated_cameras(images, "{cameras")


def test_geo_txt_replaces_positions_and_names_its_bad_lines(tmp_path: Path) -> None:
    images = read_images(BRIGHTON / "images")
    first = images[0]
    geo = tmp_path / "geo.txt"
    geo.write_text(
        f"EPSG:4326\n# a comment\n\n{first.name} -82.5 27.25 123.456\nnot-an-image 1 2\n"
    )
    placed, count = apply_geo_file(images, geo)
    assert count == 1
    assert (placed[0].longitude, placed[0].latitude, placed[0].altitude_m) == (
        -82.5,
        27.25,
        123.456,
    )
    assert placed[1:] == images[1:]
    # a projected CRS: back to WGS 84 degrees, the altitude kept
    from pyproj import Transformer

    east, north = Transformer.from_crs(4326, 32615, always_xy=True).transform(
        first.longitude, first.latitude
    )
    geo.write_text(f"EPSG:32615\n{first.name} {east:.3f} {north:.3f} 50\n")
    lon, lat, z = read_geo_file(geo)[first.name]
    assert (lon, lat, z) == (
        pytest.approx(first.longitude, abs=1e-7),
        pytest.approx(first.latitude, abs=1e-7),
        50.0,
    )
    geo.write_text("EPSG:4326\nDJI_0018.JPG east north\n")
    with pytest.raises(InputError, match="geo.txt line 2"):
        read_geo_file(geo)
    geo.write_text("not a crs at all\nDJI_0018.JPG 1 2\n")
    with pytest.raises(InputError, match="geo.txt line 1"):
        read_geo_file(geo)


def test_given_calibration_is_held_in_structure_from_motion(tmp_path: Path) -> None:
    """Twelve images (one camera below the full model's 15) with a calibration: the posed
    cameras keep it exactly, the radial camera included, and ``cameras.json`` is written at the
    end of the opensfm stage, as ODM writes it there."""
    names = sorted(p.name for p in (BRIGHTON / "images").iterdir())[:12]
    task = make_task(tmp_path, [BRIGHTON / "images" / n for n in names])
    lines: list[str] = []
    options = {"cameras": json.dumps(CALIBRATION), "end-with": "opensfm", "max-concurrency": 2}
    pipeline.run(task, options, log=lines.append)
    assert any("1 held at a given calibration" in line for line in lines)
    scene = json.loads((task / "opensfm" / "scene.json").read_text())
    assert len(scene["cameras"]) >= 10
    for pose in scene["cameras"]:
        assert pose["focal_px"] == pytest.approx(0.56 * 1600, abs=1e-9)
        assert (pose["cx"], pose["cy"]) == pytest.approx((792.32, 455.12), abs=1e-9)
        assert (pose["k1"], pose["k2"]) == pytest.approx((0.0006, 0.0114), abs=1e-12)
    written = json.loads((task / "cameras.json").read_text())[BRIGHTON_CAMERA]
    assert written["focal_x"] == pytest.approx(0.56) and written["k2"] == pytest.approx(0.0114)
