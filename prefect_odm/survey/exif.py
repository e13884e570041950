"""EXIF and XMP metadata of survey images, read from the header bytes only (pure core + Pillow).

A drone JPEG keeps everything a split plan needs (GPS, camera, dimensions, DJI attitude) in its
APP1 segments, before the first start-of-scan (SOS) marker; for DJI cameras that is ~10-70 KB of a
5-20 MB file. :func:`read_header` therefore reads :data:`HEADER_READ_BYTES` first and extends the
read only when the marker walk shows the header is longer. TIFF keeps its IFDs anywhere in the
file, so a TIFF whose tags are not inside the first read is read whole. A separate short read of
the file's tail tells whether a JPEG is complete (ends with the EOI marker ``FF D9``).

The I/O is a callable ``read(offset, length) -> bytes`` so that the same code serves local files
and object stores (ranged GETs); see :mod:`prefect_odm.survey.scan`. The byte-level readers live in
:mod:`prefect_odm.survey.jpeg_markers` (JPEG segments) and :mod:`prefect_odm.survey.tiff_ifd` (TIFF/EXIF tags);
the result is the :class:`~prefect_odm.models.ImageMetadata` model.

Sources: JPEG markers, ITU-T T.81 annex B; EXIF 2.32 (CIPA DC-008) for the GPS IFD (tags 1-6) and
the EXIF IFD (FocalLength 0x920A, FocalLengthIn35mmFilm 0xA405, DateTimeOriginal 0x9003,
FocalPlaneXResolution 0xA20E with FocalPlaneResolutionUnit 0xA210); DJI XMP
``drone-dji:`` namespace as written by DJI cameras (RelativeAltitude, GimbalPitchDegree, ...);
the XMP ``Camera:`` namespace's ``AboveGroundAltitude`` (Parrot, Sentera and MicaSense cameras
write it, as a decimal or a ``num/den`` rational; read by OpenDroneMap's ``opendm/photo.py`` too).
"""

from __future__ import annotations

import io
import logging
import math
import os
import re
import warnings
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import IO, Any

from PIL import Image, UnidentifiedImageError

from prefect_odm.errors import ImageHeaderError
from prefect_odm.models import HeaderProblem, ImageFormat, ImageMetadata
from prefect_odm.survey.jpeg_markers import jpeg_header_end, jpeg_is_complete, jpeg_segments
from prefect_odm.survey.tiff_ifd import (
    EXIF_IFD,
    GPS_IFD,
    GPS_TAGS,
    SUB_TAGS,
    TAG_DATETIME,
    TAG_DATETIME_ORIGINAL,
    TAG_FOCAL_35MM,
    TAG_FOCAL_LENGTH,
    TAG_FOCAL_PLANE_RES_UNIT,
    TAG_FOCAL_PLANE_X_RES,
    TAG_MAKE,
    TAG_MODEL,
    TIFF_ERRORS,
    TiffReader,
    read_tags,
)

__all__ = [
    "HEADER_READ_BYTES",
    "MAX_HEADER_BYTES",
    "METADATA_READER_VERSION",
    "TAIL_READ_BYTES",
    "HeaderProblem",
    "ImageFormat",
    "ImageHeaderError",
    "ImageMetadata",
    "RangeReader",
    "check_pixels_complete",
    "file_range_reader",
    "jpeg_header_end",
    "jpeg_is_complete",
    "parse_above_ground_xmp",
    "parse_dji_xmp",
    "parse_metadata",
    "read_header",
    "read_local_metadata",
    "read_metadata",
    "sniff_format",
]

logger = logging.getLogger(__name__)

