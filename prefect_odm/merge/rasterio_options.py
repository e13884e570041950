"""The keyword records of the raster merges' rasterio and GDAL calls, typed so that a misspelt
keyword is a mypy error where it is written (rasterio itself takes ``**kwargs``).

Names are rasterio's (``crs``, ``transform``, ``resampling``, ``src_alpha``...) and GDAL's GTiff
creation options (upper case), as the calls take them.
"""

from __future__ import annotations

from typing import NotRequired, TypedDict

from rasterio.crs import CRS
from rasterio.enums import Resampling
from rasterio.transform import Affine
from rasterio.windows import Window


class WarpOptions(TypedDict, total=False):
    """The ``WarpedVRT`` keywords the merges use (rasterio's names; the first five always set)."""

    crs: CRS
    transform: Affine
    width: int
    height: int
    resampling: Resampling
    src_transform: Affine
    """The source's geotransform with its alignment correction applied."""
    src_alpha: int
    dst_alpha: int
    src_nodata: float
    nodata: float
    add_alpha: bool


class ReadKeywords(TypedDict, total=False):
    """The ``read``/``read_masks`` keywords of :meth:`.sources.SourceReader.read`."""

    window: Window
    resampling: Resampling


class GeoTiffOptions(TypedDict):
    """A product's own GeoTIFF creation options for :func:`.blocks.write_merged_raster` (rasterio's
    profile keys and GDAL's GTiff creation options)."""

    count: int
    """Bands."""
    dtype: str
    """numpy/GDAL data type name (``uint8``, ``float32``)."""
    nodata: NotRequired[float]
    """The value of cells without data (none: an alpha band says it)."""
    photometric: NotRequired[str]
    """GDAL ``PHOTOMETRIC`` (``RGB``)."""
    ALPHA: NotRequired[str]
    """GDAL ``ALPHA`` (``YES``: the last band is alpha)."""
    SPARSE_OK: NotRequired[str]
    """GDAL ``SPARSE_OK`` (``TRUE``: blocks never written take no space)."""


class CogOptions(TypedDict):
    """The :func:`.cog.write_cog` keywords a product chooses (``workers`` comes from the run)."""

    compress: str
    predictor: bool
    compress_level: NotRequired[int | None]


class BlocksProfile(GeoTiffOptions):
    """The rasterio profile of the tiled temporary GeoTIFF of :func:`.blocks.write_merged_raster`."""

    driver: str
    width: int
    height: int
    crs: CRS
    transform: Affine
    tiled: bool
    blockxsize: int
    blockysize: int
    BIGTIFF: str
