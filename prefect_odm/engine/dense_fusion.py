"""Fusion of the stereo pairs' points into one dense cloud (the end of ODM's ``openmvs`` stage).

Algorithm (a per-cell form of the multi-view consistency test of depth-map fusion, e.g. OpenMVS's
``DensifyPointCloud`` or Merrell et al., "Real-Time Visibility-Based Fusion of Depth Maps",
ICCV 2007):

1. Each pair's points are averaged per cell of a fusion grid (``cell_m``, UTM): one height per
   pair and cell.
2. Per cell, the heights of the pairs that agree within ``tolerance_m`` of the median of all
   pairs are kept; a cell is *measured* when at least ``min_pairs`` pairs agree and they are at
   least ``min_agreeing_share`` of the pairs that see the cell, and its height is the median of
   the agreeing pairs. The share is the stability test of Merrell et al.: a height that most of
   the pairs seeing the cell contradict is not kept, however many pairs agree on it. On seneca's
   ploughed, near-textureless fields the matcher scatters. In the cells more than 1 m below
   their surroundings (pits), a median of 11 pairs see the cell and 2 of them agree, 22 %;
   elsewhere the median share is 69 %. A third removes 72 % of the pits and 3.6 % of the other
   cells. Seneca ``--split 50``: DSM p90 in the overlaps after alignment 0.77 / 0.93 / 0.80 ->
   0.51 / 0.37 / 0.39 m (``benchmarks/bench_align.py --survey``), 4-7 % fewer measured cells;
   brighton against ODM's cloud: plane-removed median 0.15 -> 0.11 m, measured share of ODM's
   footprint 87 -> 84 %.
3. Outlier filtering: a measured cell with fewer than ``MIN_MEASURED_NEIGHBOURS`` measured cells
   among its 8 neighbours is dropped (isolated blunders).
4. The dense cloud: every pair point within ``tolerance_m`` of its measured cell's height, with
   its colour; then ``pc-sample`` (ODM: one point per ``pc-sample`` metres; 0 keeps all) keeps
   the first point of each cube of that side (deterministic).

Memory: one record (cell, pair, height) per occupied cell of each pair, sorted once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from prefect_odm.engine.camera import CameraPose, Scene
from prefect_odm.engine.dense import PairPoints, StereoPair, match_pair, select_pairs
from prefect_odm.errors import ProcessingFailedError
from prefect_odm.grid import Grid

logger = logging.getLogger(__name__)

FUSION_TOLERANCE_M = 0.3
"""Pairs agree on a cell when their heights are within this of the cell's median, metres."""

FUSION_MIN_PAIRS = 2
"""A cell is measured when at least this many pairs agree on it."""

FUSION_MIN_AGREEING_SHARE = 1.0 / 3.0
"""... and when they are at least this share of the pairs that see the cell (module docstring)."""

MIN_MEASURED_NEIGHBOURS = 3
"""A measured cell needs this many measured cells among its 8 neighbours to be kept."""


@dataclass(frozen=True)
class FusedCloud:
    """The fused dense cloud and the height per fusion cell.

    Attributes:
        xyz: points, UTM metres, ``(n, 3)`` float64.
        rgb: colours, ``(n, 3)`` uint8.
        heights: fused height per cell of ``grid`` (metres, NaN where not measured), float32,
            ``(grid.height, grid.width)``.
        grid: the fusion grid.
        agreeing_pairs: pairs that agree per cell (0 where not measured), uint8.
    """

    xyz: NDArray[np.float64]
    rgb: NDArray[np.uint8]
    heights: NDArray[np.float32]
    grid: Grid
    agreeing_pairs: NDArray[np.uint8]


def cell_index(xyz: NDArray[np.float64], grid: Grid) -> NDArray[np.int64]:
    """Flat cell index (row * width + col) of each point on ``grid``; -1 outside."""
    col = np.floor((xyz[:, 0] - grid.left) / grid.resolution_m).astype(np.int64)
    row = np.floor((grid.top - xyz[:, 1]) / grid.resolution_m).astype(np.int64)
    inside = (col >= 0) & (col < grid.width) & (row >= 0) & (row < grid.height)
    return np.where(inside, row * grid.width + col, -1)


