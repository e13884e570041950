"""Rendering the labelled views onto the orthophoto grid and blending them, tile by tile.

Each orthophoto cell (x, y, z from the DSM) is projected into the cameras labelled near it
(:mod:`.ortho_labels`), sampled bilinearly (``cv2.remap``) and multiplied by the radiometric
correction (:mod:`.ortho_radiometry`). Where the label changes, the views are blended by multi-band
blending (Burt and Adelson, 1983, *A multiresolution spline with application to image mosaics*,
ACM ToG 2(4); OpenCV's ``cv2.detail.MultiBandBlender``): low frequencies are mixed over a wide
band, fine detail over a narrow one, so there is no seamline to see and no ghosting.

The grid is processed in tiles of ``TILE_CELLS`` cells with ``MARGIN_CELLS`` of overlap (more
than the blender's support of ``2 ** BANDS`` cells), so memory is bounded by the tile size and the
result does not depend on the order of anything (deterministic).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
from numpy.typing import NDArray

from prefect_odm.engine.camera import CameraPose
from prefect_odm.engine.dem import HeightSampler
from prefect_odm.engine.footprints import cell_offsets, in_image
from prefect_odm.engine.ortho_radiometry import ImageSource, Radiometry
from prefect_odm.merge.grid import Grid

TILE_CELLS = 1024
"""Orthophoto cells per tile side."""

MARGIN_CELLS = 64
"""Overlap of the tiles, cells (the blender's reach)."""

BANDS = 5
"""Pyramid levels of the multi-band blender (support about ``2 ** BANDS`` cells)."""


@dataclass(frozen=True)
class Tile:
    """One tile: the cells it writes and the padded window it renders (orthophoto rows/cols)."""

    rows: slice
    cols: slice
    pad_rows: slice
    pad_cols: slice


def tiles(grid: Grid, tile: int = TILE_CELLS, margin: int = MARGIN_CELLS) -> Iterator[Tile]:
    """The tiles of ``grid``, row-major."""
    for r0 in range(0, grid.height, tile):
        for c0 in range(0, grid.width, tile):
            r1, c1 = min(grid.height, r0 + tile), min(grid.width, c0 + tile)
            yield Tile(
                slice(r0, r1),
                slice(c0, c1),
                slice(max(0, r0 - margin), min(grid.height, r1 + margin)),
                slice(max(0, c0 - margin), min(grid.width, c1 + margin)),
            )


def render_view(
    camera: CameraPose,
    image: NDArray[np.uint8],
    grid: Grid,
    rows: slice,
    cols: slice,
    z: NDArray[np.float32],
    *,
    image_scale: float = 1.0,
) -> tuple[NDArray[np.float32], NDArray[np.float32], NDArray[np.float32], NDArray[np.bool_]]:
    """One camera's view of the window ``rows, cols`` of ``grid``, bilinear.

    Args:
        camera: the camera.
        image: its image, ``(rows, cols, 3)`` uint8, at ``image_scale`` times the camera's size.
        grid: the orthophoto grid.
        rows, cols: the window.
        z: surface heights of the window's cells, metres, ``(window rows, window cols)``.
        image_scale: size of ``image`` over the camera's (a downsampled copy: < 1).

    Returns:
        ``(colour (rows, cols, 3) float32 DN, u, v (pixels of the camera), inside the image)``.
    """
    import cv2

    r = np.arange(rows.start, rows.stop, dtype=np.float32)[:, None]
    c = np.arange(cols.start, cols.stop, dtype=np.float32)[None, :]
    dx, dy = cell_offsets(camera, grid, r, c)
    dz = (z - np.float32(camera.center[2])).astype(np.float32)
    u, v, depth = camera.project_offsets(
        np.broadcast_to(dx, dz.shape), np.broadcast_to(dy, dz.shape), dz
    )
    inside = in_image(camera, u, v, depth)
    s = np.float32(image_scale)
    map_u = np.where(inside, u * s - 0.5, -1.0).astype(np.float32)
    map_v = np.where(inside, v * s - 0.5, -1.0).astype(np.float32)
    colour = cv2.remap(image, map_u, map_v, cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE)
    return colour.astype(np.float32), u, v, inside


def _bbox(mask: NDArray[np.bool_], margin: int) -> tuple[slice, slice]:
    rows = np.flatnonzero(mask.any(axis=1))
    cols = np.flatnonzero(mask.any(axis=0))
    return (
        slice(max(0, int(rows[0]) - margin), min(mask.shape[0], int(rows[-1]) + 1 + margin)),
        slice(max(0, int(cols[0]) - margin), min(mask.shape[1], int(cols[-1]) + 1 + margin)),
    )


def blend_tile(
    tile: Tile,
    grid: Grid,
    labels: NDArray[np.int32],
    height_at: HeightSampler,
    cameras: tuple[CameraPose, ...],
    source: ImageSource,
    radiometry: Radiometry,
) -> NDArray[np.uint8]:
    """The RGBA orthophoto of one tile, ``(4, rows, cols)`` uint8 (alpha 0 where unlabelled).

    Args:
        tile: the tile.
        grid: the orthophoto grid.
        labels: camera index per orthophoto cell of the tile's padded window, int32, -1 none.
        height_at: ``(rows, cols) -> z`` of orthophoto cells, metres.
        cameras: the posed cameras (indexed by ``labels``).
        source: loads a camera's image.
        radiometry: the exposure and vignetting correction.
    """
    import cv2

    pr, pc = tile.pad_rows, tile.pad_cols
    shape = (pr.stop - pr.start, pc.stop - pc.start)
    out = np.zeros(
        (4, tile.rows.stop - tile.rows.start, tile.cols.stop - tile.cols.start), np.uint8
    )
    used = [int(i) for i in np.unique(labels) if i >= 0]
    if not used:
        return out
    rr, cc = np.meshgrid(np.arange(pr.start, pr.stop), np.arange(pc.start, pc.stop), indexing="ij")
    z = np.asarray(height_at(rr.ravel(), cc.ravel()), dtype=np.float32).reshape(shape)
    bands = max(1, min(BANDS, int(np.log2(max(2, MARGIN_CELLS)))))
    blender = cv2.detail.MultiBandBlender(0, bands)
    blender.prepare((0, 0, shape[1], shape[0]))
    for index in used:
        camera = cameras[index]
        mask = labels == index
        wr, wc = _bbox(mask, MARGIN_CELLS)
        window_rows = slice(pr.start + wr.start, pr.start + wr.stop)
        window_cols = slice(pc.start + wc.start, pc.start + wc.stop)
        colour, u, v, inside = render_view(
            camera, source(camera), grid, window_rows, window_cols, z[wr, wc]
        )
        colour *= radiometry.factor(index, camera, u, v)
        feed_mask = (mask[wr, wc] & inside).astype(np.uint8) * 255
        image16 = np.clip(np.rint(colour), 0, 255).astype(np.int16)
        blender.feed(image16, feed_mask, (wc.start, wr.start))
    blended, blended_mask = cast(Any, blender).blend(None, None)
    inner = (
        slice(tile.rows.start - pr.start, tile.rows.stop - pr.start),
        slice(tile.cols.start - pc.start, tile.cols.stop - pc.start),
    )
    rgb = np.clip(blended[inner], 0, 255).astype(np.uint8)
    out[:3] = np.moveaxis(rgb, -1, 0)
    out[3] = np.where((labels[inner] >= 0) & (blended_mask[inner] > 0), 255, 0).astype(np.uint8)
    out[:3] *= (out[3] > 0).astype(np.uint8)[None]
    return out


def load_rgb(path: Path) -> NDArray[np.uint8]:
    """An image file as ``(rows, cols, 3)`` uint8 RGB."""
    from PIL import Image

    with Image.open(path) as image:
        return np.asarray(image.convert("RGB"))
