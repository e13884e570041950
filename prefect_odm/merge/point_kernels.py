"""The point merge's per-point loops, compiled (numba): one pass where numpy needs several.

These loops held most of the merge's own work besides LAZ decoding and encoding (issue 36's
profile: ownership lookup, format conversion, record gathers, Morton keys, the grid, sorting,
level assignment, each a numpy pass over every point):

- :func:`.cell_owners.table_labels` (there, beside its only user): the owner of each point from
  the ownership table, from the integer coordinates (:class:`.cell_owners.CellOwners`);
- :func:`record_keys`: the Morton keys of spilled records, computed again when a cell is read;
- :func:`spill_order`: the grid coordinates, Morton key and spill cell of each kept point of a
  chunk, and a stable counting sort by cell (the order ``np.argsort(cells, kind="stable")``);
- :func:`copy_rows`: the kept records gathered in that order and written in the output point
  format in the same pass (byte runs, the 0-3 -> 6-8 bit fields repacked, X/Y/Z moved by whole
  steps), with the histogram of return numbers;
- :func:`key_order`: a spill cell's points sorted by Morton key (a stable radix sort);
- :func:`levels_of`: the octree level of each point of a spill cell (:func:`.octree.assign_levels`),
  and :func:`level_order`, the stable counting sort of a cell's points by level.

Each computes exactly what the numpy passes it replaces computed (the same floating-point
operations in the same order, the same stable orders), so the merged file is the same, byte for
byte. Compiled on first use and cached beside this module (``cache=True``); ``nogil``.
"""

from __future__ import annotations

from typing import Any

import numba
import numpy as np
from numpy.typing import NDArray

_jit = numba.njit(cache=True, nogil=True)


def _grid_cell(
    grid_cells: int, ints: Any, scale: float, offset: float, low: float, per_m: float
) -> Any:
    value = ints * scale  # the float operations of the numpy passes, in their order
    value += offset
    value -= low
    value *= per_m
    return min(max(np.int64(np.floor(value)), 0), grid_cells - 1)


_grid_cell_jit = _jit(_grid_cell)


def _morton(
    ix: Any,
    iy: Any,
    iz: Any,
    scales: Any,
    offsets: Any,
    low: Any,
    per_m: float,
    cells: int,
    spread: Any,
) -> Any:
    gx = _grid_cell_jit(cells, ix, scales[0], offsets[0], low[0], per_m)
    gy = _grid_cell_jit(cells, iy, scales[1], offsets[1], low[1], per_m)
    gz = _grid_cell_jit(cells, iz, scales[2], offsets[2], low[2], per_m)
    two, one = np.uint64(2), np.uint64(1)
    low_bits = (spread[gx & 0xFF] << two) | (spread[gy & 0xFF] << one) | spread[gz & 0xFF]
    high_bits = (spread[gx >> 8] << two) | (spread[gy >> 8] << one) | spread[gz >> 8]
    return low_bits | (high_bits << np.uint64(24))


_morton_jit = _jit(_morton)


def _record_keys(
    x: Any,
    y: Any,
    z: Any,
    scales: Any,
    offsets: Any,
    low: Any,
    per_m: float,
    cells: int,
    spread: Any,
) -> Any:
    keys = np.empty(x.size, dtype=np.uint64)
    for j in range(x.size):
        ix, iy, iz = np.int64(x[j]), np.int64(y[j]), np.int64(z[j])
        keys[j] = _morton_jit(ix, iy, iz, scales, offsets, low, per_m, cells, spread)
    return keys


_record_keys_jit = _jit(_record_keys)


def record_keys(
    xyz: tuple[NDArray[np.int32], NDArray[np.int32], NDArray[np.int32]],
    scales_offsets: tuple[NDArray[np.float64], NDArray[np.float64]],
    grid: tuple[tuple[float, float, float], float, int, NDArray[np.uint64]],
) -> NDArray[np.uint64]:
    """The Morton keys ``(n,)`` of points by their integer ``X, Y, Z`` ``(n,)`` each (in the
    header's offsets): the keys :func:`spill_order` gave them, computed again from the spilled
    records instead of spilled beside them; ``scales_offsets`` and ``grid`` as there."""
    origin, per_m, grid_cells, spread = grid
    scales, offsets = (np.asarray(v, dtype=np.float64) for v in scales_offsets)
    keys: NDArray[np.uint64] = _record_keys_jit(
        *xyz,
        scales,
        offsets,
        np.asarray(origin, dtype=np.float64),
        float(per_m),
        grid_cells,
        spread,
    )
    return keys


