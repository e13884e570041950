"""Camera altitudes for a survey whose GPS altitude the plan finds unreliable (pure core).

Structure from motion takes a block's orientation from the GPS altitude priors: brighton with
its GPS altitude drifting +1.7 m per image came out tilted 19 degrees (issue 31). A DJI drone
also records its barometric height above the take-off point (XMP ``RelativeAltitude``), which
holds over a flight where the GPS altitude drifts or lags. Where the plan's GPS checks find an
altitude trend or altitude jumps (:mod:`prefect_odm.survey.gps_quality`) and every image has a
capture time, a GPS altitude and a relative altitude, each camera's altitude becomes its
flight's take-off height plus its relative altitude (:func:`altitude_correction`). The take-off
height is the flight's Theil-Sen line of GPS minus relative altitude at its first shot: a drift
grows from the take-off, so the first shots hold the least of it; without a trend it is the
flight's median. The horizontal GPS is kept. Every node gets the altitudes as ODM's
``geo.txt`` (:func:`geo_txt`), which NodeODM passes to ODM as ``--geo`` and the built-in engine
reads in its dataset stage.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC

from prefect_odm.models import ImageRecord
from prefect_odm.survey.gps_records import AltitudeCorrection, GpsQualityOptions, GpsWarning

ALTITUDE_WARNINGS = ("altitude_trend", "altitude_jump")
"""The GPS warnings that make the plan replace the GPS altitudes."""

GEO_TXT_CRS = "EPSG:4326"
"""The CRS line of the ``geo.txt`` the plan writes: longitude, latitude, ellipsoidal height as
the EXIF GPS gives them (ODM ``opendm/geo.py`` reads ``image x y z`` in the header's CRS)."""


def altitude_correction(
    images: Sequence[ImageRecord],
    warnings: Sequence[GpsWarning],
    options: GpsQualityOptions | None = None,
) -> tuple[AltitudeCorrection, dict[str, float]] | None:
    """The corrected altitude of every image, or None where none is needed or possible.

    Args:
        images: the planned images.
        warnings: the plan's GPS warnings (:func:`prefect_odm.plan.checks.gps_warnings`).
        options: the GPS checks' thresholds (their ``flight_gap_s`` cuts the flights).

    Returns:
        ``(the correction, image name -> altitude in metres)``; None when no altitude warning
        was raised, or an image lacks a capture time, a GPS altitude or a relative altitude.
    """
    import numpy as np

    from prefect_odm.survey.gps_quality import GpsFix, flights, theil_sen_slope

    reasons = sorted({w.kind for w in warnings if w.kind in ALTITUDE_WARNINGS})
    if not reasons or not images:
        return None
    if any(
        im.capture_time is None or im.altitude_m is None or im.relative_altitude_m is None
        for im in images
    ):
        return None
    fixes = [
        GpsFix(
            im.name,
            _seconds(im),
            0.0,
            0.0,
            float(im.altitude_m or 0.0),
            float(im.relative_altitude_m or 0.0),
        )
        for im in images
    ]
    altitudes: dict[str, float] = {}
    take_off: list[float] = []
    for flight in flights(fixes, (options or GpsQualityOptions()).flight_gap_s):
        h = np.array([f.alt_m - (f.relative_alt_m or 0.0) for f in flight])
        slope = theil_sen_slope(h)[0] if len(h) >= 3 else 0.0
        h0 = float(np.median(h - slope * np.arange(len(h))))
        take_off.append(round(h0, 3))
        for f in flight:
            altitudes[f.name] = round(h0 + (f.relative_alt_m or 0.0), 3)
    heights = ", ".join(f"{h:.1f}" for h in take_off[:4]) + (" ..." if len(take_off) > 4 else "")
    message = (
        f"GPS altitude unreliable ({' and '.join(r.replace('_', ' ') for r in reasons)}): each "
        f"camera's altitude is its flight's take-off height ({heights} m, {len(take_off)} "
        "flight(s)) + its RelativeAltitude, the horizontal GPS kept; sent to the nodes as geo.txt"
    )
    correction = AltitudeCorrection(reasons=list(reasons), take_off_m=take_off, message=message)
    return correction, altitudes


def _seconds(image: ImageRecord) -> float:
    """The capture time as seconds (EXIF times are naive, read as UTC, as the GPS checks do)."""
    t = image.capture_time
    assert t is not None
    return (t if t.tzinfo is not None else t.replace(tzinfo=UTC)).timestamp()


def geo_txt(images: Sequence[ImageRecord], altitudes_m: Mapping[str, float]) -> str:
    """ODM's geolocation file for ``images``: the CRS line, then ``name longitude latitude
    altitude`` per image that has a corrected altitude (sorted by name; the file's base name,
    as a node stores it).

    Degrees to 1e-8 (about a millimetre), altitudes to the millimetre.
    """
    lines = [GEO_TXT_CRS]
    for im in sorted(images, key=lambda i: i.name):
        if im.name in altitudes_m:
            base = im.name.rsplit("/", 1)[-1]  # nodes store each upload under its base name
            lines.append(f"{base} {im.longitude:.8f} {im.latitude:.8f} {altitudes_m[im.name]:.3f}")
    return "\n".join(lines) + "\n"
