"""Which cameras see each cell of the orthophoto, and how well: the candidate views.

The orthophoto grid is viewed on a coarse *view grid* (``VIEW_CELL_M`` cells, a whole number of
orthophoto cells). For each camera and view cell, with the cell's centre at the surface height:

* **in image**: the centre projects inside the image, at least ``BORDER_PX`` from its edge (so
  the blending has image content around every chosen cell);
* **visible**: a z-buffer test against the DSM. Every view cell within the camera's footprint is
  projected into a depth buffer of ``ZBUFFER_CELL_PX`` pixels (the nearest depth per buffer pixel,
  widened by a 3 x 3 minimum filter to close the holes between splatted cells, with points added
  down the vertical faces where the DSM steps by more than a cell); a cell is occluded
  when something lies more than ``OCCLUSION_TOLERANCE_M`` (plus the depth change across one view
  cell) in front of it along the ray. This is the splatting z-buffer of true-orthophoto
  production (e.g. Habib et al., 2007, *Photogrammetric Engineering & Remote Sensing* 73(1)).
* **cost** (lower is better): ``tan(nadir angle of the ray) + DISTANCE_WEIGHT * (ground sample
  distance / the best camera's - 1)``; off-nadir rays displace and smear relief, far cameras see
  less detail.

Only the ``CANDIDATES`` cheapest visible views of a cell are kept, so memory grows with the area,
not with the number of cameras. A cell that lies in some image but is occluded in every one (a
narrow gap between trees, or a bump of the gap-filled DSM in a forest) takes the cheapest of
those occluded views as its only candidate, as a texturing step colours every face from some
view: before, it stayed a hole (brighton: 37 holes inside the orthophoto, 13 m2 in all).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from prefect_odm.engine.camera import CameraPose, Scene
from prefect_odm.engine.dem import HeightSampler
from prefect_odm.engine.footprints import camera_window, cell_offsets, in_image
from prefect_odm.grid import Grid

VIEW_CELL_M = 0.4
"""Target side of a view-grid cell, metres (rounded to whole orthophoto cells)."""

CANDIDATES = 6
"""Views kept per view cell, the cheapest first."""

BORDER_PX = 24.0
"""A camera colours only cells projecting at least this far inside its image, pixels."""

ZBUFFER_CELL_PX = 1.5
"""Depth-buffer pixel size in projected view cells (larger than one closes splatting holes)."""

OCCLUSION_TOLERANCE_M = 0.3
"""Depth margin of the occlusion test, metres, on top of one view cell's depth change."""

MAX_WALL_POINTS = 60
"""Points added down one cell's vertical face in the z-buffer, at most."""

DISTANCE_WEIGHT = 0.5
"""Weight of the relative ground sample distance in the view cost."""


@dataclass(frozen=True)
class ViewCandidates:
    """The best visible views per view cell.

    Attributes:
        grid: the view grid (same upper-left corner as the orthophoto grid).
        factor: orthophoto cells per view cell side.
        camera: camera index per candidate, int32, shape ``(CANDIDATES, rows, cols)``, -1 none,
            ordered by cost.
        cost: view cost, float32, same shape, ``inf`` where there is no candidate.
        u, v: where the cell centre projects in the candidate's image, pixels (COLMAP
            convention), float32, same shape.
        z: surface height of each view cell centre, metres, float32, ``(rows, cols)``.
    """

    grid: Grid
    factor: int
    camera: NDArray[np.int32]
    cost: NDArray[np.float32]
    u: NDArray[np.float32]
    v: NDArray[np.float32]
    z: NDArray[np.float32]


def view_grid(grid: Grid, cell_m: float = VIEW_CELL_M) -> tuple[Grid, int]:
    """The coarse view grid over ``grid`` and its factor (orthophoto cells per view cell)."""
    factor = max(1, int(round(cell_m / grid.resolution_m)))
    return grid.coarsened(factor), factor


