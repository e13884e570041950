"""Scan a survey: list images, read their metadata, give every problem image a reason (adapter).

Reads from a local folder (recursive) or any fsspec URL prefix (``s3://bucket/prefix`` with
``storage_options``, e.g. an ``endpoint_url``). Per file it reads only the header bytes
(:mod:`prefect_odm.exif`) plus a short tail read that tells whether a JPEG is complete. Content
identity: ``sha256:<hex>`` of the whole file for local files; for object stores
``etag:<etag>:<size>`` (no full read), falling back to sha256 when the store gives no ETag.

Rejection rules (each rejected file keeps its reason, :data:`prefect_odm.models.RejectReason`):

* ``empty_file``, ``not_an_image``, ``truncated``, ``unreadable`` -- from the header read;
* ``duplicate`` -- same identity as an image earlier in name order (the first is kept);
* ``no_gps`` -- no GPS latitude/longitude in EXIF; ``gps_zero`` -- GPS at exactly (0, 0);
* ``position_outlier`` -- far from the rest (:func:`position_outlier_mask`);
* ``low_altitude`` -- far below the survey's flight height (:func:`low_altitude_mask`).
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

from prefect_odm.errors import InputError, NoImagesError, StorageError
from prefect_odm.exif import ImageHeaderError, ImageMetadata, read_metadata
from prefect_odm.fingerprints import survey_fingerprint
from prefect_odm.geo import project_lonlat, survey_utm_epsg
from prefect_odm.models import ImageRecord, RejectedImage, RejectReason, Survey

logger = logging.getLogger(__name__)

#: File name endings scanned as images (case-insensitive).
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".tif", ".tiff", ".png")
#: Robust-distance multiplier of :func:`position_outlier_mask`.
OUTLIER_MAD_FACTOR = 10.0
#: Minimum outlier distance beyond the median distance, metres (small surveys).
OUTLIER_MIN_EXCESS_M = 200.0
_HASH_CHUNK = 1 << 20


@dataclass
class ScanStats:
    """Counters of one scan: files, bytes read for metadata and for identities, seconds."""

    files: int = 0
    metadata_bytes: int = 0
    identity_bytes: int = 0
    seconds: float = 0.0

    @property
    def metadata_bytes_per_image(self) -> float:
        return self.metadata_bytes / self.files if self.files else 0.0

    @property
    def images_per_second(self) -> float:
        return self.files / self.seconds if self.seconds else 0.0


@dataclass
class _FileResult:
    name: str
    url: str
    size_bytes: int
    identity: str = ""
    meta: ImageMetadata | None = None
    reason: RejectReason | None = None
    detail: str = ""
    metadata_bytes: int = 0
    identity_bytes: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


def position_outlier_mask(x_m: ArrayLike, y_m: ArrayLike) -> NDArray[np.bool_]:
    """Positions far from the rest of the survey (median/MAD rule on distances).

    With ``d`` the distance of each position to the coordinate-wise median position, a position is
    an outlier when ``d > median(d) + max(OUTLIER_MAD_FACTOR * 1.4826 * MAD(d),
    OUTLIER_MIN_EXCESS_M)``. For a uniformly covered disk of radius R the threshold is about 3.7 R,
    so only positions well away from the flight area are flagged. (Median absolute deviation as a
    robust scale: Rousseeuw & Croux 1993, JASA 88(424).)

    Args:
        x_m, y_m: positions in a projected CRS, metres, shape ``(n,)``.
    """
    x = np.asarray(x_m, dtype=np.float64)
    y = np.asarray(y_m, dtype=np.float64)
    if len(x) < 3:
        return np.zeros(len(x), dtype=bool)
    d = np.hypot(x - np.median(x), y - np.median(y))
    med = float(np.median(d))
    mad = float(np.median(np.abs(d - med)))
    return d > med + max(OUTLIER_MAD_FACTOR * 1.4826 * mad, OUTLIER_MIN_EXCESS_M)


def low_altitude_mask(
    altitude_m: Sequence[float | None], relative_altitude_m: Sequence[float | None]
) -> NDArray[np.bool_]:
    """Images taken far below the survey's flight height (take-off and landing tails).

    With DJI relative altitude (height above the take-off point) on at least half of the images:
    low when below half the median relative altitude. Otherwise with absolute GPS altitude: low
    when more than ``max(5 * 1.4826 * MAD, 20 m)`` below the median altitude (the flight height is
    unknown without a terrain model, so only a clear drop counts). Images lacking the value used
    are never flagged.

    Args:
        altitude_m: absolute GPS altitude per image (metres) or None.
        relative_altitude_m: DJI relative altitude per image (metres) or None.
    """
    n = len(altitude_m)
    rel = np.array(
        [np.nan if v is None else float(v) for v in relative_altitude_m], dtype=np.float64
    )
    ab = np.array([np.nan if v is None else float(v) for v in altitude_m], dtype=np.float64)
    out = np.zeros(n, dtype=bool)
    if n < 3:
        return out
    if np.count_nonzero(np.isfinite(rel)) * 2 >= n:
        med = float(np.nanmedian(rel))
        if med > 0:
            with np.errstate(invalid="ignore"):
                out = np.isfinite(rel) & (rel < 0.5 * med)
        return out
    if np.count_nonzero(np.isfinite(ab)) >= 3:
        med = float(np.nanmedian(ab))
        mad = float(np.nanmedian(np.abs(ab - med)))
        with np.errstate(invalid="ignore"):
            out = np.isfinite(ab) & (ab < med - max(5 * 1.4826 * mad, 20.0))
    return out


def flight_tail_mask(
    capture_time: Sequence[datetime | None],
    x_m: ArrayLike,
    y_m: ArrayLike,
    *,
    flight_gap_seconds: float = 60.0,
    axis_tolerance_deg: float = 15.0,
    stationary_m: float = 1.0,
) -> NDArray[np.bool_]:
    """Take-off and landing tails: images shot while flying to or from the survey lines.

    Images are grouped into flights (time order, a new flight after ``flight_gap_seconds``
    without a shot). The survey lines of a flight share one axis: the distance-weighted mode of
    the track directions (modulo 180 degrees, 5-degree bins). The leading and trailing runs of
    shots whose track deviates from that axis by more than ``axis_tolerance_deg`` (or that do not
    move, hovering before landing) are the tails; turns between lines are inside the flight and
    never flagged.

    Args:
        capture_time: capture time per image; images without one are never flagged.
        x_m, y_m: positions in a projected CRS, metres.

    Returns:
        ``(n,)`` bool, True for tail images.
    """
    x = np.asarray(x_m, dtype=np.float64)
    y = np.asarray(y_m, dtype=np.float64)
    n = len(x)
    out = np.zeros(n, dtype=bool)
    timed = [i for i in range(n) if capture_time[i] is not None]
    timed.sort(key=lambda i: (capture_time[i], x[i], y[i]))
    flights: list[list[int]] = []
    for i in timed:
        if flights:
            last = flights[-1][-1]
            gap = (capture_time[i] - capture_time[last]).total_seconds()  # type: ignore[operator]
            if gap <= flight_gap_seconds:
                flights[-1].append(i)
                continue
        flights.append([i])
    for flight in flights:
        if len(flight) < 10:
            continue
        idx = np.array(flight)
        dx, dy = np.diff(x[idx]), np.diff(y[idx])
        step = np.hypot(dx, dy)
        axis = np.degrees(np.arctan2(dy, dx)) % 180.0
        hist, edges = np.histogram(axis, bins=36, range=(0.0, 180.0), weights=step)
        main = (edges[int(np.argmax(hist))] + 2.5) % 180.0
        dev = np.abs((axis - main + 90.0) % 180.0 - 90.0)
        off = (dev > axis_tolerance_deg) | (step < stationary_m)
        # off[j] describes the move from shot j to shot j+1.
        m = len(off)
        start = 0
        while start < m and off[start]:
            start += 1
        end = m
        while end > start and off[end - 1]:
            end -= 1
        if start > 0:
            out[idx[:start]] = True
        if end < m:
            out[idx[end + 1 :]] = True
    return out


def _is_image_name(name: str) -> bool:
    return name.lower().endswith(IMAGE_SUFFIXES) and not os.path.basename(name).startswith(".")


def _scan_local_file(root: Path, path: Path) -> _FileResult:
    name = path.relative_to(root).as_posix()
    size = path.stat().st_size
    res = _FileResult(name=name, url=str(path), size_bytes=size)
    with path.open("rb") as fh:

        def read(offset: int, length: int) -> bytes:
            fh.seek(offset)
            return fh.read(length)

        try:
            res.meta, res.metadata_bytes = read_metadata(read, size)
        except ImageHeaderError as exc:
            res.reason, res.detail = exc.reason, exc.detail
        digest = hashlib.sha256()
        fh.seek(0)
        while chunk := fh.read(_HASH_CHUNK):
            digest.update(chunk)
            res.identity_bytes += len(chunk)
    res.identity = f"sha256:{digest.hexdigest()}"
    return res


def _scan_remote_file(
    fs: Any, root: str, path: str, info: dict[str, Any], protocol: str
) -> _FileResult:
    name = path[len(root) :].lstrip("/")
    size = int(info.get("size") or 0)
    res = _FileResult(name=name, url=f"{protocol}://{path}", size_bytes=size)

    def read(offset: int, length: int) -> bytes:
        if length <= 0:
            return b""
        return bytes(fs.cat_file(path, start=offset, end=offset + length))

    try:
        res.meta, res.metadata_bytes = read_metadata(read, size)
    except ImageHeaderError as exc:
        res.reason, res.detail = exc.reason, exc.detail
    etag = info.get("ETag") or info.get("etag")
    if etag:
        res.identity = f"etag:{str(etag).strip(chr(34))}:{size}"
    else:
        data = read(0, size)
        res.identity_bytes = len(data)
        res.identity = f"sha256:{hashlib.sha256(data).hexdigest()}"
    return res


def _list_and_scan(
    images: str, storage_options: dict[str, Any] | None, max_workers: int
) -> list[_FileResult]:
    if "://" not in images or images.startswith("file://"):
        root = Path(images[len("file://") :] if images.startswith("file://") else images)
        if not root.exists():
            raise InputError(f"{images}: does not exist")
        if not root.is_dir():
            raise InputError(f"{images}: is not a folder")
        paths = sorted(
            p
            for p in root.rglob("*")
            if p.is_file() and _is_image_name(p.relative_to(root).as_posix())
        )
        if not paths:
            raise NoImagesError(f"{images}: no image files ({', '.join(IMAGE_SUFFIXES)}) found")
        with ThreadPoolExecutor(max_workers=max(1, max_workers)) as pool:
            return list(pool.map(lambda p: _scan_local_file(root, p), paths))
    try:
        from fsspec.core import url_to_fs

        fs, root_path = url_to_fs(images, **(storage_options or {}))
    except (ImportError, ValueError) as exc:
        raise StorageError(f"{images}: cannot open this location ({exc})") from exc
    protocol = images.split("://", 1)[0]
    root_path = root_path.rstrip("/")
    try:
        found = fs.find(root_path, detail=True)
    except FileNotFoundError as exc:
        raise InputError(f"{images}: does not exist") from exc
    except OSError as exc:
        raise StorageError(f"{images}: cannot list ({exc})") from exc
    entries = sorted(
        (p, info)
        for p, info in found.items()
        if info.get("type", "file") == "file" and _is_image_name(p[len(root_path) :].lstrip("/"))
    )
    if not entries:
        if not found and not fs.exists(root_path):
            raise InputError(f"{images}: does not exist")
        raise NoImagesError(f"{images}: no image files ({', '.join(IMAGE_SUFFIXES)}) found")
    with ThreadPoolExecutor(max_workers=max(1, max_workers)) as pool:
        return list(
            pool.map(lambda e: _scan_remote_file(fs, root_path, e[0], e[1], protocol), entries)
        )


def scan_survey_with_stats(
    images: str,
    *,
    policy: Literal["exclude", "fail"] = "exclude",
    storage_options: dict[str, Any] | None = None,
    max_workers: int = 8,
) -> tuple[Survey, ScanStats]:
    """:func:`scan_survey`, also returning the :class:`ScanStats` of the scan."""
    if policy not in ("exclude", "fail"):
        raise InputError(f"unknown policy {policy!r}; expected 'exclude' or 'fail'")
    t0 = time.perf_counter()
    results = _list_and_scan(str(images), storage_options, max_workers)
    stats = ScanStats(
        files=len(results),
        metadata_bytes=sum(r.metadata_bytes for r in results),
        identity_bytes=sum(r.identity_bytes for r in results),
    )
    results.sort(key=lambda r: r.name)
    readable = [r for r in results if r.reason is None]
    if not readable:
        kinds = Counter(r.reason for r in results)
        raise NoImagesError(
            f"{images}: none of the {len(results)} files is a readable image "
            f"({', '.join(f'{k}: {v}' for k, v in sorted(kinds.items()))})"
        )
    seen: dict[str, str] = {}
    for r in readable:
        if r.identity in seen:
            r.reason, r.detail = "duplicate", f"same content as {seen[r.identity]}"
        else:
            seen[r.identity] = r.name
    for r in readable:
        if r.reason is not None:
            continue
        assert r.meta is not None
        if not r.meta.has_gps:
            r.reason, r.detail = "no_gps", "no GPS latitude/longitude in EXIF"
        elif abs(r.meta.latitude or 0.0) < 1e-9 and abs(r.meta.longitude or 0.0) < 1e-9:
            r.reason, r.detail = "gps_zero", "GPS position is (0, 0)"
    located = [r for r in readable if r.reason is None]
    if not located:
        raise InputError(f"{images}: none of the {len(readable)} images has GPS coordinates")
    metas = [r.meta for r in located]
    lat = np.array([m.latitude for m in metas], dtype=np.float64)  # type: ignore[union-attr]
    lon = np.array([m.longitude for m in metas], dtype=np.float64)  # type: ignore[union-attr]
    # Zone of the median position: robust to the outliers being looked for.
    zone = survey_utm_epsg([float(np.median(lat))], [float(np.median(lon))])
    x, y = project_lonlat(lon, lat, zone)
    far = position_outlier_mask(x, y)
    cx, cy = float(np.median(x)), float(np.median(y))
    for r, bad, xi, yi in zip(located, far, x, y, strict=True):
        if bad:
            r.reason = "position_outlier"
            r.detail = f"{np.hypot(xi - cx, yi - cy):.0f} m from the survey's median position"
    kept = [r for r in located if r.reason is None]
    low = low_altitude_mask(
        [r.meta.altitude_m for r in kept],  # type: ignore[union-attr]
        [r.meta.relative_altitude_m for r in kept],  # type: ignore[union-attr]
    )
    for r, bad in zip(kept, low, strict=True):
        if bad:
            assert r.meta is not None
            value = (
                r.meta.relative_altitude_m
                if r.meta.relative_altitude_m is not None
                else r.meta.altitude_m
            )
            which = "relative" if r.meta.relative_altitude_m is not None else "absolute"
            r.reason, r.detail = (
                "low_altitude",
                f"{which} altitude {value:.1f} m, far below the flight height",
            )
    accepted = [r for r in results if r.reason is None]
    rejected = [r for r in results if r.reason is not None]
    if policy == "fail" and rejected:
        first = rejected[0]
        more = f" (and {len(rejected) - 1} more)" if len(rejected) > 1 else ""
        raise InputError(f"{first.url}: {first.reason}: {first.detail}{more}")
    records = [_record(r) for r in accepted]
    crs = survey_utm_epsg([im.latitude for im in records], [im.longitude for im in records])
    survey = Survey(
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
    stats.seconds = time.perf_counter() - t0
    for r in rejected:
        logger.info("rejected %s: %s (%s)", r.name, r.reason, r.detail)
    return survey, stats


def scan_survey(
    images: str,
    *,
    policy: Literal["exclude", "fail"] = "exclude",
    storage_options: dict[str, Any] | None = None,
    max_workers: int = 8,
) -> Survey:
    """Scan the images of a survey.

    Args:
        images: a local folder (searched recursively) or an fsspec URL prefix (``s3://bucket/p``).
        policy: ``"exclude"`` leaves problem images out and lists them with reasons in
            ``Survey.rejected``; ``"fail"`` raises on the first one.
        storage_options: fsspec options for URLs (e.g. ``{"endpoint_url": ..., "key": ...}``).
        max_workers: files read concurrently.

    Returns:
        The :class:`~prefect_odm.models.Survey`: accepted images sorted by name, rejected files
        with reasons, ``crs_epsg`` = WGS 84 / UTM zone of the accepted images' mean position.

    Raises:
        InputError: the location does not exist or is not a folder; no image has GPS; with
            ``policy="fail"``, any rejected image (message names the file and the reason).
        NoImagesError: no image files, or none of them readable.
        StorageError: the location cannot be listed.
    """
    return scan_survey_with_stats(
        images, policy=policy, storage_options=storage_options, max_workers=max_workers
    )[0]


def _record(r: _FileResult) -> ImageRecord:
    m = r.meta
    assert m is not None and m.latitude is not None and m.longitude is not None
    return ImageRecord(
        name=r.name,
        url=r.url,
        identity=r.identity,
        size_bytes=r.size_bytes,
        width=m.width,
        height=m.height,
        latitude=m.latitude,
        longitude=m.longitude,
        altitude_m=m.altitude_m,
        relative_altitude_m=m.relative_altitude_m,
        gimbal_pitch_deg=m.gimbal_pitch_deg,
        gimbal_yaw_deg=m.gimbal_yaw_deg,
        flight_yaw_deg=m.flight_yaw_deg,
        make=m.make,
        model=m.model,
        focal_length_mm=m.focal_length_mm,
        focal_length_35mm=m.focal_length_35mm,
        capture_time=m.capture_time,
    )


@dataclass(frozen=True)
class SequenceGap:
    """Missing shots in a flight: the camera kept moving but no photo exists.

    Attributes:
        before, after: indices (into the input arrays) of the shots on either side of the gap.
        missing: estimated number of missing shots (from the shot interval).
        x_m, y_m: midpoint of the gap, metres.
        length_m: distance between the shots on either side, metres.
    """

    before: int
    after: int
    missing: int
    x_m: float
    y_m: float
    length_m: float


def find_sequence_gaps(
    capture_time: Sequence[datetime | None],
    x_m: ArrayLike,
    y_m: ArrayLike,
    *,
    flight_gap_seconds: float = 60.0,
    ratio: float = 1.75,
) -> list[SequenceGap]:
    """Gaps in the shot sequence of each flight (deleted or never taken photos).

    Drones shoot at a fixed interval. Within a flight (see :func:`flight_tail_mask`), a step whose
    time interval is at least ``ratio`` times the flight's median interval marks missing
    shots when the camera kept moving through it (distance at least half what its local speed,
    the median speed of two steps on each side, gives over that interval); the interval ratio
    estimates how many shots are missing. Hovering (no distance) is not a gap.

    Args:
        capture_time: capture time per image (images without one are skipped).
        x_m, y_m: positions in a projected CRS, metres.

    Returns:
        Gaps in flight and time order.
    """
    x = np.asarray(x_m, dtype=np.float64)
    y = np.asarray(y_m, dtype=np.float64)
    timed = sorted(
        (i for i in range(len(x)) if capture_time[i] is not None),
        key=lambda i: (capture_time[i], x[i], y[i]),
    )
    flights: list[list[int]] = []
    for i in timed:
        if flights:
            gap = (capture_time[i] - capture_time[flights[-1][-1]]).total_seconds()  # type: ignore[operator]
            if gap <= flight_gap_seconds:
                flights[-1].append(i)
                continue
        flights.append([i])
    out: list[SequenceGap] = []
    for flight in flights:
        if len(flight) < 6:
            continue
        idx = np.array(flight)
        dt = np.array(
            [
                (capture_time[b] - capture_time[a]).total_seconds()
                for a, b in zip(idx, idx[1:], strict=False)
            ]
        )
        step = np.hypot(np.diff(x[idx]), np.diff(y[idx]))
        dt0 = float(np.median(dt[dt > 0])) if np.any(dt > 0) else 0.0
        if dt0 <= 0:
            continue
        speed = np.where(dt > 0, step / np.maximum(dt, 1e-9), 0.0)
        for j in range(len(step)):
            if dt[j] < ratio * dt0:
                continue
            around = np.concatenate([speed[max(0, j - 2) : j], speed[j + 1 : j + 3]])
            if len(around) == 0:
                continue
            local_speed = float(np.median(around))
            # The camera kept moving at about its local speed through the long interval.
            if local_speed <= 0 or step[j] < 0.5 * local_speed * dt[j]:
                continue
            a, b = int(idx[j]), int(idx[j + 1])
            out.append(
                SequenceGap(
                    before=a,
                    after=b,
                    missing=max(1, int(round(dt[j] / dt0)) - 1),
                    x_m=float((x[a] + x[b]) / 2),
                    y_m=float((y[a] + y[b]) / 2),
                    length_m=float(step[j]),
                )
            )
    return out
