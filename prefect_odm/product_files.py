"""Whether stored product files are there and whole, before a run trusts a reuse (no Prefect).

A submodel's ``result.json`` and a run's ``manifest.json`` name product files; a reuse of either
is trusted only when each named file exists with the size recorded when it was written
(:func:`product_sizes`). A record written before sizes were recorded has none: its files must
then open (a raster's header with rasterio, a point cloud's with laspy). Both are cheap: one stat
per file, a header read only for old records; no product is read in full.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from prefect_odm import storage
from prefect_odm.errors import StorageError


def product_sizes(products: Mapping[str, str]) -> dict[str, int]:
    """Product name -> size in bytes of each stored file (one stat each).

    Raises:
        StorageError: a file cannot be listed (it was just written, so this is a storage fault).
    """
    sizes: dict[str, int] = {}
    for name, url in products.items():
        fs, path = storage.filesystem(url)
        try:
            sizes[name] = storage.file_size_bytes(fs.info(path))
        except OSError as exc:
            raise StorageError(f"{url}: cannot read its size ({exc})") from exc
    return sizes


def _last_block_inside(raster: Any, size: int) -> bool:
    """Whether the last block of the raster's last band ends within the file's ``size`` bytes
    (a GeoTIFF's header, at its start, still opens when the file was cut short)."""
    rows, cols = (-(-raster.height // raster.block_shapes[-1][0]),
                  -(-raster.width // raster.block_shapes[-1][1]))  # fmt: skip
    where = f"{cols - 1}_{rows - 1}"
    offset = raster.get_tag_item(f"BLOCK_OFFSET_{where}", "TIFF", bidx=raster.count)
    length = raster.get_tag_item(f"BLOCK_SIZE_{where}", "TIFF", bidx=raster.count)
    if not offset or not length:
        return bool(raster.driver != "GTiff")  # a GeoTIFF whose block table is cut off is not whole
    return int(offset) + int(length) <= size


def _opens(url: str, size: int) -> bool:
    """Whether the file's header opens: rasterio for a raster (and its last block lies within
    its ``size`` bytes), laspy for a point cloud; any other file only has to exist."""
    lowered = url.lower()
    try:
        if lowered.endswith((".tif", ".tiff")):
            import rasterio

            with rasterio.open(url) as raster:
                return _last_block_inside(raster, size)
        if lowered.endswith((".las", ".laz")):
            import laspy

            fs, path = storage.filesystem(url)
            with fs.open(path, "rb") as fh, laspy.open(fh):
                return True
    except Exception:  # any reader's refusal means the file is not whole
        return False
    return True


def damaged_products(products: Mapping[str, str], sizes: Mapping[str, int]) -> str | None:
    """Why the stored ``products`` cannot be trusted, or ``None`` when each is there and whole.

    Args:
        products: product name -> URL of the stored file.
        sizes: product name -> bytes recorded when it was written; a product without a recorded
            size (an older record) must open instead (:func:`_opens`).

    Returns:
        ``"missing (URL)"``, ``"damaged (URL: N of M bytes)"`` or ``"damaged (URL does not
        open)"`` for the first product that fails; ``None`` when all pass.
    """
    for name, url in sorted(products.items()):
        try:
            fs, path = storage.filesystem(url)
            info = fs.info(path)
        except (FileNotFoundError, StorageError):
            return f"missing ({url})"
        except OSError as exc:
            return f"unreadable ({url}: {exc})"
        size = storage.file_size_bytes(info)
        expected = sizes.get(name)
        if expected is not None and size != expected:
            return f"damaged ({url}: {size} of {expected} bytes)"
        if expected is None and not _opens(url, size):
            return f"damaged ({url} does not open)"
    return None
