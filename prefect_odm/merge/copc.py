"""Write a LAS/LAZ point cloud as COPC (Cloud Optimized Point Cloud, LAZ 1.4 with an octree).

A COPC file is one LAZ 1.4 file whose points are grouped into the nodes of an octree, each node a
separately compressed chunk listed in a hierarchy, so a viewer (QGIS, Potree 2, a browser) or laspy's
``CopcReader`` reads only the nodes that intersect its query by range request. Source: the COPC 1.0
specification (https://copc.io) and the first-point-per-cell sampling of Untwine / PotreeConverter.
"""

from __future__ import annotations

from pathlib import Path

import copclib
import laspy
import numpy as np
import numpy.typing as npt

from prefect_odm.errors import MergeError

#: Sampling cells per node side (COPC viewers expect about 128: spacing = node width / 128).
CELLS_PER_NODE_SIDE = 128
#: Deepest octree level; every point not sampled above lands in a node of this level.
MAX_DEPTH = 8
#: A level whose remaining points fit in this many per node is the last one.
LEAF_POINTS = 100_000

#: COPC allows point formats 6, 7 and 8 only: ODM's format 3 (RGB) becomes 7, 2 becomes 7, 0/1 become 6.
_COPC_FORMAT = {0: 6, 1: 6, 2: 7, 3: 7, 6: 6, 7: 7, 8: 8}


def _node_levels(
    scaled_xyz: npt.NDArray[np.float64], cube_min: npt.NDArray[np.float64], cube_size_m: float
) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.int64]]:
    """Assign every point its octree level by first-point-per-cell sampling.

    Args:
        scaled_xyz: (N, 3) coordinates in the file CRS, metres.
        cube_min: (3,) lower corner of the root cube, metres.
        cube_size_m: side of the root cube, metres.

    Returns:
        (levels (N,), cell indices (N, 3) of each point's node at its level).
    """
    n = scaled_xyz.shape[0]
    levels = np.full(n, -1, dtype=np.int32)
    unit = (scaled_xyz - cube_min) / cube_size_m  # in [0, 1]
    remaining = np.arange(n)
    for level in range(MAX_DEPTH + 1):
        nodes_per_side = 2**level
        last = level == MAX_DEPTH or remaining.size <= LEAF_POINTS * max(1, nodes_per_side)
        if last:
            levels[remaining] = level
            break
        cells_per_side = CELLS_PER_NODE_SIDE * nodes_per_side
        cell = np.minimum((unit[remaining] * cells_per_side).astype(np.int64), cells_per_side - 1)
        cell_id = (cell[:, 0] * cells_per_side + cell[:, 1]) * cells_per_side + cell[:, 2]
        _, first = np.unique(cell_id, return_index=True)
        taken = remaining[first]
        levels[taken] = level
        keep = np.ones(remaining.size, dtype=bool)
        keep[first] = False
        remaining = remaining[keep]
    node_cells = np.minimum(
        (unit * (2 ** levels.astype(np.int64))[:, None]).astype(np.int64),
        (2 ** levels.astype(np.int64))[:, None] - 1,
    )
    return levels, node_cells


def write_copc(source: Path, destination: Path) -> int:
    """Write the points of a LAS/LAZ file as a COPC file.

    Point format 3 (ODM's: RGB) is written as COPC format 7 (RGB kept), 0/1/2 as 6/7; classification,
    intensity, returns and GPS time are carried over. The whole cloud is held in memory (36 bytes per
    point at format 7 plus ~40 bytes of indices): about 0.3 GiB for 4 M points.

    Args:
        source: LAS/LAZ file, any point format laspy reads.
        destination: the ``.copc.laz`` file to write; written to a temporary name and renamed.

    Returns:
        The number of points written (equal to the source's).

    Raises:
        MergeError: the source has no points or a point format COPC cannot hold.
    """
    las = laspy.read(str(source))
    fmt = las.header.point_format.id
    if fmt not in _COPC_FORMAT:
        raise MergeError(
            f"{source}: point format {fmt} cannot be written as COPC (formats 0-3, 6-8)"
        )
    n = len(las.points)
    if n == 0:
        raise MergeError(f"{source}: no points to write as COPC")
    target_fmt = _COPC_FORMAT[fmt]
    if fmt != target_fmt:
        las = laspy.convert(las, point_format_id=target_fmt, file_version="1.4")
    xyz = np.column_stack([np.asarray(las.x), np.asarray(las.y), np.asarray(las.z)])
    lo, hi = xyz.min(axis=0), xyz.max(axis=0)
    size_m = float(max(hi - lo)) or 1.0
    size_m *= 1.0 + 1e-9
    levels, cells = _node_levels(xyz, lo, size_m)
    order = np.lexsort((cells[:, 2], cells[:, 1], cells[:, 0], levels))
    keys = np.column_stack([levels[order], cells[order]])
    starts = np.flatnonzero(np.r_[True, np.any(keys[1:] != keys[:-1], axis=1)])
    ends = np.r_[starts[1:], n]
    raw = las.points.array[order]

    scale = las.header.scales
    offset = las.header.offsets
    wkt = ""
    crs = las.header.parse_crs()
    if crs is not None:
        wkt = crs.to_wkt()
    config = copclib.CopcConfigWriter(
        target_fmt,
        copclib.Vector3(*[float(v) for v in scale]),
        copclib.Vector3(*[float(v) for v in offset]),
        wkt,
    )
    config.las_header.min = copclib.Vector3(*[float(v) for v in lo])
    config.las_header.max = copclib.Vector3(*[float(v) for v in hi])
    half = size_m / 2.0
    centre = lo + half
    config.copc_info.center_x, config.copc_info.center_y, config.copc_info.center_z = (
        float(centre[0]),
        float(centre[1]),
        float(centre[2]),
    )
    config.copc_info.halfsize = half
    config.copc_info.spacing = size_m / CELLS_PER_NODE_SIDE
    destination.parent.mkdir(parents=True, exist_ok=True)
    partial = destination.with_name(destination.name + ".partial")
    writer = copclib.FileWriter(str(partial), config)
    try:
        for start, end in zip(starts, ends, strict=True):
            level, ix, iy, iz = (int(v) for v in keys[start])
            chunk = raw[start:end].tobytes()
            writer.AddNode(
                copclib.VoxelKey(level, ix, iy, iz),
                copclib.VectorChar(np.frombuffer(chunk, dtype=np.int8)),
            )
    finally:
        writer.Close()
    partial.replace(destination)
    return n
