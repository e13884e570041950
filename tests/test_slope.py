"""A survey over a 150 m slope (issue 11): the direct pipeline's DSM follows the terrain, and the
merged DSM of 10 submodels keeps the slope's relief with no step at the seams.

The survey is rendered at test time (``tests/synthetic_survey.py``): 144 nadir images at 70 m
above a plane rising 150 m from west to east, GPS with 0.5 m of noise per axis, the height above
ground in XMP ``Camera:AboveGroundAltitude``. Structure from motion on the same survey is
``benchmarks/bench_slope.py`` (minutes).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import rasterio
from synthetic_survey import SlopeSurvey, slope_figures, write_slope_survey

from prefect_odm.align import AlignmentOptions
from prefect_odm.engine.terrain import MIN_GROUND_POINTS, ground_surface
from prefect_odm.grid import Grid
from prefect_odm.models import MergeOptions, ProcessingOptions
from prefect_odm.survey.exif import parse_above_ground_xmp

GPS_SIGMA_M = 0.5
"""Noise of the written GPS: the cameras' ground heights are this accurate (the height above
ground is exact), so two submodels' DSMs may differ by sqrt(2) times this at a seam, no more."""


def test_ground_surface_reproduces_a_slope_and_falls_back_to_the_plane() -> None:
    grid = Grid(left=1000.0, top=2000.0, resolution_m=0.5, width=400, height=200)
    rng = np.random.default_rng(3)
    xy = np.column_stack([rng.uniform(1000, 1200, 40), rng.uniform(1900, 2000, 40)])
    z = 250.0 + 0.4 * (xy[:, 0] - 1000.0) - 0.1 * (xy[:, 1] - 1900.0)
    surface = ground_surface(np.column_stack([xy, z]), grid, plane_z_m=0.0)
    rows, cols = np.mgrid[0:200, 0:400]
    x = grid.left + (cols + 0.5) * 0.5
    y = grid.top - (rows + 0.5) * 0.5
    truth = 250.0 + 0.4 * (x - 1000.0) - 0.1 * (y - 1900.0)
    assert surface.shape == (200, 400) and surface.dtype == np.float32
    assert np.abs(surface - truth).max() < 0.01  # a plane is in the spline's linear trend
    few = np.column_stack([xy, z])[: MIN_GROUND_POINTS - 1]
    assert np.all(ground_surface(few, grid, plane_z_m=123.0) == np.float32(123.0))
    line = np.column_stack([np.linspace(1000, 1200, 10), np.full(10, 1950.0), np.arange(10.0)])
    assert np.all(ground_surface(line, grid, plane_z_m=0.0) == np.float32(4.5))


@pytest.mark.parametrize(
    ("xmp", "expected"),
    [
        (b'<x:xmpmeta><rdf:Description Camera:AboveGroundAltitude="70.25"/></x:xmpmeta>', 70.25),
        (b"<x:xmpmeta><Camera:AboveGroundAltitude>7025/100</Camera:AboveGroundAltitude>", 70.25),
        (b'<x:xmpmeta><rdf:Description Camera:AboveGroundAltitude="1/0"/></x:xmpmeta>', None),
        (b'<x:xmpmeta><rdf:Description drone-dji:RelativeAltitude="+40.1"/></x:xmpmeta>', None),
    ],
)
def test_above_ground_altitude_read_from_xmp(xmp: bytes, expected: float | None) -> None:
    assert parse_above_ground_xmp(b"\xff\xd8junk" + xmp) == expected


@pytest.fixture(scope="module")
def slope_direct_run(prefect_api, tmp_path_factory):  # type: ignore[no-untyped-def]
    """The slope survey through ``reconstruct --pipeline direct --dtm`` in 10 submodels."""
    os.environ["PREFECT_ODM_HOME"] = str(tmp_path_factory.mktemp("odm-home"))
    from prefect_odm.flows import reconstruct

    images = tmp_path_factory.mktemp("slope") / "images"
    survey = write_slope_survey(images, SlopeSurvey(gps_sigma_m=GPS_SIGMA_M))
    out = tmp_path_factory.mktemp("slope-out")
    manifest = reconstruct(
        images=str(images),
        output=str(out),
        split=14,
        split_overlap_m=10,
        options=ProcessingOptions(pipeline="direct", dtm=True),
        # The direct DSM is as good as its cameras' ground heights (0.5 m of GPS noise each):
        # two submodels' surfaces disagree by up to about 1.5 m rms in an overlap near the
        # survey's edge, above the 1 m gate meant for structure-from-motion products.
        # The same noise places each direct orthophoto up to about 1.6 m off its neighbour
        # (feature matches measured 1.3-1.6 m in three overlaps), above the 1 m seam gate.
        merge_options=MergeOptions(
            alignment=AlignmentOptions(max_overlap_rms_m=2.5, max_seam_m=2.5)
        ),
    )
    return survey, manifest


