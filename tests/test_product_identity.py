"""The one check of a node's products against the images it was sent
(:mod:`prefect_odm.product_identity`), on NodeODM 2.2.4's canned files as shipped: brighton's
18 cameras, and brighton's camera at 4000 x 2250."""

from __future__ import annotations

import json
from pathlib import Path

import peers
import pytest

from prefect_odm.models import ImageRecord
from prefect_odm.plan.planning import plan_split
from prefect_odm.product_identity import (
    camera_id_prefix,
    foreign_cameras,
    foreign_images,
    foreign_products_message,
    shot_names,
    survey_camera_ids,
)
from prefect_odm.survey.scan import scan_images

CANNED = peers.NODEODM_SRC / "tests" / "processing_results"


@pytest.fixture(scope="module")
def brighton(brighton_images: Path) -> list[ImageRecord]:
    return scan_images(str(brighton_images)).images


def test_the_canned_cameras_of_18_images_are_foreign_to_a_submodel_of_12(
    brighton: list[ImageRecord], brighton_images: Path
) -> None:
    returned = shot_names((CANNED / "odm_report" / "shots.geojson").read_bytes())
    assert len(returned) == 18
    plan = plan_split(scan_images(str(brighton_images)), split=9, split_overlap_m=20)
    for submodel in plan.submodels:
        foreign = foreign_images(returned, submodel.image_names)
        assert foreign == sorted(returned - set(submodel.image_names)) and len(foreign) == 6
        message = foreign_products_message(submodel.id, "http://n:1", "u-1", foreign)
        assert message.startswith(f"{submodel.id} on http://n:1 (task u-1) returned cameras of 6 ")
        assert f"({', '.join(foreign[:3])}, ...)" in message and "\n" not in message
    assert foreign_images(returned, [f"sub/{name}" for name in returned]) == []  # file names


def test_shots_that_are_not_geojson_raise() -> None:
    with pytest.raises(ValueError):
        shot_names(b"[1, 2]")
    with pytest.raises(ValueError):
        shot_names(b"not json")


def test_the_canned_calibration_describes_no_camera_of_brighton(
    brighton: list[ImageRecord],
) -> None:
    canned = json.loads((CANNED / "cameras.json").read_text())
    assert survey_camera_ids(brighton) == {"dji fc300s 1600 900"}
    assert foreign_cameras(canned, brighton) == [peers.CANNED_CAMERA]
    for ok in (
        "dji fc300s 1600 900 perspective 0.5555",
        "v2 dji fc300s 1600 900 brown 0.5612",  # OpenSfM's own id, another projection and focal
        "dji fc300s 900 1600 perspective 0.5555",  # read after the EXIF orientation
    ):
        assert foreign_cameras({ok: {}, peers.CANNED_CAMERA: {}}, brighton) == [], ok


def test_the_engine_keys_its_cameras_json_by_an_id_the_check_accepts(
    brighton: list[ImageRecord], brighton_images: Path
) -> None:
    """The built-in engine's ``cameras.json`` key (ODM's id) passes: one id format for both."""
    from prefect_odm.engine.camera import read_image_meta
    from prefect_odm.engine.camera_calibration import odm_camera_id

    camera_id = odm_camera_id(read_image_meta(brighton_images / brighton[0].name))
    assert camera_id.startswith("dji fc300s 1600 900 brown 0.")
    assert camera_id_prefix(camera_id) in survey_camera_ids(brighton)


def test_the_make_is_taken_out_of_the_model_as_opensfm_does(brighton: list[ImageRecord]) -> None:
    """OpenSfM's id takes the make out of the model; the built-in engine's keeps it (seneca's
    ``Canon`` / ``Canon PowerShot ELPH 300 HS``): both name the survey's camera."""
    image = brighton[0].model_copy(update={"make": "DJI", "model": "DJI FC300S"})
    assert survey_camera_ids([image]) == {"dji fc300s 1600 900", "dji dji fc300s 1600 900"}
    for key in ("dji fc300s 1600 900 brown 0.5555", "dji dji fc300s 1600 900 brown 0.5555"):
        assert foreign_cameras({key: {}}, [image]) == []
    assert foreign_cameras({"dji fc300s 4000 2250 brown 0.5555": {}}, [image]) != []
