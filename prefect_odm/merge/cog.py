"""Cloud Optimized GeoTIFF output of the raster merges (adapter: rasterio, rio-cogeo).

Blocks go to a tiled, uncompressed temporary GeoTIFF; its overviews are built there (average,
down to one 512-pixel tile, :func:`build_overviews`) and GDAL's COG driver copies data and
overviews into a COG (:func:`write_cog`: DEFLATE with predictor by default, compressed on
``workers`` threads), checked with ``rio_cogeo.cog_validate`` and only then moved to its final
name. GDAL's block cache is bounded for a whole merge by :func:`with_gdal_cache`.
"""

from __future__ import annotations

import functools
import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

import rasterio
import rasterio.shutil
from rasterio.enums import Resampling

from prefect_odm.errors import MergeError

DEFAULT_GDAL_CACHE_MB = 64
"""GDAL block cache of a merge, MiB (see ``gdal_cache_mb``)."""

FINISH_GDAL_CACHE_MB = 16
"""GDAL block cache while the overviews are built and the COG is copied, MiB (at most the
merge's): both pass over the tiled temporary GeoTIFF once, so a larger cache only held more
tiles (64 MiB filled by a 8.5 Mpx DSM, 16 MiB in a 1.9 Mpx one) for the same CPU time
(``benchmarks/bench_merge_city.py``, RESULTS.md issue 33)."""

COG_BLOCK_SIZE = 512
"""Tile side of the written COGs, pixels."""

_P = ParamSpec("_P")
_R = TypeVar("_R")


def temporary_sibling(out: Path, tag: str) -> Path:
    """A hidden, unique temporary ``.tif`` path beside ``out``."""
    return out.with_name(f".{out.stem}.{tag}.{uuid.uuid4().hex[:8]}.tif")


def gdal_cache_env(cache_mb: int) -> rasterio.Env:
    """``rasterio.Env`` bounding GDAL's block cache to ``cache_mb`` MiB inside it."""
    # in bytes: a small integer is not read as megabytes here
    return rasterio.Env(GDAL_CACHEMAX=int(cache_mb) * 1024 * 1024)


def with_gdal_cache(fn: Callable[_P, _R]) -> Callable[_P, _R]:
    """Run ``fn`` inside ``rasterio.Env(GDAL_CACHEMAX=gdal_cache_mb)`` (keyword, default 64)."""

    @functools.wraps(fn)
    def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        with gdal_cache_env(int(kwargs.get("gdal_cache_mb", DEFAULT_GDAL_CACHE_MB))):  # type: ignore[call-overload]
            return fn(*args, **kwargs)

    return wrapper


def overview_factors(width: int, height: int, block: int = COG_BLOCK_SIZE) -> list[int]:
    """Overview decimation factors down to the first level that fits in one tile (as GDAL's COG
    driver's ``OVERVIEWS=AUTO`` chooses them)."""
    factors = []
    f = 2
    while -(-max(width, height) // (f // 2)) > block:
        factors.append(f)
        f *= 2
    return factors


def build_overviews(dataset: Any, workers: int = 1) -> None:
    """Build internal overviews (average) on the uncompressed temporary GeoTIFF, on ``workers``
    threads (GDAL ``GDAL_NUM_THREADS``; the same pixels on any number).

    Building them here, on uncompressed data, and letting the COG driver copy them is about
    twice as fast as letting the COG driver compute them into a compressed temporary file.
    """
    factors = overview_factors(dataset.width, dataset.height)
    if factors:
        with rasterio.Env(GDAL_NUM_THREADS=str(max(1, workers))):
            dataset.build_overviews(factors, Resampling.average)


def write_cog(
    blocks_path: Path,
    out: Path,
    *,
    workers: int,
    compress: str,
    predictor: bool,
    compress_level: int | None = None,
    overview_resampling: str = "AVERAGE",
) -> None:
    """Convert a tiled GeoTIFF into a validated COG at ``out`` (temporary name, then promoted).

    Overviews present in ``blocks_path`` are reused; otherwise GDAL builds them.

    Args:
        blocks_path: the tiled GeoTIFF.
        out: the COG path.
        workers: compression threads (GDAL ``NUM_THREADS``).
        compress: GDAL compression name (DEFLATE, ZSTD, LZW, JPEG...).
        predictor: use GDAL's predictor.
        compress_level: GDAL ``LEVEL``, None for GDAL's default.
        overview_resampling: resampling of overviews GDAL builds itself.

    Raises:
        MergeError: GDAL failed or the result is not a valid COG.
    """
    from rio_cogeo.cogeo import cog_validate

    tmp = temporary_sibling(out, "cog")
    options: dict[str, str] = {
        "COMPRESS": compress,
        "BLOCKSIZE": str(COG_BLOCK_SIZE),
        "OVERVIEWS": "AUTO",
        "OVERVIEW_RESAMPLING": overview_resampling,
        "NUM_THREADS": str(max(1, workers)),
        "BIGTIFF": "IF_SAFER",
    }
    if predictor:
        options["PREDICTOR"] = "YES"
    if compress_level is not None:
        options["LEVEL"] = str(compress_level)
    try:
        with rasterio.Env(GDAL_NUM_THREADS=str(max(1, workers))):
            rasterio.shutil.copy(blocks_path, tmp, driver="COG", **options)
        valid, errors, _warnings = cog_validate(str(tmp), quiet=True)
        if not valid:
            raise MergeError(f"{out}: the written COG is not valid: {errors}")
        os.replace(tmp, out)
    except rasterio.errors.RasterioError as exc:
        raise MergeError(f"{out}: writing the COG failed: {exc}") from exc
    finally:
        if tmp.exists():
            tmp.unlink()
