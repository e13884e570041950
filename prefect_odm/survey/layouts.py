"""Camera layouts of real surveys without pixels: exiftool CSVs -> positions (pure core + csv).

The layouts in ``../shared/data/layouts`` (agung-2, freetown-1; CC-BY-4.0, see their SOURCE.md)
are exiftool CSV exports of DJI survey photos: ``SourceFile, FileName, DateTimeOriginal,
GPSLatitude, GPSLongitude, AbsoluteAltitude, GimbalPitchDegree, FlightYawDegree`` with GPS as
DMS strings such as ``8 deg 27' 55.22" N``. They let planning run at realistic scale without the
images. :func:`layout_survey` turns a layout into a :class:`~prefect_odm.models.Survey` whose
identities are derived from the file names (there is no content to hash).
"""

from __future__ import annotations

import csv
import hashlib
import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from prefect_odm.errors import InputError
from prefect_odm.fingerprints import survey_fingerprint
from prefect_odm.geo import project_lonlat, survey_utm_epsg
from prefect_odm.models import ImageRecord, Survey

logger = logging.getLogger(__name__)

_DMS = re.compile(
    r"""^\s*(\d+(?:\.\d+)?)\s*deg\s*(\d+(?:\.\d+)?)'\s*(\d+(?:\.\d+)?)"\s*([NSEW])\s*$"""
)


def parse_dms(text: str) -> float:
    """Degrees from an exiftool DMS string (``8 deg 27' 55.22" N``); S and W are negative.

    Raises:
        InputError: when the text is not in that form.
    """
    m = _DMS.match(text)
    if not m:
        try:
            return float(text)
        except ValueError:
            raise InputError(f"not a DMS angle: {text!r}") from None
    value = float(m[1]) + float(m[2]) / 60.0 + float(m[3]) / 3600.0
    return -value if m[4] in "SW" else value


@dataclass(frozen=True)
class Layout:
    """Camera positions of one layout, in CSV order.

    Attributes:
        name: folder name (e.g. ``freetown-1``).
        source_files: exiftool ``SourceFile`` of each photo (e.g. ``./images/task-28/DJI_...JPG``).
        latitude, longitude: WGS 84 degrees, shape ``(n,)``.
        altitude_m: absolute altitude, metres, shape ``(n,)`` (NaN where missing).
        gimbal_pitch_deg, flight_yaw_deg: degrees, shape ``(n,)`` (NaN where missing).
        capture_time: capture time of each photo, None where missing.
    """

    name: str
    source_files: tuple[str, ...]
    latitude: NDArray[np.float64]
    longitude: NDArray[np.float64]
    altitude_m: NDArray[np.float64]
    gimbal_pitch_deg: NDArray[np.float64]
    flight_yaw_deg: NDArray[np.float64]
    capture_time: tuple[datetime | None, ...]

    def __len__(self) -> int:
        """Number of photos."""
        return len(self.source_files)

    @property
    def crs_epsg(self) -> int:
        """EPSG code of the WGS 84 / UTM zone of the layout's mean position."""
        return survey_utm_epsg(self.latitude, self.longitude)

    def projected(self, epsg: int | None = None) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """Positions in ``epsg`` (default: the layout's UTM zone), metres."""
        return project_lonlat(self.longitude, self.latitude, epsg or self.crs_epsg)

    def without(self, source_files: Iterable[str]) -> Layout:
        """A copy without the given photos (matched by ``SourceFile``)."""
        drop = {_norm(s) for s in source_files}
        keep = np.array([_norm(s) not in drop for s in self.source_files], dtype=bool)
        return Layout(
            name=self.name,
            source_files=tuple(s for s, k in zip(self.source_files, keep, strict=True) if k),
            latitude=self.latitude[keep],
            longitude=self.longitude[keep],
            altitude_m=self.altitude_m[keep],
            gimbal_pitch_deg=self.gimbal_pitch_deg[keep],
            flight_yaw_deg=self.flight_yaw_deg[keep],
            capture_time=tuple(t for t, k in zip(self.capture_time, keep, strict=True) if k),
        )


