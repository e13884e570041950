"""The COPC octree of a point cloud, built one spill cell at a time (pure numpy, no I/O).

The octree is a cube over the cloud (:class:`OctreeCube`); each point gets integer grid coordinates
of :data:`GRID_BITS` bits per axis and their Morton (z-order) key, so that every node and every
sampling cell of every level is one contiguous run of keys once a cell's points are sorted.

Levels are filled top-down. A node at level ``l`` keeps one point of every occupied sampling cell
(:data:`CELLS_PER_NODE_SIDE` cells per node side, COPC's ``spacing``: node width / 128), chosen
pseudo-randomly within the cell from a hash of the cell's key (Untwine keeps a random point per
cell, PotreeConverter the first; both are random with respect to the ground). A node whose
remaining points number at most :data:`LEAF_POINTS` keeps them all and has no children; level
:data:`MAX_DEPTH` keeps everything left. Every point lands in exactly one node.

The cloud is cut into *spill cells*, the nodes of one depth ``d`` (:func:`spill_depth`), which are
built independently: a sampling cell of any level lies inside one spill cell, so the picks of the
levels above ``d`` are made inside each spill cell too and gathered per ancestor node
(:class:`CellBuild`). Those ancestors never end as leaves (their counts span many cells), which
only makes them hold one point per sampling cell. Sources: the COPC 1.0 specification
(https://copc.io), Untwine's bottom-up build (hobuinc/untwine, ``bu/Processor.cpp``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from prefect_odm.merge.point_kernels import key_order, level_order, levels_of

GRID_BITS = 15
"""Bits per axis of a point's grid coordinates: level 8 nodes are 2**7 cells wide."""
CELL_BITS = 7
CELLS_PER_NODE_SIDE = 2**CELL_BITS
"""Sampling cells per node side (COPC viewers expect about 128: spacing = node width / 128)."""
MAX_DEPTH = GRID_BITS - CELL_BITS
"""Deepest octree level (8); every point not kept above lands in a node of this level."""
LEAF_POINTS = 50_000
"""A node whose remaining points number at most this many keeps them all (no children); on
brighton (940,393 points) 50,000 gives 65 nodes, a 10 m box reading 28 % of the file (20,000:
149 nodes, 22 %, a 7 % larger file)."""
CELL_POINTS = 2_000_000
"""Points of a spill cell built in memory at once (about 110 bytes each at the peak)."""

NodeKey = tuple[int, int, int, int]
"""A COPC voxel key ``(level, x, y, z)``; the root is ``(0, 0, 0, 0)``."""


@dataclass(frozen=True)
class OctreeCube:
    """The octree's root cube in the cloud's CRS.

    Attributes:
        origin: ``(x, y, z)`` of the cube's lower corner, CRS units (metres).
        size_m: side of the cube, metres.
    """

    origin: tuple[float, float, float]
    size_m: float

    @classmethod
    def around(cls, mins: NDArray[np.float64], maxs: NDArray[np.float64]) -> OctreeCube:
        """The cube over the bounds ``mins``..``maxs`` (each ``(3,)``, metres), widened by 1 %
        of the largest extent plus 1 m on every side so points on or just past the header
        bounds (rounded, or reprojected from a sample of the edges) still fall inside."""
        lo, hi = np.asarray(mins, dtype=np.float64), np.asarray(maxs, dtype=np.float64)
        pad = 0.01 * float(np.max(hi - lo)) + 1.0
        lo, hi = lo - pad, hi + pad
        size = float(np.max(hi - lo))
        centre = (lo + hi) / 2.0
        origin = centre - size / 2.0
        return cls((float(origin[0]), float(origin[1]), float(origin[2])), size)

    @property
    def centre(self) -> tuple[float, float, float]:
        """The cube's centre ``(x, y, z)`` (COPC info ``center_x`` .. ``center_z``)."""
        h = self.size_m / 2.0
        return (self.origin[0] + h, self.origin[1] + h, self.origin[2] + h)

    def grid(
        self, x: NDArray[np.float64], y: NDArray[np.float64], z: NDArray[np.float64]
    ) -> tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.int64]]:
        """Integer grid coordinates (``0 .. 2**GRID_BITS - 1``) of points, each axis ``(n,)``.

        Raises:
            ValueError: a point lies outside the cube.
        """
        steps = float(2**GRID_BITS) / self.size_m
        out = []
        for values, low in zip((x, y, z), self.origin, strict=True):
            g = np.floor((np.asarray(values, dtype=np.float64) - low) * steps).astype(np.int64)
            if g.size and (int(g.min()) < 0 or int(g.max()) >= 2**GRID_BITS):
                raise ValueError("a point lies outside the octree's cube")
            out.append(g)
        return out[0], out[1], out[2]


