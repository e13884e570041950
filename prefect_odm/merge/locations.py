"""Whether each submodel's products lie where its images are (adapter: rasterio, laspy, pyproj).

Checked before the merge (and the alignment before it) reads or allocates anything from the
products: a node that returns canned products wherever the survey is (NodeODM's test mode gives
brighton's, EPSG:32615, to a survey in Freetown) or another survey's outputs would otherwise
make the merge build a grid spanning both places. Only headers are read: a raster's CRS and
bounds, a LAZ header's CRS and its mins/maxs.

The rule: a product's bounding box, taken to the survey CRS (edges densified), must come within
``max(TOLERANCE_MIN_M, d)`` of its submodel's planned footprint, ``d`` being that footprint's
diagonal. GPS error (metres to tens of metres), the half image footprint around the cameras and
a DSM's edge effects all fit well inside it; a product off by more than the footprint's own size
is not of those images. The distance reported is the planar one in the survey CRS up to
:data:`GEODESIC_BEYOND_M`, beyond it (another UTM zone distorts planar distances) the geodesic
distance between the product's centre and the footprint's centre.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import laspy
import numpy as np
import pyproj
import rasterio
from shapely.geometry import MultiPoint, box, shape
from shapely.geometry.base import BaseGeometry

from prefect_odm import storage
from prefect_odm.errors import MergeError, MisplacedProductError
from prefect_odm.grid import Bounds
from prefect_odm.ownership import Ownership
from prefect_odm.registry import PRODUCTS

TOLERANCE_MIN_M = 100.0
"""The least distance a product may lie from its submodel's planned footprint, metres (the
tolerance is ``max(TOLERANCE_MIN_M, the footprint's diagonal)``)."""

GEODESIC_BEYOND_M = 100_000.0
"""Planar distances in the survey CRS above this are reported as geodesic centre distances."""

_POINT_CLOUD_SUFFIXES = (".laz", ".las")


@dataclass(frozen=True)
class ProductPlace:
    """Where one product file lies, from its header.

    Attributes:
        path: the file (local path or URL).
        crs: its CRS, None when the header has none (a LAZ: taken as the survey's).
        bounds: ``(left, bottom, right, top)`` in ``crs`` units.
    """

    path: str
    crs: pyproj.CRS | None
    bounds: Bounds


def _crs_name(crs: pyproj.CRS | None) -> str:
    if crs is None:
        return "no CRS"
    epsg = crs.to_epsg()
    return f"EPSG:{epsg}" if epsg is not None else str(crs.name)


def read_place(url: str) -> ProductPlace:
    """The CRS and bounds of a raster (GeoTIFF) or point cloud (LAS/LAZ) from its header.

    Args:
        url: a local path or fsspec URL; a remote file is read through fsspec (header bytes
            only).

    Raises:
        MergeError: the file cannot be opened or its header read (naming it).
    """
    try:
        member = url.split("::", 1)[0]  # zip://MEMBER::ARCHIVE names the member first
        if member.lower().endswith(_POINT_CLOUD_SUFFIXES):
            return _point_cloud_place(url)
        return _raster_place(url)
    except (OSError, rasterio.errors.RasterioError, laspy.LaspyException) as exc:
        raise MergeError(f"{url} cannot be opened to check where it lies: {exc}") from exc


def _raster_place(url: str) -> ProductPlace:
    if storage.is_local(url):
        ds_ctx = rasterio.open(storage.local_path(url))
    else:
        fs, path = storage.filesystem(url)
        ds_ctx = rasterio.open(path, opener=fs)
    with ds_ctx as ds:
        crs = None if ds.crs is None else pyproj.CRS.from_wkt(ds.crs.to_wkt())
        return ProductPlace(url, crs, tuple(ds.bounds))


def _point_cloud_place(url: str) -> ProductPlace:
    fs, path = storage.filesystem(url)
    with fs.open(path, "rb") as fh, laspy.open(fh) as reader:
        header = reader.header
        try:
            crs = header.parse_crs()
        except Exception as exc:  # noqa: BLE001 - laspy raises several types here
            raise MergeError(f"{url}: unreadable CRS: {exc}") from exc
        mins, maxs = header.mins, header.maxs
        bounds = (float(mins[0]), float(mins[1]), float(maxs[0]), float(maxs[1]))
    return ProductPlace(url, crs, bounds)


def footprints_from_ownership(ownership: Ownership) -> dict[str, BaseGeometry]:
    """Each submodel's cameras' convex hull (a point or line for one or two cameras), in the
    ownership's CRS: the planned footprint where the plan's own is not at hand."""
    out: dict[str, BaseGeometry] = {}
    owners = np.asarray(ownership.camera_submodel)
    for sid in ownership.submodel_ids:
        mine = owners == sid
        points = np.column_stack([ownership.x_m[mine], ownership.y_m[mine]])
        out[sid] = MultiPoint([tuple(p) for p in points]).convex_hull
    return out


@dataclass(frozen=True)
class Misplaced:
    """One product that does not lie where its submodel's images are.

    Attributes:
        submodel_id: the submodel.
        place: the product's header place.
        distance_m: from the product to the submodel's planned footprint, metres.
        tolerance_m: the distance it was allowed.
    """

    submodel_id: str
    place: ProductPlace
    distance_m: float
    tolerance_m: float


@functools.lru_cache(maxsize=64)
def _transformer(src: pyproj.CRS, dst: pyproj.CRS) -> pyproj.Transformer:
    """One transformer per pair of CRSs (a merge has a few; each costs milliseconds to make)."""
    return pyproj.Transformer.from_crs(src, dst, always_xy=True)


def _geodesic_m(
    a: tuple[float, float], a_crs: pyproj.CRS, b: tuple[float, float], b_crs: pyproj.CRS
) -> float:
    """Geodesic distance between two points given in their CRSs, metres (WGS 84)."""
    lonlat = pyproj.CRS.from_epsg(4326)
    lon_a, lat_a = _transformer(a_crs, lonlat).transform(*a)
    lon_b, lat_b = _transformer(b_crs, lonlat).transform(*b)
    _, _, dist = pyproj.Geod(ellps="WGS84").inv(lon_a, lat_a, lon_b, lat_b)
    return float(dist)


def _distance_m(place: ProductPlace, footprint: BaseGeometry, survey: pyproj.CRS) -> float:
    """Distance from the product's box to ``footprint`` (survey CRS), metres (see module)."""
    own = place.crs if place.crs is not None else survey
    left, bottom, right, top = place.bounds
    planar = math.inf
    try:
        if own.equals(survey):
            moved = place.bounds
        else:
            moved = _transformer(own, survey).transform_bounds(
                left, bottom, right, top, densify_pts=21
            )
        if all(math.isfinite(v) for v in moved):
            planar = float(footprint.distance(box(*moved)))
    except pyproj.exceptions.ProjError:
        pass
    if planar <= GEODESIC_BEYOND_M:
        return planar
    x0, y0, x1, y1 = footprint.bounds  # the footprint's box centre: it is never empty here
    return _geodesic_m(
        ((left + right) / 2, (bottom + top) / 2), own, ((x0 + x1) / 2, (y0 + y1) / 2), survey
    )


def _product_order(name: str) -> int:
    """The registry's order (orthophoto first)."""
    return [str(n) for n in PRODUCTS].index(name)


def _tolerance_m(footprint: BaseGeometry) -> float:
    x0, y0, x1, y1 = footprint.bounds
    return max(TOLERANCE_MIN_M, math.hypot(x1 - x0, y1 - y0))


def misplaced_products(
    products: Mapping[str, Mapping[str, str]],
    footprints: Mapping[str, BaseGeometry | Mapping[str, Any]],
    crs_epsg: int,
) -> list[Misplaced]:
    """The products lying farther from their submodel's planned footprint than the tolerance
    (see the module), sorted by submodel id, then product (orthophoto first).

    Args:
        products: submodel id -> product name -> file (local path or URL); names the registry
            does not know (:data:`prefect_odm.registry.PRODUCTS`) are not merged, nor checked.
        footprints: submodel id -> planned footprint in ``crs_epsg`` (a shapely geometry or a
            GeoJSON dict); submodels without one are not checked.
        crs_epsg: the survey's CRS.

    Raises:
        MergeError: a product cannot be opened or its header read.
    """
    survey = pyproj.CRS.from_epsg(crs_epsg)
    out = []
    for sid in sorted(products):
        planned = footprints.get(sid)
        if planned is None:
            continue
        area = planned if isinstance(planned, BaseGeometry) else shape(dict(planned))
        if area.is_empty:
            continue
        tolerance = _tolerance_m(area)
        for name in sorted((n for n in products[sid] if n in PRODUCTS), key=_product_order):
            place = read_place(products[sid][name])
            distance = _distance_m(place, area, survey)
            if not distance <= tolerance:
                out.append(Misplaced(sid, place, distance, tolerance))
    return out


def check_product_locations(
    products: Mapping[str, Mapping[str, str]],
    footprints: Mapping[str, BaseGeometry | Mapping[str, Any]],
    crs_epsg: int,
    advice: Callable[[str], str],
) -> None:
    """Refuse products that do not lie where their submodel's images are (see the module).

    Args:
        products, footprints, crs_epsg: as :func:`misplaced_products`.
        advice: submodel id -> what to run (ends the error line).

    Raises:
        MisplacedProductError: one line naming the first such submodel, its file, the distance
            and both CRSs, and how many other submodels have such products.
        MergeError: a product cannot be opened or its header read.
    """
    found = misplaced_products(products, footprints, crs_epsg)
    if not found:
        return
    first = found[0]
    others = tuple(sorted({m.submodel_id for m in found} - {first.submodel_id}))
    raise MisplacedProductError(
        first.submodel_id,
        first.place.path,
        first.distance_m,
        _crs_name(first.place.crs or pyproj.CRS.from_epsg(crs_epsg)),
        f"EPSG:{crs_epsg}",
        advice(first.submodel_id),
        others,
    )
