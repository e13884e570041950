"""UTM zone choice and projection of WGS 84 positions to metres (pure core: numpy + pyproj).

A survey is planned in ONE projected CRS: the WGS 84 / UTM zone of its mean longitude (EPSG 326xx
north of the equator, 327xx south), even when some images lie in the neighbouring zone. UTM stays
usable a few degrees outside its zone (scale error ~0.1 % at 3 degrees past the edge), far beyond
any drone survey, while splitting a survey between two CRSs would break the plan's geometry.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from functools import lru_cache
from typing import Any, TypedDict

import numpy as np
from numpy.typing import ArrayLike, NDArray
from pyproj import Transformer

from prefect_odm.errors import InputError

logger = logging.getLogger(__name__)


class GeoJSONGeometry(TypedDict):
    """A GeoJSON geometry object (RFC 7946, section 3.1) in a projected CRS, as shapely's
    ``mapping`` writes a polygon: ``type`` (``Polygon``, ``MultiPolygon``) and ``coordinates``
    (nested sequences of ``(x, y)`` positions, CRS units)."""

    type: str
    coordinates: Sequence[Any]


def utm_zone_number(longitude_deg: float) -> int:
    """UTM zone number 1..60 of a longitude in degrees (standard 6-degree zones, no exceptions)."""
    lon = ((float(longitude_deg) + 180.0) % 360.0) - 180.0
    return min(60, int(math.floor((lon + 180.0) / 6.0)) + 1)


def utm_epsg(latitude_deg: float, longitude_deg: float) -> int:
    """EPSG code of the WGS 84 / UTM zone holding ``(latitude_deg, longitude_deg)``.

    Raises:
        InputError: for latitudes outside [-90, 90] or non-finite values.
    """
    if not (math.isfinite(latitude_deg) and math.isfinite(longitude_deg)) or abs(latitude_deg) > 90:
        raise InputError(f"invalid position lat={latitude_deg} lon={longitude_deg}")
    zone = utm_zone_number(longitude_deg)
    return (32600 if latitude_deg >= 0 else 32700) + zone


def survey_utm_epsg(latitude_deg: ArrayLike, longitude_deg: ArrayLike) -> int:
    """The UTM zone of a whole survey: the zone of its mean position.

    The mean longitude is the circular mean, so a survey across the antimeridian is handled.

    Args:
        latitude_deg, longitude_deg: WGS 84 degrees, shape ``(n,)``, n >= 1.

    Raises:
        InputError: when no position is given.
    """
    lat = np.asarray(latitude_deg, dtype=np.float64)
    lon = np.asarray(longitude_deg, dtype=np.float64)
    if lat.size == 0:
        raise InputError("no position to choose a UTM zone from")
    rad = np.radians(lon)
    mean_lon = math.degrees(math.atan2(float(np.sin(rad).mean()), float(np.cos(rad).mean())))
    return utm_epsg(float(lat.mean()), mean_lon)


@lru_cache(maxsize=16)
def _transformer(src_epsg: int, dst_epsg: int) -> Transformer:
    return Transformer.from_crs(src_epsg, dst_epsg, always_xy=True)


def project_lonlat(
    longitude_deg: ArrayLike, latitude_deg: ArrayLike, epsg: int
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Project WGS 84 longitude/latitude (degrees) to ``epsg`` (x, y in metres), shape kept."""
    x, y = _transformer(4326, int(epsg)).transform(
        np.asarray(longitude_deg, dtype=np.float64), np.asarray(latitude_deg, dtype=np.float64)
    )
    return np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)


def unproject_xy(
    x_m: ArrayLike, y_m: ArrayLike, epsg: int
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Inverse of :func:`project_lonlat`: (longitude, latitude) in degrees."""
    lon, lat = _transformer(int(epsg), 4326).transform(
        np.asarray(x_m, dtype=np.float64), np.asarray(y_m, dtype=np.float64)
    )
    return np.asarray(lon, dtype=np.float64), np.asarray(lat, dtype=np.float64)


def half_footprint_m(
    height_above_ground_m: float | None,
    focal_length_35mm: float | None,
    *,
    default_m: float = 30.0,
) -> float:
    """Half the ground width of a nadir image's long side, in metres.

    The 35 mm equivalent focal length ``f35`` fixes the horizontal field of view on the 36 mm
    frame width: ground width = ``h * 36 / f35``. Falls back to ``default_m`` when either value is
    missing or not positive.
    """
    if not height_above_ground_m or not focal_length_35mm:
        return default_m
    if height_above_ground_m <= 0 or focal_length_35mm <= 0:
        return default_m
    return float(height_above_ground_m) * 36.0 / float(focal_length_35mm) / 2.0