#: Bytes read first from each file: the EXIF APP1 segment is at most 64 KiB (EXIF 2.32 4.5.4);
#: longer headers (XMP, ICC) are read on demand.
HEADER_READ_BYTES = 65_536
#: The version of what :func:`parse_metadata` reads from a header: raise it when a header would
#: read differently (the identity cache keeps metadata per reader version and reads again
#: files stored by another one). The fields of ImageMetadata are part of the version.
METADATA_READER_VERSION = "1:" + ",".join(ImageMetadata.model_fields)
#: Bytes read from the end of a JPEG to find its end-of-image marker.
TAIL_READ_BYTES = 1_024
#: A JPEG header longer than this is treated as unreadable (guards against runaway reads).
MAX_HEADER_BYTES = 16 * 1024 * 1024

#: ``read(offset, length) -> bytes``; may return fewer bytes at the end of the file.
RangeReader = Callable[[int, int], bytes]

#: FocalPlaneResolutionUnit -> millimetres per unit (EXIF 2.32: 2 inch, 3 cm; 4 mm and 5 um as
#: exiftool reads them). 1 (no absolute unit) and unknown values give no resolution.
_RESOLUTION_UNIT_MM = {2: 25.4, 3: 10.0, 4: 1.0, 5: 0.001}


def sniff_format(head: bytes) -> ImageFormat | None:
    """The image format from the magic bytes, ``"OTHER"`` for formats Pillow may know, or None."""
    if head[:3] == b"\xff\xd8\xff":
        return "JPEG"
    if head[:4] in (b"II*\x00", b"MM\x00*", b"II+\x00", b"MM\x00+"):
        return "TIFF"
    if head[:8] == b"\x89PNG\r\n\x1a\n":
        return "PNG"
    if not head:
        return None
    return "OTHER"


def read_header(
    read: RangeReader, size_bytes: int, *, first_read_bytes: int = HEADER_READ_BYTES
) -> bytes:
    """Read the bytes of a file that hold its metadata.

    Args:
        read: ``read(offset, length) -> bytes``.
        size_bytes: size of the file in bytes.
        first_read_bytes: bytes read first.

    Returns:
        The header bytes: for a JPEG everything up to and including the SOS segment header; for a
        TIFF the first read, or the whole file when its tags lie further in; else the first read.

    Raises:
        ImageHeaderError: ``empty_file`` for zero bytes, ``not_an_image`` for unknown magic bytes,
            ``truncated`` when a JPEG ends inside its header, ``unreadable`` for a broken header.
    """
    if size_bytes == 0:
        raise ImageHeaderError("empty_file", "the file has zero bytes")
    data = read(0, min(first_read_bytes, size_bytes))
    fmt = sniff_format(data)
    if fmt is None:
        raise ImageHeaderError("empty_file", "the file has zero bytes")
    if fmt == "JPEG":
        while True:
            end = jpeg_header_end(data)
            if end is not None:
                return data[:end]
            if len(data) >= size_bytes:
                raise ImageHeaderError(
                    "truncated", f"JPEG ends inside its header ({size_bytes} bytes)"
                )
            if len(data) >= MAX_HEADER_BYTES:
                raise ImageHeaderError(
                    "unreadable", f"JPEG header longer than {MAX_HEADER_BYTES} bytes"
                )
            more = read(len(data), min(len(data), size_bytes - len(data)))
            if not more:
                raise ImageHeaderError("truncated", "JPEG ends inside its header")
            data += more
    if fmt == "TIFF" and len(data) < size_bytes:
        try:
            read_tags(TiffReader(data))
            return data
        except TIFF_ERRORS:
            # The tags lie further in: TIFF allows them anywhere, read the whole file.
            return data + read(len(data), size_bytes - len(data))
    return data


def _open(data: bytes) -> Image.Image:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return Image.open(io.BytesIO(data))
    except UnidentifiedImageError as exc:
        raise ImageHeaderError("not_an_image", "not an image format Pillow knows") from exc
    except (OSError, SyntaxError, ValueError, EOFError) as exc:
        raise ImageHeaderError("unreadable", f"cannot read the image header ({exc})") from exc


