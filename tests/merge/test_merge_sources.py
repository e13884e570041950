"""Decimated reads of the merge's sources: the statistics of overlaps (colour balance, DEM
offsets) sample every source at the same coarse-pixel centres, warped or not."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from rasterio.enums import Resampling

from prefect_odm.merge.sources import SourceReader, plan_grid

from .conftest import LEFT, TOP, ground_texture, write_dem, write_rgba

RES = 0.1


def _plan(tmp_path: Path):
    ground = ground_texture(200, 260)
    alpha = np.ones((200, 200), dtype=bool)
    alpha[:20, :30] = False  # a corner without data
    inputs = {
        # on the output grid
        "a": write_rgba(tmp_path / "a.tif", ground[:, :, :200], LEFT, TOP, RES, alpha),
        # shifted by a third of a pixel: warped onto the grid
        "b": write_rgba(tmp_path / "b.tif", ground[:, :, 60:], LEFT + 60 * RES + RES / 3, TOP, RES),
    }
    return plan_grid(inputs, resolution_m=None, crs_epsg=None, value_bands=3)


@pytest.mark.parametrize("factor", [3, 5])
def test_decimated_reads_equal_the_full_reads_at_the_coarse_centres(
    tmp_path: Path, factor: int
) -> None:
    plan = _plan(tmp_path)
    assert [s.warp for s in plan.sources] == [False, True]
    reader = SourceReader(plan, Resampling.nearest)
    try:
        for src in plan.sources:
            window = (src.row_off + 7, src.col_off + 4, src.height - 11, src.width - 9)
            values, valid, aligned = reader.read_decimated(src, window, factor)
            assert aligned[0] % factor == 0 and aligned[1] % factor == 0
            assert aligned[0] >= window[0] and aligned[1] >= window[1]
            assert aligned[0] + aligned[2] <= window[0] + window[2]
            full, full_valid = reader.read(src, aligned)
            centre = slice(factor // 2, None, factor)
            assert values.shape[1:] == full[:, centre, centre].shape[1:] == valid.shape
            np.testing.assert_array_equal(valid, full_valid[centre, centre])
            np.testing.assert_array_equal(values[:, valid], full[:, centre, centre][:, valid])
            assert 0 < valid.sum() < valid.size if src.submodel_id == "a" else valid.all()
    finally:
        reader.close()


def test_decimated_dem_reads_use_nodata(tmp_path: Path) -> None:
    z = np.full((90, 120), 250.0, dtype=np.float32)
    z[:30, :30] = -9999.0
    plan = plan_grid(
        {"d": write_dem(tmp_path / "d.tif", z, LEFT, TOP, RES)},
        resolution_m=None,
        crs_epsg=None,
        value_bands=1,
    )
    reader = SourceReader(plan, Resampling.nearest)
    try:
        values, valid, aligned = reader.read_decimated(plan.sources[0], (0, 0, 90, 120), 3)
    finally:
        reader.close()
    assert aligned == (0, 0, 90, 120) and valid.shape == (30, 40)
    assert not valid[:10, :10].any() and valid[10:, :].all()
    assert np.all(values[0][valid] == 250.0)


def test_direct_decimated_reads_of_rgba_sample_the_cells_gdals_warper_samples(
    tmp_path: Path,
) -> None:
    """Orthophotos on the grid with an alpha band (a ragged edge, scattered holes) are
    sliced from full-resolution strips too: the same values, validity and window as the warped
    coarse read, so the colour balance solves the same corrections."""
    from prefect_odm.merge.overlap_sampling import _STRIP_ROWS, read_decimated_direct

    rng = np.random.default_rng(5)
    rows, cols = _STRIP_ROWS + 61, 257
    ground = ground_texture(rows, cols + 23)
    alpha = rng.random((rows, cols)) < 0.9
    alpha[:, :40] &= np.arange(rows)[:, None] % 7 > 2  # a ragged edge
    inputs = {
        "a": write_rgba(tmp_path / "a.tif", ground[:, :, :cols], LEFT, TOP, RES, alpha),
        "b": write_rgba(
            tmp_path / "b.tif", ground[:, :, 23:], LEFT + 23 * RES, TOP, RES, alpha[::-1]
        ),
    }
    plan = plan_grid(inputs, resolution_m=None, crs_epsg=None, value_bands=3)
    reader = SourceReader(plan, Resampling.nearest)
    try:
        for src in plan.sources:
            assert not src.warp and src.alpha_band is not None
            for factor in (2, 3, 4, 7):
                for window in [src.window, (3, src.col_off + 5, rows - 10, 200), (51, 30, 99, 17)]:
                    got = read_decimated_direct(reader, src, window, factor)
                    want = reader.read_decimated(src, window, factor)
                    assert got[2] == want[2], (factor, window)
                    assert np.array_equal(got[1], want[1])
                    if window == src.window:
                        assert 0 < got[1].sum() < got[1].size
                    assert np.array_equal(got[0][:, got[1]], want[0][:, want[1]])
    finally:
        reader.close()
