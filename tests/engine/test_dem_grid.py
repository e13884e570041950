"""The DEM grid of the built-in engine: on the orthophoto's grid, at the resolution asked.

Pure rules (:func:`prefect_odm.grid.dem_cells_per_orthophoto_cell`, :meth:`Grid.refined`,
:meth:`Grid.is_aligned_with`) on synthesized numbers; the engine's own products in
``test_pipeline.py``.
"""

from __future__ import annotations

import pytest

from prefect_odm.engine.pipeline_options import OPTIONS, settings
from prefect_odm.grid import Grid, dem_cells_per_orthophoto_cell
from prefect_odm.plan.depthmaps import depthmap_scale


@pytest.mark.parametrize(
    ("ortho_m", "asked_m", "default_m", "cells"),
    [
        (0.05, 0.20, 0.30, 4),  # asked, a whole number of orthophoto cells: kept
        (0.05, 0.07, 0.30, 1),  # asked between: the nearest whole number (1.4 -> 1)
        (0.05, 0.08, 0.30, 2),  # 1.6 -> 2
        (0.05, 0.01, 0.30, 1),  # finer than the orthophoto: one cell (ODM's GSD cap)
        (0.05, None, 0.2005, 4),  # not asked: the default, to the nearest whole number
        (0.05, 0.0, 0.2005, 4),  # 0 is "not asked" (the engine's /options default)
        (0.0437, None, 0.0437 * 4.6, 5),
    ],
)
def test_dem_cells_per_orthophoto_cell(
    ortho_m: float, asked_m: float | None, default_m: float, cells: int
) -> None:
    assert dem_cells_per_orthophoto_cell(ortho_m, asked_m, default_m) == cells


def test_dem_cells_rejects_non_positive_resolutions() -> None:
    with pytest.raises(ValueError, match="positive"):
        dem_cells_per_orthophoto_cell(0.0, 0.2, 0.2)
    with pytest.raises(ValueError, match="positive"):
        dem_cells_per_orthophoto_cell(0.05, 0.2, -1.0)


def test_refined_grid_has_the_same_corner_and_extent() -> None:
    dem = Grid.covering((576_624.87, 5_188_300.1, 576_700.3, 5_188_399.93), 0.2, 0.2)
    ortho = dem.refined(4, 0.05)
    assert (ortho.left, ortho.top) == (dem.left, dem.top)
    assert ortho.bounds == pytest.approx(dem.bounds, abs=1e-6)
    assert dem.is_aligned_with(ortho) and ortho.is_aligned_with(ortho)
    assert not ortho.is_aligned_with(dem)  # 0.05 is not a multiple of 0.2
    with pytest.raises(ValueError, match="pixel size"):
        dem.refined(3, 0.05)
    with pytest.raises(ValueError, match="at least 1"):
        dem.refined(0, 0.2)


def test_is_aligned_with_needs_the_corner_on_a_pixel_edge() -> None:
    ortho = Grid(left=576_625.0, top=5_188_400.0, resolution_m=0.05, width=100, height=100)
    on_edges = Grid(left=576_624.8, top=5_188_400.2, resolution_m=0.2, width=10, height=10)
    # the issue's merged DSM: 0.2005 m cells from 576624.84 E
    issue = Grid(left=576_624.84, top=5_188_400.0, resolution_m=0.2005, width=10, height=10)
    half = Grid(left=576_624.825, top=5_188_400.0, resolution_m=0.2, width=10, height=10)
    assert on_edges.is_aligned_with(ortho)
    assert not issue.is_aligned_with(ortho)
    assert not half.is_aligned_with(ortho)


def test_dem_resolution_default_is_automatic_and_said_so() -> None:
    entry = next(o for o in OPTIONS if o["name"] == "dem-resolution")
    assert entry["value"] == "0" and "0: automatic" in entry["help"]
    assert settings({})["dem-resolution"] == 0.0
    assert settings({"dem-resolution": "12.5"})["dem-resolution"] == 12.5
    quality = next(o for o in OPTIONS if o["name"] == "pc-quality")
    # brighton's 1600 px photos give 800 px depth maps at medium (plan.depthmaps.depthmap_scale)
    assert "medium 0.125" in quality["help"] and "image scale 0.5" in quality["help"]
    assert depthmap_scale(1600, 900, "medium") == 0.5  # what the engine logs and uses
