"""Synthetic submodel products for the alignment's stage checks (tests only).

One textured ground (grey blobs for the orthophotos, smooth bumps on the 1 in 10 slope of
``align_blocks.make_block`` for the DSMs) cut into the submodels of a block, each written as an
RGBA orthophoto and a DSM GeoTIFF in EPSG:32615 that agree exactly where they overlap: products
with no misregistration. A submodel's products can be moved by a known raster correction (as
the merge would move them), and its cameras written as a ``shots.geojson``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import rasterio
from align_blocks import ORIGIN, Block
from rasterio.transform import Affine, from_origin
from scipy.ndimage import gaussian_filter, map_coordinates

from prefect_odm.align import CameraTable, RasterCorrection

ORTHO_RES_M = 0.2
DSM_RES_M = 0.5
CRS = "EPSG:32615"


def _field(shape: tuple[int, int], sigma: float, seed: int) -> np.ndarray:
    noise = np.random.default_rng(seed).normal(0.0, 1.0, shape)
    smooth = gaussian_filter(noise, sigma)
    return smooth / smooth.std()


class Ground:
    """The true ground over ``bounds`` (plan CRS metres, ``(left, bottom, right, top)``)."""

    def __init__(self, bounds: tuple[float, float, float, float]) -> None:
        self.bounds = bounds
        left, bottom, right, top = bounds
        rows = int((top - bottom) / ORTHO_RES_M)
        cols = int((right - left) / ORTHO_RES_M)
        self.grey = np.clip(128 + 45 * _field((rows, cols), 2.0, 7), 1, 255)
        self.bumps = 1.5 * _field((rows // 5, cols // 5), 6.0, 11)

    def _sample(self, image: np.ndarray, res: float, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        left, _, _, top = self.bounds
        cols = (x - left) / res - 0.5
        rows = (top - y) / res - 0.5
        out: np.ndarray = map_coordinates(image, [rows, cols], order=1, mode="nearest")
        return out

    def grey_at(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        return self._sample(self.grey, ORTHO_RES_M, x, y)

    def height_at(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        bumps = self._sample(self.bumps, ORTHO_RES_M * 5, x, y)
        return 0.1 * (x - ORIGIN[0]) + bumps


def write_products(
    ground: Ground, box: tuple[float, float, float, float], folder: Path
) -> dict[str, str]:
    """The orthophoto and DSM of the ground over ``box``, in ``folder``: product -> path."""
    folder.mkdir(parents=True, exist_ok=True)
    left, bottom, right, top = box
    out = {}
    for name, res in (("orthophoto", ORTHO_RES_M), ("dsm", DSM_RES_M)):
        cols, rows = int(round((right - left) / res)), int(round((top - bottom) / res))
        xs = left + (np.arange(cols) + 0.5) * res
        ys = top - (np.arange(rows) + 0.5) * res
        gx, gy = np.meshgrid(xs, ys)
        path = folder / f"{name}.tif"
        profile = {"driver": "GTiff", "width": cols, "height": rows, "crs": CRS,
                   "transform": from_origin(left, top, res, res)}  # fmt: skip
        if name == "orthophoto":
            grey = ground.grey_at(gx, gy).astype(np.uint8)
            bands = np.stack([grey, grey, grey, np.full_like(grey, 255)])
            with rasterio.open(path, "w", count=4, dtype="uint8", **profile) as dst:
                dst.write(bands)
        else:
            z = ground.height_at(gx, gy).astype(np.float32)
            with rasterio.open(path, "w", count=1, dtype="float32", nodata=-9999.0,
                               **profile) as dst:  # fmt: skip
                dst.write(z[None])
        out[name] = str(path)
    return out


def move_products(products: dict[str, str], fix: RasterCorrection) -> None:
    """Rewrite a submodel's products as the merge would place them after ``fix``: corrected
    geotransforms, and the DSM's heights with the height correction."""
    for name in ("orthophoto", "dsm"):
        with rasterio.open(products[name], "r+") as ds:
            t = ds.transform
            if name == "dsm":
                z = ds.read(1)
                rows, cols = np.indices(z.shape)
                x = t.c + (cols + 0.5) * t.a
                y = t.f + (rows + 0.5) * t.e
                z = fix.corrected_heights(x, y, z).astype(np.float32)
                ds.write(z[None])
            ds.transform = Affine(*fix.corrected_geotransform((t.a, t.b, t.c, t.d, t.e, t.f)))


def write_shots(table: CameraTable, path: Path) -> str:
    """The cameras of ``table`` as a ``shots.geojson`` (ODM's properties)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    assert table.rotations is not None
    features = [
        {
            "type": "Feature",
            "geometry": None,
            "properties": {
                "filename": name,
                "translation": [float(v) for v in table.centres[i]],
                "rotation": [float(v) for v in table.rotations[i].ravel()],
            },
        }
        for i, name in enumerate(table.names)
    ]
    path.write_text(json.dumps({"type": "FeatureCollection", "features": features}))
    return str(path)


def block_products(
    block: Block, tables: list[CameraTable], folder: Path
) -> tuple[dict[str, dict[str, str]], dict[str, str], Ground]:
    """Products and ``shots.geojson`` of every submodel of ``block``: each submodel's products
    cover its true cameras' extent (no misregistration, whatever ``tables`` say).

    Returns:
        (submodel id -> product -> path, submodel id -> shots path, the ground).
    """
    xy = np.stack(list(block.truth.values()))[:, :2]
    ground = Ground((xy[:, 0].min() - 20, xy[:, 1].min() - 20,
                     xy[:, 0].max() + 20, xy[:, 1].max() + 20))  # fmt: skip
    products, shots = {}, {}
    for table in tables:
        sid = table.submodel_id
        mine = np.stack([block.truth[n] for n in block.members[sid]])[:, :2]
        box = (mine[:, 0].min() - 10, mine[:, 1].min() - 10,
               mine[:, 0].max() + 10, mine[:, 1].max() + 10)  # fmt: skip
        products[sid] = write_products(ground, box, folder / sid)
        shots[sid] = write_shots(table, folder / sid / "shots.geojson")
    return products, shots, ground
