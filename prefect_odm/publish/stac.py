"""A STAC catalogue of a finished run: a Collection for the survey, an Item per product set.

``{run folder}/stac/collection.json`` (the run folder is the one holding ``manifest.json``):

- Item ``merged``: the merged orthophoto, DSM, DTM (when made) and point cloud;
- Item ``<submodel id>`` per completed submodel: that submodel's own products.

Raster assets carry the projection extension (``proj:code``/EPSG, ``proj:shape`` rows x columns,
``proj:transform`` the 6 affine terms, ``proj:bbox`` in the product's CRS) and the raster extension
(per band: nodata, data type, spatial resolution in metres, statistics over the valid pixels read
block by block with rasterio). The LAZ asset carries the point-cloud extension (``pc:count``,
``pc:density`` in points per m² of the header's xy bounds, ``pc:schemas``, encoding) read from the
LAS header with laspy, without reading the points; a COPC file (``*.copc.laz``) has the media type
``application/vnd.laszip+copc``. Items carry the run's fingerprints and NodeODM
options as ``prefect_odm:*`` properties.

Every link and asset href is relative (:attr:`pystac.CatalogType.SELF_CONTAINED`), so the run
folder can be moved or synced to object storage as it is. Reading and writing go through fsspec
(:mod:`prefect_odm.storage`): the run folder can be local or ``s3://``.

Sources: STAC 1.0 (https://github.com/radiantearth/stac-spec), the projection, raster and
point-cloud extensions (https://github.com/stac-extensions).
"""

from __future__ import annotations

import math
import posixpath
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import IO, Any

import laspy
import numpy as np
import pystac
import rasterio
from pystac.extensions.pointcloud import PhenomenologyType, PointcloudExtension, Schema, SchemaType
from pystac.extensions.projection import ProjectionExtension
from pystac.extensions.raster import (
    DataType,
    NoDataStrings,
    RasterBand,
    RasterExtension,
    Statistics,
)
from pystac.stac_io import DefaultStacIO
from rasterio.warp import transform_bounds

from prefect_odm import storage
from prefect_odm.errors import InputError
from prefect_odm.layout import OutputLayout, join
from prefect_odm.models import Manifest, SplitPlan, Survey
from prefect_odm.publish import surface
from prefect_odm.registry import DSM_SURFACES, PRODUCTS, point_cloud_format_of

STAC_FOLDER = "stac"
"""The catalogue's folder inside a run folder."""

LAZ_MEDIA_TYPE = "application/vnd.laszip"
"""Media type of a LAZ point cloud (as the point-cloud extension's examples use it)."""

COPC_MEDIA_TYPE = "application/vnd.laszip+copc"
"""Media type of a COPC point cloud (copc.io; the STAC point-cloud extension's COPC examples)."""

MERGED_ITEM_ID = "merged"

_ROLES: dict[str, list[str]] = {
    "orthophoto": ["data", "visual"],
    "dsm": ["data", "elevation"],
    "dtm": ["data", "elevation"],
    "point_cloud": ["data", "point-cloud"],
}
_TITLES: dict[str, str] = {
    "orthophoto": "Orthophoto (RGBA)",
    "dsm": "Digital surface model (DSM), metres",
    "dtm": "Digital terrain model (DTM), metres",
    "point_cloud": "Georeferenced point cloud (LAZ)",
}


class FsspecStacIO(DefaultStacIO):
    """pystac's reads and writes through :mod:`prefect_odm.storage` (local paths or fsspec URLs)."""

    def read_text_from_href(self, href: str) -> str:
        """Read ``href`` (a path or fsspec URL) as UTF-8 text."""
        return storage.read_bytes(href).decode()

    def write_text_to_href(self, href: str, txt: str) -> None:
        """Write ``txt`` to ``href`` atomically (a partial file, then renamed)."""
        storage.write_bytes_atomic(href, txt.encode())