def _clean_text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        value = value.decode("utf-8", errors="replace")
    text = str(value).replace("\x00", "").strip()
    return text or None


def _rational(value: Any) -> float | None:
    try:
        out = float(value)
    except (TypeError, ValueError, ZeroDivisionError):
        return None
    return out if out == out else None  # NaN from 0/0 rationals


def _dms(value: Any) -> float | None:
    try:
        d, m, s = (float(v) for v in value)
    except (TypeError, ValueError, ZeroDivisionError):
        return _rational(value)
    if any(v != v for v in (d, m, s)):
        return None
    return d + m / 60.0 + s / 3600.0


def _focal_plane_px_per_mm(resolution: Any, unit: Any) -> float | None:
    """``FocalPlaneXResolution`` (pixels per ``unit``) in pixels per millimetre, or None."""
    per_unit = _rational(resolution)
    if not unit:
        unit = 2  # absent (or 0, not a valid value): the EXIF 2.32 default, inch
    mm_per_unit = _RESOLUTION_UNIT_MM.get(unit) if isinstance(unit, int) else None
    if not per_unit or mm_per_unit is None or not math.isfinite(per_unit):
        return None
    return per_unit / mm_per_unit


def _exif_time(value: Any) -> datetime | None:
    text = _clean_text(value)
    if not text:
        return None
    try:
        return datetime.strptime(text[:19], "%Y:%m:%d %H:%M:%S")
    except ValueError:
        return None


#: TIFF field type -> bytes per value (TIFF 6.0 section 2, plus the EXIF types).
_XMP_ATTR = re.compile(rb'drone-dji:(\w+)\s*=\s*"([^"]*)"')
_XMP_ELEM = re.compile(rb"<drone-dji:(\w+)>([^<]*)</drone-dji:\1>")


def parse_dji_xmp(data: bytes) -> dict[str, float]:
    """DJI ``drone-dji:`` XMP values in ``data`` as name -> float (attributes or elements).

    Example keys: ``RelativeAltitude`` (m above take-off), ``AbsoluteAltitude`` (m),
    ``GimbalPitchDegree``, ``GimbalYawDegree``, ``FlightYawDegree`` (degrees).
    """
    start = data.find(b"<x:xmpmeta")
    if start < 0:
        return {}
    stop = data.find(b"</x:xmpmeta>", start)
    block = data[start : stop if stop > 0 else len(data)]
    out: dict[str, float] = {}
    for pattern in (_XMP_ATTR, _XMP_ELEM):
        for key, raw in pattern.findall(block):
            try:
                out.setdefault(key.decode("ascii"), float(raw.strip()))
            except ValueError:
                continue
    return out


_AGL_ATTR = re.compile(rb'Camera:AboveGroundAltitude\s*=\s*"([^"]*)"')
_AGL_ELEM = re.compile(rb"<Camera:AboveGroundAltitude>([^<]*)</Camera:AboveGroundAltitude>")


def parse_above_ground_xmp(data: bytes) -> float | None:
    """XMP ``Camera:AboveGroundAltitude`` in ``data``: metres above the ground below, or None.

    The value is a decimal (``"80.25"``) or a rational (``"8025/100"``); anything else, or a
    zero denominator, reads as None.
    """
    start = data.find(b"<x:xmpmeta")
    if start < 0:
        return None
    stop = data.find(b"</x:xmpmeta>", start)
    block = data[start : stop if stop > 0 else len(data)]
    for pattern in (_AGL_ATTR, _AGL_ELEM):
        found = pattern.search(block)
        if found is None:
            continue
        text = found.group(1).decode("ascii", "replace").strip()
        num, _, den = text.partition("/")
        try:
            value = float(num) / float(den) if den else float(num)
        except (ValueError, ZeroDivisionError):
            return None
        return value if math.isfinite(value) else None
    return None


