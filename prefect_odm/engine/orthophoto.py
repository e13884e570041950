"""The built-in engine's orthophoto on the DSM, seamless, and the direct method's points
coloured from it.

Steps (each in its own module):

1. :mod:`.ortho_views`: the candidate views of every 0.4 m view cell (nadir angle, distance,
   occlusion tested against the DSM with a z-buffer per camera);
2. :mod:`.ortho_radiometry`: a gain per image and band and a vignetting polynomial per camera,
   solved by robust least squares from the ground seen by several images;
3. :mod:`.ortho_labels`: one view per view cell, changing along low-contrast paths (an MRF);
4. :mod:`.ortho_blend`: the labelled views rendered per cell (x, y, z from the DSM), corrected,
   and multi-band blended across the view changes, tile by tile.

The first renderer (the best camera per block, no blending) is kept in
``tests/engine/ortho_blocks.py`` as the baseline of the tests and benchmarks.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from prefect_odm.engine import ortho_blend, ortho_labels, ortho_radiometry, ortho_views
from prefect_odm.engine.camera import CameraPose, Scene
from prefect_odm.engine.dem import HeightSampler
from prefect_odm.engine.footprints import FloatArray
from prefect_odm.engine.ortho_radiometry import ImageSource, Radiometry
from prefect_odm.engine.ortho_views import ViewCandidates
from prefect_odm.grid import Grid

logger = logging.getLogger(__name__)

EDGE_EXTENSION_CELLS = 2.0
"""How far (view cells) the outermost labels reach into unlabelled cells."""

PREFILTERED_BYTES = 512 * 2**20
"""Memory for the prefiltered images kept while blending, bytes."""

IMAGE_CACHE = 12
"""Decoded images kept in memory while blending (about 4 MB each at 1600 x 900)."""


@dataclass(frozen=True)
class OrthophotoResult:
    """The orthophoto and how it was made.

    Attributes:
        rgba: ``(4, grid.height, grid.width)`` uint8; alpha 255 where coloured, else 0.
        views: the candidate views on the view grid.
        labels: camera index per view cell, int32, ``views.camera.shape[1:]``, -1 none.
        radiometry: the exposure and vignetting correction applied.
        sweeps: iterations of the labelling.
        seconds: wall time per step (``views``, ``radiometry``, ``labels``, ``blend``).
    """

    rgba: NDArray[np.uint8]
    views: ViewCandidates
    labels: NDArray[np.int32]
    radiometry: Radiometry
    sweeps: int
    seconds: dict[str, float] = field(default_factory=dict)


def _image_source(image_dir: Path) -> ImageSource:
    """Camera -> image, with the last ``IMAGE_CACHE`` decoded images kept."""
    cache: OrderedDict[str, NDArray[np.uint8]] = OrderedDict()

    def source(camera: CameraPose) -> NDArray[np.uint8]:
        if camera.name in cache:
            cache.move_to_end(camera.name)
            return cache[camera.name]
        image = ortho_blend.load_rgb(image_dir / camera.name)
        cache[camera.name] = image
        if len(cache) > IMAGE_CACHE:
            cache.popitem(last=False)
        return image

    return source


def _prefiltered_source(
    source: ImageSource, grid: Grid, z_m: float
) -> ortho_blend.PrefilteredSource:
    """Camera -> its image area-averaged to the orthophoto's GSD at height ``z_m``, the most
    recently used kept up to ``PREFILTERED_BYTES``."""
    cache: OrderedDict[str, tuple[NDArray[np.uint8], float]] = OrderedDict()

    def filtered(camera: CameraPose) -> tuple[NDArray[np.uint8], float]:
        if camera.name not in cache:
            cache[camera.name] = ortho_blend.prefiltered(camera, source(camera), grid, z_m)
            while len(cache) > 1 and sum(i.nbytes for i, _ in cache.values()) > PREFILTERED_BYTES:
                cache.popitem(last=False)
        cache.move_to_end(camera.name)
        return cache[camera.name]

    return filtered


def _compensated_grey(
    scene: Scene, views: ViewCandidates, colours: NDArray[np.float32], radiometry: Radiometry
) -> NDArray[np.float32]:
    """Mean-of-bands colour of each candidate after the correction, ``views.camera.shape``."""
    grey = np.full(views.camera.shape, np.nan, dtype=np.float32)
    for index, camera in enumerate(scene.cameras):
        where = views.camera == index
        if where.any():
            factor = radiometry.factor(index, camera, views.u[where], views.v[where])
            grey[where] = (colours[where] * factor).mean(axis=1)
    return grey


def _extend_to_edges(labels: NDArray[np.int32]) -> NDArray[np.int32]:
    """Labels with the unlabelled cells within ``EDGE_EXTENSION_CELLS`` of a labelled one given
    the nearest label: the footprint's outline then follows the images' borders (the fine
    in-image test of the blending) instead of the view grid's staircase."""
    from scipy.ndimage import distance_transform_edt

    empty = labels < 0
    if not empty.any() or empty.all():
        return labels
    distance, (rows, cols) = distance_transform_edt(empty, return_indices=True)
    near = empty & (distance <= EDGE_EXTENSION_CELLS)
    return np.where(near, labels[rows, cols], labels).astype(np.int32)


