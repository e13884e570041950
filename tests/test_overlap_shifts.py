"""The orthophoto shift of an overlap (``merge.overlaps.ortho_shifts``) on synthetic GeoTIFFs.

Two orthophotos of one random texture, the second's content moved by a known offset: the shift is
the median over the overlap's clear tiles, and an overlap with fewer than ``MIN_SHIFT_TILES``
tiles gives none (a median of two is moved by one wrong peak).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import rasterio
from rasterio.transform import from_origin
from scipy.ndimage import gaussian_filter, shift

from prefect_odm.merge.overlaps import MIN_SHIFT_TILES, ortho_shifts

RES_M = 0.1
LEFT, TOP = 500_000.0, 4_500_000.0


def _texture(rows: int, cols: int) -> np.ndarray:
    noise = np.random.default_rng(3).normal(0.0, 1.0, (rows, cols))
    grey = gaussian_filter(noise, 1.5)
    return np.clip(128 + 50 * grey / grey.std(), 1, 255)


def _write(path: Path, grey: np.ndarray, left: float) -> None:
    rgb = np.repeat(grey[None].astype(np.uint8), 3, axis=0)
    alpha = np.full((1, *grey.shape), 255, dtype=np.uint8)
    with rasterio.open(
        path, "w", driver="GTiff", width=grey.shape[1], height=grey.shape[0], count=4,
        dtype="uint8", crs="EPSG:32615", transform=from_origin(left, TOP, RES_M, RES_M),
    ) as dst:  # fmt: skip
        dst.write(np.concatenate([rgb, alpha]))


@pytest.mark.parametrize(("overlap_px", "tiles", "given"), [(400, 4, True), (200, 2, False)])
def test_shift_needs_three_clear_tiles(
    tmp_path: Path, overlap_px: int, tiles: int, given: bool
) -> None:
    """400 x 400 px in common (four 20 m tiles): the offset is measured; 200 x 400 px (two
    tiles): no shift is given, however clear its tiles."""
    rows, width = 400, 600
    ground = _texture(rows, 2 * width)
    dx_m, dy_m = 0.32, 0.21  # the second orthophoto shows the ground moved this far east, north
    moved = shift(ground, (-dy_m / RES_M, dx_m / RES_M), order=3, mode="nearest")
    start = width - overlap_px  # the second begins where the first's last overlap_px columns do
    _write(tmp_path / "a.tif", ground[:, :width], LEFT)
    _write(tmp_path / "b.tif", moved[:, start : start + width], LEFT + start * RES_M)
    found = ortho_shifts({"a": tmp_path / "a.tif", "b": tmp_path / "b.tif"}, tile_m=20.0)
    assert MIN_SHIFT_TILES == 3
    if given:
        s = found[("a", "b")]
        assert s.tiles == tiles
        assert (s.dx_m, s.dy_m) == pytest.approx((dx_m, dy_m), abs=0.03)
    else:
        assert ("a", "b") not in found
