"""ODM's geolocation file, ``geo.txt``: camera positions that replace the images' EXIF GPS.

Format (ODM ``opendm/geo.py`` ``GeoFile``): the first line names the CRS (``EPSG:4326``, or
any text pyproj reads), then one line per image: ``name x y [z [yaw pitch roll [horizontal
vertical accuracy]]] [extras]``; empty lines and lines starting with ``#`` are skipped. In
``EPSG:4326`` x is the longitude and y the latitude, degrees. The engine takes the position
(and the altitude when given) and ignores the angles and accuracies. NodeODM hands the file to
ODM as ``--geo``; the engine's upload routing keeps it as ``geo.txt`` at the top of the task
folder, and its dataset stage applies it (:func:`apply_geo_file`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from prefect_odm.engine.camera import ImageMeta
from prefect_odm.errors import InputError

GEO_FILE = "geo.txt"
"""The file's name in the task folder."""


def read_geo_file(path: Path) -> dict[str, tuple[float, float, float | None]]:
    """Image name -> ``(longitude, latitude, altitude or None)``, WGS 84 degrees and metres.

    Raises:
        InputError: an unreadable CRS line, or an entry whose coordinates are not numbers;
            the message names the file and the line.
    """
    from pyproj import CRS, Transformer
    from pyproj.exceptions import CRSError

    lines = path.read_text(encoding="utf-8-sig").strip().splitlines()
    if not lines:
        raise InputError(f"{path.name}: empty (expected a CRS line, then one line per image)")
    try:
        crs = CRS.from_user_input(lines[0].strip())
    except CRSError as exc:
        raise InputError(f"{path.name} line 1: not a CRS ({lines[0].strip()!r})") from exc
    to_lonlat = Transformer.from_crs(crs, 4326, always_xy=True)
    out: dict[str, tuple[float, float, float | None]] = {}
    for number, line in enumerate(lines[1:], start=2):
        parts = line.split()
        if not parts or parts[0].startswith("#"):
            continue
        try:
            if len(parts) < 3:
                raise ValueError("fewer than three fields")
            x, y = float(parts[1]), float(parts[2])
            z = float(parts[3]) if len(parts) >= 4 else None
        except ValueError as exc:
            raise InputError(f"{path.name} line {number}: not 'name x y [z]' ({exc})") from exc
        lon, lat = to_lonlat.transform(x, y)
        out[parts[0]] = (float(lon), float(lat), z)
    return out


def apply_geo_file(images: Sequence[ImageMeta], path: Path) -> tuple[list[ImageMeta], int]:
    """``images`` with the positions ``path`` gives (by file name), and how many it gave.

    Raises:
        InputError: the file does not read (:func:`read_geo_file`).
    """
    entries = read_geo_file(path)
    out: list[ImageMeta] = []
    placed = 0
    for meta in images:
        entry = entries.get(meta.name)
        if entry is None:
            out.append(meta)
            continue
        lon, lat, z = entry
        update: dict[str, float] = {"longitude": lon, "latitude": lat}
        if z is not None:
            update["altitude_m"] = z
        out.append(meta.model_copy(update=update))
        placed += 1
    return out, placed
