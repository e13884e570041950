"""The merge's readers hold open only the sources of the work around them: a source is closed
after the last overlapping pair or block that reads it, and read the same when opened again."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from rasterio.enums import Resampling

from prefect_odm.grid import Grid
from prefect_odm.merge.blocks import block_lifetimes, block_order
from prefect_odm.merge.shared_readers import SharedReaders, ThreadReaders
from prefect_odm.merge.source_lifetimes import SourceLifetimes
from prefect_odm.merge.sources import GridPlan, SourceReader, plan_grid, sources_in

from .conftest import LEFT, TOP, write_dem

RES = 1.0


def _strip_of_dems(tmp_path: Path, n: int = 8) -> GridPlan:
    """``n`` DEM tiles of 60 x 50 pixels in a row, each overlapping the next by 10 columns."""
    yy, xx = np.mgrid[0:60, 0:50].astype(np.float32)
    inputs = {
        f"s{i}": write_dem(
            tmp_path / f"s{i}.tif", 100 + xx + 40 * i - 0.5 * yy, LEFT + 40 * i * RES, TOP, RES
        )
        for i in range(n)
    }
    return plan_grid(inputs, resolution_m=None, crs_epsg=None, value_bands=1)


def test_lifetimes_say_which_sources_no_later_item_reads() -> None:
    lifetimes = SourceLifetimes.of_items([("a", "b"), ("a", "c"), ("b", "c"), ("c", "d")])
    assert lifetimes.last_use == {"a": 1, "b": 2, "c": 3, "d": 3}
    assert lifetimes.finished(["a", "b", "c", "d", "e"], 2) == ["a", "e"]
    assert lifetimes.finished(["a", "b", "c", "d"], 0) == []
    assert lifetimes.finished(["a", "b", "c", "d"], 4) == ["a", "b", "c", "d"]


def test_blocks_run_across_the_shorter_side() -> None:
    wide = Grid(LEFT, TOP, RES, 300, 100)
    blocks = block_order(wide, 64)
    assert [(b.row_off, b.col_off) for b in blocks[:3]] == [(0, 0), (64, 0), (0, 64)]
    tall = Grid(LEFT, TOP, RES, 100, 300)
    assert [(b.row_off, b.col_off) for b in block_order(tall, 64)[:3]] == [
        (0, 0),
        (0, 64),
        (64, 0),
    ]
    assert len(blocks) == 5 * 2 and len({(b.row_off, b.col_off) for b in blocks}) == 10


def test_block_lifetimes_are_each_sources_last_block(tmp_path: Path) -> None:
    plan = _strip_of_dems(tmp_path)
    for size in (16, 37, 64, 500):
        blocks = block_order(plan.grid, size)
        last: dict[str, int] = {}
        for n, block in enumerate(blocks):
            for src, _ in sources_in(plan, block):
                last[src.submodel_id] = n
        assert block_lifetimes(plan, blocks, size).last_use == last


def test_a_closed_source_reads_the_same_when_opened_again(tmp_path: Path) -> None:
    plan = _strip_of_dems(tmp_path, 3)
    reader = SourceReader(plan, Resampling.nearest)
    try:
        src = plan.sources[1]
        window = (src.row_off + 5, src.col_off + 3, 20, 30)
        values, valid = reader.read(src, window)
        coarse, coarse_valid, _ = reader.read_decimated(src, src.window, 4)
        reader.read(plan.sources[0], plan.sources[0].window)
        assert set(reader.open_ids) == {"s0", "s1"}
        reader.close_sources(["s1"])
        assert reader.open_ids == ("s0",)
        again, again_valid = reader.read(src, window)
        np.testing.assert_array_equal(again, values)
        np.testing.assert_array_equal(again_valid, valid)
        coarse2, coarse_valid2, _ = reader.read_decimated(src, src.window, 4)
        np.testing.assert_array_equal(coarse2, coarse)
        np.testing.assert_array_equal(coarse_valid2, coarse_valid)
    finally:
        reader.close()
    assert reader.open_ids == ()


def _most_open(plan: GridPlan, readers: ThreadReaders, size: int, retire: bool) -> int:
    """The most sources ``readers`` hold open while the blocks are read in order."""
    blocks = block_order(plan.grid, size)
    lifetimes = block_lifetimes(plan, blocks, size)
    most = 0
    try:
        for n, block in enumerate(blocks):
            if retire:
                readers.retire(lifetimes, n)
            reader = readers.get()
            for src, window in sources_in(plan, block):
                reader.read(src, window)
            most = max(most, len(reader.open_ids))
    finally:
        readers.close()
    return most


def test_block_readers_hold_the_sources_of_the_current_blocks_only(tmp_path: Path) -> None:
    plan = _strip_of_dems(tmp_path)
    assert _most_open(plan, ThreadReaders(plan), 16, retire=False) == 8
    assert _most_open(plan, ThreadReaders(plan), 16, retire=True) == 2
    for workers in (2, 4):  # one handle per source, then two
        assert _most_open(plan, SharedReaders(plan, workers), 16, retire=True) == 2