def render_orthophoto_views(
    scene: Scene,
    image_dir: Path,
    grid: Grid,
    height_at: HeightSampler,
    *,
    compensate: bool = True,
    log: Callable[[str], None] = logger.info,
) -> OrthophotoResult:
    """The orthophoto of ``grid`` (see the module docstring), with its views and labels.

    Args:
        scene: posed cameras (UTM metres, ``scene.epsg``).
        image_dir: folder of the image files named as the cameras.
        grid: the orthophoto grid.
        height_at: ``(rows, cols) -> z`` of orthophoto cells in metres (the DSM, gap-free).
        compensate: solve and apply the exposure and vignetting correction (else identity).
        log: progress line sink.

    Returns:
        The orthophoto and the intermediate results.
    """
    seconds: dict[str, float] = {}
    started = time.perf_counter()
    views = ortho_views.candidate_views(scene, grid, height_at)
    seconds["views"] = time.perf_counter() - started
    source = _image_source(image_dir)
    colours = ortho_radiometry.sample_candidate_colours(scene, views, source)
    radiometry = (
        ortho_radiometry.solve_radiometry(scene, views, colours)
        if compensate
        else Radiometry.identity(len(scene.cameras))
    )
    seconds["radiometry"] = time.perf_counter() - started - seconds["views"]
    mark = time.perf_counter()
    grey = _compensated_grey(scene, views, colours, radiometry)
    labels, sweeps = ortho_labels.label_views(views, grey)
    seconds["labels"] = time.perf_counter() - mark
    mark = time.perf_counter()
    rgba = np.zeros((4, grid.height, grid.width), dtype=np.uint8)
    render_labels = _extend_to_edges(labels)
    filtered = _prefiltered_source(source, grid, float(np.median(views.z)))
    f = views.factor
    for tile in ortho_blend.tiles(grid):
        rows = np.arange(tile.pad_rows.start, tile.pad_rows.stop) // f
        cols = np.arange(tile.pad_cols.start, tile.pad_cols.stop) // f
        tile_labels = render_labels[np.ix_(rows, cols)]
        rgba[:, tile.rows, tile.cols] = ortho_blend.blend_tile(
            tile, grid, tile_labels, height_at, scene.cameras, filtered, radiometry
        )
    seconds["blend"] = time.perf_counter() - mark
    log(
        f"Orthophoto {grid.width}x{grid.height} cells at {grid.resolution_m * 100:.1f} cm from "
        f"{len(np.unique(labels[labels >= 0]))} images; exposure/vignetting spread "
        f"{radiometry.rms_log_before:.3f} -> {radiometry.rms_log_after:.3f} (log), "
        f"{sweeps} labelling sweeps"
    )
    return OrthophotoResult(rgba, views, labels, radiometry, sweeps, seconds)


def render_orthophoto(
    scene: Scene,
    image_dir: Path,
    grid: Grid,
    height_at: HeightSampler,
    *,
    log: Callable[[str], None] = logger.info,
) -> NDArray[np.uint8]:
    """Colour every cell of ``grid`` (see the module docstring).

    Args:
        scene: posed cameras.
        image_dir: folder of the image files named as the cameras.
        grid: the orthophoto grid.
        height_at: ``(rows, cols) -> z`` of orthophoto cells in metres (the DSM, gap-free).
        log: progress line sink.

    Returns:
        RGBA, uint8, shape ``(4, grid.height, grid.width)``; alpha 255 where coloured, else 0.
    """
    return render_orthophoto_views(scene, image_dir, grid, height_at, log=log).rgba


def grid_points_from_orthophoto(
    rgba: NDArray[np.uint8],
    grid: Grid,
    height_at: HeightSampler,
    spacing_m: float,
) -> tuple[FloatArray, NDArray[np.uint8]]:
    """A regular grid of surface points every ``spacing_m``, coloured from the orthophoto.

    Returns:
        ``(xyz (n, 3) UTM metres, rgb (n, 3) uint8)`` for the grid nodes where alpha is 255.
    """
    step = max(1, int(round(spacing_m / grid.resolution_m)))
    row_grid, col_grid = np.meshgrid(
        np.arange(step // 2, grid.height, step),
        np.arange(step // 2, grid.width, step),
        indexing="ij",
    )
    rows, cols = row_grid.ravel(), col_grid.ravel()
    keep = rgba[3, rows, cols] == 255
    rows, cols = rows[keep], cols[keep]
    xyz = np.column_stack(
        [
            grid.left + (cols + 0.5) * grid.resolution_m,
            grid.top - (rows + 0.5) * grid.resolution_m,
            height_at(rows, cols),
        ]
    )
    return xyz, rgba[:3, rows, cols].T.copy()
