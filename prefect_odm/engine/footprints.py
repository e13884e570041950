"""Where the built-in engine's cameras look: footprints, resolutions and coverage on a grid.

Everything is in the survey's WGS 84 / UTM CRS. Rasters are north-up on a
:class:`~prefect_odm.grid.Grid` whose origin is snapped to whole multiples of the DEM cell
size, so the orthophoto and the DEMs of one task share their upper-left corner.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numpy.typing import NDArray

from prefect_odm.engine.camera import CameraPose, Scene
from prefect_odm.errors import ProcessingFailedError
from prefect_odm.grid import Grid

FloatArray = NDArray[np.floating[Any]]
"""float32 or float64 array."""


def reference_ground_z_m(scene: Scene) -> float:
    """A single ground elevation for footprints: the plane (direct) or the median point height.

    Raises:
        ProcessingFailedError: the scene has neither.
    """
    if scene.ground_z_m is not None:
        return float(scene.ground_z_m)
    if len(scene.points_xyz):
        return float(np.median(scene.points_xyz[:, 2]))
    raise ProcessingFailedError("scene has neither a ground plane nor points")


def estimate_gsd_cm(scene: Scene, ground_z_m: float) -> float:
    """Median ground sample distance of the cameras, cm/pixel: height above ground / focal.

    Raises:
        ProcessingFailedError: no camera is above ``ground_z_m``.
    """
    values = [
        (c.center[2] - ground_z_m) / c.focal_px * 100.0
        for c in scene.cameras
        if c.center[2] - ground_z_m > 0
    ]
    if not values:
        raise ProcessingFailedError("every camera is below the ground: cannot estimate the GSD")
    return float(np.median(values))


def coverage_bounds(scene: Scene, ground_z_m: float) -> tuple[float, float, float, float]:
    """Bounding box (left, bottom, right, top) of every camera footprint on ``z = ground_z_m``.

    Raises:
        ProcessingFailedError: no camera sees the plane (all look above the horizon).
    """
    corners = [fp for c in scene.cameras if (fp := c.footprint(ground_z_m)) is not None]
    if not corners:
        raise ProcessingFailedError("no camera footprint reaches the ground")
    allc = np.concatenate(corners)
    return (
        float(allc[:, 0].min()),
        float(allc[:, 1].min()),
        float(allc[:, 0].max()),
        float(allc[:, 1].max()),
    )


def in_image(
    camera: CameraPose,
    u: FloatArray,
    v: FloatArray,
    depth: FloatArray,
    margin_px: float = 0.0,
) -> NDArray[np.bool_]:
    """Which projections ``(u, v, depth)`` (pixels, pixels, metres) fall inside the image.

    Args:
        margin_px: how far outside the image border still counts, pixels.
    """
    return (
        (depth > 0)
        & (u >= -margin_px)
        & (u <= camera.width + margin_px)
        & (v >= -margin_px)
        & (v <= camera.height + margin_px)
    )


def camera_window(
    camera: CameraPose, grid: Grid, z_low_m: float, z_high_m: float
) -> tuple[slice, slice] | None:
    """Rows and columns of ``grid`` the camera can see between two surface heights.

    The bounding box of the image outline projected on both planes, padded by 10 % (lens
    distortion) and one cell. Returns the whole grid when an outline misses a plane (oblique
    view), None when the window is empty.
    """
    outlines = [camera.footprint(z) for z in (z_low_m, z_high_m)]
    if any(o is None for o in outlines):
        return slice(0, grid.height), slice(0, grid.width)
    corners = np.concatenate([o for o in outlines if o is not None])
    lo, hi = corners.min(axis=0), corners.max(axis=0)
    pad = 0.1 * float((hi - lo).max()) + grid.resolution_m
    col0 = max(0, int(math.floor((lo[0] - pad - grid.left) / grid.resolution_m)))
    col1 = min(grid.width, int(math.ceil((hi[0] + pad - grid.left) / grid.resolution_m)))
    row0 = max(0, int(math.floor((grid.top - hi[1] - pad) / grid.resolution_m)))
    row1 = min(grid.height, int(math.ceil((grid.top - lo[1] + pad) / grid.resolution_m)))
    if col0 >= col1 or row0 >= row1:
        return None
    return slice(row0, row1), slice(col0, col1)


def cell_offsets(
    camera: CameraPose, grid: Grid, rows: NDArray[np.float32], cols: NDArray[np.float32]
) -> tuple[NDArray[np.float32], NDArray[np.float32]]:
    """East and north offsets (metres, float32) of cell centres from the camera centre.

    Camera-relative float32 offsets keep large UTM numbers out of the projection's hot loop.

    Args:
        rows, cols: cell indices of ``grid`` as float32, broadcastable to each other.

    Returns:
        ``(dx, dy)``: ``dx`` shaped as ``cols``, ``dy`` shaped as ``rows``.
    """
    dx = cols * np.float32(grid.resolution_m) + np.float32(
        grid.left + 0.5 * grid.resolution_m - camera.center[0]
    )
    dy = rows * np.float32(-grid.resolution_m) + np.float32(
        grid.top - 0.5 * grid.resolution_m - camera.center[1]
    )
    return dx, dy


def coverage_mask(scene: Scene, grid: Grid, surface: NDArray[np.float32]) -> NDArray[np.bool_]:
    """Cells whose centre (at the surface height) lies inside at least one image.

    Args:
        surface: heights on ``grid`` without gaps, shape ``(height, width)``.
    """
    seen = np.zeros(surface.shape, dtype=bool)
    z_low, z_high = float(surface.min()), float(surface.max())
    for camera in scene.cameras:
        window = camera_window(camera, grid, z_low, z_high)
        if window is None:
            continue
        rows_slice, cols_slice = window
        cols = np.arange(cols_slice.start, cols_slice.stop, dtype=np.float32)[None, :]
        rows = np.arange(rows_slice.start, rows_slice.stop, dtype=np.float32)[:, None]
        dz = (surface[window] - np.float32(camera.center[2])).astype(np.float32)
        dx, dy = cell_offsets(camera, grid, rows, cols)
        u, v, depth = camera.project_offsets(
            np.broadcast_to(dx, dz.shape), np.broadcast_to(dy, dz.shape), dz
        )
        seen[window] |= in_image(camera, u, v, depth)
    return seen
