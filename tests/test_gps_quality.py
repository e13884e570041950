"""GPS checks along the capture sequence, on seneca's real EXIF and on copies made wrong on purpose."""

from __future__ import annotations

import csv
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest
from pyproj import Transformer

from prefect_odm.survey.gps_quality import (
    GpsFix,
    GpsQualityOptions,
    check_gps,
    flights,
    jump_distances,
)


@pytest.fixture(scope="module")
def seneca(data_dir: Path) -> list[GpsFix]:
    """Seneca's EXIF (capture time, lat, lon, alt) projected to UTM 17N, sorted by time."""
    with open(data_dir / "seneca_1200" / "manifest.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    to_utm = Transformer.from_crs(4326, 32617, always_xy=True)
    fixes = []
    for r in rows:
        t = datetime.strptime(r["dt"], "%Y:%m:%d %H:%M:%S").replace(tzinfo=UTC)
        x, y = to_utm.transform(float(r["lon"]), float(r["lat"]))
        rel = float(r["rel_alt"]) if r["rel_alt"] else None
        fixes.append(GpsFix(r["file"], t.timestamp(), x, y, float(r["alt"]), rel))
    return sorted(fixes, key=lambda f: (f.time_s, f.name))


def with_drift(fixes: list[GpsFix], m_per_image: float) -> list[GpsFix]:
    return [
        GpsFix(f.name, f.time_s, f.x_m, f.y_m, f.alt_m + m_per_image * k, f.relative_alt_m)
        for k, f in enumerate(fixes)
    ]


def with_lag_on_turns(
    fixes: list[GpsFix], lag_m: float = 20.0, turn_deg: float = 60.0
) -> tuple[list[GpsFix], list[str]]:
    """The first shot after each turn (heading change > ``turn_deg``) reported ``lag_m`` back
    along the step that brought the drone there, as a lagging receiver reports it."""
    p = np.array([(f.x_m, f.y_m) for f in fixes])
    d = np.diff(p, axis=0)
    heading = np.degrees(np.arctan2(d[:, 1], d[:, 0]))
    out = list(fixes)
    lagged = []
    for k in range(1, len(d)):
        if abs((heading[k] - heading[k - 1] + 180.0) % 360.0 - 180.0) > turn_deg:
            j = k + 1
            u = d[k] / np.linalg.norm(d[k])
            f = fixes[j]
            out[j] = GpsFix(f.name, f.time_s, f.x_m - lag_m * u[0], f.y_m - lag_m * u[1], f.alt_m)
            lagged.append(f.name)
    return out, lagged


def test_seneca_gps_gives_no_warning(seneca: list[GpsFix]) -> None:
    assert len(seneca) > 100
    assert check_gps(seneca) == []


def test_drift_and_lag_on_turns_both_warned(seneca: list[GpsFix]) -> None:
    bad, lagged = with_lag_on_turns(with_drift(seneca, 0.5))
    assert len(lagged) > 10
    warnings = check_gps(bad)
    kinds = {w.kind for w in warnings}
    assert {"altitude_trend", "position_jump"} <= kinds
    trend = next(w for w in warnings if w.kind == "altitude_trend")
    assert trend.value == pytest.approx(0.5 * (len(seneca) - 1), rel=0.05)
    assert trend.images == [seneca[0].name, seneca[-1].name]
    assert seneca[0].name in trend.message and "+0.50 m per image" in trend.message
    jump = next(w for w in warnings if w.kind == "position_jump")
    assert len(set(jump.images) & set(lagged)) >= len(lagged) // 2
    assert jump.images[0] in jump.message


def test_each_fault_alone_gives_only_its_warning(seneca: list[GpsFix]) -> None:
    assert [w.kind for w in check_gps(with_drift(seneca, 0.5))] == ["altitude_trend"]
    lag_only, _ = with_lag_on_turns(seneca)
    assert [w.kind for w in check_gps(lag_only)] == ["position_jump"]


def test_relative_altitude_removes_a_real_climb() -> None:
    """A drone climbing 0.5 m per image by the barometer too is not a GPS drift."""
    fixes = [
        GpsFix(f"I{k:03d}", 2.0 * k, 10.0 * k, 0.0, 300.0 + 0.5 * k, 50.0 + 0.5 * k)
        for k in range(60)
    ]
    assert check_gps(fixes) == []
    drifting = [GpsFix(f.name, f.time_s, f.x_m, f.y_m, f.alt_m, 50.0) for f in fixes]
    (w,) = check_gps(drifting)
    assert w.kind == "altitude_trend" and "relative altitude" in w.message


def test_implausible_speed_names_the_step() -> None:
    fixes = [GpsFix(f"I{k:03d}", 2.0 * k, 10.0 * k, 0.0, 300.0) for k in range(30)]
    fixes[15] = GpsFix("I015", 30.0, 150.0, 400.0, 300.0)
    warnings = check_gps(fixes, GpsQualityOptions(max_jump_share=0.5))
    (speed,) = [w for w in warnings if w.kind == "implausible_speed"]
    assert "I014->I015" in speed.message and "I015->I016" in speed.message
    assert speed.value > 100.0


def test_jump_distances_zero_on_a_straight_line_and_flights_split() -> None:
    t = np.arange(10.0) * 3
    p = np.stack([5.0 * t, 2.0 * t], axis=1)
    assert np.allclose(jump_distances(t, p), 0.0)
    a = [GpsFix(f"A{k}", k * 3.0, 0.0, 0.0, 100.0 + 5 * k) for k in range(4)]
    b = [GpsFix(f"B{k}", 1000.0 + k * 3.0, 0.0, 0.0, 100.0) for k in range(10)]
    assert check_gps(a + b) == []  # the drifting flight is too short to judge


def _bad_gps_copy(src: Path, dst: Path, fixes: list[GpsFix]) -> None:
    """Copy the images of ``src`` into ``dst`` with the EXIF GPS of ``fixes`` (UTM 17N)."""
    from exif_gps_edit import set_gps

    to_lonlat = Transformer.from_crs(32617, 4326, always_xy=True)
    dst.mkdir()
    for f in fixes:
        lon, lat = to_lonlat.transform(f.x_m, f.y_m)
        (dst / f.name).write_bytes(set_gps((src / f.name).read_bytes(), lat, lon, f.alt_m))


def _plan(images: Path, out: Path, capsys: pytest.CaptureFixture[str]) -> tuple[str, dict]:
    """``prefect-odm plan IMAGES --split 50``: (what it printed, plan.json)."""
    import json

    from prefect_odm.cli import main

    assert main(["plan", str(images), "--split", "50", "--output", str(out)]) == 0
    return capsys.readouterr().out, json.loads((out / "plan.json").read_text())


def _plan_report(folder: Path) -> str:
    """The plan report (the flow's ``plan-report`` artifact) of a ``prefect-odm plan`` folder."""
    from prefect_odm.models import SplitPlan, Survey
    from prefect_odm.plan.picture import plan_markdown

    plan = SplitPlan.model_validate_json((folder / "plan.json").read_text())
    return plan_markdown(plan, Survey.model_validate_json((folder / "survey.json").read_text()))


def test_plan_warns_on_a_seneca_copy_with_drift_and_lag(
    seneca: list[GpsFix], data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 11's acceptance: 0.5 m per image of altitude drift and a 20 m lag on turns written
    into the EXIF of a copy of seneca; ``prefect-odm plan`` names both, the clean survey neither."""
    images = data_dir / "seneca_1200" / "images"
    bad, lagged = with_lag_on_turns(with_drift(seneca, 0.5), lag_m=20.0)
    _bad_gps_copy(images, tmp_path / "bad", bad)
    printed, plan = _plan(tmp_path / "bad", tmp_path / "bad-plan", capsys)
    lines = [line for line in printed.splitlines() if line.startswith("warning: GPS: ")]
    assert len(lines) == 2, printed
    assert "GPS altitude (constant height assumed) drifts +0.50 m per image" in lines[0]
    assert f"from {seneca[0].name} to {seneca[-1].name} (167 images)" in lines[0]
    assert "positions jump more than 20 m off their track" in lines[1]
    kinds = [w["kind"] for w in plan["gps_warnings"]]
    assert kinds == ["altitude_trend", "position_jump"]
    jumped = set(plan["gps_warnings"][1]["images"])
    assert len(jumped & set(lagged)) >= len(lagged) // 2
    report = _plan_report(tmp_path / "bad-plan")
    assert "## GPS before compute" in report
    drift = plan["gps_warnings"][0]["value"]
    assert f"| altitude trend | {drift:.2f} | 10 |" in report and "| position jumps |" in report
    clean_printed, clean = _plan(images, tmp_path / "clean-plan", capsys)
    assert "None found (altitude trend" in _plan_report(tmp_path / "clean-plan")
    assert "GPS" not in clean_printed and clean["gps_warnings"] == []
    with capsys.disabled():
        print("\n" + "\n".join(lines))


@pytest.mark.parametrize("drift_m_per_image", [0.0, 0.002, 0.05])
def test_sampled_theil_sen_matches_the_exact_one_above_the_exact_size(
    drift_m_per_image: float,
) -> None:
    """Above ``EXACT_MAX_IMAGES`` the pair-sampled estimator gives scipy's exact slope and
    interval to a small share of the interval's width, and is deterministic."""
    from scipy.stats import theilslopes

    from prefect_odm.survey.gps_quality import EXACT_MAX_IMAGES, theil_sen_slope

    n = EXACT_MAX_IMAGES + 1000
    rng = np.random.default_rng(7)
    h = 300.0 + drift_m_per_image * np.arange(n) + rng.normal(0.0, 0.5, n)
    h[rng.integers(0, n, 60)] += 40.0  # outliers
    slope, _, low, high = theilslopes(h, np.arange(n), alpha=0.95)
    got = theil_sen_slope(h)
    width = high - low
    assert got == theil_sen_slope(h)
    assert abs(got[0] - slope) < 0.1 * width
    assert abs(got[1] - low) < 0.1 * width and abs(got[2] - high) < 0.1 * width
    print(
        f"\nn={n} drift {drift_m_per_image}: exact {slope:.6f} [{low:.6f}, {high:.6f}], "
        f"sampled {got[0]:.6f} [{got[1]:.6f}, {got[2]:.6f}]"
    )


def test_a_long_drifting_flight_is_warned_and_a_level_one_is_not() -> None:
    """20,000 shots of one flight (sampled estimator): 0.001 m per image of drift (20 m) warned."""
    rng = np.random.default_rng(3)
    n = 20_000
    alt = 300.0 + rng.normal(0.0, 1.0, n)
    level = [GpsFix(f"I{k:05d}", 2.0 * k, 10.0 * k, 0.0, float(alt[k])) for k in range(n)]
    assert check_gps(level) == []
    drifting = with_drift(level, 0.001)
    (w,) = check_gps(drifting)
    assert w.kind == "altitude_trend" and w.value == pytest.approx(20.0, rel=0.1)


def _trend_warned(fit: tuple[float, float, float], n: int) -> bool:
    """The altitude-trend rule of ``altitude_trend`` on a (slope, low, high) fit of n heights."""
    slope, low, high = fit
    return abs(slope * (n - 1)) > GpsQualityOptions().max_altitude_drift_m and not (
        low <= 0.0 <= high
    )


@pytest.mark.parametrize("name", ["agung-2", "freetown-1"])
def test_sampled_theil_sen_agrees_with_scipy_on_the_real_flights(
    data_dir: Path, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On every flight of the real layouts (1,817 and 1,452 positions) the pair-sampled estimator
    gives scipy's exact slope and interval to within a tenth of the interval's width and the same
    altitude-trend verdict; forced on every flight, the survey's warnings are the same (a jump
    list within 1 % of its images)."""
    from scipy.stats import theilslopes

    from prefect_odm.plan.checks import gps_warnings
    from prefect_odm.survey import gps_quality
    from prefect_odm.survey.layouts import layout_survey, read_layout

    survey = layout_survey(read_layout(data_dir / "layouts" / name))
    pairs = [(im.name, im) for im in survey.images]
    x = np.arange(len(pairs), dtype=np.float64)
    fixes = [
        GpsFix(n, im.capture_time.timestamp(), 0.0, 0.0, im.altitude_m)
        for n, im in pairs
        if im.capture_time is not None and im.altitude_m is not None
    ]
    checked = 0
    for flight in flights(fixes, GpsQualityOptions().flight_gap_s):
        if len(flight) < GpsQualityOptions().min_images:
            continue
        h = np.array([f.alt_m for f in flight])
        exact = theilslopes(h, np.arange(len(h)), alpha=0.95)
        got = gps_quality.sampled_theil_sen_slope(h)
        width = max(exact.high_slope - exact.low_slope, 1e-12)
        assert abs(got[0] - exact.slope) <= 0.1 * width
        assert abs(got[1] - exact.low_slope) <= 0.1 * width
        assert abs(got[2] - exact.high_slope) <= 0.1 * width
        assert _trend_warned(got, len(h)) == _trend_warned(
            (exact.slope, exact.low_slope, exact.high_slope), len(h)
        )
        checked += 1
    assert checked >= 1
    exact_found, _ = gps_warnings(pairs, x, x)
    monkeypatch.setattr(gps_quality, "EXACT_MAX_IMAGES", 0)
    sampled_found, _ = gps_warnings(pairs, x, x)
    # The same warnings; a jump list may differ by a shot on the 10 m line (the slope moves a hair).
    assert [w.kind for w in sampled_found] == [w.kind for w in exact_found]
    for s, e in zip(sampled_found, exact_found, strict=True):
        assert len(set(s.images) ^ set(e.images)) <= max(1, len(e.images) // 100)


def test_the_exact_theil_sen_is_scipys_to_the_last_bit() -> None:
    """``exact_theil_sen_slope`` (no ``scipy.stats`` import) against ``scipy.stats.theilslopes``
    on noisy, quantized (ties), constant and drifting heights: the same floats."""
    from scipy.stats import theilslopes

    from prefect_odm.survey.gps_quality import exact_theil_sen_slope

    rng = np.random.default_rng(33)
    for trial in range(400):
        n = int(rng.integers(2, 300))
        heights = [
            rng.normal(100.0, 3.0, n),
            np.round(rng.normal(100.0, 1.0, n), 1),
            np.full(n, 120.5),
            np.round(100.0 + 0.05 * np.arange(n) + rng.normal(0.0, 0.5, n), 2),
        ][trial % 4]
        slope, _, low, high = theilslopes(heights, np.arange(n), alpha=0.95)
        assert exact_theil_sen_slope(heights) == (float(slope), float(low), float(high))
