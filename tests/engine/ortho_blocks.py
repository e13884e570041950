"""The built-in engine's first orthophoto renderer, kept (out of the library) as the named
baseline of ``test_orthophoto.py`` and ``benchmarks/bench_orthophoto.py``.

For every ground cell, the camera whose image holds the cell nearest to its centre is chosen
(decided on blocks of ``SELECTION_BLOCK`` x ``SELECTION_BLOCK`` cells), the cell (x, y, z from the
surface) is projected into that image and its colour sampled bilinearly; alpha 0 where no image
sees the cell. No occlusion test (not a true orthophoto).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from prefect_odm.engine.camera import Scene
from prefect_odm.engine.dem import HeightSampler
from prefect_odm.engine.footprints import camera_window, cell_offsets, in_image
from prefect_odm.engine.ortho_blend import load_rgb
from prefect_odm.grid import Grid

logger = logging.getLogger(__name__)

SELECTION_BLOCK = 16
"""Orthophoto cells per block side when choosing the best camera."""


def _bilinear(
    image: NDArray[np.uint8], u: NDArray[np.floating], v: NDArray[np.floating]
) -> NDArray[np.uint8]:
    """Sample ``image`` (rows, cols, 3) at continuous pixel coordinates (COLMAP convention:
    pixel centres at integer + 0.5), bilinearly; returns ``(n, 3)`` uint8.

    The three channels are packed into one uint32 per pixel so each corner is one 1-D gather.
    """
    h, w = image.shape[:2]
    packed = (
        image[..., 0].astype(np.uint32)
        | (image[..., 1].astype(np.uint32) << 8)
        | (image[..., 2].astype(np.uint32) << 16)
    ).ravel()
    x = np.clip(u - 0.5, 0, w - 1.001).astype(np.float32)
    y = np.clip(v - 0.5, 0, h - 1.001).astype(np.float32)
    x0 = x.astype(np.int32)
    y0 = y.astype(np.int32)
    fx = x - x0
    fy = y - y0
    i00 = y0 * np.int32(w) + x0
    corners = (packed[i00], packed[i00 + 1], packed[i00 + w], packed[i00 + w + 1])
    weights = ((1 - fx) * (1 - fy), fx * (1 - fy), (1 - fx) * fy, fx * fy)
    out = np.empty((len(x), 3), dtype=np.uint8)
    for band in range(3):
        shift = np.uint32(8 * band)
        total = np.full(len(x), 0.5, dtype=np.float32)
        for corner, weight in zip(corners, weights, strict=True):
            total += ((corner >> shift) & np.uint32(255)).astype(np.float32) * weight
        out[:, band] = total.astype(np.uint8)
    return out


def best_cameras(scene: Scene, grid: Grid, height_at: HeightSampler) -> NDArray[np.int32]:
    """The camera that colours each block of ``SELECTION_BLOCK`` x ``SELECTION_BLOCK`` cells.

    A camera sees a block when the block centre (at the surface height) projects within about
    half a block of its image; among those, the one whose image holds the centre nearest its
    principal point wins, and a camera holding the centre itself always beats one that only
    grazes it.

    Args:
        scene: posed cameras.
        grid: the orthophoto grid.
        height_at: ``(rows, cols) -> z`` of orthophoto cells in metres (the surface).

    Returns:
        Camera index per block (-1: no camera), int32, shape
        ``(ceil(grid.height / SELECTION_BLOCK), ceil(grid.width / SELECTION_BLOCK))``.
    """
    block = SELECTION_BLOCK
    brows = -(-grid.height // block)
    bcols = -(-grid.width // block)
    # block centres, in orthophoto cell indices
    crow = np.minimum(np.arange(brows) * block + block // 2, grid.height - 1)
    ccol = np.minimum(np.arange(bcols) * block + block // 2, grid.width - 1)
    rr, cc = np.meshgrid(crow, ccol, indexing="ij")
    bx = grid.left + (cc + 0.5) * grid.resolution_m
    by = grid.top - (rr + 0.5) * grid.resolution_m
    bz = height_at(rr.ravel(), cc.ravel()).reshape(rr.shape)
    best = np.full(rr.shape, -1, dtype=np.int32)
    best_score = np.full(rr.shape, np.inf)
    block_grid = Grid(grid.left, grid.top, grid.resolution_m * block, bcols, brows)
    z_low, z_high, z_mid = float(bz.min()), float(bz.max()), float(np.median(bz))
    for index, camera in enumerate(scene.cameras):
        window = camera_window(camera, block_grid, z_low, z_high)
        if window is None:
            continue
        u, v, depth = camera.project(bx[window], by[window], bz[window])
        # a block counts as seen when its centre is within half a block of the image
        gsd = max((camera.center[2] - z_mid) / camera.focal_px, 1e-3)
        margin = 0.75 * block * grid.resolution_m / gsd
        seen = in_image(camera, u, v, depth, margin)
        score = np.hypot((u - camera.cx) / camera.width, (v - camera.cy) / camera.height)
        # a camera that holds the block centre itself always beats one that only grazes it
        score = np.where(in_image(camera, u, v, depth), score, score + 10.0)
        better = seen & (score < best_score[window])
        best[window][better] = index
        best_score[window][better] = score[better]
    return best


def _block_cells(
    brow: NDArray[np.integer[Any]], bcol: NDArray[np.integer[Any]], grid: Grid
) -> tuple[NDArray[np.int32], NDArray[np.int32]]:
    """Rows and columns (flat, int32) of every grid cell in the blocks ``(brow, bcol)``."""
    block = SELECTION_BLOCK
    offsets = np.arange(block, dtype=np.int32)
    shape = (brow.size, block, block)
    rows = np.broadcast_to(
        (brow.astype(np.int32) * block)[:, None, None] + offsets[None, :, None], shape
    ).ravel()
    cols = np.broadcast_to(
        (bcol.astype(np.int32) * block)[:, None, None] + offsets[None, None, :], shape
    ).ravel()
    keep = (rows < grid.height) & (cols < grid.width)
    if not keep.all():
        rows, cols = rows[keep], cols[keep]
    return rows, cols


def render_orthophoto_blocks(
    scene: Scene,
    image_dir: Path,
    grid: Grid,
    height_at: HeightSampler,
    *,
    log: Callable[[str], None] = logger.info,
) -> NDArray[np.uint8]:
    """Colour every cell of ``grid`` from the best camera of its block (see the module
    docstring); arguments and result as :func:`.orthophoto.render_orthophoto`'s."""
    best = best_cameras(scene, grid, height_at)
    rgba = np.zeros((4, grid.height, grid.width), dtype=np.uint8)
    used = 0
    for index, camera in enumerate(scene.cameras):
        brow, bcol = np.nonzero(best == index)
        if brow.size == 0:
            continue
        used += 1
        rows, cols = _block_cells(brow, bcol, grid)
        dx, dy = cell_offsets(camera, grid, rows.astype(np.float32), cols.astype(np.float32))
        dz = (height_at(rows, cols) - camera.center[2]).astype(np.float32)
        u, v, depth = camera.project_offsets(dx, dy, dz)
        seen = in_image(camera, u, v, depth)
        if not seen.any():
            continue
        image = load_rgb(image_dir / camera.name)
        colour = _bilinear(image, u[seen], v[seen])
        flat = rows[seen].astype(np.intp) * grid.width + cols[seen]
        for band in range(3):
            rgba[band].reshape(-1)[flat] = colour[:, band]
        rgba[3].reshape(-1)[flat] = 255
    log(
        f"Orthophoto {grid.width}x{grid.height} cells at {grid.resolution_m * 100:.1f} cm "
        f"from {used} images"
    )
    return rgba
