"""Rendering the labelled views onto the orthophoto grid and blending them, tile by tile.

Each orthophoto cell (x, y, z from the DSM) is projected into the cameras labelled near it
(:mod:`.ortho_labels`), sampled bicubically (``cv2.remap``, ``INTER_CUBIC``: bilinear sampling
at the source GSD loses a third of the detail) from the image area-averaged to the orthophoto's
GSD where it is finer (sampling a finer image directly aliases) and multiplied by the radiometric correction (:mod:`.ortho_radiometry`). Where the label changes, the views are blended by multi-band
blending (Burt and Adelson, 1983, *A multiresolution spline with application to image mosaics*,
ACM ToG 2(4); :class:`PyramidBlender`): low frequencies are mixed over a wide
band, fine detail over a narrow one, so there is no seamline to see and no ghosting.

The grid is processed in tiles of ``TILE_CELLS`` cells with ``MARGIN_CELLS`` of overlap (more
than the blender's support of ``2 ** BANDS`` cells), so memory is bounded by the tile size and the
result does not depend on the order of anything (deterministic).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from prefect_odm.engine.camera import CameraPose
from prefect_odm.engine.dem import HeightSampler
from prefect_odm.engine.footprints import cell_offsets, in_image
from prefect_odm.engine.ortho_radiometry import Radiometry
from prefect_odm.grid import Grid

PrefilteredSource = Callable[[CameraPose], tuple[NDArray[np.uint8], float]]
"""Camera -> ``(image, its size over the camera's)`` (:func:`prefiltered`)."""

TILE_CELLS = 1024
"""Orthophoto cells per tile side."""

MARGIN_CELLS = 64
"""Overlap of the tiles, cells (the blender's reach)."""

BANDS = 5
"""Pyramid levels of the multi-band blender (support about ``2 ** BANDS`` cells)."""

FINE_BAND_SIGMA_CELLS = 0.5
"""Gaussian blur of each view's mask for the finest band, cells."""

PREFILTER_BELOW = 0.7
"""Images whose GSD is below this fraction of the orthophoto's are area-averaged first (a milder
downsampling keeps more detail sampled directly: brighton, 0.83, sharpness 2.04 vs 0.70 prefiltered
of the area-averaged source)."""


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
    """One camera's view of the window ``rows, cols`` of ``grid``, bicubic.

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
    colour = cv2.remap(image, map_u, map_v, cv2.INTER_CUBIC, borderMode=cv2.BORDER_REPLICATE)
    return colour.astype(np.float32), u, v, inside


class PyramidBlender:
    """Multi-band blending in float32 with Laplacian pyramids (Burt and Adelson, 1983).

    Each view adds its Laplacian pyramid weighted by the Gaussian pyramid of its mask; the
    blended levels are the weighted means, collapsed at the end. Views are fed as windows whose
    corner is a multiple of ``2 ** bands`` cells, so every level of a window lines up with the
    accumulators. Exact: one view with a full mask comes back unchanged (to float rounding),
    unlike OpenCV's ``MultiBandBlender``, whose int16 pyramids lose 1-3 DN.
    """

    def __init__(self, shape: tuple[int, int], bands: int) -> None:
        """Zeroed accumulators for a ``shape`` ``(rows, cols)`` mosaic and ``bands`` pyramid
        levels below it."""
        self.bands = bands
        self.shapes = [shape]
        for _ in range(bands):
            rows, cols = self.shapes[-1]
            self.shapes.append(((rows + 1) // 2, (cols + 1) // 2))
        self.num = [np.zeros((*s, 3), np.float32) for s in self.shapes]
        self.den = [np.zeros(s, np.float32) for s in self.shapes]

    @property
    def align(self) -> int:
        """Window corners must be multiples of this many cells."""
        return int(2**self.bands)

    def feed(
        self, image: NDArray[np.float32], mask: NDArray[np.float32], row: int, col: int
    ) -> None:
        """Add a view: ``image (rows, cols, 3)`` and its weight ``mask (rows, cols)`` in 0..1,
        placed at ``(row, col)`` (multiples of :attr:`align`)."""
        import cv2

        # the finest band too is mixed over a few cells (a hard cut shows misregistered detail)
        gauss = [image]
        weights = [np.asarray(cv2.GaussianBlur(mask, (0, 0), FINE_BAND_SIGMA_CELLS), np.float32)]
        for _ in range(self.bands):
            gauss.append(np.asarray(cv2.pyrDown(gauss[-1]), dtype=np.float32))
            weights.append(np.asarray(cv2.pyrDown(weights[-1]), dtype=np.float32))
        for level in range(self.bands + 1):
            g = gauss[level]
            if level < self.bands:
                up = cv2.pyrUp(gauss[level + 1], dstsize=(g.shape[1], g.shape[0]))
                lap = g - up
            else:
                lap = g
            r0, c0 = row >> level, col >> level
            rows, cols = self.shapes[level]
            h, w = min(lap.shape[0], rows - r0), min(lap.shape[1], cols - c0)
            weight = weights[level][:h, :w]
            self.num[level][r0 : r0 + h, c0 : c0 + w] += lap[:h, :w] * weight[..., None]
            self.den[level][r0 : r0 + h, c0 : c0 + w] += weight

    def blend(self) -> NDArray[np.float32]:
        """The blended image, ``(rows, cols, 3)`` float32."""
        import cv2

        out: NDArray[np.float32] | None = None
        for level in range(self.bands, -1, -1):
            den = self.den[level][..., None]
            band = np.where(den > 1e-6, self.num[level] / np.maximum(den, 1e-6), 0.0)
            if out is None:
                out = band.astype(np.float32)
            else:
                rows, cols = self.shapes[level]
                out = np.asarray(cv2.pyrUp(out, dstsize=(cols, rows)) + band, np.float32)
        assert out is not None
        return np.asarray(out, dtype=np.float32)


def _bbox(mask: NDArray[np.bool_], margin: int) -> tuple[slice, slice]:
    rows = np.flatnonzero(mask.any(axis=1))
    cols = np.flatnonzero(mask.any(axis=0))
    return (
        slice(max(0, int(rows[0]) - margin), min(mask.shape[0], int(rows[-1]) + 1 + margin)),
        slice(max(0, int(cols[0]) - margin), min(mask.shape[1], int(cols[-1]) + 1 + margin)),
    )


def prefiltered(
    camera: CameraPose, image: NDArray[np.uint8], grid: Grid, z_m: float
) -> tuple[NDArray[np.uint8], float]:
    """The image area-averaged to about the orthophoto's GSD when finer (against aliasing),
    and its scale to the camera's size."""
    import cv2

    gsd_m = max(camera.center[2] - z_m, 1e-3) / camera.focal_px
    scale = gsd_m / grid.resolution_m
    if scale >= PREFILTER_BELOW:
        return image, 1.0
    small = cv2.resize(image, None, fx=scale, fy=scale, interpolation=cv2.INTER_AREA)
    return np.asarray(small, dtype=np.uint8), small.shape[1] / image.shape[1]


def blend_tile(
    tile: Tile,
    grid: Grid,
    labels: NDArray[np.int32],
    height_at: HeightSampler,
    cameras: tuple[CameraPose, ...],
    source: PrefilteredSource,
    radiometry: Radiometry,
) -> NDArray[np.uint8]:
    """The RGBA orthophoto of one tile, ``(4, rows, cols)`` uint8 (alpha 0 where unlabelled).

    Args:
        tile: the tile.
        grid: the orthophoto grid.
        labels: camera index per orthophoto cell of the tile's padded window, int32, -1 none.
        height_at: ``(rows, cols) -> z`` of orthophoto cells, metres.
        cameras: the posed cameras (indexed by ``labels``).
        source: a camera's image, prefiltered (:func:`prefiltered`), and its scale.
        radiometry: the exposure and vignetting correction.
    """
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
    blender = PyramidBlender(shape, BANDS)
    a = blender.align
    for index in used:
        camera = cameras[index]
        mask = labels == index
        wr, wc = _bbox(mask, MARGIN_CELLS)
        # window corners on the pyramid's alignment
        wr = slice(wr.start - wr.start % a, wr.stop)
        wc = slice(wc.start - wc.start % a, wc.stop)
        window_rows = slice(pr.start + wr.start, pr.start + wr.stop)
        window_cols = slice(pc.start + wc.start, pc.start + wc.stop)
        image, scale = source(camera)
        colour, u, v, inside = render_view(
            camera, image, grid, window_rows, window_cols, z[wr, wc], image_scale=scale
        )
        colour *= radiometry.factor(index, camera, u, v)
        blender.feed(colour, (mask[wr, wc] & inside).astype(np.float32), wr.start, wc.start)
    blended = blender.blend()
    blended_mask = blender.den[0]
    inner = (
        slice(tile.rows.start - pr.start, tile.rows.stop - pr.start),
        slice(tile.cols.start - pc.start, tile.cols.stop - pc.start),
    )
    rgb = np.clip(np.rint(blended[inner]), 0, 255).astype(np.uint8)
    out[:3] = np.moveaxis(rgb, -1, 0)
    out[3] = np.where((labels[inner] >= 0) & (blended_mask[inner] > 0), 255, 0).astype(np.uint8)
    out[:3] *= (out[3] > 0).astype(np.uint8)[None]
    return out


def load_rgb(path: Path) -> NDArray[np.uint8]:
    """An image file as ``(rows, cols, 3)`` uint8 RGB."""
    from PIL import Image

    try:
        with Image.open(path) as image:
            return np.asarray(image.convert("RGB"))
    except (OSError, SyntaxError, ValueError) as exc:  # Pillow's errors never name the file
        raise OSError(f"{path.name}: cannot decode the image ({exc})") from exc