def _grouped_median(
    groups: NDArray[np.int64], values: NDArray[np.float64]
) -> tuple[NDArray[np.int64], NDArray[np.float64], NDArray[np.int64]]:
    """``(group ids, median per group, count per group)`` (lower/upper middle averaged)."""
    order = np.lexsort((values, groups))
    g, v = groups[order], values[order]
    ids, starts, counts = np.unique(g, return_index=True, return_counts=True)
    lower = v[starts + (counts - 1) // 2]
    upper = v[starts + counts // 2]
    return ids, 0.5 * (lower + upper), counts


def _per_pair_cells(
    pairs: Sequence[PairPoints], grid: Grid
) -> tuple[list[NDArray[np.int64]], NDArray[np.int64], NDArray[np.float64]]:
    """Each pair's point cells, and the records (cell, mean height) of every pair and cell."""
    cells_of_pairs, rec_cells, rec_z = [], [], []
    for points in pairs:
        cells = cell_index(points.xyz, grid)
        cells_of_pairs.append(cells)
        inside = cells >= 0
        ids, inverse = np.unique(cells[inside], return_inverse=True)
        sums = np.bincount(inverse, weights=points.xyz[inside, 2], minlength=len(ids))
        counts = np.bincount(inverse, minlength=len(ids))
        rec_cells.append(ids)
        rec_z.append(sums / np.maximum(counts, 1))
    if not rec_cells:
        return [], np.zeros(0, np.int64), np.zeros(0)
    return cells_of_pairs, np.concatenate(rec_cells), np.concatenate(rec_z)


def _drop_isolated(heights: NDArray[np.float32], min_neighbours: int) -> NDArray[np.float32]:
    from scipy.ndimage import convolve

    measured = np.isfinite(heights)
    kernel = np.ones((3, 3), dtype=np.int32)
    kernel[1, 1] = 0
    neighbours = convolve(measured.astype(np.int32), kernel, mode="constant")
    return np.where(measured & (neighbours >= min_neighbours), heights, np.nan).astype(np.float32)


def sample_points(xyz: NDArray[np.float64], sample_m: float) -> NDArray[np.intp]:
    """Indices of the first point in each cube of side ``sample_m`` (ODM's ``pc-sample``),
    ascending; all indices when ``sample_m <= 0``."""
    if sample_m <= 0 or len(xyz) == 0:
        return np.arange(len(xyz))
    keys = np.floor((xyz - xyz.min(axis=0)) / sample_m).astype(np.int64)
    _, first = np.unique(keys, axis=0, return_index=True)
    return np.sort(first)


def fuse_pairs(
    pairs: Sequence[PairPoints],
    grid: Grid,
    *,
    tolerance_m: float = FUSION_TOLERANCE_M,
    min_pairs: int = FUSION_MIN_PAIRS,
    min_agreeing_share: float = FUSION_MIN_AGREEING_SHARE,
    min_measured_neighbours: int = MIN_MEASURED_NEIGHBOURS,
    sample_m: float = 0.0,
) -> FusedCloud:
    """Fuse the pairs' points on ``grid`` (algorithm in the module docstring).

    Args:
        pairs: the points of each stereo pair (UTM metres).
        grid: the fusion grid (UTM; its cell is the consistency test's cell).
        tolerance_m: the agreement tolerance, metres.
        min_pairs: agreeing pairs needed for a measured cell.
        min_agreeing_share: least share of the pairs seeing a cell that must agree (0 to 1).
        min_measured_neighbours: measured cells among the 8 neighbours a measured cell needs
            (0 keeps every cell the agreement test kept).
        sample_m: ODM's ``pc-sample``, metres (0: keep every consistent point).

    Returns:
        The fused cloud (possibly empty) and the fused heights.
    """
    size = grid.width * grid.height
    cells_of_pairs, rec_cells, rec_z = _per_pair_cells(pairs, grid)
    heights = np.full(size, np.nan, dtype=np.float32)
    agreeing = np.zeros(size, dtype=np.uint8)
    if len(rec_cells):
        ids, median, counts = _grouped_median(rec_cells, rec_z)
        median_of = np.full(size, np.nan)
        median_of[ids] = median
        agree = np.abs(rec_z - median_of[rec_cells]) <= tolerance_m
        ids2, median2, counts2 = _grouped_median(rec_cells[agree], rec_z[agree])
        seeing = np.zeros(size, dtype=np.int64)
        seeing[ids] = counts
        ok = (counts2 >= min_pairs) & (counts2 >= min_agreeing_share * seeing[ids2])
        heights[ids2[ok]] = median2[ok]
        agreeing[ids2[ok]] = np.minimum(counts2[ok], 255)
    heights2d = _drop_isolated(heights.reshape(grid.height, grid.width), min_measured_neighbours)
    agreeing2d = np.where(np.isfinite(heights2d), agreeing.reshape(heights2d.shape), 0)
    flat = heights2d.reshape(-1)
    xyz_parts, rgb_parts = [], []
    for points, cells in zip(pairs, cells_of_pairs, strict=True):
        ref = np.where(cells >= 0, flat[np.maximum(cells, 0)], np.nan)
        keep = np.abs(points.xyz[:, 2] - ref) <= tolerance_m
        xyz_parts.append(points.xyz[keep])
        rgb_parts.append(points.rgb[keep])
    xyz = np.concatenate(xyz_parts) if xyz_parts else np.zeros((0, 3))
    rgb = np.concatenate(rgb_parts) if rgb_parts else np.zeros((0, 3), dtype=np.uint8)
    chosen = sample_points(xyz, sample_m)
    return FusedCloud(xyz[chosen], rgb[chosen], heights2d, grid, agreeing2d.astype(np.uint8))


def _match_job(args: tuple[CameraPose, CameraPose, Path, NDArray[np.float64], float]) -> PairPoints:
    return match_pair(*args)


def densify(
    scene: Scene,
    image_dir: Path,
    grid: Grid,
    *,
    scale: float,
    workers: int,
    sample_m: float = 0.0,
    log: Callable[[str], None] = logger.info,
) -> tuple[FusedCloud, list[StereoPair]]:
    """Dense cloud of a structure-from-motion scene: select pairs, match them in a thread pool
    (``workers`` threads, results in pair order), fuse on ``grid``.

    Args:
        scene: cameras and sparse points (UTM).
        image_dir: folder of the image files.
        grid: the fusion grid (UTM).
        scale: depth-map image scale (:func:`~prefect_odm.plan.depthmaps.depthmap_scale`).
        workers: threads matching pairs at once (>= 1).
        sample_m: ODM's ``pc-sample``, metres.
        log: progress line sink.

    Returns:
        ``(fused cloud, the pairs matched)``.

    Raises:
        ProcessingFailedError: no stereo pair in the scene.
        OSError: an image cannot be read.
    """
    from concurrent.futures import ThreadPoolExecutor

    import cv2

    pairs = select_pairs(scene.cameras, scene.points_xyz)
    if not pairs:
        raise ProcessingFailedError("dense matching: no stereo pair overlaps enough")
    started = time.perf_counter()
    jobs = [
        (scene.cameras[p.first], scene.cameras[p.second], image_dir, scene.points_xyz, scale)
        for p in pairs
    ]
    threads = cv2.getNumThreads()
    cv2.setNumThreads(1)  # parallel over pairs instead: OpenCV releases the GIL while matching
    try:
        with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
            results = list(pool.map(_match_job, jobs))
    finally:
        cv2.setNumThreads(threads)
    matched = sum(len(r.xyz) for r in results)
    log(
        f"Dense matching: {len(pairs)} pairs at image scale {scale:g}, {matched} points "
        f"in {time.perf_counter() - started:.1f} s"
    )
    fused = fuse_pairs(results, grid, sample_m=sample_m)
    measured = int(np.isfinite(fused.heights).sum())
    log(f"Fused {len(fused.xyz)} points; {measured} cells measured by >= 2 agreeing pairs")
    return fused, pairs
