"""Files of the built-in engine's products: GeoTIFF rasters, the LAZ point cloud, camera shots."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from prefect_odm.engine.camera import ImageMeta, Scene
from prefect_odm.engine.footprints import FloatArray
from prefect_odm.grid import Grid

ENGINE_TAG = "PREFECT_ODM_ENGINE_METHOD"
"""GeoTIFF metadata tag that names the method that made a raster (``sfm`` or ``direct``)."""


def write_geotiff(
    path: Path,
    data: NDArray[Any],
    grid: Grid,
    epsg: int,
    *,
    nodata: float | None = None,
    tags: dict[str, str] | None = None,
    rgba: bool = False,
    descriptions: tuple[str, ...] = (),
) -> None:
    """Write a tiled, DEFLATE-compressed GeoTIFF (written to a temporary name, then renamed).

    Args:
        data: shape ``(bands, rows, cols)`` or ``(rows, cols)``.
        rgba: mark 4 uint8 bands as red, green, blue, alpha.
        descriptions: band descriptions (GDAL's band names), from band 1; may be fewer.
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
        "transform": grid.affine,
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
            for band, text in enumerate(descriptions, start=1):
                dst.set_band_description(band, text)
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


def write_cameras_json(path: Path, scene: Scene, images: Sequence[ImageMeta]) -> None:
    """The camera models as ODM writes ``cameras.json``: OpenSfM's ``brown`` camera per camera.

    One entry per camera (make, model, image size), keyed as ODM keys it (OpenSfM's camera id
    without ``v2``: ``"make model width height brown focal"``, lower case, the focal prior as a
    ratio of the long side cut to 6 characters; ODM ``opendm/camera.py``). Values are OpenSfM's
    normalised ones: ``focal_x``, ``focal_y`` the focal length over the long side; ``c_x``,
    ``c_y`` the principal point's offset from the image centre over the long side; ``k1``,
    ``k2`` the radial terms on normalised image coordinates (the same in COLMAP and OpenSfM);
    ``p1``, ``p2``, ``k3`` zero (the engine does not refine them). ODM takes the file back with
    ``--cameras``. Cameras of images that did not register are left out.
    """
    from prefect_odm.engine.camera_calibration import odm_camera_id

    by_name = {m.name: m for m in images}
    cameras: dict[str, dict[str, Any]] = {}
    for pose in scene.cameras:
        meta = by_name.get(pose.name)
        size = float(max(pose.width, pose.height))
        if meta is not None:
            key = odm_camera_id(meta)
        else:
            key = (
                f"unknown unknown {pose.width} {pose.height} brown {str(pose.focal_px / size)[:6]}"
            )
        cameras.setdefault(
            key,
            {
                "projection_type": "brown",
                "width": pose.width,
                "height": pose.height,
                "focal_x": pose.focal_px / size,
                "focal_y": pose.focal_px / size,
                "c_x": (pose.cx - pose.width / 2.0) / size,
                "c_y": (pose.cy - pose.height / 2.0) / size,
                "k1": pose.k1,
                "k2": pose.k2,
                "p1": 0.0,
                "p2": 0.0,
                "k3": 0.0,
            },
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(cameras, indent=4))
