"""Issue 30/31: a survey whose GPS altitude drifts, with no relative altitude to correct it
(``tests/test_altitude_correction.py``), is refused at the plan, before any upload."""

from __future__ import annotations

from pathlib import Path

import pytest
from exif_gps_edit import drifted_copy

from prefect_odm.plan.checks import altitude_prior_tilt_deg, plan_gps_refusal
from prefect_odm.plan.planning import plan_split
from prefect_odm.survey.scan import scan_images


@pytest.fixture(scope="module")
def drifted(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """brighton with its GPS altitude drifting +1.7 m per image (EXIF and XMP), its relative
    altitudes hidden."""
    folder = tmp_path_factory.mktemp("drift") / "images"
    drifted_copy(data_dir / "brighton_beach_1600" / "images", folder, 1.7, keep_relative=False)
    return folder


def test_prior_tilt_of_a_plane_and_of_a_line() -> None:
    x, y = [0.0, 100.0, 0.0, 100.0], [0.0, 0.0, 100.0, 100.0]
    assert altitude_prior_tilt_deg(x, y, [0.0, 100.0, 0.0, 100.0]) == pytest.approx(45.0)
    assert altitude_prior_tilt_deg(x, y, [5.0] * 4) == pytest.approx(0.0)
    assert altitude_prior_tilt_deg([0.0, 1.0, 2.0], [0.0, 1.0, 2.0], [0.0, 1.0, 9.0]) == 0.0


def test_untouched_brighton_is_planned(data_dir: Path) -> None:
    survey = scan_images(str(data_dir / "brighton_beach_1600" / "images"))
    plan = plan_split(survey, split=10, split_overlap_m=20)
    assert plan_gps_refusal(plan, survey) is None


def test_drifting_altitude_stops_the_run_at_the_plan(
    drifted: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from prefect_odm.cli import main

    out = tmp_path / "out"
    args = ["reconstruct", str(drifted), "--output", str(out), "--split", "10"]
    code = main([*args, "--split-overlap-m", "20"])
    printed = capsys.readouterr()
    lines = [ln for ln in (printed.out + printed.err).splitlines() if "GPS altitude unusable" in ln]
    print(lines)
    assert code == 2
    assert len(lines) >= 1 and "drifts +1.70 m per image" in lines[0]
    assert "priors slope 22.0 deg" in lines[0]
    assert not list(out.rglob("submodels/*/*"))  # nothing processed