def _norm(source_file: str) -> str:
    return source_file.strip().removeprefix("./")


def _float(text: str | None) -> float:
    if text is None or not text.strip():
        return float("nan")
    return float(text.strip().lstrip("+"))


def read_layout(folder: Path, csv_name: str = "image_metadata.csv") -> Layout:
    """Read a layout folder's exiftool CSV.

    Raises:
        InputError: the CSV is missing or a row cannot be parsed (message names file and row).
    """
    path = Path(folder) / csv_name
    if not path.is_file():
        raise InputError(f"{path}: does not exist")
    files: list[str] = []
    lat: list[float] = []
    lon: list[float] = []
    alt: list[float] = []
    pitch: list[float] = []
    yaw: list[float] = []
    times: list[datetime | None] = []
    with path.open(newline="", encoding="utf-8") as fh:
        for row_no, row in enumerate(csv.DictReader(fh), start=2):
            try:
                files.append(row["SourceFile"])
                lat.append(parse_dms(row["GPSLatitude"]))
                lon.append(parse_dms(row["GPSLongitude"]))
                alt.append(_float(row.get("AbsoluteAltitude")))
                pitch.append(_float(row.get("GimbalPitchDegree")))
                yaw.append(_float(row.get("FlightYawDegree")))
                dt = (row.get("DateTimeOriginal") or "").strip()
                times.append(datetime.strptime(dt[:19], "%Y:%m:%d %H:%M:%S") if dt else None)
            except (KeyError, ValueError, InputError) as exc:
                raise InputError(f"{path}: row {row_no}: {exc}") from exc
    return Layout(
        name=Path(folder).name,
        source_files=tuple(files),
        latitude=np.array(lat),
        longitude=np.array(lon),
        altitude_m=np.array(alt),
        gimbal_pitch_deg=np.array(pitch),
        flight_yaw_deg=np.array(yaw),
        capture_time=tuple(times),
    )


def read_file_list(path: Path) -> list[str]:
    """Non-comment, non-blank lines of a list file (e.g. ``images-to-delete-for-gaps.txt``)."""
    out: list[str] = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            out.append(line)
    return out


def layout_survey(
    layout: Layout, *, width: int = 4000, height: int = 3000, focal_length_35mm: float = 24.0
) -> Survey:
    """A :class:`Survey` of a layout, for planning without pixels.

    Identities are ``layout:<sha256 of the SourceFile>``; image size and focal length are
    assumed (the CSVs do not carry them; defaults fit a 12 MP DJI camera).
    """
    records = []
    for i, source in enumerate(layout.source_files):
        name = _norm(source)
        alt = float(layout.altitude_m[i])
        yaw = float(layout.flight_yaw_deg[i])
        pitch = float(layout.gimbal_pitch_deg[i])
        records.append(
            ImageRecord(
                name=name,
                url=source,
                identity="layout:" + hashlib.sha256(name.encode()).hexdigest(),
                size_bytes=0,
                width=width,
                height=height,
                latitude=float(layout.latitude[i]),
                longitude=float(layout.longitude[i]),
                altitude_m=None if np.isnan(alt) else alt,
                gimbal_pitch_deg=None if np.isnan(pitch) else pitch,
                flight_yaw_deg=None if np.isnan(yaw) else yaw,
                make="DJI",
                focal_length_35mm=focal_length_35mm,
                capture_time=layout.capture_time[i],
            )
        )
    records.sort(key=lambda r: r.name)
    return Survey(
        source=f"layout:{layout.name}",
        images=records,
        crs_epsg=layout.crs_epsg,
        fingerprint=survey_fingerprint(r.identity for r in records),
        cameras={"DJI": len(records)},
    )
