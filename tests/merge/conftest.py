"""Synthetic rasters and point clouds for the merge tests (small, made in tmp_path)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import rasterio
from numpy.typing import NDArray
from rasterio.transform import from_origin

EPSG = 32615
LEFT = 576_000.0
TOP = 5_188_400.0


def ground_texture(height: int, width: int, seed: int = 7) -> NDArray[np.uint8]:
    """A ``(3, height, width)`` uint8 ground image with smooth shading, edges and noise.

    Values stay within 30..200 so a +20 DN brightening never saturates.
    """
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float64)
    img = np.empty((3, height, width))
    for c in range(3):
        img[c] = 110 + 40 * np.sin(xx / (17 + 5 * c)) * np.cos(yy / (23 + 3 * c))
    # "buildings": bright and dark rectangles (high-contrast features)
    for _ in range(12):
        r, q = rng.integers(0, height - 30), rng.integers(0, width - 30)
        img[:, r : r + rng.integers(8, 30), q : q + rng.integers(8, 30)] = rng.choice([45, 185])
    img += rng.normal(0, 4, img.shape)
    return np.clip(img, 30, 200).astype(np.uint8)


def rgba_profile(
    width: int,
    height: int,
    left: float,
    top: float,
    res: float,
    epsg: int = EPSG,
    block: int = 128,
    **extra: Any,
) -> dict[str, Any]:
    """Creation options of a tiled RGBA GeoTIFF (alpha band 4) with square ``res`` pixels whose
    top-left corner is ``(left, top)`` in ``EPSG:epsg`` (shared with the merge benchmarks)."""
    return {
        "driver": "GTiff",
        "width": width,
        "height": height,
        "count": 4,
        "dtype": "uint8",
        "crs": f"EPSG:{epsg}",
        "transform": from_origin(left, top, res, res),
        "photometric": "RGB",
        "ALPHA": "YES",
        "tiled": True,
        "blockxsize": block,
        "blockysize": block,
        **extra,
    }


def write_rgba(
    path: Path,
    rgb: NDArray[np.uint8],
    left: float,
    top: float,
    res: float,
    alpha: NDArray[np.bool_] | None = None,
    epsg: int = EPSG,
) -> Path:
    """Write an RGBA GeoTIFF (alpha 255 where ``alpha`` is True or everywhere)."""
    _, h, w = rgb.shape
    a = (
        np.full((h, w), 255, np.uint8)
        if alpha is None
        else np.where(alpha, 255, 0).astype(np.uint8)
    )
    with rasterio.open(path, "w", **rgba_profile(w, h, left, top, res, epsg)) as dst:
        dst.write(rgb, indexes=[1, 2, 3])
        dst.write(a, 4)
    return path


def write_dem(
    path: Path, z: NDArray[np.float32], left: float, top: float, res: float, epsg: int = EPSG
) -> Path:
    """Write a single-band float32 GeoTIFF with OpenDroneMap's nodata (-9999)."""
    with rasterio.open(
        path,
        "w",
        driver="GTiff",
        width=z.shape[1],
        height=z.shape[0],
        count=1,
        dtype="float32",
        crs=f"EPSG:{epsg}",
        transform=from_origin(left, top, res, res),
        nodata=-9999.0,
    ) as dst:
        dst.write(z, 1)
    return path


TILES = {"a": (0, 300, 0, 240), "b": (0, 180, 160, 400), "c": (120, 300, 160, 400)}
"""Tile windows ``(row0, row1, col0, col1)`` on a 300 x 400 ground (in units of ``scale``)."""

CAMERAS = [
    (LEFT + 12.0, TOP - 15.0, "a"),
    (LEFT + 6.0, TOP - 8.0, "a"),
    (LEFT + 28.0, TOP - 8.0, "b"),
    (LEFT + 34.0, TOP - 5.0, "b"),
    (LEFT + 28.0, TOP - 22.0, "c"),
    (LEFT + 35.0, TOP - 26.0, "c"),
]
"""Core cameras ``(x_m, y_m, submodel_id)`` of the three tiles."""


@pytest.fixture
def ortho_tiles(tmp_path: Path) -> Callable[..., dict[str, Path]]:
    """Factory: a 40 m x 30 m ground image cut into three overlapping tiles a, b, c.

    Args (of the factory): ``brighten`` submodel id -> DN added; ``scale`` pixels per 0.1 m;
    ``holes`` submodel id -> list of ``(row0, row1, col0, col1)`` ground windows made alpha 0.

    Returns:
        ``(tiles, ground)``: submodel id -> path, and the ``(3, rows, cols)`` ground image.
    """

    def make(
        brighten: dict[str, int] | None = None,
        scale: int = 1,
        holes: dict[str, list[tuple[int, int, int, int]]] | None = None,
        folder: str = "tiles",
    ) -> tuple[dict[str, Path], NDArray[np.uint8]]:
        res = 0.1 / scale
        ground = ground_texture(300 * scale, 400 * scale)
        base = tmp_path / folder
        base.mkdir(exist_ok=True)
        out = {}
        for sid, (r0, r1, c0, c1) in TILES.items():
            r0, r1, c0, c1 = (v * scale for v in (r0, r1, c0, c1))
            tile = ground[:, r0:r1, c0:c1].astype(np.int16) + (brighten or {}).get(sid, 0)
            alpha = np.ones(tile.shape[1:], dtype=bool)
            for hr0, hr1, hc0, hc1 in (holes or {}).get(sid, []):
                alpha[
                    max(hr0 * scale - r0, 0) : max(hr1 * scale - r0, 0),
                    max(hc0 * scale - c0, 0) : max(hc1 * scale - c0, 0),
                ] = False
            out[sid] = write_rgba(
                base / f"{sid}.tif",
                np.clip(tile, 0, 255).astype(np.uint8),
                LEFT + c0 * res,
                TOP - r0 * res,
                res,
                alpha=alpha,
            )
        return out, ground

    return make