def test_direct_dsm_of_a_150_m_slope_keeps_its_relief_across_10_submodels(
    slope_direct_run,  # type: ignore[no-untyped-def]
) -> None:
    survey, manifest = slope_direct_run
    assert len(manifest.submodels) >= 10
    assert all(r.status == "completed" for r in manifest.submodels)
    plan = Path(manifest.products["dsm"]).parents[1] / "plan" / "plan.json"
    for product in ("dsm", "dtm"):
        f = slope_figures(Path(manifest.products[product]), plan, survey)
        print(
            f"\n{product}: range {f.range_m:.2f} m vs truth {f.truth_range_m:.2f} m "
            f"({f.range_error_pct:.2f} %), |dz| median {f.median_abs_dz_m:.3f} p99 "
            f"{f.p99_abs_dz_m:.3f} m, seam step max {f.seam_step_max_m:.3f} p99 "
            f"{f.seam_step_p99_m:.3f} m over {f.seam_pairs} pairs (inside p99 "
            f"{f.inner_step_p99_m:.3f} m), level step {f.seam_offset_max_m:.3f} m"
        )
        assert f.truth_range_m > 140.0
        assert f.range_error_pct <= 5.0
        assert f.median_abs_dz_m <= GPS_SIGMA_M
        assert f.seam_pairs > 1000
        # two neighbours' ground heights, each good to GPS_SIGMA_M, differ by sqrt(2) of it
        assert f.seam_step_max_m <= np.sqrt(2.0) * GPS_SIGMA_M
        assert f.seam_step_p99_m <= 0.1
        assert f.seam_offset_max_m <= 0.1


def _fitted_slope(path: Path) -> float:
    """dz/dx of the plane fitted (least squares) to a DSM's valid cells."""
    with rasterio.open(path) as ds:
        z = ds.read(1, masked=True)
        rows, cols = np.nonzero(~np.ma.getmaskarray(z))
        xs, ys = rasterio.transform.xy(ds.transform, rows, cols)
    a = np.column_stack(
        [np.asarray(xs) - np.mean(xs), np.asarray(ys) - np.mean(ys), np.ones(len(rows))]
    )
    coefficients, *_ = np.linalg.lstsq(a, z.data[rows, cols].astype(np.float64), rcond=None)
    return float(coefficients[0])


def test_direct_submodel_dsms_follow_the_slope(slope_direct_run) -> None:  # type: ignore[no-untyped-def]
    """Each submodel's own DSM rises with the ground (it was one flat plane per submodel)."""
    survey, manifest = slope_direct_run
    root = Path(manifest.products["dsm"]).parents[1]
    plan = root / "plan" / "plan.json"
    dsms = sorted((root / "submodels").glob("*/dsm.tif"))
    assert len(dsms) == len(manifest.submodels)
    for path in dsms:
        f = slope_figures(path, plan, survey)
        assert f.truth_range_m > 30.0
        assert f.range_error_pct <= 5.0, f"{path.parent.name}: {f}"
        slope = _fitted_slope(path)
        # 5 %: GPS_SIGMA_M of tilt over a ~60 m submodel is 2-3 % of this slope
        assert slope == pytest.approx(survey.slope, rel=0.05), f"{path.parent.name}: {slope:.4f}"


def test_direct_dsm_through_recorded_heights_is_said_to_be_not_measured(
    slope_direct_run,  # type: ignore[no-untyped-def]
) -> None:
    """The terrain through the images' recorded heights above ground is not measured either:
    the report's summary and the console say where it comes from and name the pipeline."""
    from prefect_odm.publish.surface import console_lines

    _, manifest = slope_direct_run
    words = (
        "DSM: the terrain through the ground heights the images record (GPS altitude minus XMP "
        "Camera:AboveGroundAltitude; direct pipeline): from the images' recorded height, not "
        "measured"
    )
    lines = console_lines(manifest)
    assert lines[0].startswith("pipeline: direct (") and any(words in line for line in lines)
    report = Path(manifest.products["dsm"]).parents[1] / "report" / "report.md"
    summary = report.read_text().split("## Products\n")[0]
    assert f"**{words}" in summary and "0.0 % of its valid cells are measured" in summary
