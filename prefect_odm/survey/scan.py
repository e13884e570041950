"""Scan a survey: list images, read their metadata, give every problem image a reason (adapter).

Reads from a local folder (recursive) or any fsspec URL prefix (``s3://bucket/prefix`` with
``storage_options``, e.g. an ``endpoint_url``). Local folders: :mod:`prefect_odm.survey.local_scan`
(an unchanged image is answered by :mod:`prefect_odm.survey.identity_cache` with no file opened;
any other is read once, whole: ``sha256:<hex>`` identity, header, decode). Object stores: per
file only the header bytes (:mod:`prefect_odm.survey.exif`) plus a short tail read that tells
whether a JPEG is complete; identity ``etag:<etag>:<size>`` (no full read), falling back to
sha256 when the store gives no ETag.

Rejection rules (each rejected file keeps its reason, :data:`prefect_odm.models.RejectReason`):

* ``empty_file``, ``not_an_image``, ``truncated``, ``unreadable`` -- from the header read;
  ``unreadable`` also for a local image whose pixels do not decode whole (Pillow, once per
  content: the identity cache remembers images that decoded);
* ``duplicate`` -- same identity as an image earlier in name order (the first is kept);
* ``no_gps`` -- no GPS latitude/longitude in EXIF; ``gps_zero`` -- GPS at exactly (0, 0);
* ``position_outlier`` -- far from the rest (:func:`~prefect_odm.survey.flight_checks.position_outlier_mask`);
* ``low_altitude`` -- far below the survey's flight height
  (:func:`~prefect_odm.survey.flight_checks.low_altitude_mask`).
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from prefect_odm.errors import InputError, NoImagesError, StorageError
from prefect_odm.fingerprints import survey_fingerprint
from prefect_odm.geo import project_lonlat, survey_utm_epsg
from prefect_odm.models import ImageMetadata, ImageRecord, RejectedImage, Survey
from prefect_odm.settings import prefect_odm_home
from prefect_odm.storage import StorageOptions, file_size_bytes, filesystem, is_local, local_path
from prefect_odm.survey.exif import METADATA_READER_VERSION
from prefect_odm.survey.flight_checks import low_altitude_mask, position_outlier_mask
from prefect_odm.survey.identity_cache import open_default_cache
from prefect_odm.survey.local_scan import (
    IMAGE_SUFFIXES as IMAGE_SUFFIXES,  # re-exported
)
from prefect_odm.survey.local_scan import (
    FileResult,
    is_image_name,
    is_stray_name,
    local_folder,
    map_in_threads,
    no_images_error,
    read_header_into,
    scan_local,
    stray_result,
)

logger = logging.getLogger(__name__)


@dataclass
class ScanStats:
    """Counters of one scan: files, bytes read for metadata and for identities, seconds."""

    files: int = 0
    metadata_bytes: int = 0
    identity_bytes: int = 0
    seconds: float = 0.0

    @property
    def metadata_bytes_per_image(self) -> float:
        """Header bytes read per image (0 before any file)."""
        return self.metadata_bytes / self.files if self.files else 0.0

    @property
    def images_per_second(self) -> float:
        """Files scanned per second of wall time (0 before any time passed)."""
        return self.files / self.seconds if self.seconds else 0.0


def _scan_remote_file(
    fs: Any, root: str, path: str, info: Mapping[str, object], protocol: str
) -> FileResult:
    name = path[len(root) :].lstrip("/")
    size = file_size_bytes(info)
    res = FileResult(name=name, url=f"{protocol}://{path}", size_bytes=size)

    def read(offset: int, length: int) -> bytes:
        if length <= 0:
            return b""
        return bytes(fs.cat_file(path, start=offset, end=offset + length))

    read_header_into(res, read)
    etag = info.get("ETag") or info.get("etag")
    if etag:
        res.identity = f"etag:{str(etag).strip(chr(34))}:{size}"
    else:
        data = read(0, size)
        res.identity_bytes = len(data)
        res.identity = f"sha256:{hashlib.sha256(data).hexdigest()}"
    return res


def check_local_images(images: str) -> None:
    """Fail fast on a local images location that the scan would refuse: it does not exist, is
    not a folder, or holds no image file by name (the listing only; no file is read). Other
    locations (``s3://``...) are left to the scan.

    Raises:
        InputError: the location does not exist or is not a folder.
        NoImagesError: no file in it has an image suffix (:data:`IMAGE_SUFFIXES`).
    """
    if "://" in images and not images.startswith("file://"):
        return
    root = local_folder(images)
    for path in root.rglob("*"):
        if is_image_name(path.relative_to(root).as_posix()) and path.is_file():
            return
    raise no_images_error(images)


def check_output_outside_images(images: str, output: str) -> None:
    """Refuse an output location that is the images location or lies inside it.

    The scan lists the images location recursively: an output inside it would make every rerun
    scan the run's own products as rejected images (and change nothing but the time it takes).
    Local paths are compared resolved (symbolic links, ``..``); URLs (``s3://bucket/prefix``)
    by their text, a prefix ending at a ``/``.

    Raises:
        InputError: one line naming both locations.
    """
    inside: bool
    if is_local(images) and is_local(output):
        root = local_path(images).resolve()
        out = local_path(output).resolve()
        inside = out == root or root in out.parents
    elif is_local(images) or is_local(output):
        inside = False
    else:
        inside = (output.rstrip("/") + "/").startswith(images.rstrip("/") + "/")
    if inside:
        raise InputError(
            f"{output}: the output is inside the images location {images} (the scan would read "
            "the run's own products as images); choose an output outside it"
        )


def _scan_remote(
    images: str, storage_options: StorageOptions | None, max_workers: int
) -> list[FileResult]:
    fs, root_path = filesystem(images, storage_options)
    protocol = images.split("://", 1)[0]
    root_path = root_path.rstrip("/")
    try:
        found = fs.find(root_path, detail=True)
    except FileNotFoundError as exc:
        raise InputError(f"{images}: does not exist") from exc
    except Exception as exc:  # noqa: BLE001 - botocore/aiohttp errors are not OSError
        raise StorageError(f"{images}: cannot list ({type(exc).__name__}: {exc})") from exc
    entries = sorted(
        (p, info)
        for p, info in found.items()
        if info.get("type", "file") == "file" and is_image_name(p[len(root_path) :].lstrip("/"))
    )
    if not entries:
        if not found and not fs.exists(root_path):
            raise InputError(f"{images}: does not exist")
        raise no_images_error(images)
    strays = [
        stray_result(p[len(root_path) :].lstrip("/"), f"{protocol}://{p}", file_size_bytes(info))
        for p, info in sorted(found.items())
        if info.get("type", "file") == "file" and is_stray_name(p[len(root_path) :].lstrip("/"))
    ]
    scanned = map_in_threads(
        lambda e: _scan_remote_file(fs, root_path, e[0], e[1], protocol), entries, max_workers
    )
    return [*scanned, *strays]


def _list_and_scan(
    images: str,
    storage_options: StorageOptions | None,
    max_workers: int,
    use_identity_cache: bool,
) -> list[FileResult]:
    if "://" not in images or images.startswith("file://"):
        cache = (
            open_default_cache(prefect_odm_home(), METADATA_READER_VERSION)
            if use_identity_cache
            else None
        )
        try:
            return scan_local(images, max_workers, cache)
        finally:
            if cache is not None:
                cache.close()
    return _scan_remote(images, storage_options, max_workers)


def _mark_duplicates(readable: list[FileResult]) -> None:
    """Reject every image with the identity of one earlier in name order, naming that image
    (``same bytes as IMG_1.JPG``; from an object store's ETag identity, ``same ETag and size
    as ...``)."""
    seen: dict[str, str] = {}
    for r in readable:
        if r.identity in seen:
            same = "same ETag and size" if r.identity.startswith("etag:") else "same bytes"
            r.reason, r.detail = "duplicate", f"{same} as {seen[r.identity]}"
        else:
            seen[r.identity] = r.name


def _mark_without_gps(readable: list[FileResult]) -> None:
    """Reject the images without a GPS position, or with GPS at exactly (0, 0)."""
    for r in readable:
        if r.reason is not None:
            continue
        assert r.meta is not None
        if not r.meta.has_gps:
            r.reason, r.detail = "no_gps", "no GPS latitude/longitude in EXIF"
        elif abs(r.meta.latitude or 0.0) < 1e-9 and abs(r.meta.longitude or 0.0) < 1e-9:
            r.reason, r.detail = "gps_zero", "GPS position is (0, 0)"


def _metas(results: list[FileResult]) -> list[ImageMetadata]:
    """The metadata of files whose header was read."""
    metas: list[ImageMetadata] = []
    for r in results:
        assert r.meta is not None
        metas.append(r.meta)
    return metas


def _mark_position_outliers(located: list[FileResult]) -> None:
    """Reject the images far from the rest (:func:`position_outlier_mask`)."""
    metas = _metas(located)
    lat = np.array([m.latitude for m in metas], dtype=np.float64)
    lon = np.array([m.longitude for m in metas], dtype=np.float64)
    # Zone of the median position: robust to the outliers being looked for.
    zone = survey_utm_epsg([float(np.median(lat))], [float(np.median(lon))])
    x, y = project_lonlat(lon, lat, zone)
    far = position_outlier_mask(x, y)
    cx, cy = float(np.median(x)), float(np.median(y))
    for r, bad, xi, yi in zip(located, far, x, y, strict=True):
        if bad:
            r.reason = "position_outlier"
            r.detail = f"{np.hypot(xi - cx, yi - cy):.0f} m from the survey's median position"


def _mark_low_altitude(kept: list[FileResult]) -> None:
    """Reject the images far below the flight height (:func:`low_altitude_mask`)."""
    metas = _metas(kept)
    low = low_altitude_mask([m.altitude_m for m in metas], [m.relative_altitude_m for m in metas])
    for r, m, bad in zip(kept, metas, low, strict=True):
        if bad:
            value = m.relative_altitude_m if m.relative_altitude_m is not None else m.altitude_m
            which = "relative" if m.relative_altitude_m is not None else "absolute"
            r.reason, r.detail = (
                "low_altitude",
                f"{which} altitude {value:.1f} m, far below the flight height",
            )


def _apply_rejection_rules(images: str, results: list[FileResult]) -> None:
    """Give every problem file its reason, in rule order (see the module docstring).

    Raises:
        NoImagesError: no file is a readable image.
        InputError: no readable image has GPS.
    """
    readable = [r for r in results if r.reason is None]
    if not readable:
        if len(results) <= 3:  # few: name each file and its problem
            named = "; ".join(f"{r.name}: {r.detail or r.reason}" for r in results)
            many = (
                "its one file is not"
                if len(results) == 1
                else f"none of the {len(results)} files is"
            )
            raise NoImagesError(f"{images}: {many} a readable image ({named})")
        kinds = Counter(r.reason for r in results)
        raise NoImagesError(
            f"{images}: none of the {len(results)} files is a readable image "
            f"({', '.join(f'{k}: {v}' for k, v in sorted(kinds.items()))})"
        )
    _mark_duplicates(readable)
    _mark_without_gps(readable)
    located = [r for r in readable if r.reason is None]
    if not located:
        raise InputError(f"{images}: none of the {len(readable)} images has GPS coordinates")
    _mark_position_outliers(located)
    _mark_low_altitude([r for r in located if r.reason is None])


def _survey(images: str, accepted: list[FileResult], rejected: list[FileResult]) -> Survey:
    records = [_record(r) for r in accepted]
    crs = survey_utm_epsg([im.latitude for im in records], [im.longitude for im in records])
    return Survey(
        source=str(images),
        images=records,
        rejected=[
            RejectedImage(name=r.name, url=r.url, reason=r.reason, detail=r.detail)
            for r in rejected
            if r.reason is not None
        ],
        crs_epsg=crs,
        fingerprint=survey_fingerprint(im.identity for im in records),
        cameras=dict(sorted(Counter(im.camera for im in records).items())),
    )


def scan_images_with_stats(
    images: str,
    *,
    policy: Literal["exclude", "fail"] = "exclude",
    storage_options: StorageOptions | None = None,
    max_workers: int = 8,
    use_identity_cache: bool = True,
) -> tuple[Survey, ScanStats]:
    """:func:`scan_images`, also returning the :class:`ScanStats` of the scan."""
    if policy not in ("exclude", "fail"):
        raise InputError(f"unknown policy {policy!r}; expected 'exclude' or 'fail'")
    t0 = time.perf_counter()
    results = _list_and_scan(str(images), storage_options, max_workers, use_identity_cache)
    stats = ScanStats(
        files=len(results),
        metadata_bytes=sum(r.metadata_bytes for r in results),
        identity_bytes=sum(r.identity_bytes for r in results),
    )
    results.sort(key=lambda r: r.name)
    _apply_rejection_rules(str(images), results)
    accepted = [r for r in results if r.reason is None]
    rejected = [r for r in results if r.reason is not None]
    if policy == "fail" and rejected:
        first = rejected[0]
        more = f" (and {len(rejected) - 1} more)" if len(rejected) > 1 else ""
        raise InputError(f"{first.url}: {first.reason}: {first.detail}{more}")
    survey = _survey(images, accepted, rejected)
    stats.seconds = time.perf_counter() - t0
    for r in rejected:
        logger.info("rejected %s: %s (%s)", r.name, r.reason, r.detail)
    return survey, stats


def scan_images(
    images: str,
    *,
    policy: Literal["exclude", "fail"] = "exclude",
    storage_options: StorageOptions | None = None,
    max_workers: int = 8,
    use_identity_cache: bool = True,
) -> Survey:
    """Scan the images of a survey.

    Args:
        images: a local folder (searched recursively) or an fsspec URL prefix (``s3://bucket/p``).
        policy: ``"exclude"`` leaves problem images out and lists them with reasons in
            ``Survey.rejected``; ``"fail"`` raises on the first one.
        storage_options: fsspec options for URLs (e.g. ``{"endpoint_url": ..., "key": ...}``).
        max_workers: files read concurrently.
        use_identity_cache: take a local image's identity from the machine's cache
            (:mod:`prefect_odm.survey.identity_cache`, keyed by path and stat) instead of hashing it
            again when the file is unchanged.

    Returns:
        The :class:`~prefect_odm.models.Survey`: accepted images sorted by name, rejected files
        with reasons, ``crs_epsg`` = WGS 84 / UTM zone of the accepted images' mean position.

    Raises:
        InputError: the location does not exist or is not a folder; no image has GPS; with
            ``policy="fail"``, any rejected image (message names the file and the reason).
        NoImagesError: no image files, or none of them readable.
        StorageError: the location cannot be listed.
    """
    return scan_images_with_stats(
        images,
        policy=policy,
        storage_options=storage_options,
        max_workers=max_workers,
        use_identity_cache=use_identity_cache,
    )[0]


def _record(r: FileResult) -> ImageRecord:
    m = r.meta
    assert m is not None and m.latitude is not None and m.longitude is not None
    return ImageRecord(
        name=r.name, url=r.url, identity=r.identity, size_bytes=r.size_bytes, **m.capture_fields()
    )