def find_run_folder(folder: str) -> str:
    """The run folder (the one holding ``manifest.json``) at or directly under ``folder``.

    Args:
        folder: a run folder (``{output}/{survey_fingerprint[:16]}``) or an output root holding
            exactly one run.

    Raises:
        InputError: ``folder`` does not exist, no ``manifest.json`` there (the run did not
            finish), or several runs.
    """
    folder = folder.rstrip("/")
    if storage.exists(join(folder, "manifest.json")):
        return folder
    fs, path = storage.filesystem(folder)
    found = sorted(p for p in fs.glob(f"{path}/*/manifest.json"))
    if len(found) == 1:
        return posixpath.dirname(join(folder, posixpath.relpath(found[0], path)))
    if not found and not storage.exists(folder):
        raise InputError(f"{folder}: does not exist")
    if not found:
        raise InputError(f"{folder}: no manifest.json here (a finished run's folder has one)")
    raise InputError(f"{folder}: {len(found)} runs here; name one of their folders")


def write_stac(run_folder: str, manifest: Manifest | None = None) -> str:
    """Write the STAC catalogue of a finished run; returns the URL of ``stac/collection.json``.

    Args:
        run_folder: the folder holding ``manifest.json`` (local path or fsspec URL), or an output
            root holding exactly one run.
        manifest: the run's manifest when it is about to be written (the run writes the
            catalogue just before it, so the manifest stays the last file written); None: read
            ``manifest.json``.

    Returns:
        ``{run_folder}/stac/collection.json``; Items under ``stac/<item id>/<item id>.json``.

    Raises:
        InputError: no manifest, or a product the manifest names is missing or unreadable
            (the message names the file).
    """
    if storage.is_local(run_folder):  # absolute, so pystac can make every href relative
        run_folder = str(storage.local_path(run_folder).resolve())
    if manifest is None:
        run_folder = find_run_folder(run_folder)
        manifest = Manifest.model_validate(storage.read_json(join(run_folder, "manifest.json")))
    # The manifest's URLs say where the products were written; the layout says where they are
    # relative to this folder, which still holds after the folder was moved or synced.
    root, name = run_folder.rsplit("/", 1) if "/" in run_folder else (".", run_folder)
    layout = OutputLayout(root=root, survey_fingerprint=manifest.survey_fingerprint)
    if not layout.survey_dir.endswith("/" + name):
        raise InputError(
            f"{run_folder}: folder name {name!r} is not the manifest's survey fingerprint "
            f"({manifest.survey_fingerprint[:16]})"
        )
    collection = pystac.Collection(
        id=f"prefect-odm-{manifest.survey_fingerprint[:16]}",
        title=f"Drone survey {posixpath.basename(manifest.source.rstrip('/'))}",
        description=(
            f"Products of a prefect-odm run over {manifest.source}: merged orthophoto, DEMs and "
            f"point cloud, and each submodel's own ({len(manifest.submodels)} submodels)."
        ),
        extent=pystac.Extent(
            pystac.SpatialExtent([[-180.0, -90.0, 180.0, 90.0]]),
            pystac.TemporalExtent([[manifest.created, manifest.created]]),
        ),
        license="other",
    )
    merged = _merged_products(layout, manifest)
    times = acquisition_times(layout)
    items = [_item(MERGED_ITEM_ID, merged, manifest, _common_options(manifest), None, times)]
    for result in manifest.submodels:
        if result.status == "failed":
            continue
        products: dict[str, str] = {
            p: _in_folder_or_stored(
                layout.submodel_product(result.submodel_id, result.fingerprint, p),
                result.products[p],
            )
            for p in PRODUCTS
            if p in result.products
        }
        items.append(
            _item(result.submodel_id, products, manifest, result.options, result.fingerprint, times)
        )
    for item in items:
        collection.add_item(item)
    collection.update_extent_from_items()
    collection.add_asset(
        "manifest",
        pystac.Asset(href=layout.manifest, roles=["metadata"], media_type=pystac.MediaType.JSON),
    )
    if storage.exists(layout.report_md):
        collection.add_asset(
            "report",
            pystac.Asset(href=layout.report_md, roles=["overview"], media_type="text/markdown"),
        )
    stac_root = join(run_folder, STAC_FOLDER)
    collection.normalize_hrefs(stac_root)
    collection.make_all_asset_hrefs_relative()  # the Items' assets
    collection.make_asset_hrefs_relative()  # the Collection's own (manifest, report)
    collection.save(pystac.CatalogType.SELF_CONTAINED, stac_io=FsspecStacIO())
    return join(stac_root, "collection.json")


