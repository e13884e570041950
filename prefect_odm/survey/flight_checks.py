"""Checks on a survey's camera positions and capture times (pure core: numpy only).

Rejection rules of :mod:`prefect_odm.survey.scan` (:func:`position_outlier_mask`,
:func:`low_altitude_mask`) and the flight-pattern analysis shown with a plan
(:func:`flight_tail_mask`, :func:`find_sequence_gaps`). Positions are in a projected CRS, metres;
times are the cameras' (naive) capture times. A *flight* is a run of shots in time order with no
pause longer than ``flight_gap_seconds`` (:func:`split_flights`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import numpy as np
from numpy.typing import ArrayLike, NDArray

#: A pause longer than this, seconds, between two shots starts a new flight.
FLIGHT_GAP_SECONDS = 60.0
#: Robust-distance multiplier of :func:`position_outlier_mask`.
OUTLIER_MAD_FACTOR = 10.0
#: Minimum outlier distance beyond the median distance, metres (small surveys).
OUTLIER_MIN_EXCESS_M = 200.0


def split_flights(
    capture_time: Sequence[datetime | None],
    x: NDArray[np.float64],
    y: NDArray[np.float64],
    flight_gap_seconds: float,
) -> list[list[int]]:
    """The images with a capture time grouped into flights.

    Images are sorted by ``(capture time, x, y)``; a new flight starts after more than
    ``flight_gap_seconds`` without a shot. Images without a capture time are in no flight.

    Returns:
        Per flight, the image indices in time order.
    """
    timed = sorted(
        ((t, i) for i, t in enumerate(capture_time) if t is not None),
        key=lambda ti: (ti[0], x[ti[1]], y[ti[1]]),
    )
    flights: list[list[int]] = []
    last: datetime | None = None
    for t, i in timed:
        if last is not None and (t - last).total_seconds() <= flight_gap_seconds:
            flights[-1].append(i)
        else:
            flights.append([i])
        last = t
    return flights


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
    flight_gap_seconds: float = FLIGHT_GAP_SECONDS,
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
    for flight in split_flights(capture_time, x, y, flight_gap_seconds):
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
    ratio: float = 1.75,
    flight_gap_seconds: float = FLIGHT_GAP_SECONDS,
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
    out: list[SequenceGap] = []
    for flight in split_flights(capture_time, x, y, flight_gap_seconds):
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
