"""Surveys for planning tests, without pixels: a flown grid of camera positions (issue 30)."""

from __future__ import annotations

import hashlib
from datetime import datetime, timedelta

import numpy as np
from pyproj import Transformer

from prefect_odm.fingerprints import survey_fingerprint
from prefect_odm.models import ImageRecord, Survey

GRID_EPSG = 32633
START = datetime(2026, 6, 1, 10, 0, 0)


def grid_survey(
    lines: int = 20,
    per_line: int = 30,
    *,
    line_spacing_m: float = 36.0,
    shot_spacing_m: float = 27.0,
    height_m: float = 100.0,
    focal_length_35mm: float = 24.0,
    jitter_m: float = 0.5,
    gap_m: float = 0.0,
    seed: int = 7,
) -> Survey:
    """A lawnmower grid of nadir images, ``lines x per_line`` positions (600 by default, issue
    30's synthetic survey: 36 m between lines, 27 m between shots), in EPSG:32633.

    Positions carry a seeded jitter (a flown grid is never exact, and an exact one is
    degenerate for the Voronoi core areas); the ground footprint follows ``height_m`` (as DJI's
    RelativeAltitude) and ``focal_length_35mm`` (150 m wide by default). ``gap_m`` moves the
    eastern half of the lines that much further east (two blocks). No files exist.
    """
    rng = np.random.default_rng(seed)
    to_lonlat = Transformer.from_crs(GRID_EPSG, 4326, always_xy=True)
    records = []
    for line in range(lines):
        for shot in range(per_line):
            k = line * per_line + shot
            along = shot if line % 2 == 0 else per_line - 1 - shot
            gap = gap_m if line >= lines // 2 else 0.0
            x = 500_000.0 + line * line_spacing_m + gap + rng.normal(0.0, jitter_m)
            y = 4_995_000.0 + along * shot_spacing_m + rng.normal(0.0, jitter_m)
            lon, lat = to_lonlat.transform(x, y)
            name = f"grid_{k:04d}.jpg"
            records.append(
                ImageRecord(
                    name=name,
                    url=name,
                    identity="grid:" + hashlib.sha256(name.encode()).hexdigest(),
                    size_bytes=0,
                    width=4000,
                    height=3000,
                    latitude=float(lat),
                    longitude=float(lon),
                    altitude_m=400.0,
                    relative_altitude_m=height_m,
                    gimbal_pitch_deg=-90.0,
                    make="DJI",
                    focal_length_35mm=focal_length_35mm,
                    capture_time=START + timedelta(seconds=2 * k + 10 * line),
                )
            )
    return Survey(
        source="grid:600",
        images=records,
        crs_epsg=GRID_EPSG,
        fingerprint=survey_fingerprint(r.identity for r in records),
        cameras={"DJI": len(records)},
    )