def _spill_order(
    x: Any,
    y: Any,
    z: Any,
    index: Any,
    steps: Any,
    scales: Any,
    offsets: Any,
    low: Any,
    per_m: float,
    grid_cells: int,
    cell_shift: int,
    cells: int,
    spread: Any,
) -> Any:
    n = index.size
    keys = np.empty(n, dtype=np.uint64)
    counts = np.zeros(cells, dtype=np.int64)
    lo = np.full(3, 2**62, dtype=np.int64)
    hi = np.full(3, -(2**62), dtype=np.int64)
    for j in range(n):
        row = index[j]
        ix = np.int64(x[row]) + steps[0]
        iy = np.int64(y[row]) + steps[1]
        iz = np.int64(z[row]) + steps[2]
        lo[0], hi[0] = min(lo[0], ix), max(hi[0], ix)
        lo[1], hi[1] = min(lo[1], iy), max(hi[1], iy)
        lo[2], hi[2] = min(lo[2], iz), max(hi[2], iz)
        key = _morton_jit(ix, iy, iz, scales, offsets, low, per_m, grid_cells, spread)
        keys[j] = key
        counts[np.int64(key >> np.uint64(cell_shift))] += 1
    at = np.empty(cells, dtype=np.int64)
    total = 0
    for c in range(cells):
        at[c] = total
        total += counts[c]
    sorted_keys = np.empty(n, dtype=np.uint64)
    dest = np.empty(n, dtype=np.int64)
    for j in range(n):
        cell = np.int64(keys[j] >> np.uint64(cell_shift))
        p = at[cell]
        at[cell] = p + 1
        sorted_keys[p] = keys[j]
        dest[j] = p
    return sorted_keys, dest, counts, lo, hi


_spill_order_jit = _jit(_spill_order)


def spill_order(
    xyz: tuple[NDArray[np.int32], NDArray[np.int32], NDArray[np.int32]],
    index: NDArray[np.int64],
    steps: tuple[int, int, int],
    scales_offsets: tuple[NDArray[np.float64], NDArray[np.float64]],
    grid: tuple[tuple[float, float, float], float, int, NDArray[np.uint64]],
    depth: int,
) -> tuple[
    NDArray[np.uint64], NDArray[np.int64], NDArray[np.int64], NDArray[np.int64], NDArray[np.int64]
]:
    """Morton keys of the points ``index`` of a chunk, sorted stably by spill cell.

    Args:
        xyz: the chunk's integer ``X, Y, Z`` (each ``(m,)``, any stride), in their own offsets.
        index: ``(n,)`` the rows to key (the kept points, ascending).
        steps: whole steps from the chunk's offsets to the header's (added to ``X, Y, Z``).
        scales_offsets: the header's scales and offsets, ``(3,)`` each (CRS units).
        grid: the octree cube's origin ``(x, y, z)``, grid cells per metre, grid cells per
            axis (``2**GRID_BITS``, at most ``2**16``) and the table ``(256,)`` spreading a
            byte's bits to every third bit (:data:`.octree.MORTON_SPREAD`).
        depth: the depth of the spill cells (``8**depth`` cells).

    Returns:
        ``(keys, dest, counts, lo, hi)``: the keys ``(n,)`` in spill-cell order (stable), the
        place ``(n,)`` of each point ``index[j]`` in that order, the points per cell ``(cells,)``, the least and greatest
        ``X, Y, Z`` after the steps ``(3,)`` each. The caller checks the grid bounds from
        ``lo``/``hi`` (a point outside the cube gets a key clamped to it).
    """
    origin, per_m, grid_cells, spread = grid
    cell_shift = 3 * (int(grid_cells).bit_length() - 1 - depth)
    scales, offsets = scales_offsets
    out: tuple[Any, ...] = _spill_order_jit(
        *xyz,
        index,
        np.asarray(steps, dtype=np.int64),
        np.asarray(scales, dtype=np.float64),
        np.asarray(offsets, dtype=np.float64),
        np.asarray(origin, dtype=np.float64),
        float(per_m),
        grid_cells,
        cell_shift,
        8**depth,
        spread,
    )
    return out[0], out[1], out[2], out[3], out[4]