def view_cell_heights(grid: Grid, factor: int, height_at: HeightSampler) -> NDArray[np.float32]:
    """Surface height at each view cell's centre (the orthophoto cell nearest it), metres."""
    coarse, _ = view_grid_from_factor(grid, factor)
    rows = np.minimum(np.arange(coarse.height) * factor + factor // 2, grid.height - 1)
    cols = np.minimum(np.arange(coarse.width) * factor + factor // 2, grid.width - 1)
    rr, cc = np.meshgrid(rows, cols, indexing="ij")
    return np.asarray(height_at(rr.ravel(), cc.ravel()), dtype=np.float32).reshape(rr.shape)


def view_grid_from_factor(grid: Grid, factor: int) -> tuple[Grid, int]:
    """The view grid of ``factor`` orthophoto cells per side."""
    return view_grid(grid, factor * grid.resolution_m)


def _zbuffer_visible(
    camera: CameraPose,
    u: NDArray[np.float32],
    v: NDArray[np.float32],
    depth: NDArray[np.float32],
    seen: NDArray[np.bool_],
    cell_px: float,
    cell_m: float,
    walls: tuple[NDArray[np.float32], NDArray[np.float32], NDArray[np.float32]],
) -> NDArray[np.bool_]:
    """Which of the projected cells ``seen`` no other cell (nor wall point) hides."""
    from scipy.ndimage import minimum_filter

    step = max(1.0, ZBUFFER_CELL_PX * cell_px)
    bw = int(camera.width // step) + 2
    bh = int(camera.height // step) + 2
    bu = np.clip((u / step).astype(np.int64), 0, bw - 1)
    bv = np.clip((v / step).astype(np.int64), 0, bh - 1)
    index = bv * bw + bu
    buffer = np.full(bw * bh, np.inf, dtype=np.float32)
    np.minimum.at(buffer, index[seen], depth[seen])
    wu, wv, wd = walls
    w_ok = (wd > 0) & (wu >= 0) & (wu < camera.width) & (wv >= 0) & (wv < camera.height)
    w_index = (wv[w_ok] / step).astype(np.int64) * bw + (wu[w_ok] / step).astype(np.int64)
    np.minimum.at(buffer, w_index, wd[w_ok])
    nearest = minimum_filter(buffer.reshape(bh, bw), size=3, mode="nearest").ravel()
    tolerance = np.float32(OCCLUSION_TOLERANCE_M + 2.0 * cell_m)
    return np.asarray(seen & (depth <= nearest[index] + tolerance), dtype=bool)


def _wall_points(
    camera: CameraPose, coarse: Grid, z: NDArray[np.float32], window: tuple[slice, slice]
) -> tuple[NDArray[np.float32], NDArray[np.float32], NDArray[np.float32]]:
    """``(u, v, depth)`` of points down the vertical faces of the DSM in ``window``.

    A DSM of cells splatted as points leaves the faces of walls and tree edges empty; a
    cell higher than its lowest 8-neighbour by more than a cell side gets points every cell side
    down to that neighbour's height (at most ``MAX_WALL_POINTS`` per cell).
    """
    from scipy.ndimage import minimum_filter

    lowest = minimum_filter(z, size=3, mode="nearest")[window]
    drop = z[window] - lowest
    cell = np.float32(coarse.resolution_m)
    steps = np.minimum(np.floor(drop / cell), MAX_WALL_POINTS).astype(np.int64)
    rows, cols = np.nonzero(steps > 0)
    if len(rows) == 0:
        empty = np.zeros(0, np.float32)
        return empty, empty, empty
    count = steps[rows, cols]
    rows, cols = np.repeat(rows, count), np.repeat(cols, count)
    level = np.arange(len(rows)) - np.repeat(np.cumsum(count) - count, count) + 1
    zs = z[window][rows, cols] - level.astype(np.float32) * cell
    dx, dy = cell_offsets(
        camera,
        coarse,
        (rows + window[0].start).astype(np.float32),
        (cols + window[1].start).astype(np.float32),
    )
    return camera.project_offsets(dx, dy, (zs - np.float32(camera.center[2])).astype(np.float32))


def _camera_views(
    camera: CameraPose, coarse: Grid, z: NDArray[np.float32], best_gsd_m: float
) -> (
    tuple[
        tuple[slice, slice],
        NDArray[np.float32],
        NDArray[np.float32],
        NDArray[np.float32],
        NDArray[np.float32],
    ]
    | None
):
    """``(window, cost, hidden cost, u, v)`` of one camera on the view grid: the cost where the
    camera sees the cell (``inf`` elsewhere), and where the cell lies in its image but is
    occluded (``inf`` elsewhere)."""
    window = camera_window(camera, coarse, float(z.min()), float(z.max()))
    if window is None:
        return None
    rs, cs = window
    rows = np.arange(rs.start, rs.stop, dtype=np.float32)[:, None]
    cols = np.arange(cs.start, cs.stop, dtype=np.float32)[None, :]
    dz = (z[window] - np.float32(camera.center[2])).astype(np.float32)
    dx, dy = cell_offsets(camera, coarse, rows, cols)
    dx, dy = np.broadcast_to(dx, dz.shape), np.broadcast_to(dy, dz.shape)
    u, v, depth = camera.project_offsets(dx, dy, dz)
    inside = in_image(camera, u, v, depth) & (
        (u >= BORDER_PX)
        & (u <= camera.width - BORDER_PX)
        & (v >= BORDER_PX)
        & (v <= camera.height - BORDER_PX)
    )
    if not inside.any():
        return None
    distance = np.sqrt(dx * dx + dy * dy + dz * dz)
    gsd = np.maximum(distance, 1e-3) / np.float32(camera.focal_px)
    cell_px = float(coarse.resolution_m / max(float(np.median(gsd[inside])), 1e-6))
    walls = _wall_points(camera, coarse, z, window)
    visible = _zbuffer_visible(camera, u, v, depth, inside, cell_px, coarse.resolution_m, walls)
    tan_nadir = np.hypot(dx, dy) / np.maximum(-dz, 1e-3)
    cost = tan_nadir + np.float32(DISTANCE_WEIGHT) * (gsd / np.float32(best_gsd_m) - 1.0)
    hidden = np.where(inside & ~visible, cost, np.inf).astype(np.float32)
    return window, np.where(visible, cost, np.inf).astype(np.float32), hidden, u, v


def _best_gsd_m(scene: Scene, z_mid: float) -> float:
    values = [(c.center[2] - z_mid) / c.focal_px for c in scene.cameras if c.center[2] > z_mid]
    return max(min(values), 1e-3) if values else 1.0


def candidate_views(
    scene: Scene,
    grid: Grid,
    height_at: HeightSampler,
    *,
    cell_m: float = VIEW_CELL_M,
    candidates: int = CANDIDATES,
) -> ViewCandidates:
    """The ``candidates`` best visible views of every view cell (see the module docstring).

    Args:
        scene: posed cameras (UTM metres, ``scene.epsg``).
        grid: the orthophoto grid.
        height_at: ``(rows, cols) -> z`` of orthophoto cells in metres (the DSM, gap-free).
        cell_m: target view-cell side, metres.
        candidates: views kept per cell.

    Returns:
        The candidates; a cell occluded in every image it lies in has its cheapest occluded view
        as its one candidate; cells in no image have camera -1 in every slot.
    """
    coarse, factor = view_grid(grid, cell_m)
    z = view_cell_heights(grid, factor, height_at)
    shape = (candidates, coarse.height, coarse.width)
    best_cam = np.full(shape, -1, dtype=np.int32)
    best_cost = np.full(shape, np.inf, dtype=np.float32)
    best_u = np.zeros(shape, dtype=np.float32)
    best_v = np.zeros(shape, dtype=np.float32)
    best_gsd = _best_gsd_m(scene, float(np.median(z)))
    # the cheapest occluded view of each cell (a one-slot candidate list), for the cells no
    # camera sees
    hidden_cam = np.full((1, *shape[1:]), -1, dtype=np.int32)
    hidden_cost = np.full((1, *shape[1:]), np.inf, dtype=np.float32)
    hidden_u = np.zeros((1, *shape[1:]), dtype=np.float32)
    hidden_v = np.zeros((1, *shape[1:]), dtype=np.float32)
    for index, camera in enumerate(scene.cameras):
        found = _camera_views(camera, coarse, z, best_gsd)
        if found is None:
            continue
        window, cost, hidden, u, v = found
        _insert(best_cam, best_cost, best_u, best_v, window, index, cost, u, v)
        _insert(hidden_cam, hidden_cost, hidden_u, hidden_v, window, index, hidden, u, v)
    unseen = (best_cam[0] < 0) & (hidden_cam[0] >= 0)
    for best, fallback in (
        (best_cam, hidden_cam),
        (best_cost, hidden_cost),
        (best_u, hidden_u),
        (best_v, hidden_v),
    ):
        best[0][unseen] = fallback[0][unseen]
    return ViewCandidates(coarse, factor, best_cam, best_cost, best_u, best_v, z)


def _insert(
    cams: NDArray[np.int32],
    costs: NDArray[np.float32],
    us: NDArray[np.float32],
    vs: NDArray[np.float32],
    window: tuple[slice, slice],
    index: int,
    cost: NDArray[np.float32],
    u: NDArray[np.float32],
    v: NDArray[np.float32],
) -> None:
    """Merge one camera's views into the sorted candidate lists (in place, stable order)."""
    k = cams.shape[0]
    sub: tuple[Any, ...] = (slice(None), *window)
    all_cost = np.concatenate([costs[sub], cost[None]], axis=0)
    all_cam = np.concatenate([cams[sub], np.full((1, *cost.shape), index, np.int32)], axis=0)
    all_u = np.concatenate([us[sub], u[None].astype(np.float32)], axis=0)
    all_v = np.concatenate([vs[sub], v[None].astype(np.float32)], axis=0)
    order = np.argsort(all_cost, axis=0, kind="stable")[:k]
    costs[sub] = np.take_along_axis(all_cost, order, axis=0)
    cams[sub] = np.where(
        np.isfinite(costs[sub]), np.take_along_axis(all_cam, order, axis=0), np.int32(-1)
    )
    us[sub] = np.take_along_axis(all_u, order, axis=0)
    vs[sub] = np.take_along_axis(all_v, order, axis=0)