AcquisitionTimes = dict[str, tuple[datetime, datetime]]
"""Item id -> the first and last capture time of the images its products are made from."""


def acquisition_times(layout: OutputLayout) -> AcquisitionTimes:
    """When each Item's images were taken: the merged Item's from every image of
    ``plan/survey.json``, a submodel's from its images in ``plan/plan.json``.

    EXIF ``DateTimeOriginal`` is the camera's clock without a zone; it is taken as UTC (a few
    hours off at most, where the processing date would be years off). Items whose images have
    no capture time are left out (the caller falls back to the run's time).

    Raises:
        InputError: ``survey.json`` or ``plan.json`` exists but cannot be read as one.
    """
    if not storage.exists(layout.survey_json):
        return {}
    try:
        survey = Survey.model_validate(storage.read_json(layout.survey_json))
        plan = (
            SplitPlan.model_validate(storage.read_json(layout.plan_json))
            if storage.exists(layout.plan_json)
            else None
        )
    except ValueError as exc:
        raise InputError(f"{layout.plan_dir}: not a prefect-odm plan ({exc})") from exc
    taken = {
        im.name: im.capture_time.replace(tzinfo=im.capture_time.tzinfo or UTC)
        for im in survey.images
        if im.capture_time is not None
    }
    groups = {MERGED_ITEM_ID: list(taken)}
    for submodel in plan.submodels if plan is not None else []:
        groups[submodel.id] = [n for n in submodel.image_names if n in taken]
    return {
        item_id: (min(taken[n] for n in names), max(taken[n] for n in names))
        for item_id, names in groups.items()
        if names
    }


def _merged_products(layout: OutputLayout, manifest: Manifest) -> dict[str, str]:
    """Product -> its path in this run folder's ``merged/`` (the point cloud's file name, COPC or
    LAZ, as the manifest's URL names it)."""
    return {
        p: layout.merged_product(p, point_cloud_format_of(manifest.products[p]))
        for p in PRODUCTS
        if p in manifest.products
    }


def _in_folder_or_stored(in_folder: str, stored: str) -> str:
    """The product's path in the run folder when it is there, else the manifest's URL (``prefect-odm
    merge`` reads submodels from ODM projects elsewhere: their Items link to them absolutely)."""
    return in_folder if storage.exists(in_folder) else stored


def _common_options(manifest: Manifest) -> dict[str, Any]:
    """The NodeODM options every processed submodel used with the same value."""
    done = [r.options for r in manifest.submodels if r.status != "failed"]
    if not done:
        return {}
    return {k: v for k, v in done[0].items() if all(o.get(k) == v for o in done[1:])}


def _label_unmeasured(item: pystac.Item, manifest: Manifest) -> None:
    """A DSM the direct pipeline made from the images' metadata (:mod:`.surface`): the Item's
    ``prefect_odm:dsm_surface`` names it, the DSM asset's description says it in words and the
    point cloud asset is ``prefect_odm:synthetic`` (sampled from that surface)."""
    kind = surface.dsm_surface_of(manifest)
    if kind is None:
        return
    item.properties["prefect_odm:dsm_surface"] = kind
    if "dsm" in item.assets:
        item.assets["dsm"].description = f"DSM: {DSM_SURFACES[kind]}"
    if "point_cloud" in item.assets:
        cloud = item.assets["point_cloud"]
        cloud.extra_fields["prefect_odm:synthetic"] = True
        cloud.description = "Synthetic: sampled from the DSM's surface, not measured"