def _copy_rows(
    src: Any,
    rows: Any,
    dest: Any,
    out: Any,
    byte_map: Any,
    legacy: Any,
    to_extended: Any,
    rank_to_angle: Any,
    returns_at: int,
) -> Any:
    hist = np.zeros(16, dtype=np.int64)
    s_size = src.shape[1]
    d_size = out.shape[1]
    s_flat, d_flat = src.ravel(), out.ravel()
    for i in range(rows.size):  # flat offsets, one loop over the output bytes: vectorised
        s = rows[i] * s_size  # read in the source's order, written to their places: a few
        d = dest[i] * d_size  # streams of whole cache lines instead of gathers from many
        for b in range(d_size):
            at = byte_map[b]
            d_flat[d + b] = s_flat[s + at] if at >= 0 else 0
        if legacy[0] >= 0:  # format 0-3 -> 6-8: LAS 1.4 R15 tables 7, 8, 15, 16
            bits, raw_class = s_flat[s + legacy[0]], s_flat[s + legacy[1]]
            d_flat[d + legacy[3]] = to_extended[bits]
            d_flat[d + legacy[4]] = (raw_class >> 5) | (bits & 0xC0)
            d_flat[d + legacy[5]] = raw_class & 0x1F
            angle = np.int64(rank_to_angle[s_flat[s + legacy[2]]]) & 0xFFFF
            d_flat[d + legacy[6]] = np.uint8(angle & 0xFF)
            d_flat[d + legacy[6] + 1] = np.uint8(angle >> 8)
        hist[d_flat[d + returns_at] & 0x0F] += 1
    return hist


_copy_rows_jit = _jit(_copy_rows)

# ODM's case, point format 3 (34 bytes) -> 7 (36 bytes), LAS 1.4 R15 tables 7 and 15: X, Y, Z
# and intensity at 0-13 in both, user data at 17, point source id, GPS time and RGB at 18-33 ->
# 20-35; the repacked bit fields at 14-16 -> 14-16 and 18-19. Fixed offsets compile to wide
# moves: 14 ns a point where the byte map takes 35-55.
_RUNS_3_TO_7 = ((0, 0, 14), (17, 17, 1), (18, 20, 16))
_LEGACY_3_TO_7 = (14, 15, 16, 14, 15, 16, 18)


def _copy_3_to_7(
    src: Any, rows: Any, dest: Any, out: Any, to_extended: Any, rank_to_angle: Any
) -> Any:
    hist = np.zeros(16, dtype=np.int64)
    s_flat, d_flat = src.ravel(), out.ravel()
    for i in range(rows.size):
        s = rows[i] * 34
        d = dest[i] * 36
        for b in range(14):
            d_flat[d + b] = s_flat[s + b]
        d_flat[d + 17] = s_flat[s + 17]
        for b in range(16):
            d_flat[d + 20 + b] = s_flat[s + 18 + b]
        bits, raw_class = s_flat[s + 14], s_flat[s + 15]
        returns = to_extended[bits]
        d_flat[d + 14] = returns
        d_flat[d + 15] = (raw_class >> 5) | (bits & 0xC0)
        d_flat[d + 16] = raw_class & 0x1F
        angle = np.int64(rank_to_angle[s_flat[s + 16]]) & 0xFFFF
        d_flat[d + 18] = np.uint8(angle & 0xFF)
        d_flat[d + 19] = np.uint8(angle >> 8)
        hist[returns & 0x0F] += 1
    return hist


_copy_3_to_7_jit = _jit(_copy_3_to_7)


def _is_3_to_7(src_size: int, out_size: int, byte_map: Any, legacy: Any) -> bool:
    """Whether a layout is :data:`_RUNS_3_TO_7`'s (then the fixed-offset copy applies)."""
    if (src_size, out_size) != (34, 36) or tuple(int(v) for v in legacy) != _LEGACY_3_TO_7:
        return False
    want = np.full(36, -1, dtype=np.int64)
    for s_off, d_off, size in _RUNS_3_TO_7:
        want[d_off : d_off + size] = np.arange(s_off, s_off + size)
    return bool(np.array_equal(byte_map, want))


