"""Products of the built-in engine: DSM, DTM, orthophoto, point cloud, camera shots.

Everything is in the survey's WGS 84 / UTM CRS. Rasters are north-up on a :class:`Grid` whose
origin is snapped to whole multiples of the DEM cell size, so the orthophoto and the DEMs of one
task share their upper-left corner.

Algorithms:

* **DSM (sfm)**: outliers removed from the sparse points (height against the median of their
  nearest neighbours, robust MAD threshold), Delaunay-linear interpolation
  (``scipy.interpolate.griddata``) inside the points' convex hull, a NaN-aware Gaussian smoothing
  of ``DSM_SMOOTHING_M``, nodata outside the hull and outside every camera's view.
* **DSM (direct)**: the ground plane over the area seen by at least one camera.
* **DTM**: a morphological opening of the DSM (minimum then maximum filter over
  ``DTM_WINDOW_M``), i.e. the surface a ``DTM_WINDOW_M`` square "rolls" under, then smoothed:
  buildings and trees smaller than the window are removed. (A simple ground filter, not ODM's SMRF.)
* **Orthophoto**: for every ground cell, the camera whose image holds the cell nearest to its
  centre is chosen (decided on blocks of ``SELECTION_BLOCK`` x ``SELECTION_BLOCK`` cells), the cell
  (x, y, z from the surface) is projected into that image and its colour sampled bilinearly;
  alpha 0 where no image sees the cell. No occlusion test (not a true orthophoto).
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray
from PIL import Image

from prefect_odm.engine.camera import CameraPose, Scene
from prefect_odm.errors import ProcessingFailedError

logger = logging.getLogger(__name__)

FloatArray = NDArray[np.floating[Any]]
"""float32 or float64 array."""

HeightSampler = Callable[[NDArray[np.integer[Any]], NDArray[np.integer[Any]]], FloatArray]
"""``(rows, cols) -> z``: surface heights (metres) of grid cells."""

DSM_NODATA = -9999.0
"""Nodata value of the DSM and DTM (as ODM writes them)."""

DSM_SMOOTHING_M = 0.5
"""Standard deviation in metres of the Gaussian smoothing of the interpolated DSM."""

DTM_WINDOW_M = 12.0
"""Side of the square window of the DTM's morphological opening, metres."""

SELECTION_BLOCK = 16
"""Orthophoto cells per block side when choosing the best camera."""

OUTLIER_NEIGHBOURS = 12
OUTLIER_MAD_FACTOR = 5.0
OUTLIER_MIN_M = 1.0

ENGINE_TAG = "PREFECT_ODM_ENGINE_METHOD"
"""GeoTIFF metadata tag that names the method that made a raster (``sfm`` or ``direct``)."""


@dataclass(frozen=True)
class Grid:
    """A north-up raster grid in a projected CRS.

    Attributes:
        left, top: upper-left corner, CRS metres.
        res_m: cell size, metres.
        width, height: columns and rows.
    """

    left: float
    top: float
    res_m: float
    width: int
    height: int

    @classmethod
    def covering(
        cls, bounds: tuple[float, float, float, float], res_m: float, snap_m: float
    ) -> Grid:
        """The grid of ``res_m`` cells covering ``bounds`` (left, bottom, right, top), with its
        corner snapped outward to multiples of ``snap_m``."""
        left = math.floor(bounds[0] / snap_m) * snap_m
        top = math.ceil(bounds[3] / snap_m) * snap_m
        right = math.ceil(bounds[2] / snap_m) * snap_m
        bottom = math.floor(bounds[1] / snap_m) * snap_m
        width = max(1, int(math.ceil((right - left) / res_m - 1e-9)))
        height = max(1, int(math.ceil((top - bottom) / res_m - 1e-9)))
        return cls(left=left, top=top, res_m=res_m, width=width, height=height)

    @property
    def bounds(self) -> tuple[float, float, float, float]:
        return (
            self.left,
            self.top - self.height * self.res_m,
            self.left + self.width * self.res_m,
            self.top,
        )

    @property
    def transform(self) -> Any:
        from affine import Affine

        return Affine(self.res_m, 0.0, self.left, 0.0, -self.res_m, self.top)

    def xs(self) -> FloatArray:
        """Cell-centre eastings, shape ``(width,)``."""
        return self.left + (np.arange(self.width) + 0.5) * self.res_m

    def ys(self) -> FloatArray:
        """Cell-centre northings, shape ``(height,)``."""
        return self.top - (np.arange(self.height) + 0.5) * self.res_m


