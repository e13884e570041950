"""Issue 31 item 3: the Quickstart's split calibrates brighton's camera once, and both
submodels hold that calibration; the merged DSM then lies where ODM's cloud does.

Uses the session's ``brighton_split`` run (``--split 10 --split-overlap-m 20``, the built-in
engine). Before, each 12-image submodel calibrated a simpler camera alone: merged DSM 1.07 m
below ODM's cloud (median |dz|; p90 1.43 m, tilt 1.04 deg). Figures against the single block
and run times: ``python benchmarks/bench_engine.py --quickstart OUT``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import laspy
import numpy as np
import pytest
from engine.dense_figures import _read, _tilt, rasterise

from prefect_odm.models import SplitPlan


def test_both_submodels_hold_the_survey_calibration(
    brighton_split: tuple[Any, Path, SplitPlan],
) -> None:
    _, survey_dir, plan = brighton_split
    (stored,) = survey_dir.glob("calibration/*/cameras.json")
    calibration = json.loads(stored.read_text())
    assert list(calibration) == ["dji fc300s 1600 900 brown 0.5555"]
    camera = calibration["dji fc300s 1600 900 brown 0.5555"]
    assert camera["k2"] != 0.0 and camera["c_x"] != 0.0  # the full model, refined
    assert json.loads(str(plan.options.extra["cameras"])) == calibration
    written = sorted(survey_dir.glob("submodels/*/report/cameras.json"))
    assert len(written) == len(plan.submodels) == 2
    for path in written:
        held = json.loads(path.read_text())["dji fc300s 1600 900 brown 0.5555"]
        for term in ("focal_x", "c_x", "c_y", "k1", "k2"):
            assert held[term] == pytest.approx(camera[term], abs=1e-12), (path, term)


def test_the_merged_dsm_lies_on_odms_cloud(
    brighton_split: tuple[Any, Path, SplitPlan], data_dir: Path
) -> None:
    """The issue's acceptance: median |dz| <= 0.3 m, p90 <= 0.8 m, tilt <= 0.5 deg, over the
    merged DSM's measured heights against the mean height of ODM's cloud per cell."""
    _, survey_dir, _ = brighton_split
    dsm, transform = _read(survey_dir / "merged" / "dsm.tif", measured_only=True)
    las = laspy.read(data_dir / "brighton_beach_1600" / "reference" / "model.laz")
    reference, counts = rasterise(np.column_stack([las.x, las.y, las.z]), transform, dsm.shape)
    both = np.isfinite(dsm) & (counts > 0)
    dz = np.abs(dsm[both] - reference[both])
    tilt_deg, _ = _tilt(np.where(both, dsm - reference, np.nan), both, transform.a)
    print(f"median {np.median(dz):.2f} m, p90 {np.percentile(dz, 90):.2f} m, tilt {tilt_deg:.2f}")
    assert np.median(dz) <= 0.3
    assert np.percentile(dz, 90) <= 0.8
    assert tilt_deg <= 0.5