def copy_rows(
    records: NDArray[Any],
    rows: NDArray[np.int64],
    dest: NDArray[np.int64],
    dtype: np.dtype,
    layout: tuple[NDArray[np.int64], NDArray[np.int64]],
    steps: tuple[int, int, int],
    tables: tuple[NDArray[np.uint8], NDArray[np.int16]],
) -> tuple[NDArray[Any], NDArray[np.int64]]:
    """The records ``records[rows]`` put at ``dest`` (``out[dest] = records[rows]``) in the point
    format of ``dtype`` (6-8) with ``X, Y, Z`` moved by ``steps``, in one pass over the bytes;
    and the histogram ``(16,)`` of their return numbers
    (the low four bits of ``bit_fields``).

    Args:
        records: ``(m,)`` point records (any structured dtype).
        rows: ``(n,)`` the rows to take (ascending reads the source once, in order).
        dest: ``(n,)`` the place of each in the output, a permutation of ``0 .. n - 1``.
        dtype: the output records' dtype (point format 6-8, with ``X, Y, Z`` and
            ``bit_fields``).
        layout: ``(byte_map, legacy)`` from :func:`.las_points.record_layout`: the source byte
            of each output byte (-1: zero or repacked) and the source and output offsets of the
            fields repacked from formats 0-3 ``(7,)`` (all -1: none).
        steps: whole steps added to ``X, Y, Z``.
        tables: the format 0-3 ``bit_fields`` byte -> format 6-8 returns byte ``(256,)``, and the
            ``scan_angle_rank`` byte -> ``scan_angle`` ``(256,)``.
    """
    byte_map, legacy = layout
    out = np.empty(rows.size, dtype=dtype)
    src = np.ascontiguousarray(records).view(np.uint8).reshape(records.size, records.dtype.itemsize)
    returns_at = int(dtype.fields["bit_fields"][1]) if dtype.fields else 0
    out_bytes = out.view(np.uint8).reshape(rows.size, dtype.itemsize)
    hist: NDArray[np.int64]
    if _is_3_to_7(src.shape[1], dtype.itemsize, byte_map, legacy):
        hist = _copy_3_to_7_jit(src, rows, dest, out_bytes, tables[0], tables[1])
    else:
        hist = _copy_rows_jit(
            src, rows, dest, out_bytes, byte_map, legacy, tables[0], tables[1], returns_at
        )
    for name, step in zip(("X", "Y", "Z"), steps, strict=True):
        if step:
            out[name] += np.int32(step)
    return out, hist


def _levels_of(keys: Any, depth: int, shape: Any) -> Any:
    max_depth, grid_bits, cell_bits, leaf_points = shape[0], shape[1], shape[2], shape[3]
    n = keys.size
    level = np.full(n, -1, dtype=np.int8)
    alive = np.arange(n)
    spare = np.empty(n, dtype=np.int64)
    take = np.zeros(n, dtype=np.bool_)
    hash_ = np.uint64(0x9E3779B97F4A7C15)  # Fibonacci hashing (Knuth), to pick a point in a cell
    count = n
    for lv in range(max_depth + 1):
        if count == 0:
            break
        if lv == max_depth:
            for j in range(count):
                level[alive[j]] = lv
            break
        node_shift = np.uint64(3 * (grid_bits - lv))
        cell_shift = np.uint64(3 * (grid_bits - cell_bits - lv))
        start = 0
        while start < count:  # one node of this level at a time
            node = keys[alive[start]] >> node_shift
            stop = start + 1
            while stop < count and keys[alive[stop]] >> node_shift == node:
                stop += 1
            leaf = lv >= depth and stop - start <= leaf_points
            for j in range(start, stop):
                take[j] = leaf
            s = start
            while s < stop:  # one sampling cell at a time: its hashed pick
                cell = keys[alive[s]] >> cell_shift
                e = s + 1
                while e < stop and keys[alive[e]] >> cell_shift == cell:
                    e += 1
                take[s + np.int64(((cell * hash_) >> np.uint64(33)) % np.uint64(e - s))] = True
                s = e
            start = stop
        kept = 0
        for j in range(count):
            if take[j]:
                level[alive[j]] = lv
                take[j] = False
            else:
                spare[kept] = alive[j]
                kept += 1
        alive, spare = spare, alive
        count = kept
    return level


_levels_of_jit = _jit(_levels_of)


def levels_of(
    keys: NDArray[np.uint64], depth: int, shape: tuple[int, int, int, int]
) -> NDArray[np.int8]:
    """The octree level ``(n,)`` of each point of one spill cell of ``depth``, whose Morton
    keys ``keys`` ``(n,)`` are sorted ascending (the rule of :func:`.octree.assign_levels`);
    ``shape`` is ``(MAX_DEPTH, GRID_BITS, CELL_BITS, LEAF_POINTS)``."""
    level: NDArray[np.int8] = _levels_of_jit(keys, depth, np.asarray(shape, dtype=np.int64))
    return level


