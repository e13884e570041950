"""The point merge's compiled loops against the numpy passes they replace (same values)."""

from __future__ import annotations

import laspy
import numpy as np
import pytest
from numpy.typing import NDArray

from prefect_odm.merge.las_points import convert_points, record_layout
from prefect_odm.merge.octree import (
    CELL_BITS,
    GRID_BITS,
    LEAF_POINTS,
    MAX_DEPTH,
    MORTON_SPREAD,
    assign_levels,
    cell_of,
    morton,
)
from prefect_odm.merge.point_kernels import (
    copy_rows,
    key_order,
    level_order,
    record_keys,
    spill_order,
)


def _numpy_levels(keys: NDArray[np.uint64], depth: int) -> NDArray[np.int8]:
    """The level rule of :mod:`.octree` in numpy passes (the writer's code before numba)."""

    def runs(values: NDArray[np.uint64]) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
        starts = np.flatnonzero(np.r_[True, values[1:] != values[:-1]])
        return starts, np.diff(np.r_[starts, values.size])

    level = np.full(keys.size, -1, dtype=np.int8)
    alive = np.arange(keys.size)
    for lv in range(MAX_DEPTH + 1):
        if alive.size == 0:
            break
        if lv == MAX_DEPTH:
            level[alive] = lv
            break
        k = keys[alive]
        take = np.zeros(alive.size, dtype=bool)
        if lv >= depth:
            _, node_len = runs(k >> np.uint64(3 * (GRID_BITS - lv)))
            take |= np.repeat(node_len <= LEAF_POINTS, node_len)
        cells = k >> np.uint64(3 * (GRID_BITS - CELL_BITS - lv))
        starts, lengths = runs(cells)
        spread = (cells[starts] * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(33)
        take[starts + (spread % lengths.astype(np.uint64)).astype(np.int64)] = True
        level[alive[take]] = lv
        alive = alive[~take]
    return level


@pytest.mark.parametrize(("points", "depth", "spread_cells"), [(300_000, 0, 40), (120_000, 2, 3)])
def test_levels_are_those_of_the_numpy_rule(points: int, depth: int, spread_cells: int) -> None:
    rng = np.random.default_rng(depth)
    grid = [rng.integers(0, 2**GRID_BITS // spread_cells, points) for _ in range(3)]
    keys = np.sort(morton(*grid))
    if depth:  # all in one cell of ``depth``: the prefix of the first key
        prefix_shift = np.uint64(3 * (GRID_BITS - depth))
        keys = keys[(keys >> prefix_shift) == (keys[0] >> prefix_shift)]
    levels = assign_levels(keys, depth)
    assert np.array_equal(levels, _numpy_levels(keys, depth))
    assert len(np.unique(levels)) > 2  # upper picks, and leaves below


def test_spill_order_is_the_stable_sort_of_the_numpy_keys() -> None:
    rng = np.random.default_rng(1)
    n, depth = 50_000, 2
    xyz = [rng.integers(-10_000, 900_000, n).astype(np.int32) for _ in range(3)]
    index = np.flatnonzero(rng.random(n) < 0.7)
    steps = (1_000, -2_000, 0)
    scales, offsets = np.array([0.001, 0.001, 0.001]), np.array([100.0, 200.0, 0.0])
    origin, size_m = (50.0, 100.0, -500.0), 2_000.0
    per_m = float(2**GRID_BITS) / size_m
    grid = []
    for axis in range(3):
        values = (xyz[axis][index].astype(np.int64) + steps[axis]) * scales[axis]
        grid.append(np.floor((values + offsets[axis] - origin[axis]) * per_m).astype(np.int64))
    want = morton(*grid)
    order = np.argsort(cell_of(want, depth), kind="stable")
    keys, dest, counts, lo, hi = spill_order(
        (xyz[0], xyz[1], xyz[2]),
        index,
        steps,
        (scales, offsets),
        (origin, per_m, 2**GRID_BITS, MORTON_SPREAD),
        depth,
    )
    assert np.array_equal(keys, want[order])
    assert np.array_equal(dest[order], np.arange(index.size))
    assert np.array_equal(counts, np.bincount(cell_of(want, depth).astype(np.int64), minlength=64))
    assert lo.tolist() == [int(xyz[a][index].min()) + steps[a] for a in range(3)]
    assert hi.tolist() == [int(xyz[a][index].max()) + steps[a] for a in range(3)]
    # the keys computed again from the records (X, Y, Z moved by the steps, as copy_rows writes
    # them) are the spilled keys, in the records' order
    moved = [(xyz[a][index].astype(np.int64) + steps[a]).astype(np.int32) for a in range(3)]
    again = record_keys(
        (moved[0][order], moved[1][order], moved[2][order]),
        (scales, offsets),
        (origin, per_m, 2**GRID_BITS, MORTON_SPREAD),
    )
    assert np.array_equal(again, keys)


@pytest.mark.parametrize(("source", "target"), [(3, 7), (1, 6), (0, 6), (2, 7), (7, 7), (6, 6)])
def test_copy_rows_writes_what_convert_points_writes(source: int, target: int) -> None:
    rng = np.random.default_rng(source)
    n = 5_000
    header = laspy.LasHeader(point_format=source, version="1.4" if source >= 6 else "1.2")
    header.scales = np.array([0.01, 0.01, 0.01])
    header.offsets = np.array([1_000.0, 2_000.0, 0.0])
    raw = rng.integers(0, 256, (n, header.point_format.size), dtype=np.uint8)
    records = raw.view(header.point_format.dtype()).reshape(n)
    chunk = laspy.ScaleAwarePointRecord(records, header.point_format, header.scales, header.offsets)
    out_header = laspy.LasHeader(point_format=target, version="1.4")
    out_header.scales = header.scales
    out_header.offsets = np.array([990.0, 2_000.0, -5.0])  # whole steps: 1000, 0, 500
    want = np.asarray(convert_points(chunk, out_header).array)
    layout = record_layout(chunk.point_format, records.dtype, out_header.point_format)
    assert layout is not None
    rows = np.flatnonzero(rng.random(n) < 0.6)
    dest = rng.permutation(rows.size)
    got, returns = copy_rows(
        records,
        rows,
        dest,
        out_header.point_format.dtype(),
        (layout.byte_map, layout.legacy),
        (1_000, 0, 500),
        layout.tables,
    )
    expected = np.empty_like(want[: rows.size])
    expected[dest] = want[rows]
    assert got.tobytes() == expected.tobytes()
    assert np.array_equal(returns, np.bincount(expected["bit_fields"] & 0x0F, minlength=16))


def test_no_byte_layout_for_extra_bytes() -> None:
    extra = laspy.PointFormat(3)
    extra.add_extra_dimension(laspy.ExtraBytesParams(name="height", type=np.float32))
    assert record_layout(extra, extra.dtype(), laspy.PointFormat(7)) is None


def test_level_order_is_the_stable_sort_by_level() -> None:
    rng = np.random.default_rng(3)
    level = rng.integers(0, MAX_DEPTH + 1, 10_000).astype(np.int8)
    by_key = rng.permutation(10_000)
    keys = np.sort(rng.integers(0, 2**40, 10_000).astype(np.uint64))
    order, keys_out, counts = level_order(level, by_key, keys, MAX_DEPTH + 1)
    stable = np.argsort(level, kind="stable")
    assert np.array_equal(order, by_key[stable])
    assert np.array_equal(keys_out, keys[stable])
    assert np.array_equal(counts, np.bincount(level, minlength=MAX_DEPTH + 1))


def test_key_order_is_the_stable_sort_of_the_cell_bits() -> None:
    rng = np.random.default_rng(4)
    prefix = np.uint64(5) << np.uint64(39)
    local = rng.integers(0, 2**39, 40_000).astype(np.uint64)
    local[::7] = local[0]  # ties: broken by the order given
    order, sorted_local = key_order(local | prefix, 39)
    assert np.array_equal(order, np.argsort(local, kind="stable"))
    assert np.array_equal(sorted_local, np.sort(local))
    empty, keys = key_order(np.zeros(0, dtype=np.uint64), 39)
    assert empty.size == 0 and keys.size == 0


def test_owners_from_integers_are_those_from_coordinates() -> None:
    from prefect_odm.merge.cell_owners import CellOwners
    from prefect_odm.ownership import Ownership

    rng = np.random.default_rng(5)
    cams = [(100.0 * i, 50.0 * (i % 3), f"s{i % 4}") for i in range(20)]
    owners = CellOwners(Ownership.from_cameras(cams), (0.0, 0.0, 1_900.0, 100.0), 4_096)
    n = 100_000
    xy = (rng.integers(-50_000, 2_000_000, n).astype(np.int32),
          rng.integers(-20_000, 150_000, n).astype(np.int32))  # fmt: skip
    scales, offsets = np.array([0.001, 0.001, 0.001]), np.array([-10.0, -5.0, 0.0])
    x, y = xy[0] * scales[0] + offsets[0], xy[1] * scales[1] + offsets[1]
    want = owners.label_of_points(x, y)
    assert np.array_equal(owners.label_of_integers(xy, scales, offsets), want)
    assert len(np.unique(want)) == 4


def test_laspys_format_3_to_7_layout_takes_the_fixed_offset_copy() -> None:
    from prefect_odm.merge.point_kernels import _is_3_to_7

    f3, f7 = laspy.PointFormat(3), laspy.PointFormat(7)
    layout = record_layout(f3, f3.dtype(), f7)
    assert layout is not None
    assert _is_3_to_7(f3.dtype().itemsize, f7.dtype().itemsize, layout.byte_map, layout.legacy)
    other = record_layout(laspy.PointFormat(1), laspy.PointFormat(1).dtype(), laspy.PointFormat(6))
    assert other is not None
    assert not _is_3_to_7(28, 30, other.byte_map, other.legacy)
