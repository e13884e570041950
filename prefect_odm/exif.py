"""EXIF and XMP metadata of survey images, read from the header bytes only (pure core + Pillow).

A drone JPEG keeps everything a split plan needs (GPS, camera, dimensions, DJI attitude) in its
APP1 segments, before the first start-of-scan (SOS) marker; for DJI cameras that is ~10-70 KB of a
5-20 MB file. :func:`read_header` therefore reads :data:`HEADER_READ_BYTES` first and extends the
read only when the marker walk shows the header is longer. TIFF keeps its IFDs anywhere in the
file, so a TIFF whose tags are not inside the first read is read whole. A separate short read of
the file's tail tells whether a JPEG is complete (ends with the EOI marker ``FF D9``).

The I/O is a callable ``read(offset, length) -> bytes`` so that the same code serves local files
and object stores (ranged GETs); see :mod:`prefect_odm.scan`.

Sources: JPEG markers, ITU-T T.81 annex B; EXIF 2.32 (CIPA DC-008) for the GPS IFD (tags 1-6) and
the EXIF IFD (FocalLength 0x920A, FocalLengthIn35mmFilm 0xA405, DateTimeOriginal 0x9003,
FocalPlaneXResolution 0xA20E with FocalPlaneResolutionUnit 0xA210); DJI XMP
``drone-dji:`` namespace as written by DJI cameras (RelativeAltitude, GimbalPitchDegree, ...).
"""

from __future__ import annotations

import io
import logging
import math
import re
import struct
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from PIL import Image, UnidentifiedImageError

from prefect_odm.errors import InputError

logger = logging.getLogger(__name__)

#: Bytes read first from each file: the EXIF APP1 segment is at most 64 KiB (EXIF 2.32 4.5.4);
#: longer headers (XMP, ICC) are read on demand.
HEADER_READ_BYTES = 65_536
#: Bytes read from the end of a JPEG to find its end-of-image marker.
TAIL_READ_BYTES = 1_024
#: A JPEG header longer than this is treated as unreadable (guards against runaway reads).
MAX_HEADER_BYTES = 16 * 1024 * 1024

ImageFormat = Literal["JPEG", "TIFF", "PNG", "OTHER"]
HeaderProblem = Literal["unreadable", "truncated", "empty_file", "not_an_image"]

#: ``read(offset, length) -> bytes``; may return fewer bytes at the end of the file.
RangeReader = Callable[[int, int], bytes]

_GPS_IFD = 0x8825
_EXIF_IFD = 0x8769
_TAG_MAKE = 0x010F
_TAG_MODEL = 0x0110
_TAG_DATETIME = 0x0132
_TAG_DATETIME_ORIGINAL = 0x9003
_TAG_FOCAL_LENGTH = 0x920A
_TAG_FOCAL_35MM = 0xA405
_TAG_FOCAL_PLANE_X_RES = 0xA20E
_TAG_FOCAL_PLANE_RES_UNIT = 0xA210
#: The EXIF IFD tags read.
_SUB_TAGS = (
    _TAG_DATETIME_ORIGINAL,
    _TAG_FOCAL_LENGTH,
    _TAG_FOCAL_35MM,
    _TAG_FOCAL_PLANE_X_RES,
    _TAG_FOCAL_PLANE_RES_UNIT,
)
#: FocalPlaneResolutionUnit -> millimetres per unit (EXIF 2.32: 2 inch, 3 cm; 4 mm and 5 um as
#: exiftool reads them). 1 (no absolute unit) and unknown values give no resolution.
_RESOLUTION_UNIT_MM = {2: 25.4, 3: 10.0, 4: 1.0, 5: 0.001}


class ImageHeaderError(InputError):
    """A file whose header cannot give image metadata.

    Attributes:
        reason: one of ``"unreadable"``, ``"truncated"``, ``"empty_file"``, ``"not_an_image"``
            (the matching :data:`prefect_odm.models.RejectReason`).
    """

    def __init__(self, reason: HeaderProblem, detail: str) -> None:
        self.reason: HeaderProblem = reason
        self.detail = detail
        super().__init__(f"{reason}: {detail}")


@dataclass(frozen=True)
class ImageMetadata:
    """Metadata of one image as read from its header.

    Latitude/longitude are WGS 84 degrees (EPSG:4326, south and west negative); ``None`` when the
    file has no GPS IFD. ``altitude_m`` is the EXIF GPS altitude (metres above sea level as the
    camera records it); ``relative_altitude_m`` is DJI's height above the take-off point. Angles
    are degrees as DJI writes them (gimbal pitch -90 = nadir).
    ``focal_plane_x_resolution_px_per_mm`` is EXIF ``FocalPlaneXResolution`` converted to pixels
    per millimetre with ``FocalPlaneResolutionUnit`` (default inch); ``None`` when absent, zero or
    without an absolute unit.
    """

    format: ImageFormat
    width: int
    height: int
    latitude: float | None = None
    longitude: float | None = None
    altitude_m: float | None = None
    relative_altitude_m: float | None = None
    gimbal_pitch_deg: float | None = None
    gimbal_yaw_deg: float | None = None
    flight_yaw_deg: float | None = None
    make: str | None = None
    model: str | None = None
    focal_length_mm: float | None = None
    focal_length_35mm: float | None = None
    capture_time: datetime | None = None
    focal_plane_x_resolution_px_per_mm: float | None = None

    @property
    def megapixels(self) -> float:
        """Image size in millions of pixels."""
        return self.width * self.height / 1e6

    @property
    def has_gps(self) -> bool:
        return self.latitude is not None and self.longitude is not None


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