def _raw_tags(
    fmt: ImageFormat, header: bytes
) -> tuple[tuple[int, int], dict[int, Any], dict[int, Any], dict[int, Any]]:
    """``((width, height), IFD0 tags, EXIF IFD tags, GPS IFD tags)`` of a header.

    Raises:
        ImageHeaderError: see :func:`parse_metadata`.
    """
    main: dict[int, Any] = {}
    sub: dict[int, Any] = {}
    gps: dict[int, Any] = {}
    if fmt == "JPEG":
        size, app1 = jpeg_segments(header)
        if size is None:
            raise ImageHeaderError(
                "unreadable", "JPEG has no frame header (SOF) before its image data"
            )
        for body in app1:
            if body[:6] == b"Exif\x00\x00":
                try:
                    main, sub, gps = read_tags(TiffReader(body[6:]))
                except TIFF_ERRORS as exc:
                    logger.debug("broken EXIF block ignored: %s", exc)
                break
        return size, main, sub, gps
    if fmt == "TIFF":
        try:
            main, sub, gps = read_tags(TiffReader(header))
        except TIFF_ERRORS as exc:
            raise ImageHeaderError("unreadable", f"broken TIFF structure ({exc})") from exc
        if not isinstance(main.get(256), int) or not isinstance(main.get(257), int):
            raise ImageHeaderError("unreadable", "TIFF without image width/length")
        return (int(main[256]), int(main[257])), main, sub, gps
    im = _open(header)
    try:
        exif = im.getexif()
        main = {t: exif.get(t) for t in (TAG_MAKE, TAG_MODEL, TAG_DATETIME)}
        gps_ifd = exif.get_ifd(GPS_IFD)
        gps = {t: gps_ifd.get(t) for t in GPS_TAGS}
        sub_ifd = exif.get_ifd(EXIF_IFD)
        sub = {t: sub_ifd.get(t) for t in SUB_TAGS}
    except Exception as exc:  # noqa: BLE001 - Pillow raises many types for broken EXIF
        logger.debug("broken EXIF ignored: %s", exc)
    return im.size, main, sub, gps


def _gps_position(gps: dict[int, Any]) -> tuple[float | None, float | None, float | None]:
    """``(latitude, longitude, altitude_m)`` from GPS IFD tags; both coordinates or neither."""
    lat = _dms(gps.get(2))
    lon = _dms(gps.get(4))
    if lat is not None and _clean_text(gps.get(1)) in ("S", "s"):
        lat = -lat
    if lon is not None and _clean_text(gps.get(3)) in ("W", "w"):
        lon = -lon
    if lat is None or lon is None:
        lat = lon = None
    alt = _rational(gps.get(6))
    if alt is not None:
        ref = gps.get(5)
        ref_byte = ref[0] if isinstance(ref, bytes) and ref else ref
        if ref_byte == 1:
            alt = -alt
    return lat, lon, alt


def parse_metadata(header: bytes) -> ImageMetadata:
    """Image metadata from header bytes (as returned by :func:`read_header`).

    JPEG and TIFF tags are read by a small IFD reader that decodes only the tags used (Pillow
    would decode every tag, maker notes included: ~10x slower); other formats go through Pillow.
    A broken EXIF block leaves the tags unset (the image then lacks GPS) rather than failing.

    Raises:
        ImageHeaderError: ``unreadable`` for a JPEG without a frame header or a broken TIFF;
            ``not_an_image`` when no reader knows the format.
    """
    fmt = sniff_format(header)
    if fmt is None:
        raise ImageHeaderError("empty_file", "the file has zero bytes")
    (width, height), main, sub, gps = _raw_tags(fmt, header)
    lat, lon, alt = _gps_position(gps)
    xmp = parse_dji_xmp(header)
    focal35 = _rational(sub.get(TAG_FOCAL_35MM))
    return ImageMetadata(
        format=fmt,
        width=int(width),
        height=int(height),
        latitude=lat,
        longitude=lon,
        altitude_m=alt,
        relative_altitude_m=xmp.get("RelativeAltitude"),
        gimbal_pitch_deg=xmp.get("GimbalPitchDegree"),
        gimbal_yaw_deg=xmp.get("GimbalYawDegree"),
        flight_yaw_deg=xmp.get("FlightYawDegree"),
        above_ground_altitude_m=parse_above_ground_xmp(header),
        make=_clean_text(main.get(TAG_MAKE)),
        model=_clean_text(main.get(TAG_MODEL)),
        focal_length_mm=_rational(sub.get(TAG_FOCAL_LENGTH)),
        focal_length_35mm=focal35 if focal35 else None,
        capture_time=_exif_time(sub.get(TAG_DATETIME_ORIGINAL))
        or _exif_time(main.get(TAG_DATETIME)),
        focal_plane_x_resolution_px_per_mm=_focal_plane_px_per_mm(
            sub.get(TAG_FOCAL_PLANE_X_RES), sub.get(TAG_FOCAL_PLANE_RES_UNIT)
        ),
    )


