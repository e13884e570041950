"""Plan-time checks of camera GPS along the capture sequence (pure core: numpy, scipy, pydantic).

Wrong GPS is cheaper to catch before compute than after: a submodel placed by drifting GPS
lands metres away from its neighbour. With the images sorted by capture time and split into
flights at gaps longer than ``flight_gap_s``, three checks run per flight:

* **altitude trend**: the Theil-Sen slope (robust to outliers; P. K. Sen, JASA 63:1379, 1968)
  of the GPS altitude (exact up to ``EXACT_MAX_IMAGES`` images a flight; above, the same
  median and interval ranks read from ``SAMPLED_PAIRS`` image pairs drawn uniformly with a seed
  fixed by the flight's length: O(pairs) time and memory instead of O(n^2), see
  :func:`theil_sen_slope`) against the image number, minus the barometric relative altitude when
  every image has one (DJI XMP ``RelativeAltitude``: then ``alt - rel_alt`` is the take-off height
  and must stay constant whatever the flight does); without it a constant-height flight is
  assumed. Warned when the drift over the flight exceeds ``max_altitude_drift_m`` and the 95 %
  interval of the slope excludes zero.
* **altitude jumps** (GPS altitude lagging on turns): the same heights less the flight's
  Theil-Sen line; warned when more than ``max_jump_share`` of the shots lie over
  ``altitude_jump_m`` off it.
* **implausible speed**: distance between consecutive shots over the time between them plus the
  clock's resolution (EXIF times have whole seconds), above ``max_speed_m_s``.
* **position jumps** (GPS lag on turns): each shot is predicted at constant velocity from the two
  shots before it and from the two after it; the smaller miss is its jump. A real turn is
  predicted well from one side; a lagging fix from neither. Some misses are normal on curved
  paths, so the warning is for a flight where more than ``max_jump_share`` of the shots miss by
  more than ``jump_m``.

Input is plain records (:class:`GpsFix`), independent of the Survey model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np
from numpy.typing import NDArray

from prefect_odm.survey.gps_records import GpsQualityOptions, GpsWarning

__all__ = [
    "GpsFix",
    "GpsQualityOptions",
    "GpsWarning",
    "altitude_jumps",
    "altitude_trend",
    "check_gps",
    "flights",
    "implausible_speeds",
    "jump_distances",
    "position_jumps",
    "exact_theil_sen_slope",
    "sampled_theil_sen_slope",
    "theil_sen_slope",
]

FloatArray = NDArray[np.float64]
NAMES_SHOWN = 8
EXACT_MAX_IMAGES = 2000  # 2.0 M pairwise slopes, ~50 MiB in scipy's exact Theil-Sen
SAMPLED_PAIRS = 1_000_000


def theil_sen_slope(h: FloatArray, alpha: float = 0.95) -> tuple[float, float, float]:
    """Theil-Sen slope of ``h`` against its index and Sen's (1968) interval of confidence ``alpha``.

    Up to ``EXACT_MAX_IMAGES`` values this is ``scipy.stats.theilslopes(h, arange(n), alpha)``;
    above, :func:`sampled_theil_sen_slope` (the n(n-1)/2 pairwise slopes of the exact estimator
    cost O(n^2) time and memory: 37.5 s and 9.75 GiB at 20,000 images).

    Args:
        h: values, shape ``(n,)``, n >= 2.
        alpha: confidence degree of the interval.

    Returns:
        (slope, low, high), in units of ``h`` per index step.
    """
    n = len(h)
    if n <= EXACT_MAX_IMAGES:
        return exact_theil_sen_slope(h, alpha)
    return sampled_theil_sen_slope(h, alpha)


def exact_theil_sen_slope(h: FloatArray, alpha: float = 0.95) -> tuple[float, float, float]:
    """``scipy.stats.theilslopes(h, arange(n), alpha)``'s slope and interval, the same floats
    by the same operations (SciPy 1.x's), without importing ``scipy.stats`` (0.4 CPU-s of a
    50,000-image plan; issue 33): no repeats in ``x``, the repeats of ``h`` counted as scipy's
    ``_find_repeats`` counts them.

    Args:
        h: values, shape ``(n,)``, n >= 2.
        alpha: confidence degree of the interval.

    Returns:
        (slope, low, high), in units of ``h`` per index step.
    """
    from scipy.special import ndtri  # imported with scipy.spatial already

    y = np.array(h, dtype=float).ravel()
    x = np.arange(len(y), dtype=float)
    deltax = x[:, np.newaxis] - x
    deltay = y[:, np.newaxis] - y
    slopes = deltay[deltax > 0] / deltax[deltax > 0]
    slopes.sort()
    medslope = np.median(slopes)
    if alpha > 0.5:
        alpha = 1.0 - alpha
    z = ndtri(alpha / 2.0)
    sorted_y = np.sort(y)
    change = np.concatenate(([True], sorted_y[1:] != sorted_y[:-1]))
    freq = np.diff(np.concatenate(np.nonzero(change) + ([sorted_y.size],)))
    nt, ny = len(slopes), len(y)
    sigsq = (
        1
        / 18.0
        * (
            ny * (ny - 1) * (2 * ny + 5)
            - 0
            - sum(k * (k - 1) * (2 * k + 5) for k in freq[freq > 1])
        )
    )
    sigma = np.sqrt(sigsq)
    upper = min(int(np.round((nt - z * sigma) / 2.0)), len(slopes) - 1)
    lower = max(int(np.round((nt + z * sigma) / 2.0)) - 1, 0)
    return float(medslope), float(slopes[lower]), float(slopes[upper])


def sampled_theil_sen_slope(
    h: FloatArray, alpha: float = 0.95, pairs: int = SAMPLED_PAIRS
) -> tuple[float, float, float]:
    """Theil-Sen slope and Sen's interval from ``pairs`` pairs drawn uniformly: O(pairs).

    The pairs (ordered, of distinct indices) are drawn with a seed fixed by ``n``, so the result
    is deterministic; the median and the interval are the sample's quantiles at the fractions of
    the exact ranks (Sen 1968, eq. 2.6, ties of ``h`` counted as scipy does). Chosen over
    Siegel's repeated medians because it estimates the *same* quantity as scipy's exact
    estimator (the median of all pairwise slopes) with the same interval, so the warnings do not
    change where the exact one still runs; the sampling error of a quantile, about 0.0005 in
    rank fraction at 1M pairs, is small next to the interval's half-width, about 1.3 / sqrt(n)
    in rank fraction (0.03 at 2,000 values).

    Args:
        h: values, shape ``(n,)``, n >= 2.
        alpha: confidence degree of the interval.
        pairs: pairs drawn.

    Returns:
        (slope, low, high), in units of ``h`` per index step.
    """
    n = len(h)
    rng = np.random.default_rng(n)
    i = rng.integers(0, n, pairs)
    j = rng.integers(0, n - 1, pairs)
    j += j >= i  # uniform over ordered pairs of distinct indices
    slopes = (h[j] - h[i]) / (j - i).astype(np.float64)
    z = NormalDist().inv_cdf((1.0 - max(alpha, 1.0 - alpha)) / 2.0)  # scipy.stats costs 2.6 s
    _, counts = np.unique(h, return_counts=True)
    reps = counts[counts > 1].astype(np.float64)
    sigsq = (n * (n - 1) * (2 * n + 5) - float(np.sum(reps * (reps - 1) * (2 * reps + 5)))) / 18.0
    nt = n * (n - 1) / 2
    sigma = float(np.sqrt(sigsq))
    upper = min(round((nt - z * sigma) / 2.0), nt - 1) / (nt - 1)
    lower = max(round((nt + z * sigma) / 2.0) - 1, 0) / (nt - 1)
    slope, low, high = np.quantile(slopes, [0.5, lower, upper])
    return float(slope), float(low), float(high)


@dataclass(frozen=True)
class GpsFix:
    """One image's capture time and GPS position.

    Attributes:
        name: the image name.
        time_s: capture time, seconds (any origin, e.g. POSIX time).
        x_m, y_m: position in a projected CRS (the plan's UTM zone), metres.
        alt_m: GPS altitude, metres.
        relative_alt_m: barometric altitude above take-off (DJI ``RelativeAltitude``), or None.
    """

    name: str
    time_s: float
    x_m: float
    y_m: float
    alt_m: float
    relative_alt_m: float | None = None


def flights(fixes: Sequence[GpsFix], gap_s: float) -> list[list[GpsFix]]:
    """The fixes sorted by capture time (then name), cut into flights at pauses over ``gap_s``."""
    ordered = sorted(fixes, key=lambda f: (f.time_s, f.name))
    out: list[list[GpsFix]] = []
    for fix in ordered:
        if out and fix.time_s - out[-1][-1].time_s <= gap_s:
            out[-1].append(fix)
        else:
            out.append([fix])
    return out


def _shown(names: Sequence[str]) -> str:
    more = f" and {len(names) - NAMES_SHOWN} more" if len(names) > NAMES_SHOWN else ""
    return ", ".join(names[:NAMES_SHOWN]) + more


def _heights(flight: Sequence[GpsFix]) -> tuple[FloatArray, bool]:
    """The heights that must stay constant over a flight: GPS minus relative altitude (the
    take-off height) when every shot has a relative altitude, else the GPS altitude; and which."""
    with_rel = all(f.relative_alt_m is not None for f in flight)
    h = np.array([f.alt_m - (f.relative_alt_m or 0.0) if with_rel else f.alt_m for f in flight])
    return h, with_rel


def altitude_trend(flight: Sequence[GpsFix], options: GpsQualityOptions) -> GpsWarning | None:
    """The altitude drift warning for one flight (sorted by time), or None."""
    h, with_rel = _heights(flight)
    slope, low, high = theil_sen_slope(h)
    drift = slope * (len(h) - 1)
    if abs(drift) <= options.max_altitude_drift_m or low <= 0.0 <= high:
        return None
    first, last = flight[0].name, flight[-1].name
    what = "GPS minus relative altitude" if with_rel else "GPS altitude (constant height assumed)"
    return GpsWarning(
        kind="altitude_trend",
        images=[first, last],
        value=drift,
        threshold=options.max_altitude_drift_m,
        message=f"{what} drifts {slope:+.2f} m per image, {drift:+.1f} m from {first} to {last} "
        f"({len(h)} images)",
    )


def altitude_jumps(flight: Sequence[GpsFix], options: GpsQualityOptions) -> GpsWarning | None:
    """The altitude jump warning for one flight (sorted by time), or None: too many shots whose
    height (:func:`_heights`) lies more than ``altitude_jump_m`` off the flight's Theil-Sen line."""
    h, with_rel = _heights(flight)
    slope, _, _ = theil_sen_slope(h)
    steps = np.arange(len(h), dtype=np.float64)
    off = h - slope * steps
    off = np.abs(off - float(np.median(off)))
    bad = np.flatnonzero(off > options.altitude_jump_m)
    share = len(bad) / len(flight)
    if share <= options.max_jump_share:
        return None
    names = [flight[k].name for k in bad[np.argsort(-off[bad])].tolist()]
    what = "GPS minus relative altitude" if with_rel else "GPS altitude (constant height assumed)"
    return GpsWarning(
        kind="altitude_jump",
        images=names,
        value=share,
        threshold=options.max_jump_share,
        message=f"{what} of {len(bad)} of {len(flight)} images jumps more than "
        f"{options.altitude_jump_m:g} m off the flight's trend (up to {float(off.max()):.0f} m; "
        f"GPS lag on turns?), worst first: {_shown(names)}",
    )


def implausible_speeds(flight: Sequence[GpsFix], options: GpsQualityOptions) -> GpsWarning | None:
    """The speed warning for one flight: consecutive shots farther apart than the drone can fly."""
    p = np.array([(f.x_m, f.y_m, f.alt_m) for f in flight])
    t = np.array([f.time_s for f in flight])
    dist = np.linalg.norm(np.diff(p, axis=0), axis=1)
    dt = np.maximum(np.diff(t), 0.0) + options.time_resolution_s
    speed = dist / np.maximum(dt, 1e-3)
    bad = np.flatnonzero(speed > options.max_speed_m_s)
    if not len(bad):
        return None
    names = [f"{flight[k].name}->{flight[k + 1].name}" for k in bad.tolist()]
    worst = float(speed[bad].max())
    return GpsWarning(
        kind="implausible_speed",
        images=[flight[k + 1].name for k in bad.tolist()],
        value=worst,
        threshold=options.max_speed_m_s,
        message=f"{len(bad)} step(s) faster than {options.max_speed_m_s:g} m/s (up to "
        f"{worst:.0f} m/s): {_shown(names)}",
    )


def jump_distances(t: FloatArray, p: FloatArray, min_dt_s: float = 1.0) -> FloatArray:
    """Per shot, the smaller constant-velocity miss from its two predecessors or two successors.

    Args:
        t: capture times, seconds, shape ``(n,)``, sorted.
        p: positions, shape ``(n, 2)``, metres.
        min_dt_s: the shortest time step used for a velocity (the clock's resolution).

    Returns:
        misses in metres, shape ``(n,)`` (``inf`` where neither side has two shots).
    """
    n = len(t)
    out = np.full(n, np.inf)
    dt = np.maximum(np.diff(t), max(min_dt_s, 1e-3))
    if n < 3:
        return out
    v = np.diff(p, axis=0) / dt[:, None]  # velocity of step k -> k+1
    fwd = p[1:-1] + v[:-1] * dt[1:, None]  # prediction of shot k+2 from shots k, k+1
    out[2:] = np.minimum(out[2:], np.linalg.norm(p[2:] - fwd, axis=1))
    bwd = p[1:-1] - v[1:] * dt[:-1, None]  # prediction of shot k from shots k+1, k+2
    out[:-2] = np.minimum(out[:-2], np.linalg.norm(p[:-2] - bwd, axis=1))
    return out


def position_jumps(flight: Sequence[GpsFix], options: GpsQualityOptions) -> GpsWarning | None:
    """The jump (lag on turns) warning for one flight, or None."""
    t = np.array([f.time_s for f in flight])
    p = np.array([(f.x_m, f.y_m) for f in flight])
    miss = jump_distances(t, p, options.time_resolution_s)
    bad = np.flatnonzero(np.isfinite(miss) & (miss > options.jump_m))
    share = len(bad) / len(flight)
    if share <= options.max_jump_share:
        return None
    worst = bad[np.argsort(-miss[bad])]
    names = [flight[k].name for k in worst.tolist()]
    return GpsWarning(
        kind="position_jump",
        images=names,
        value=share,
        threshold=options.max_jump_share,
        message=f"{len(bad)} of {len(flight)} positions jump more than {options.jump_m:g} m off "
        f"their track (GPS lag on turns?), worst first: {_shown(names)}",
    )


def check_gps(
    fixes: Sequence[GpsFix], options: GpsQualityOptions | None = None
) -> list[GpsWarning]:
    """Every GPS warning for a survey's images, flight by flight.

    Args:
        fixes: one per image, any order (sorted here by capture time, then name).
        options: thresholds (defaults when ``None``).

    Returns:
        warnings, in flight order; empty when the GPS looks right.
    """
    opts = options or GpsQualityOptions()
    out: list[GpsWarning] = []
    for flight in flights(fixes, opts.flight_gap_s):
        if len(flight) < opts.min_images:
            continue
        for check in (altitude_trend, altitude_jumps, implausible_speeds, position_jumps):
            warning = check(flight, opts)
            if warning is not None:
                out.append(warning)
    return out
