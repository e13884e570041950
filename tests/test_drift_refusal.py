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


def test_drifting_altitude_stops_the_run_at_the_plan(drifted: Path, tmp_path: Path) -> None:
    """The installed command refuses before Prefect starts (the built-in engine's plan is the
    flow's, so the edge's plan decides), one line, exit 2, the plan and its picture written."""
    import os
    import subprocess
    import sys

    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env.update(PREFECT_ODM_HOME=str(tmp_path / "home"), PREFECT_HOME=str(tmp_path / "ph"))
    command = Path(sys.executable).parent / "prefect-odm"
    args = ["reconstruct", str(drifted), "--output", str(out), "--split", "10"]
    proc = subprocess.run(
        [str(command), *args, "--split-overlap-m", "20"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if "GPS altitude unusable" in ln]
    assert len(lines) == 1 and "drifts +1.70 m per image" in lines[0], proc.stderr
    assert "priors slope 22.0 deg" in lines[0]
    assert "the altitude follows the time, not the ground" in lines[0]
    assert not any((tmp_path / "ph").rglob("*.db"))  # Prefect's temporary API never started
    assert not list(out.rglob("submodels/*/*"))  # nothing processed
    assert [p.name for p in out.glob("*/plan/plan.png")] == ["plan.png"]
    assert list(out.glob("*/plan/plan.json"))


@pytest.mark.parametrize("name", ["agung-2", "freetown-1"])
def test_a_terrain_following_flight_is_not_taken_for_a_drift(data_dir: Path, name: str) -> None:
    """The real DroneTM layouts (absolute altitude only, no relative altitude) follow the ground
    up a volcano and a hillside: their altitude "trend" and 9.7 / 11.7 deg priors are the
    ground's, and they were refused as a drift (a new user's trial). The same positions flown
    at one height with the altitude drifting 0.1 m per image are refused."""
    from prefect_odm.survey.layouts import layout_survey, read_layout

    survey = layout_survey(read_layout(data_dir / "layouts" / name))
    plan = plan_split(survey, split=100)
    assert any(w.kind == "altitude_trend" for w in plan.gps_warnings)
    assert plan_gps_refusal(plan, survey) is None
    in_time = sorted(
        (im for im in survey.images if im.capture_time is not None and im.altitude_m is not None),
        key=lambda im: (im.capture_time, im.name),
    )
    drift = {im.name: 100.0 + 0.1 * k for k, im in enumerate(in_time)}
    drifted = survey.model_copy(
        update={
            "images": [
                im.model_copy(update={"altitude_m": drift.get(im.name, im.altitude_m)})
                for im in survey.images
            ]
        }
    )
    plan = plan_split(drifted, split=100)
    placed = [c for c in plan.cameras if c.z_m is not None]
    tilt = altitude_prior_tilt_deg(
        [c.x_m for c in placed], [c.y_m for c in placed], [c.z_m or 0.0 for c in placed]
    )
    assert tilt > 2.0  # measured: 4.0 (agung-2) and 7.6 deg (freetown-1)
    refusal = plan_gps_refusal(plan, drifted)
    assert refusal is not None and "drifts +0.10 m per image" in refusal, refusal
    assert "leaves 0% of the altitude differences between neighbouring lines" in refusal