# -- geometry helpers -------------------------------------------------------------------------


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


def _inside(
    camera: CameraPose,
    u: FloatArray,
    v: FloatArray,
    depth: FloatArray,
    margin_px: float = 0.0,
) -> NDArray[np.bool_]:
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
    pad = 0.1 * float((hi - lo).max()) + grid.res_m
    col0 = max(0, int(math.floor((lo[0] - pad - grid.left) / grid.res_m)))
    col1 = min(grid.width, int(math.ceil((hi[0] + pad - grid.left) / grid.res_m)))
    row0 = max(0, int(math.floor((grid.top - hi[1] - pad) / grid.res_m)))
    row1 = min(grid.height, int(math.ceil((grid.top - lo[1] + pad) / grid.res_m)))
    if col0 >= col1 or row0 >= row1:
        return None
    return slice(row0, row1), slice(col0, col1)


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
        dx = cols * np.float32(grid.res_m) + np.float32(
            grid.left + 0.5 * grid.res_m - camera.center[0]
        )
        dy = rows * np.float32(-grid.res_m) + np.float32(
            grid.top - 0.5 * grid.res_m - camera.center[1]
        )
        u, v, depth = camera.project_offsets(
            np.broadcast_to(dx, dz.shape), np.broadcast_to(dy, dz.shape), dz
        )
        seen[window] |= _inside(camera, u, v, depth)
    return seen


# -- DEMs ---------------------------------------------------------------------------------------


def filter_point_outliers(xyz: FloatArray) -> NDArray[np.bool_]:
    """Keep-mask of points whose height agrees with their horizontal neighbours.

    A point is dropped when ``|z - median(z of its OUTLIER_NEIGHBOURS nearest)|`` exceeds
    ``max(OUTLIER_MIN_M, OUTLIER_MAD_FACTOR * 1.4826 * MAD)`` of that residual over all points.
    """
    from scipy.spatial import cKDTree

    n = len(xyz)
    if n <= OUTLIER_NEIGHBOURS:
        return np.ones(n, dtype=bool)
    _, index = cKDTree(xyz[:, :2]).query(xyz[:, :2], k=OUTLIER_NEIGHBOURS + 1)
    residual = xyz[:, 2] - np.median(xyz[index[:, 1:], 2], axis=1)
    mad = float(np.median(np.abs(residual - np.median(residual))))
    limit = max(OUTLIER_MIN_M, OUTLIER_MAD_FACTOR * 1.4826 * mad)
    return np.asarray(np.abs(residual) <= limit, dtype=bool)


def _nan_gaussian(data: NDArray[np.float32], sigma_cells: float) -> NDArray[np.float32]:
    from scipy.ndimage import gaussian_filter

    if sigma_cells < 0.3:
        return data
    valid = np.isfinite(data)
    filled = np.where(valid, data, 0.0).astype(np.float32)
    num = gaussian_filter(filled, sigma_cells, mode="nearest")
    den = gaussian_filter(valid.astype(np.float32), sigma_cells, mode="nearest")
    with np.errstate(invalid="ignore", divide="ignore"):
        out = num / den
    return np.where(valid, out, np.nan).astype(np.float32)


