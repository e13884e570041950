"""Issue 31 item 2: where the GPS altitude is unreliable the plan uses take-off height +
relative altitude, sends it as ``geo.txt``, and says so; refused only where no such correction
exists. Real brighton images, copied and edited at test time (nothing reconstructed here)."""

from __future__ import annotations

from pathlib import Path

import pytest
from exif_gps_edit import drifted_copy, in_capture_order, lagged_copy

from prefect_odm.plan.altitudes import geo_txt
from prefect_odm.plan.calibration import CALIBRATION_IMAGES, calibration_images, needs_calibration
from prefect_odm.plan.checks import plan_gps_refusal
from prefect_odm.plan.planning import plan_split
from prefect_odm.survey.scan import scan_images


@pytest.fixture(scope="module")
def brighton(data_dir: Path) -> Path:
    return data_dir / "brighton_beach_1600" / "images"


@pytest.fixture(scope="module")
def copies(brighton: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """brighton drifting +1.7 m per image, the same without its relative altitudes, and
    brighton with +20 m on the images either side of each turn."""
    root = tmp_path_factory.mktemp("altitudes")
    drifted_copy(brighton, root / "drift", 1.7)
    drifted_copy(brighton, root / "drift-no-relative", 1.7, keep_relative=False)
    lagged_copy(brighton, root / "lag", 20.0)
    return {name: root / name for name in ("drift", "drift-no-relative", "lag")}


def test_untouched_survey_keeps_its_gps_altitudes(brighton: Path) -> None:
    survey = scan_images(str(brighton))
    plan = plan_split(survey, split=10, split_overlap_m=20)
    assert plan.altitude_correction is None
    by_name = {im.name: im for im in survey.images}
    assert all(c.z_m == pytest.approx(by_name[c.name].altitude_m) for c in plan.cameras)


def test_drifting_altitude_becomes_take_off_plus_relative(
    brighton: Path, copies: dict[str, Path]
) -> None:
    survey = scan_images(str(copies["drift"]))
    plan = plan_split(survey, split=10, split_overlap_m=20)
    correction = plan.altitude_correction
    assert correction is not None and correction.reasons == ["altitude_trend"]
    # the first shot carries no drift: the take-off height is the untouched survey's there
    first = in_capture_order(brighton)[0]
    assert correction.take_off_m == [pytest.approx(first.altitude_m - first.relative_altitude_m)]
    by_name = {im.name: im for im in survey.images}
    for camera in plan.cameras:
        wanted = correction.take_off_m[0] + by_name[camera.name].relative_altitude_m
        assert camera.z_m == pytest.approx(wanted, abs=1e-3)
    assert any("sent to the nodes as geo.txt" in w for w in plan.warnings)
    assert plan_gps_refusal(plan, survey) is None
    # the altitudes enter the fingerprints: the same images with other altitudes differ
    untouched = plan_split(scan_images(str(brighton)), split=10, split_overlap_m=20)
    assert [s.image_names for s in plan.submodels] == [s.image_names for s in untouched.submodels]
    differ = {s.id: s.fingerprint for s in plan.submodels} != {
        s.id: s.fingerprint for s in untouched.submodels
    }
    assert differ
    text = geo_txt(survey.images, {c.name: c.z_m for c in plan.cameras if c.z_m is not None})
    lines = text.splitlines()
    assert lines[0] == "EPSG:4326" and len(lines) == 19
    name, lon, lat, z = lines[1].split()
    assert (float(lon), float(lat)) == pytest.approx(
        (by_name[name].longitude, by_name[name].latitude), abs=1e-8
    )


def test_altitude_lagging_on_turns_is_corrected(copies: dict[str, Path]) -> None:
    survey = scan_images(str(copies["lag"]))
    plan = plan_split(survey, split=10, split_overlap_m=20)
    jumps = [w for w in plan.gps_warnings if w.kind == "altitude_jump"]
    assert len(jumps) == 1
    assert sorted(jumps[0].images) == [
        "DJI_0023.JPG",
        "DJI_0024.JPG",
        "DJI_0029.JPG",
        "DJI_0030.JPG",
    ]
    assert plan.altitude_correction is not None
    assert plan.altitude_correction.reasons == ["altitude_jump"]
    by_name = {im.name: im for im in survey.images}
    heights = [c.z_m - by_name[c.name].relative_altitude_m for c in plan.cameras]
    assert max(heights) - min(heights) < 1e-6  # one take-off height, no lag left


def test_drift_without_relative_altitude_is_refused(copies: dict[str, Path]) -> None:
    survey = scan_images(str(copies["drift-no-relative"]))
    assert all(im.relative_altitude_m is None for im in survey.images)
    plan = plan_split(survey, split=10, split_overlap_m=20)
    assert plan.altitude_correction is None
    refusal = plan_gps_refusal(plan, survey)
    assert refusal is not None and "GPS altitude unusable" in refusal


def test_calibration_is_shared_between_two_submodels_only(brighton: Path) -> None:
    survey = scan_images(str(brighton))
    split = plan_split(survey, split=10, split_overlap_m=20)
    assert len(split.submodels) == 2 and needs_calibration(split)
    # brighton's 18 images are under the calibration's 30: all of them
    assert calibration_images(split, survey) == sorted(im.name for im in survey.images)
    assert not needs_calibration(plan_split(survey))  # one submodel: nothing to share
    given = split.options.model_copy(update={"extra": {"cameras": "{}"}})
    assert not needs_calibration(plan_split(survey, split=10, split_overlap_m=20, options=given))
    direct = split.options.model_copy(update={"pipeline": "direct"})
    assert not needs_calibration(plan_split(survey, split=10, split_overlap_m=20, options=direct))


def test_submodels_as_large_as_the_calibration_block_calibrate_themselves(
    seneca_images: Path,
) -> None:
    """seneca ``--split 50``: three submodels of 86-91 images, each larger than the 30-image
    calibration block, so none is held at a shared calibration (held at one, a submodel came out
    3.3 deg off nadir where calibrating itself gave 2.3 deg)."""
    plan = plan_split(scan_images(str(seneca_images)), split=50)
    assert len(plan.submodels) >= 2
    assert min(len(s.image_names) for s in plan.submodels) >= CALIBRATION_IMAGES
    assert not needs_calibration(plan)


def test_a_late_stage_option_keeps_the_survey_calibration(brighton: Path) -> None:
    """The calibration ends with structure from motion: changing the orthophoto's resolution or
    a DEM option keeps its identity (a new user's rerun with ``--orthophoto-resolution 10``
    calibrated again, to a byte-identical ``cameras.json``); a matching option changes it."""
    from prefect_odm.models import ProcessingOptions
    from prefect_odm.nodes.calibration import calibration_identity
    from prefect_odm.nodes.submodel_inputs import plan_altitudes

    survey = scan_images(str(brighton))

    def identity(**options: object) -> str:
        split = plan_split(
            survey, split=10, split_overlap_m=20, options=ProcessingOptions.model_validate(options)
        )
        names = calibration_images(split, survey)
        return calibration_identity(split, survey, names, plan_altitudes(split, names))

    base = identity()
    assert identity(orthophoto_resolution_cm=10) == base
    assert identity(extra={"dem-resolution": 10}) == base
    assert identity(extra={"min-num-features": 4000}) != base