def spill_depth(total_points: int) -> int:
    """The depth of the spill cells for a cloud of about ``total_points`` points: the smallest
    whose cells hold at most half of :data:`CELL_POINTS` on average over a flat survey
    (``4**depth`` cells), at most 5. A cell that still holds more is split again."""
    if total_points <= CELL_POINTS // 2:
        return 0
    return min(5, math.ceil(math.log(total_points / (CELL_POINTS / 2), 4)))


def _part1by2(v: NDArray[np.int64]) -> NDArray[np.uint64]:
    """Spread the low 21 bits of ``v`` to every third bit (Morton encoding, one axis)."""
    u = v.astype(np.uint64) & np.uint64(0x1FFFFF)
    for shift, mask in (
        (32, 0x1F00000000FFFF),
        (16, 0x1F0000FF0000FF),
        (8, 0x100F00F00F00F00F),
        (4, 0x10C30C30C30C30C3),
        (2, 0x1249249249249249),
    ):
        u = (u | (u << np.uint64(shift))) & np.uint64(mask)
    return u


def _compact1by2(u: NDArray[np.uint64]) -> NDArray[np.int64]:
    """The inverse of :func:`_part1by2`: every third bit gathered into the low bits."""
    v = u & np.uint64(0x1249249249249249)
    for shift, mask in (
        (2, 0x10C30C30C30C30C3),
        (4, 0x100F00F00F00F00F),
        (8, 0x1F0000FF0000FF),
        (16, 0x1F00000000FFFF),
        (32, 0x1FFFFF),
    ):
        v = (v | (v >> np.uint64(shift))) & np.uint64(mask)
    return v.astype(np.int64)


MORTON_SPREAD = _part1by2(np.arange(256, dtype=np.int64))
"""A byte's bits spread to every third bit (a table, for :func:`morton`)."""
_SPREAD_XYZ = (MORTON_SPREAD << np.uint64(2), MORTON_SPREAD << np.uint64(1), MORTON_SPREAD)


def morton(
    gx: NDArray[np.int64], gy: NDArray[np.int64], gz: NDArray[np.int64]
) -> NDArray[np.uint64]:
    """Morton keys ``(n,)`` of grid coordinates (x in the highest of each three bits), by
    table, a byte of each axis at a time (``GRID_BITS`` at most 16) (the same keys as :func:`_part1by2` on each axis)."""
    tx, ty, tz = _SPREAD_XYZ
    gx, gy, gz = np.asarray(gx), np.asarray(gy), np.asarray(gz)
    low = tx[gx & 0xFF] | ty[gy & 0xFF] | tz[gz & 0xFF]
    high = tx[gx >> 8] | ty[gy >> 8] | tz[gz >> 8]  # GRID_BITS <= 16: one byte more
    keys: NDArray[np.uint64] = low | (high << np.uint64(24))
    return keys


def node_of(key: np.uint64 | int, level: int) -> NodeKey:
    """The voxel key of the level-``level`` node holding the point of Morton key ``key``."""
    prefix = np.array([key], dtype=np.uint64) >> np.uint64(3 * (GRID_BITS - level))
    x = _compact1by2(prefix >> np.uint64(2))[0]
    y = _compact1by2(prefix >> np.uint64(1))[0]
    z = _compact1by2(prefix)[0]
    return (level, int(x), int(y), int(z))


