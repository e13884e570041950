"""Rewrite a JPEG's EXIF GPS position in place (tests only; no library needed).

Real camera headers (seneca's Canon EXIF) hold tags that piexif cannot write back, so the GPS
rationals are overwritten where they are: latitude (tag 2), longitude (tag 4) and altitude
(tag 6) of the GPS IFD (TIFF 6.0 section 2, EXIF 2.3 section 4.6.6), each already stored as
RATIONALs at an offset. The hemisphere references (tags 1, 3, 5) are kept, so the new position
must be in the same hemisphere and above the datum; anything else is an AssertionError.
"""

from __future__ import annotations

import re
import struct
from pathlib import Path
from typing import Any

RATIONAL = 5
DENOMINATOR = 10_000


def _exif_tiff_start(data: bytes) -> int:
    """Offset of the TIFF header inside the JPEG's Exif APP1 segment."""
    pos = 2
    while pos + 4 <= len(data) and data[pos] == 0xFF:
        marker, length = data[pos + 1], struct.unpack(">H", data[pos + 2 : pos + 4])[0]
        if marker == 0xE1 and data[pos + 4 : pos + 10] == b"Exif\x00\x00":
            return pos + 10
        pos += 2 + length
    raise AssertionError("no Exif APP1 segment")


def _entries(data: bytes, tiff: int, ifd: int, endian: str) -> dict[int, tuple[int, int, int]]:
    """Tag -> (type, count, value offset from the TIFF start) of one IFD."""
    (n,) = struct.unpack(endian + "H", data[tiff + ifd : tiff + ifd + 2])
    out = {}
    for k in range(n):
        at = tiff + ifd + 2 + 12 * k
        tag, kind, count, value = struct.unpack(endian + "HHII", data[at : at + 12])
        out[tag] = (kind, count, value)
    return out


def _rationals(values: list[float], endian: str) -> bytes:
    return b"".join(struct.pack(endian + "II", round(v * DENOMINATOR), DENOMINATOR) for v in values)


def _dms(degrees: float) -> list[float]:
    d = abs(degrees)
    whole, minutes = int(d), (d - int(d)) * 60.0
    return [float(whole), float(int(minutes)), (minutes - int(minutes)) * 60.0]


def set_gps(data: bytes, latitude: float, longitude: float, altitude_m: float) -> bytes:
    """``data`` (a JPEG) with its EXIF GPS latitude, longitude (degrees) and altitude (m) set."""
    assert altitude_m >= 0
    tiff = _exif_tiff_start(data)
    endian = "<" if data[tiff : tiff + 2] == b"II" else ">"
    (ifd0,) = struct.unpack(endian + "I", data[tiff + 4 : tiff + 8])
    gps_ifd = _entries(data, tiff, ifd0, endian)[0x8825][2]
    gps = _entries(data, tiff, gps_ifd, endian)
    out = bytearray(data)
    for tag, values in ((2, _dms(latitude)), (4, _dms(longitude)), (6, [altitude_m])):
        kind, count, offset = gps[tag]
        assert kind == RATIONAL and count == len(values), (
            f"GPS tag {tag} is not {len(values)} rationals"
        )
        out[tiff + offset : tiff + offset + 8 * count] = _rationals(values, endian)
    return bytes(out)


def _altered_copy(
    source: Path, dest: Path, raise_m: list[float], *, keep_relative: bool = True
) -> None:
    """``source``'s images in ``dest``, the k-th in capture order with its GPS altitude (EXIF
    and XMP ``AbsoluteAltitude``) raised by ``raise_m[k]``; ``RelativeAltitude`` untouched, or
    (``keep_relative`` False) hidden from readers under another attribute name."""
    from prefect_odm.engine.camera import read_images

    dest.mkdir(parents=True)
    for k, meta in enumerate(in_capture_order(source)):
        assert meta.altitude_m is not None
        altitude = meta.altitude_m + raise_m[k]
        data = set_gps((source / meta.name).read_bytes(), meta.latitude, meta.longitude, altitude)
        # same length: the XMP packet's size is in its segment header
        data = re.sub(
            rb'AbsoluteAltitude="[+-]?[0-9.]+"',
            f'AbsoluteAltitude="{altitude:+07.2f}"'.encode(),
            data,
            count=1,
        )
        if not keep_relative:
            data = data.replace(b"RelativeAltitude=", b"RelativeAltitudX=", 1)
        (dest / meta.name).write_bytes(data)
    assert len(read_images(dest)) == len(raise_m)


def in_capture_order(source: Path) -> list[Any]:
    """``source``'s image metadata (the engine's ``ImageMeta``) in capture order, then name."""
    from prefect_odm.engine.camera import read_images

    return sorted(
        read_images(source), key=lambda m: (m.capture_time is None, m.capture_time, m.name)
    )


def drifted_copy(source: Path, dest: Path, drift_m: float, *, keep_relative: bool = True) -> None:
    """``source``'s images in ``dest``, the GPS altitude (EXIF and XMP ``AbsoluteAltitude``)
    raised by ``drift_m`` per image in capture order; ``RelativeAltitude`` untouched (or hidden,
    ``keep_relative`` False)."""
    count = len(in_capture_order(source))
    _altered_copy(source, dest, [drift_m * k for k in range(count)], keep_relative=keep_relative)


def turn_images(source: Path, min_turn_deg: float = 90.0) -> list[str]:
    """The images on either side of a turn: consecutive shots (capture order) whose DJI
    ``FlightYawDegree`` differs by more than ``min_turn_deg``."""
    images = in_capture_order(source)
    names: set[str] = set()
    for before, after in zip(images, images[1:], strict=False):
        assert before.flight_yaw_deg is not None and after.flight_yaw_deg is not None
        turn = abs((after.flight_yaw_deg - before.flight_yaw_deg + 180.0) % 360.0 - 180.0)
        if turn > min_turn_deg:
            names |= {before.name, after.name}
    return sorted(names)


def lagged_copy(source: Path, dest: Path, lag_m: float) -> list[str]:
    """``source``'s images in ``dest``, the GPS altitude of the images on either side of each
    turn (:func:`turn_images`) raised by ``lag_m`` (a GPS altitude lagging through the turns);
    ``RelativeAltitude`` untouched.

    Returns:
        The names of the raised images.
    """
    turns = set(turn_images(source))
    raised = [lag_m if m.name in turns else 0.0 for m in in_capture_order(source)]
    _altered_copy(source, dest, raised)
    return sorted(turns)


def split_copy(source: Path, dest: Path, east_m: float) -> list[str]:
    """``source``'s images in ``dest``, the eastern half of them (by longitude) moved ``east_m``
    metres east in their EXIF GPS: two groups of cameras with a gap between their footprints.

    Returns:
        The names of the moved images.
    """
    import math

    from prefect_odm.engine.camera import read_images

    images = sorted(read_images(source), key=lambda m: (m.longitude, m.name))
    moved = images[len(images) // 2 :]
    dest.mkdir(parents=True)
    for meta in images:
        data = (source / meta.name).read_bytes()
        if meta in moved:
            assert meta.latitude is not None and meta.longitude is not None
            assert meta.altitude_m is not None
            metres_per_degree = 111_320.0 * math.cos(math.radians(meta.latitude))
            longitude = meta.longitude + east_m / metres_per_degree
            data = set_gps(data, meta.latitude, longitude, meta.altitude_m)
        (dest / meta.name).write_bytes(data)
    return [m.name for m in moved]
