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
    assert not any((tmp_path / "ph").rglob("*.db"))  # Prefect's temporary API never started
    assert not list(out.rglob("submodels/*/*"))  # nothing processed
    assert [p.name for p in out.glob("*/plan/plan.png")] == ["plan.png"]
    assert list(out.glob("*/plan/plan.json"))