def _runs(values: NDArray[np.uint64]) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """Starts and lengths of the runs of equal values of a sorted array."""
    starts = np.flatnonzero(np.r_[True, values[1:] != values[:-1]])
    lengths = np.diff(np.r_[starts, values.size])
    return starts, lengths


def assign_levels(keys: NDArray[np.uint64], depth: int) -> NDArray[np.int8]:
    """The octree level of every point of one spill cell (the rule of the module docstring).

    Args:
        keys: ``(n,)`` Morton keys of the cell's points, sorted ascending.
        depth: the spill cell's level; nodes above it are never leaves.

    Returns:
        ``(n,)`` levels, 0 .. :data:`MAX_DEPTH`, in the order of ``keys``.
    """
    return levels_of(keys, depth, (MAX_DEPTH, GRID_BITS, CELL_BITS, LEAF_POINTS))


@dataclass(frozen=True)
class CellBuild:
    """How one spill cell's points are placed: an order and the nodes over it.

    Attributes:
        order: ``(n,)`` permutation of the cell's points (as given) into node order.
        nodes: ``(key, start, stop)`` of each node at or below the cell's depth: its points are
            ``order[start:stop]``; complete (no other cell adds to them).
        ancestors: the same for the picks of the levels above the cell's depth, each keyed by
            the ancestor node they belong to (other cells add picks to the same ancestors).
    """

    order: NDArray[np.int64]
    nodes: tuple[tuple[NodeKey, int, int], ...]
    ancestors: tuple[tuple[NodeKey, int, int], ...]


def _key_order(
    keys: NDArray[np.uint64], depth: int
) -> tuple[NDArray[np.int64], NDArray[np.uint64]]:
    """The stable sort order of ``keys`` (all in one cell of ``depth``) and the sorted keys: a
    radix sort of their cell-local bits (:func:`.point_kernels.key_order`), the cell's prefix
    put back."""
    if keys.size == 0:
        return np.zeros(0, dtype=np.int64), keys.copy()
    local_bits = 3 * (GRID_BITS - depth)
    order, local = key_order(keys, local_bits)
    prefix = (keys[0] >> np.uint64(local_bits)) << np.uint64(local_bits)
    return order, local | prefix


def build_cell(keys: NDArray[np.uint64], depth: int) -> CellBuild:
    """Place the points of one spill cell into octree nodes.

    Args:
        keys: ``(n,)`` Morton keys of the cell's points, in the order they were streamed
            (ties are broken by that order, so the result does not depend on the sort used).
        depth: the level of the spill cell (all its points share its key prefix).

    Returns:
        The :class:`CellBuild`; every point is in exactly one node or ancestor run.
    """
    by_key, sorted_keys = _key_order(keys, depth)
    level = assign_levels(sorted_keys, depth)
    order, keys_out, counts = level_order(level, by_key, sorted_keys, MAX_DEPTH + 1)
    levels = np.repeat(np.arange(MAX_DEPTH + 1, dtype=np.int8), counts)  # level, sorted
    nodes: list[tuple[NodeKey, int, int]] = []
    ancestors: list[tuple[NodeKey, int, int]] = []
    lv_starts, lv_len = _runs(levels.astype(np.uint64))
    for start, length in zip(lv_starts.tolist(), lv_len.tolist(), strict=True):
        lv = int(levels[start])
        span = keys_out[start : start + length]
        if lv < depth:  # one ancestor: the cell lies inside one node of each upper level
            ancestors.append((node_of(span[0], lv), start, start + length))
            continue
        n_starts, n_len = _runs(span >> np.uint64(3 * (GRID_BITS - lv)))
        for s, n in zip(n_starts.tolist(), n_len.tolist(), strict=True):
            nodes.append((node_of(span[s], lv), start + s, start + s + n))
    return CellBuild(order, tuple(nodes), tuple(ancestors))


def cell_of(keys: NDArray[np.uint64], depth: int) -> NDArray[np.uint64]:
    """The spill cell (a Morton prefix, one value per cell of ``depth``) of each key."""
    return keys >> np.uint64(3 * (GRID_BITS - depth))