def jpeg_header_end(data: bytes) -> int | None:
    """Offset just past the first SOS segment header of a JPEG, or None if ``data`` ends first.

    Walks the marker segments from SOI (ITU-T T.81 B.1.1.2); every segment before SOS carries a
    two-byte big-endian length that includes itself.

    Raises:
        ImageHeaderError: ``unreadable`` when the bytes do not follow the marker syntax.
    """
    if data[:2] != b"\xff\xd8":
        raise ImageHeaderError("not_an_image", "no JPEG start-of-image marker")
    pos = 2
    n = len(data)
    while True:
        # Fill bytes (0xFF padding) may precede a marker.
        while pos < n and data[pos] == 0xFF and pos + 1 < n and data[pos + 1] == 0xFF:
            pos += 1
        if pos + 4 > n:
            return None
        if data[pos] != 0xFF:
            raise ImageHeaderError("unreadable", f"bad JPEG marker at byte {pos}")
        marker = data[pos + 1]
        if marker == 0xD9:
            raise ImageHeaderError("unreadable", "JPEG ends before any image data")
        if 0xD0 <= marker <= 0xD8 or marker == 0x01:
            pos += 2
            continue
        length = int.from_bytes(data[pos + 2 : pos + 4], "big")
        if length < 2:
            raise ImageHeaderError("unreadable", f"bad JPEG segment length at byte {pos}")
        end = pos + 2 + length
        if marker == 0xDA:
            return end if end <= n else None
        pos = end


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
            _read_tags(_Tiff(data))
            return data
        except (ValueError, struct.error, IndexError, TypeError):
            # The tags lie further in: TIFF allows them anywhere, read the whole file.
            return data + read(len(data), size_bytes - len(data))
    return data


def jpeg_is_complete(tail: bytes) -> bool:
    """True when the last bytes of a JPEG hold the end-of-image marker ``FF D9``.

    Entropy-coded data never contains ``FF D9`` (T.81 B.1.1.5: ``FF`` is stuffed with ``00``), so
    a file cut inside its image data lacks it; a little padding after EOI is tolerated.
    """
    return b"\xff\xd9" in tail


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


# --- a minimal TIFF/EXIF IFD reader: only the tags we need, no maker notes decoded -----------

#: TIFF field type -> bytes per value (TIFF 6.0 section 2, plus the EXIF types).
_TYPE_SIZES = {1: 1, 2: 1, 3: 2, 4: 4, 5: 8, 6: 1, 7: 1, 8: 2, 9: 4, 10: 8, 11: 4, 12: 8}


class _Tiff:
    """Read-only view of a TIFF structure (the EXIF APP1 payload or a TIFF file)."""

    def __init__(self, data: bytes) -> None:
        if data[:2] == b"II":
            self.endian = "<"
        elif data[:2] == b"MM":
            self.endian = ">"
        else:
            raise ValueError("no TIFF byte-order mark")
        self.data = data
        (magic,) = struct.unpack_from(self.endian + "H", data, 2)
        if magic != 42:
            raise ValueError(f"TIFF magic {magic} is not 42 (BigTIFF is not read here)")
        (self.ifd0,) = struct.unpack_from(self.endian + "I", data, 4)

    def entries(self, offset: int) -> dict[int, tuple[int, int, int]]:
        """Tag -> (type, count, offset of the value bytes) for the IFD at ``offset``."""
        data, e = self.data, self.endian
        (count,) = struct.unpack_from(e + "H", data, offset)
        out: dict[int, tuple[int, int, int]] = {}
        for i in range(count):
            pos = offset + 2 + 12 * i
            tag, typ, n = struct.unpack_from(e + "HHI", data, pos)
            size = _TYPE_SIZES.get(typ, 1) * n
            where = pos + 8
            if size > 4:
                (where,) = struct.unpack_from(e + "I", data, pos + 8)
            if where + size > len(data):
                raise ValueError(f"tag {tag:#x} points past the available bytes")
            out[tag] = (typ, n, where)
        return out

    def value(self, entry: tuple[int, int, int] | None) -> Any:
        """The decoded value: str (ASCII), int or float, a tuple for several, bytes otherwise."""
        if entry is None:
            return None
        typ, n, where = entry
        data, e = self.data, self.endian
        if typ == 2:
            return data[where : where + n].split(b"\x00", 1)[0].decode("utf-8", errors="replace")
        if typ in (5, 10):
            fmt = e + ("II" if typ == 5 else "ii") * n
            raw = struct.unpack_from(fmt, data, where)
            vals = tuple(
                raw[2 * i] / raw[2 * i + 1] if raw[2 * i + 1] else float("nan") for i in range(n)
            )
            return vals[0] if n == 1 else vals
        codes = {1: "B", 3: "H", 4: "I", 6: "b", 8: "h", 9: "i", 11: "f", 12: "d"}
        if typ in codes:
            vals = struct.unpack_from(e + codes[typ] * n, data, where)
            return vals[0] if n == 1 else vals
        return data[where : where + n]