def check_pixels_complete(fmt: ImageFormat, header: bytes, size_bytes: int, tail: bytes) -> None:
    """Raise when the pixel data is evidently cut short.

    JPEG: the end-of-image marker must be in ``tail``. Other formats: when the whole file is in
    ``header`` Pillow decodes it (TIFF keeps its strips anywhere, no cheaper check exists).

    Raises:
        ImageHeaderError: ``truncated`` when the file ends early, ``unreadable`` when decoding
            fails.
    """
    if fmt == "JPEG":
        if not jpeg_is_complete(tail):
            raise ImageHeaderError(
                "truncated", f"JPEG has no end-of-image marker ({size_bytes} bytes)"
            )
        return
    if len(header) >= size_bytes:
        im = _open(header)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                im.load()
        except (OSError, ValueError, SyntaxError, EOFError) as exc:
            text = str(exc)
            reason: HeaderProblem = (
                "truncated" if "truncated" in text or "end" in text else "unreadable"
            )
            raise ImageHeaderError(reason, f"cannot decode the pixels ({text})") from exc


def read_metadata(
    read: RangeReader, size_bytes: int, *, check_complete: bool = True
) -> tuple[ImageMetadata, int]:
    """Read and parse one image's metadata with as few bytes as the format allows.

    Args:
        read: ``read(offset, length) -> bytes``.
        size_bytes: the file's size in bytes.
        check_complete: also verify the file is not cut short (one tail read for JPEG).

    Returns:
        ``(metadata, bytes_read)``.

    Raises:
        ImageHeaderError: with ``reason`` one of ``empty_file``, ``not_an_image``, ``truncated``,
            ``unreadable``.
    """
    counted = [0]

    def counting_read(offset: int, length: int) -> bytes:
        chunk = read(offset, length)
        counted[0] += len(chunk)
        return chunk

    header = read_header(counting_read, size_bytes)
    meta = parse_metadata(header)
    if check_complete:
        tail = b""
        if meta.format == "JPEG":
            start = max(0, size_bytes - TAIL_READ_BYTES)
            tail = counting_read(start, size_bytes - start)
        check_pixels_complete(meta.format, header, size_bytes, tail)
    return meta, counted[0]


def file_range_reader(handle: IO[bytes]) -> RangeReader:
    """The :data:`RangeReader` of an open binary file (seek, then read)."""

    def read(offset: int, length: int) -> bytes:
        handle.seek(offset)
        return handle.read(length)

    return read


def read_local_metadata(path: Path, *, check_complete: bool = True) -> tuple[ImageMetadata, int]:
    """:func:`read_metadata` of a local file.

    Raises:
        OSError: the file cannot be opened or read.
        ImageHeaderError: see :func:`read_metadata`.
    """
    with path.open("rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        return read_metadata(file_range_reader(handle), size, check_complete=check_complete)
