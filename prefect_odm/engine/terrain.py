"""The direct method's terrain: a smooth surface through the cameras' ground heights.

Without structure from motion, the only heights of the ground the direct method has are those
the images carry. A camera whose image records its **height above the ground below** (XMP
``Camera:AboveGroundAltitude``, written by Parrot, Sentera and MicaSense cameras and by
terrain-following flight software) gives one ground height: its GPS altitude minus that height,
at the camera's x, y (the nadir point of a nadir survey). The surface through them is a
thin-plate spline with a linear trend (scipy ``RBFInterpolator``, ``kernel="thin_plate_spline"``,
``degree=1``; Duchon 1977, "Splines minimizing rotation-invariant semi-norms in Sobolev spaces"),
lightly smoothed (:data:`GROUND_SMOOTHING`), evaluated on a :data:`SURFACE_STEP_M` lattice and
interpolated bilinearly onto the DEM grid. Beyond the cameras it continues the fitted slope,
so a footprint's edge over a slope is not flattened.

DJI's ``drone-dji:RelativeAltitude`` is **not** such a height: it is the barometric height above
the take-off point, so ``altitude - RelativeAltitude`` is the take-off elevation for every image
(brighton: 158 m for all 18 images), whatever the ground below does. It gives the plane of
:func:`prefect_odm.engine.direct.estimate_ground_z_m`, which stays the surface where nothing
better is known: fewer than :data:`MIN_GROUND_POINTS` cameras with a height above ground, or all
of them on one line.

**Accuracy**: that of the cameras' ground heights, i.e. the GPS altitude error combined with the
error of the height above ground. Consumer single-frequency GNSS altitude is off by 1.5-5 m
(most of it a bias shared by a flight's shots, so neighbouring submodels agree better than
that); RTK/PPK by 2-5 cm. A laser rangefinder's height is good to ~0.1 m; a height taken from a
terrain model by flight software has that model's error (SRTM: 5-10 m). The smoothing halves
independent noise (measured: 0.5 m rms on a 30 x 20 m camera grid becomes 0.23 m rms, relief of
3 m over a 380 m wavelength kept). Relief between cameras (shorter than the camera spacing) and
everything standing on the ground (trees, buildings) is missing: it is a terrain model, so the
direct method's DTM is this same surface.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from prefect_odm.engine.camera import ImageMeta, Scene
from prefect_odm.engine.dem import HeightSampler, surface_sampler
from prefect_odm.grid import Grid

MIN_GROUND_POINTS = 3
"""Fewest cameras with a ground height for a surface (a linear trend needs three)."""

GROUND_SMOOTHING = 1000.0
"""``RBFInterpolator`` smoothing of the ground spline (coordinates in metres)."""

SURFACE_STEP_M = 2.0
"""Spacing of the lattice the spline is evaluated on (then bilinear onto the DEM grid)."""

MIN_SPREAD_M = 1.0
"""Ground points spread less than this across their main direction lie on one line."""


def camera_ground_points(
    images: Sequence[ImageMeta], positions_m: NDArray[np.float64]
) -> NDArray[np.float64]:
    """The ground heights under the cameras whose images carry their height above ground.

    Args:
        images: the task's images.
        positions_m: their UTM positions (x, y, GPS altitude), metres, shape ``(n, 3)``.

    Returns:
        ``(m, 3)``: x, y of the camera and ``altitude_m - above_ground_altitude_m``, metres, for
        the ``m`` images with both values; ``(0, 3)`` when none has them.
    """
    rows = [
        (positions_m[i, 0], positions_m[i, 1], meta.altitude_m - meta.above_ground_altitude_m)
        for i, meta in enumerate(images)
        if meta.altitude_m is not None and meta.above_ground_altitude_m is not None
    ]
    return np.array(rows, dtype=np.float64).reshape(-1, 3)


def _on_one_line(xy: NDArray[np.float64]) -> bool:
    """Whether the points (centred, metres) spread less than :data:`MIN_SPREAD_M` across."""
    singular = np.linalg.svd(xy, compute_uv=False)
    return bool(len(singular) < 2 or singular[1] / np.sqrt(len(xy)) < MIN_SPREAD_M)


def _lattice(n: int, step: int) -> NDArray[np.float64]:
    """Cell indices ``0, step, 2 step, ...`` and always the last one, ``n - 1``."""
    return np.unique(np.append(np.arange(0, n, step), n - 1)).astype(np.float64)


def ground_surface(
    ground_xyz: NDArray[np.float64], grid: Grid, plane_z_m: float
) -> NDArray[np.float32]:
    """The terrain through ``ground_xyz`` on ``grid`` (see the module docstring).

    Args:
        ground_xyz: ground heights, UTM metres, shape ``(m, 3)``.
        grid: the DEM grid (same CRS).
        plane_z_m: the plane used when the points cannot carry a surface (fewer than
            :data:`MIN_GROUND_POINTS`, or all on one line).

    Returns:
        Heights in metres, float32, shape ``(grid.height, grid.width)``, no NaN.
    """
    from scipy.interpolate import RBFInterpolator, RegularGridInterpolator

    shape = (grid.height, grid.width)
    if len(ground_xyz) < MIN_GROUND_POINTS:
        return np.full(shape, plane_z_m, dtype=np.float32)
    origin = ground_xyz[:, :2].mean(axis=0)
    xy = ground_xyz[:, :2] - origin
    if _on_one_line(xy):
        return np.full(shape, float(np.median(ground_xyz[:, 2])), dtype=np.float32)
    spline = RBFInterpolator(
        xy, ground_xyz[:, 2], kernel="thin_plate_spline", degree=1, smoothing=GROUND_SMOOTHING
    )
    step = max(1, int(round(SURFACE_STEP_M / grid.resolution_m)))
    rows, cols = _lattice(grid.height, step), _lattice(grid.width, step)
    rr, cc = np.meshgrid(rows, cols, indexing="ij")
    x = grid.left + (cc + 0.5) * grid.resolution_m - origin[0]
    y = grid.top - (rr + 0.5) * grid.resolution_m - origin[1]
    coarse = spline(np.column_stack([x.ravel(), y.ravel()])).reshape(rr.shape)
    if len(rows) == 1 or len(cols) == 1:
        return np.broadcast_to(coarse, shape).astype(np.float32)
    fine = RegularGridInterpolator((rows, cols), coarse, method="linear")
    all_r, all_c = np.meshgrid(np.arange(grid.height), np.arange(grid.width), indexing="ij")
    return fine(np.column_stack([all_r.ravel(), all_c.ravel()])).reshape(shape).astype(np.float32)


def direct_surface(scene: Scene, grid: Grid) -> NDArray[np.float32]:
    """The direct method's gap-free surface on ``grid``: the terrain through the scene's ground
    heights, else the plane at ``scene.ground_z_m``.

    Raises:
        ValueError: the scene has neither ground heights nor a ground plane.
    """
    if scene.ground_z_m is None and len(scene.ground_xyz) < MIN_GROUND_POINTS:
        raise ValueError("a direct scene needs ground_z_m or ground heights")
    plane = float(scene.ground_z_m if scene.ground_z_m is not None else 0.0)
    return ground_surface(scene.ground_xyz, grid, plane)


def direct_height_sampler(
    scene: Scene, surface: NDArray[np.float32], surface_grid: Grid, grid: Grid
) -> HeightSampler:
    """``(rows, cols) -> z`` on ``grid`` for the direct orthophoto: bilinear in ``surface``
    (the stored :func:`direct_surface`) when the scene has ground heights, else exactly the plane
    ``scene.ground_z_m`` (the orthophoto of a survey without heights above ground is unchanged)."""
    if len(scene.ground_xyz) >= MIN_GROUND_POINTS:
        return surface_sampler(surface, surface_grid, grid)
    ground = float(scene.ground_z_m if scene.ground_z_m is not None else surface.mean())

    def height_at(rows: NDArray[np.integer[Any]], cols: NDArray[np.integer[Any]]) -> Any:
        return np.full(rows.shape, ground)

    return height_at