def _item(
    item_id: str,
    products: Mapping[str, str],
    manifest: Manifest,
    options: dict[str, Any],
    fingerprint: str | None,
    times: AcquisitionTimes,
) -> pystac.Item:
    """One Item: the assets of ``products`` (name -> URL) with their extensions; its time is
    when its images were taken (``start_datetime``/``end_datetime``), else the run's."""
    props: dict[str, Any] = {
        "prefect_odm:survey_fingerprint": manifest.survey_fingerprint,
        "prefect_odm:plan_fingerprint": manifest.plan_fingerprint,
        "prefect_odm:merge_fingerprint": manifest.merge_fingerprint,
        "prefect_odm:options": dict(options),
        "prefect_odm:version": manifest.version,
    }
    if fingerprint is not None:
        props["prefect_odm:submodel_fingerprint"] = fingerprint
    start_end = times.get(item_id)
    item = pystac.Item(
        id=item_id,
        geometry=None,
        bbox=None,
        datetime=manifest.created if start_end is None else None,
        start_datetime=None if start_end is None else start_end[0],
        end_datetime=None if start_end is None else start_end[1],
        properties=props,
    )
    item.common_metadata.created = manifest.created
    bboxes: list[tuple[float, float, float, float]] = []
    for name, url in products.items():
        title = _TITLES[name]
        if point_cloud_format_of(url) == "copc":
            title = title.replace("(LAZ)", "(COPC)")
        asset = pystac.Asset(href=url, title=title, roles=_ROLES[name])
        item.add_asset(name, asset)
        if PRODUCTS[name].kind == "point_cloud":  # type: ignore[index]
            bboxes.append(_point_cloud_fields(asset, url))
        else:
            bboxes.append(_raster_fields(asset, url, merged=fingerprint is None))
    _label_unmeasured(item, manifest)
    if not bboxes:
        raise InputError(f"{item_id}: no products to describe")
    west, south = min(b[0] for b in bboxes), min(b[1] for b in bboxes)
    east, north = max(b[2] for b in bboxes), max(b[3] for b in bboxes)
    item.bbox = [west, south, east, north]
    item.geometry = {
        "type": "Polygon",
        "coordinates": [
            [[west, south], [east, south], [east, north], [west, north], [west, south]]
        ],
    }
    return item


@contextmanager
def _opened(url: str) -> Iterator[IO[bytes]]:
    """A binary file object of ``url`` through fsspec; a missing file is an :class:`InputError`."""
    fs, path = storage.filesystem(url)
    try:
        fh = fs.open(path, "rb")
    except FileNotFoundError:
        raise InputError(f"{url}: product named by the manifest is missing") from None
    with fh:
        yield fh


def _raster_fields(
    asset: pystac.Asset, url: str, *, merged: bool
) -> tuple[float, float, float, float]:
    """Projection and raster extension fields of a GeoTIFF asset; returns its WGS84 bbox."""
    with _opened(url) as fh:
        try:  # a local file by path (read block by block), a remote one through fsspec
            ds = rasterio.open(storage.local_path(url) if storage.is_local(url) else fh)
        except rasterio.errors.RasterioIOError as exc:
            raise InputError(f"{url}: not a readable raster ({exc})") from exc
        with ds:
            epsg = ds.crs.to_epsg() if ds.crs else None
            if epsg is None:
                raise InputError(f"{url}: raster has no EPSG CRS")
            asset.media_type = pystac.MediaType.COG if merged else pystac.MediaType.GEOTIFF
            proj = ProjectionExtension.ext(asset, add_if_missing=True)
            proj.apply(
                epsg=epsg,
                shape=[ds.height, ds.width],
                transform=list(ds.transform)[:6],
                bbox=list(ds.bounds),
            )
            bands = [
                RasterBand.create(
                    nodata=_nodata(ds.nodatavals[i]),
                    data_type=DataType(ds.dtypes[i]),
                    spatial_resolution=float(abs(ds.res[0])),
                    statistics=_band_statistics(ds, i + 1),
                )
                for i in range(ds.count)
            ]
            RasterExtension.ext(asset, add_if_missing=True).apply(bands)
            return tuple(transform_bounds(ds.crs, "EPSG:4326", *ds.bounds))


