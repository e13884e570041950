"""JPEG marker segments: where the header ends, the frame size, the APP1 payloads, completeness.

Sources: ITU-T T.81 annex B (B.1.1.2 marker segments and their lengths, B.1.1.5 byte stuffing in
the entropy-coded data, B.2.2 the frame header).
"""

from __future__ import annotations

from prefect_odm.errors import ImageHeaderError


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


def jpeg_segments(data: bytes) -> tuple[tuple[int, int] | None, list[bytes]]:
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


def jpeg_is_complete(tail: bytes) -> bool:
    """True when the last bytes of a JPEG hold the end-of-image marker ``FF D9``.

    Entropy-coded data never contains ``FF D9`` (T.81 B.1.1.5: ``FF`` is stuffed with ``00``), so
    a file cut inside its image data lacks it; a little padding after EOI is tolerated.
    """
    return b"\xff\xd9" in tail
