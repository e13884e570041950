"""Coverage of a merged orthophoto against its inputs and the planned footprint."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import rasterio

from prefect_odm.errors import MergeError
from prefect_odm.merge import coverage_report, merge_orthophotos
from prefect_odm.ownership import Ownership

from .conftest import CAMERAS, LEFT, TOP


def _box(x0: float, y0: float, x1: float, y1: float) -> dict:
    return {"type": "Polygon", "coordinates": [[(x0, y0), (x1, y0), (x1, y1), (x0, y1), (x0, y0)]]}


def test_full_merge_covers_the_union_and_the_plan(ortho_tiles: Callable, tmp_path: Path) -> None:
    tiles, _ = ortho_tiles(holes={"a": [(100, 140, 10, 30)]})
    out = tmp_path / "o.tif"
    merge_orthophotos(tiles, out, ownership=Ownership.from_cameras(CAMERAS))
    plan = _box(LEFT + 0.5, TOP - 29.5, LEFT + 39.5, TOP - 0.5)
    report = coverage_report(out, tiles, plan, max_side_px=200)
    assert report.coverage_of_union >= 0.995
    assert report.union_area_m2 == pytest.approx(40 * 30 - 2 * 4, rel=0.02)
    assert report.merged_area_m2 == pytest.approx(report.union_area_m2, rel=1e-6)
    assert report.coverage_of_planned == pytest.approx(1 - 8 / (39 * 29), abs=0.01)
    assert report.planned_area_m2 == pytest.approx(39 * 29, rel=0.02)
    assert [s.submodel_id for s in report.per_submodel] == ["a", "b", "c"]
    for sub in report.per_submodel:
        assert sub.covered_by_merged_fraction == 1.0
    a = report.per_submodel[0]
    assert a.covered_area_m2 == pytest.approx(24 * 30 - 8, rel=0.02)


def test_half_empty_result_raises(ortho_tiles: Callable, tmp_path: Path) -> None:
    tiles, _ = ortho_tiles()
    out = tmp_path / "o.tif"
    merge_orthophotos(tiles, out, ownership=None)
    half = tmp_path / "half.tif"
    with rasterio.open(out) as ds:
        data = ds.read()
        profile = ds.profile
    data[3, :, 200:] = 0
    with rasterio.open(half, "w", **(profile | {"driver": "GTiff"})) as dst:
        dst.write(data)
    with pytest.raises(MergeError, match="union"):
        coverage_report(half, tiles)
    # the full merge against a plan over twice its size is less than half full
    # (MIN_COVERAGE_OF_PLANNED = 0.5, the threshold the reconstruct flow has always applied)
    plan = _box(LEFT, TOP - 70, LEFT + 40, TOP)
    with pytest.raises(MergeError, match="planned footprint"):
        coverage_report(out, tiles, plan)
    empty = tmp_path / "empty.tif"
    data[3] = 0
    with rasterio.open(empty, "w", **(profile | {"driver": "GTiff"})) as dst:
        dst.write(data)
    with pytest.raises(MergeError, match="empty"):
        coverage_report(empty, tiles)
    assert np.any(data[:3])