def _nodata(value: float | None) -> float | NoDataStrings | None:
    if value is None:
        return None
    if math.isnan(value):
        return NoDataStrings.NAN
    return float(value)


def _band_statistics(ds: Any, band: int) -> Statistics:
    """Minimum, maximum, mean, standard deviation and valid share of one band's valid pixels
    (the dataset's mask: nodata or alpha), read block by block (memory bounded by a block)."""
    count = 0
    total = 0.0
    total_sq = 0.0
    low, high = math.inf, -math.inf
    for _, window in ds.block_windows(band):
        values = ds.read(band, window=window).astype(np.float64)
        valid = ds.read_masks(band, window=window) > 0
        picked = values[valid & np.isfinite(values)]
        if picked.size == 0:
            continue
        count += int(picked.size)
        total += float(picked.sum())
        total_sq += float(np.square(picked).sum())
        low, high = min(low, float(picked.min())), max(high, float(picked.max()))
    pixels = ds.width * ds.height
    if count == 0:
        return Statistics.create(valid_percent=0.0)
    mean = total / count
    stddev = math.sqrt(max(total_sq / count - mean * mean, 0.0))
    return Statistics.create(
        minimum=low, maximum=high, mean=mean, stddev=stddev, valid_percent=100.0 * count / pixels
    )


def _point_cloud_fields(asset: pystac.Asset, url: str) -> tuple[float, float, float, float]:
    """Point-cloud and projection extension fields of a LAS/LAZ asset from its header only;
    returns its WGS84 bbox."""
    with _opened(url) as fh:
        try:
            with laspy.open(fh) as reader:
                header = reader.header
        except laspy.errors.LaspyException as exc:
            raise InputError(f"{url}: not a readable LAS/LAZ file ({exc})") from exc
    crs = header.parse_crs()
    epsg = crs.to_epsg() if crs is not None else None
    if epsg is None:
        raise InputError(f"{url}: point cloud has no EPSG CRS")
    mins, maxs = [float(v) for v in header.mins], [float(v) for v in header.maxs]
    area_m2 = (maxs[0] - mins[0]) * (maxs[1] - mins[1])
    asset.media_type = LAZ_MEDIA_TYPE if url.lower().endswith(".laz") else "application/vnd.las"
    if point_cloud_format_of(url) == "copc":
        asset.media_type = COPC_MEDIA_TYPE
    pc = PointcloudExtension.ext(asset, add_if_missing=True)
    pc.apply(
        count=int(header.point_count),
        type=PhenomenologyType.OTHER,
        encoding="LASzip" if url.lower().endswith(".laz") else "LAS",
        schemas=[_schema(dim) for dim in header.point_format.dimensions],
        density=float(header.point_count) / area_m2 if area_m2 > 0 else None,
    )
    ProjectionExtension.ext(asset, add_if_missing=True).apply(epsg=epsg, bbox=mins + maxs)
    west, south, east, north = transform_bounds(
        f"EPSG:{epsg}", "EPSG:4326", mins[0], mins[1], maxs[0], maxs[1]
    )
    return (west, south, east, north)


def _schema(dim: Any) -> Schema:
    """A LAS dimension as a point-cloud extension schema (bit fields counted as 1 byte)."""
    kind = str(dim.kind.name)
    if kind == "FloatingPoint":
        stype = SchemaType.FLOATING
    elif kind == "SignedInteger":
        stype = SchemaType.SIGNED
    else:
        stype = SchemaType.UNSIGNED
    return Schema.create(name=dim.name, size=max(1, int(dim.num_bits) // 8), type=stype)