def _read_tags(tiff: _Tiff) -> tuple[dict[int, Any], dict[int, Any], dict[int, Any]]:
    """(IFD0, EXIF IFD, GPS IFD) values of the tags this module uses."""
    ifd0 = tiff.entries(tiff.ifd0)
    main = {t: tiff.value(ifd0.get(t)) for t in (256, 257, _TAG_MAKE, _TAG_MODEL, _TAG_DATETIME)}
    sub: dict[int, Any] = {}
    gps: dict[int, Any] = {}
    if _EXIF_IFD in ifd0:
        entries = tiff.entries(int(tiff.value(ifd0[_EXIF_IFD])))
        sub = {t: tiff.value(entries.get(t)) for t in _SUB_TAGS}
    if _GPS_IFD in ifd0:
        entries = tiff.entries(int(tiff.value(ifd0[_GPS_IFD])))
        gps = {t: tiff.value(entries.get(t)) for t in (1, 2, 3, 4, 5, 6)}
    return main, sub, gps


def _jpeg_segments(data: bytes) -> tuple[tuple[int, int] | None, list[bytes]]:
    """((width, height) from the SOF segment, [APP1 payloads]) of a JPEG header."""
    pos, n = 2, len(data)
    size: tuple[int, int] | None = None
    app1: list[bytes] = []
    while pos + 4 <= n:
        while pos + 1 < n and data[pos] == 0xFF and data[pos + 1] == 0xFF:
            pos += 1
        marker = data[pos + 1]
        if 0xD0 <= marker <= 0xD8 or marker == 0x01:
            pos += 2
            continue
        length = int.from_bytes(data[pos + 2 : pos + 4], "big")
        body = data[pos + 4 : pos + 2 + length]
        if marker == 0xE1:
            app1.append(body)
        elif 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC) and len(body) >= 5:
            height = int.from_bytes(body[1:3], "big")
            width = int.from_bytes(body[3:5], "big")
            size = (width, height)
        if marker == 0xDA:
            break
        pos += 2 + length
    return size, app1


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
    main: dict[int, Any] = {}
    sub: dict[int, Any] = {}
    gps: dict[int, Any] = {}
    if fmt == "JPEG":
        size, app1 = _jpeg_segments(header)
        if size is None:
            raise ImageHeaderError(
                "unreadable", "JPEG has no frame header (SOF) before its image data"
            )
        for body in app1:
            if body[:6] == b"Exif\x00\x00":
                try:
                    main, sub, gps = _read_tags(_Tiff(body[6:]))
                except (ValueError, struct.error, IndexError, TypeError) as exc:
                    logger.debug("broken EXIF block ignored: %s", exc)
                break
        width, height = size
    elif fmt == "TIFF":
        try:
            main, sub, gps = _read_tags(_Tiff(header))
        except (ValueError, struct.error, IndexError, TypeError) as exc:
            raise ImageHeaderError("unreadable", f"broken TIFF structure ({exc})") from exc
        if not isinstance(main.get(256), int) or not isinstance(main.get(257), int):
            raise ImageHeaderError("unreadable", "TIFF without image width/length")
        width, height = int(main[256]), int(main[257])
    else:
        im = _open(header)
        width, height = im.size
        try:
            exif = im.getexif()
            main = {t: exif.get(t) for t in (_TAG_MAKE, _TAG_MODEL, _TAG_DATETIME)}
            gps_ifd = exif.get_ifd(_GPS_IFD)
            gps = {t: gps_ifd.get(t) for t in (1, 2, 3, 4, 5, 6)}
            sub_ifd = exif.get_ifd(_EXIF_IFD)
            sub = {t: sub_ifd.get(t) for t in _SUB_TAGS}
        except Exception as exc:  # noqa: BLE001 - Pillow raises many types for broken EXIF
            logger.debug("broken EXIF ignored: %s", exc)

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

    xmp = parse_dji_xmp(header)
    focal35 = _rational(sub.get(_TAG_FOCAL_35MM))
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
        make=_clean_text(main.get(_TAG_MAKE)),
        model=_clean_text(main.get(_TAG_MODEL)),
        focal_length_mm=_rational(sub.get(_TAG_FOCAL_LENGTH)),
        focal_length_35mm=focal35 if focal35 else None,
        capture_time=_exif_time(sub.get(_TAG_DATETIME_ORIGINAL))
        or _exif_time(main.get(_TAG_DATETIME)),
        focal_plane_x_resolution_px_per_mm=_focal_plane_px_per_mm(
            sub.get(_TAG_FOCAL_PLANE_X_RES), sub.get(_TAG_FOCAL_PLANE_RES_UNIT)
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