def surface_from_points(xyz: FloatArray, grid: Grid) -> NDArray[np.float32]:
    """Interpolate point heights onto ``grid``: NaN outside the points' convex hull.

    Args:
        xyz: UTM metres, shape ``(n, 3)``, n >= 3 (outliers already removed).

    Returns:
        Heights in metres, float32, shape ``(grid.height, grid.width)``.

    Raises:
        ProcessingFailedError: fewer than 3 points.
    """
    from scipy.interpolate import griddata

    if len(xyz) < 3:
        raise ProcessingFailedError(f"{len(xyz)} points are too few for a surface")
    xs, ys = np.meshgrid(grid.xs(), grid.ys())
    # interpolate in local coordinates: Delaunay on 5e6-sized numbers loses precision
    ox, oy = grid.left, grid.top
    heights = griddata(
        (xyz[:, 0] - ox, xyz[:, 1] - oy), xyz[:, 2], (xs - ox, ys - oy), method="linear"
    ).astype(np.float32)
    return _nan_gaussian(heights, DSM_SMOOTHING_M / grid.res_m)


def fill_nearest(data: NDArray[np.float32]) -> NDArray[np.float32]:
    """Replace NaN cells by the value of the nearest valid cell.

    Raises:
        ProcessingFailedError: no cell is valid.
    """
    from scipy.ndimage import distance_transform_edt

    invalid = ~np.isfinite(data)
    if not invalid.any():
        return data
    if invalid.all():
        raise ProcessingFailedError("surface has no valid cell")
    _, (rows, cols) = distance_transform_edt(invalid, return_indices=True)
    return np.asarray(data[rows, cols], dtype=np.float32)


def dtm_from_dsm(dsm: NDArray[np.float32], res_m: float) -> NDArray[np.float32]:
    """A ground surface from a DSM (NaN = nodata): morphological opening, then smoothing.

    Returns:
        float32, same shape, NaN where the DSM is NaN; never above the DSM by more than the
        smoothing changes.
    """
    from scipy.ndimage import maximum_filter, minimum_filter

    if not np.isfinite(dsm).any():
        return dsm.copy()
    size = max(3, int(round(DTM_WINDOW_M / res_m)) | 1)
    filled = fill_nearest(dsm)
    opened = maximum_filter(minimum_filter(filled, size=size), size=size)
    smooth = _nan_gaussian(opened.astype(np.float32), size / 4.0)
    return np.where(np.isfinite(dsm), np.minimum(smooth, dsm), np.nan).astype(np.float32)


# -- orthophoto ---------------------------------------------------------------------------------


def _load_rgb(path: Path) -> NDArray[np.uint8]:
    with Image.open(path) as image:
        return np.asarray(image.convert("RGB"))


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