def _level_order(level: Any, by_key: Any, sorted_keys: Any, levels: int) -> Any:
    counts = np.zeros(levels, dtype=np.int64)
    for i in range(level.size):
        counts[level[i]] += 1
    at = np.empty(levels, dtype=np.int64)
    total = 0
    for lv in range(levels):
        at[lv] = total
        total += counts[lv]
    order = np.empty(level.size, dtype=np.int64)
    keys = np.empty(level.size, dtype=np.uint64)
    for i in range(level.size):
        p = at[level[i]]
        at[level[i]] = p + 1
        order[p] = by_key[i]
        keys[p] = sorted_keys[i]
    return order, keys, counts


_level_order_jit = _jit(_level_order)


def level_order(
    level: NDArray[np.int8], by_key: NDArray[np.int64], sorted_keys: NDArray[np.uint64], levels: int
) -> tuple[NDArray[np.int64], NDArray[np.uint64], NDArray[np.int64]]:
    """A cell's points sorted stably by level: ``(by_key[o], sorted_keys[o], counts)`` for
    ``o = np.argsort(level, kind="stable")``, ``counts`` the points per level ``(levels,)``;
    ``level`` (0 .. ``levels - 1``), ``by_key`` and ``sorted_keys`` are ``(n,)``."""
    out: tuple[Any, ...] = _level_order_jit(level, by_key, sorted_keys, levels)
    return out[0], out[1], out[2]


_DIGIT_BITS = 11  # radix digits: 2,048 counters, four passes for a level-2 cell's 39 bits


def _key_order(keys: Any, local_bits: int) -> Any:
    n = keys.size
    mask = np.uint64((1 << local_bits) - 1) if local_bits < 64 else ~np.uint64(0)
    passes = max(1, (local_bits + _DIGIT_BITS - 1) // _DIGIT_BITS)
    digit = np.uint64((1 << _DIGIT_BITS) - 1)
    counts = np.zeros((passes, 1 << _DIGIT_BITS), dtype=np.int64)
    key = np.empty(n, dtype=np.uint64)
    for i in range(n):
        k = keys[i] & mask
        key[i] = k
        for p in range(passes):
            counts[p, np.int64((k >> np.uint64(p * _DIGIT_BITS)) & digit)] += 1
    order = np.arange(n)
    key_b = np.empty(n, dtype=np.uint64)
    order_b = np.empty(n, dtype=np.int64)
    for p in range(passes):  # least significant digit first: each pass stable
        shift = np.uint64(p * _DIGIT_BITS)
        if n == 0 or counts[p, np.int64((key[0] >> shift) & digit)] == n:
            continue  # one digit value only: the order stays
        at = np.empty(1 << _DIGIT_BITS, dtype=np.int64)
        total = 0
        for b in range(1 << _DIGIT_BITS):
            at[b] = total
            total += counts[p, b]
        for i in range(n):
            bucket = np.int64((key[i] >> shift) & digit)
            j = at[bucket]
            at[bucket] = j + 1
            key_b[j] = key[i]
            order_b[j] = order[i]
        key, key_b = key_b, key
        order, order_b = order_b, order
    return order, key


_key_order_jit = _jit(_key_order)


def key_order(
    keys: NDArray[np.uint64], local_bits: int
) -> tuple[NDArray[np.int64], NDArray[np.uint64]]:
    """The stable sort of ``keys`` ``(n,)`` by their low ``local_bits`` bits (a least
    significant digit radix sort): the order ``(n,)`` (``np.argsort(keys & mask,
    kind="stable")``) and those bits of the keys in that order ``(n,)``."""
    out: tuple[Any, ...] = _key_order_jit(keys, local_bits)
    return out[0], out[1]


def warm_up() -> None:
    """Make numba's first call now (its machinery loaded, about 0.5 CPU-s once per process,
    whatever kernel is called first; the kernels themselves then load in about 10 ms each), with
    the argument types :func:`level_order` is called with (no other compilation): the merge calls
    it while the decoding worker decodes the first chunk, so the two overlap."""
    level_order(np.zeros(1, np.int8), np.zeros(1, np.int64), np.zeros(1, np.uint64), 1)