def render_orthophoto(
    scene: Scene,
    image_dir: Path,
    grid: Grid,
    height_at: HeightSampler,
    *,
    log: Callable[[str], None] = logger.info,
) -> NDArray[np.uint8]:
    """Colour every cell of ``grid`` from the best camera (see the module docstring).

    Args:
        scene: posed cameras.
        image_dir: folder of the image files named as the cameras.
        grid: the orthophoto grid.
        height_at: ``(rows, cols) -> z`` of orthophoto cells in metres (the surface).
        log: progress line sink.

    Returns:
        RGBA, uint8, shape ``(4, grid.height, grid.width)``; alpha 255 where coloured, else 0.
    """
    block = SELECTION_BLOCK
    brows = -(-grid.height // block)
    bcols = -(-grid.width // block)
    # block centres, in orthophoto cell indices
    crow = np.minimum(np.arange(brows) * block + block // 2, grid.height - 1)
    ccol = np.minimum(np.arange(bcols) * block + block // 2, grid.width - 1)
    rr, cc = np.meshgrid(crow, ccol, indexing="ij")
    bx = grid.left + (cc + 0.5) * grid.res_m
    by = grid.top - (rr + 0.5) * grid.res_m
    bz = height_at(rr.ravel(), cc.ravel()).reshape(rr.shape)
    best = np.full(rr.shape, -1, dtype=np.int32)
    best_score = np.full(rr.shape, np.inf)
    block_grid = Grid(grid.left, grid.top, grid.res_m * block, bcols, brows)
    z_low, z_high, z_mid = float(bz.min()), float(bz.max()), float(np.median(bz))
    for index, camera in enumerate(scene.cameras):
        window = camera_window(camera, block_grid, z_low, z_high)
        if window is None:
            continue
        u, v, depth = camera.project(bx[window], by[window], bz[window])
        # a block counts as seen when its centre is within half a block of the image
        gsd = max((camera.center[2] - z_mid) / camera.focal_px, 1e-3)
        margin = 0.75 * block * grid.res_m / gsd
        seen = _inside(camera, u, v, depth, margin)
        score = np.hypot((u - camera.cx) / camera.width, (v - camera.cy) / camera.height)
        # a camera that holds the block centre itself always beats one that only grazes it
        score = np.where(_inside(camera, u, v, depth), score, score + 10.0)
        better = seen & (score < best_score[window])
        best[window][better] = index
        best_score[window][better] = score[better]

    rgba = np.zeros((4, grid.height, grid.width), dtype=np.uint8)
    offsets = np.arange(block, dtype=np.int32)
    used = 0
    for index, camera in enumerate(scene.cameras):
        brow, bcol = np.nonzero(best == index)
        if brow.size == 0:
            continue
        used += 1
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
        # camera-relative float32 offsets: no large UTM numbers in the hot loop
        dx = cols.astype(np.float32) * np.float32(grid.res_m) + np.float32(
            grid.left + 0.5 * grid.res_m - camera.center[0]
        )
        dy = rows.astype(np.float32) * np.float32(-grid.res_m) + np.float32(
            grid.top - 0.5 * grid.res_m - camera.center[1]
        )
        dz = (height_at(rows, cols) - camera.center[2]).astype(np.float32)
        u, v, depth = camera.project_offsets(dx, dy, dz)
        seen = _inside(camera, u, v, depth)
        if not seen.any():
            continue
        image = _load_rgb(image_dir / camera.name)
        colour = _bilinear(image, u[seen], v[seen])
        flat = rows[seen].astype(np.intp) * grid.width + cols[seen]
        for band in range(3):
            rgba[band].reshape(-1)[flat] = colour[:, band]
        rgba[3].reshape(-1)[flat] = 255
    log(
        f"Orthophoto {grid.width}x{grid.height} cells at {grid.res_m * 100:.1f} cm "
        f"from {used} images"
    )
    return rgba


def surface_sampler(surface: NDArray[np.float32], surface_grid: Grid, grid: Grid) -> HeightSampler:
    """``(rows, cols) -> z`` for cells of ``grid``, bilinear in a gap-free ``surface`` on
    ``surface_grid`` (edges clamped)."""
    from scipy.ndimage import map_coordinates

    data = surface.astype(np.float64)

    def height_at(rows: NDArray[np.integer[Any]], cols: NDArray[np.integer[Any]]) -> FloatArray:
        y = grid.top - (rows + 0.5) * grid.res_m
        x = grid.left + (cols + 0.5) * grid.res_m
        srow = (surface_grid.top - y) / surface_grid.res_m - 0.5
        scol = (x - surface_grid.left) / surface_grid.res_m - 0.5
        return np.asarray(map_coordinates(data, [srow, scol], order=1, mode="nearest"))

    return height_at


# -- writers ------------------------------------------------------------------------------------


def write_geotiff(
    path: Path,
    data: NDArray[Any],
    grid: Grid,
    epsg: int,
    *,
    nodata: float | None = None,
    tags: dict[str, str] | None = None,
    rgba: bool = False,
) -> None:
    """Write a tiled, DEFLATE-compressed GeoTIFF (written to a temporary name, then renamed).

    Args:
        data: shape ``(bands, rows, cols)`` or ``(rows, cols)``.
        rgba: mark 4 uint8 bands as red, green, blue, alpha.
    """
    import rasterio
    from rasterio.enums import ColorInterp

    array = data if data.ndim == 3 else data[None]
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp.tif")
    profile: dict[str, Any] = {
        "driver": "GTiff",
        "width": grid.width,
        "height": grid.height,
        "count": array.shape[0],
        "dtype": array.dtype.name,
        "crs": f"EPSG:{epsg}",
        "transform": grid.transform,
        "tiled": True,
        "blockxsize": 256,
        "blockysize": 256,
        "compress": "deflate",
        "zlevel": 1,
        "bigtiff": "if_safer",
        "num_threads": "all_cpus",
    }
    if array.dtype == np.float32:
        profile["predictor"] = 3
    if nodata is not None:
        profile["nodata"] = nodata
    if rgba:
        profile["photometric"] = "RGB"
        profile["alpha"] = "YES"
    with rasterio.Env(GDAL_TIFF_INTERNAL_MASK=True):
        with rasterio.open(tmp, "w", **profile) as dst:
            dst.write(array)
            if rgba:
                dst.colorinterp = [
                    ColorInterp.red,
                    ColorInterp.green,
                    ColorInterp.blue,
                    ColorInterp.alpha,
                ]
            if tags:
                dst.update_tags(**tags)
    tmp.replace(path)


def write_laz(path: Path, xyz: FloatArray, rgb: NDArray[np.uint8], epsg: int) -> None:
    """Write coloured points as LAZ: LAS 1.2, point format 3, 1 cm scale, CRS as GeoTIFF keys.

    Colours are stored as 0-255 in the 16-bit RGB fields, as OpenDroneMap's own point clouds do.
    """
    import laspy
    from pyproj import CRS

    header = laspy.LasHeader(point_format=3, version="1.2")
    header.scales = np.array([0.01, 0.01, 0.01])
    header.offsets = np.floor(xyz.min(axis=0)) if len(xyz) else np.zeros(3)
    header.add_crs(CRS.from_epsg(epsg))
    las = laspy.LasData(header)
    las.x, las.y, las.z = xyz[:, 0], xyz[:, 1], xyz[:, 2]
    las.red, las.green, las.blue = (rgb[:, i].astype(np.uint16) for i in range(3))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp.laz")
    las.write(tmp)
    tmp.replace(path)


def write_shots_geojson(path: Path, scene: Scene) -> None:
    """Camera positions as a GeoJSON FeatureCollection (WGS 84 lon/lat/altitude, RFC 7946).

    Properties per shot: ``filename``, ``width``, ``height``, ``focal`` (focal / long side, as
    OpenSfM), ``translation`` (UTM x, y, z metres), ``rotation`` (world-to-camera, row-major 3x3),
    ``epsg`` and ``method``.
    """
    from pyproj import Transformer

    transformer = Transformer.from_crs(scene.epsg, 4326, always_xy=True)
    features = []
    for camera in scene.cameras:
        lon, lat = transformer.transform(camera.center[0], camera.center[1])
        features.append(
            {
                "type": "Feature",
                "geometry": {"type": "Point", "coordinates": [lon, lat, camera.center[2]]},
                "properties": {
                    "filename": camera.name,
                    "width": camera.width,
                    "height": camera.height,
                    "focal": camera.focal_px / max(camera.width, camera.height),
                    "translation": list(camera.center),
                    "rotation": [v for row in camera.rotation for v in row],
                    "epsg": scene.epsg,
                    "method": scene.method,
                },
            }
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"type": "FeatureCollection", "features": features}, indent=1))


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
    step = max(1, int(round(spacing_m / grid.res_m)))
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
            grid.left + (cols + 0.5) * grid.res_m,
            grid.top - (rows + 0.5) * grid.res_m,
            height_at(rows, cols),
        ]
    )
    return xyz, rgba[:3, rows, cols].T.copy()
