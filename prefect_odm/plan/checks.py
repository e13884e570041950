"""Checks on a split plan before it is published (pure core).

With a split overlap wider than the submodels, several submodels can hold exactly the same
images: brighton (18 images) with ``--split 6`` and the default 50 m overlap planned three
submodels of all 18 images, which share one fingerprint and so one task, reused three times
(issue 13). The planner calls :func:`find_duplicate_submodels` and keeps one submodel of each
group (:func:`drop_duplicate_submodels`), and warns with :func:`overlap_warning` when the overlap
makes each image processed more than :data:`MAX_DUPLICATION_FACTOR` times.

It also looks at the camera GPS before any compute (:func:`gps_warnings`, over
:func:`prefect_odm.survey.gps_quality.check_gps`): an altitude trend along the capture sequence,
implausible speeds between consecutive shots and positions that jump off their track. A survey
placed by such GPS lands its submodels metres apart (issue 11: a drift of over 100 m and a lag of
tens of metres on turns left two submodels 9-25 m apart with no warning).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Protocol, TypeVar

from prefect_odm.errors import PlanningError
from prefect_odm.settings import MAX_ASKED_SPLIT_OVERLAP_M

logger = logging.getLogger(__name__)

if TYPE_CHECKING:
    from prefect_odm.models import CaptureMetadata, SplitPlan, Survey
    from prefect_odm.survey.gps_records import GpsQualityOptions, GpsWarning

MAX_DUPLICATION_FACTOR = 1.5
"""Images processed / distinct images above which the plan is reported as wasteful."""


class HasImages(Protocol):
    """What these checks read of a submodel (``models.Submodel`` has both)."""

    @property
    def id(self) -> str:
        """The submodel id (``submodel-007``)."""
        ...

    @property
    def image_names(self) -> Sequence[str]:
        """Every image the submodel processes (core and overlap)."""
        ...


S = TypeVar("S", bound=HasImages)


@dataclass(frozen=True)
class Duplication:
    """How much a plan processes each image.

    Attributes:
        groups: ids of submodels with identical image sets, each group sorted by plan order,
            only groups of two or more.
        images_processed: the sum of the submodels' image counts.
        distinct_images: images in at least one submodel.
    """

    groups: tuple[tuple[str, ...], ...]
    images_processed: int
    distinct_images: int

    @property
    def factor(self) -> float:
        """Images processed per distinct image (1.0 without overlap; 0.0 for an empty plan)."""
        return self.images_processed / self.distinct_images if self.distinct_images else 0.0


def find_duplicate_submodels(submodels: Sequence[HasImages]) -> Duplication:
    """Group the submodels whose image sets are identical, and measure the duplication.

    Args:
        submodels: the plan's submodels, in plan order.

    Returns:
        The groups of identical image sets and the duplication factor.
    """
    by_set: dict[frozenset[str], list[str]] = {}
    for sub in submodels:
        by_set.setdefault(frozenset(sub.image_names), []).append(sub.id)
    distinct = set().union(*by_set) if by_set else set()
    return Duplication(
        groups=tuple(tuple(ids) for ids in by_set.values() if len(ids) > 1),
        images_processed=sum(len(set(sub.image_names)) for sub in submodels),
        distinct_images=len(distinct),
    )


def drop_duplicate_submodels(submodels: Sequence[S]) -> list[S]:
    """``submodels`` without the later members of each identical image set (order kept)."""
    seen: set[frozenset[str]] = set()
    kept: list[S] = []
    for sub in submodels:
        key = frozenset(sub.image_names)
        if key not in seen:
            seen.add(key)
            kept.append(sub)
    return kept


def kept_submodel_of(duplication: Duplication) -> dict[str, str]:
    """Dropped submodel id -> the id kept for its image set (the first of each group).

    The planner uses it to hand the dropped submodels' core images (and their cameras'
    ``submodel_id``) to the kept one, so ownership still covers every camera.
    """
    return {dropped: group[0] for group in duplication.groups for dropped in group[1:]}


def overlap_warning(duplication: Duplication, split_overlap_m: float) -> str | None:
    """A warning when each image is processed more than :data:`MAX_DUPLICATION_FACTOR` times."""
    if duplication.factor <= MAX_DUPLICATION_FACTOR:
        return None
    return (
        f"the split overlap of {split_overlap_m:g} m makes each image processed "
        f"{duplication.factor:.1f} times on average ({duplication.images_processed} images "
        f"processed for {duplication.distinct_images}); use a smaller --split-overlap-m or fewer "
        "submodels"
    )


def _seconds(t: datetime) -> float:
    """A capture time as seconds; EXIF times are naive (the camera's clock), read as UTC."""
    return (t if t.tzinfo is not None else t.replace(tzinfo=UTC)).timestamp()


def gps_warnings(
    images: Sequence[tuple[str, CaptureMetadata]],
    x_m: Iterable[float],
    y_m: Iterable[float],
    options: GpsQualityOptions | None = None,
) -> tuple[list[GpsWarning], list[str]]:
    """The GPS warnings of a survey's images (:func:`prefect_odm.survey.gps_quality.check_gps`), each
    logged; they never stop the plan.

    Args:
        images: ``(name, metadata)`` per image; those without a capture time or a GPS altitude
            cannot be placed in the sequence and are left out.
        x_m, y_m: each image's position in the plan's projected CRS, metres, same order.
        options: thresholds (:class:`~prefect_odm.survey.gps_records.GpsQualityOptions` defaults).

    Returns:
        The warnings in flight order (empty when the GPS looks right), and each as a line
        starting ``GPS:`` for ``SplitPlan.warnings``.
    """
    from prefect_odm.survey.gps_quality import GpsFix, check_gps

    fixes = [
        GpsFix(
            name,
            _seconds(meta.capture_time),
            float(x),
            float(y),
            meta.altitude_m,
            meta.relative_altitude_m,
        )
        for (name, meta), x, y in zip(images, x_m, y_m, strict=True)
        if meta.capture_time is not None and meta.altitude_m is not None
    ]
    found = check_gps(fixes, options)
    lines = [f"GPS: {w.message}" for w in found]
    for line in lines:
        logger.warning("%s", line)
    return found, lines


MAX_PRIOR_TILT_DEG = 2.0
"""Largest slope of the altitude priors' plane a run starts with, degrees (the engine's block
gate, :data:`prefect_odm.engine.block_checks.MAX_LEVEL_DEG`, would stop a block this tilted
after structure from motion)."""


def altitude_prior_tilt_deg(
    x_m: Sequence[float], y_m: Sequence[float], height_m: Sequence[float]
) -> float:
    """Slope of the least-squares plane through ``height_m`` over ``(x_m, y_m)``, degrees.

    With ``height_m`` the GPS altitude minus the relative altitude (the take-off height, which
    must be constant), or the GPS altitude of a constant-height flight, this is the tilt that
    structure from motion, oriented by the GPS altitude priors, gives the whole block (brighton
    with its altitude drifting +1.7 m per image: a DSM tilted 19 degrees, issue 31).

    Returns:
        The slope, degrees; 0.0 for fewer than 3 positions or positions on one line.
    """
    import numpy as np

    x, y, h = (np.asarray(v, dtype=np.float64) for v in (x_m, y_m, height_m))
    if len(h) < 3:
        return 0.0
    design = np.column_stack([x - x.mean(), y - y.mean(), np.ones_like(x)])
    if np.linalg.matrix_rank(design) < 3:
        return 0.0
    (a, b, _), *_ = np.linalg.lstsq(design, h, rcond=None)
    return float(np.degrees(np.arctan(np.hypot(a, b))))


MAX_TREND_NEIGHBOUR_RATIO = 0.5
"""Largest share of the altitude differences between neighbouring lines left once the flight's
trend is taken out for the trend to be called a drift (:func:`trend_neighbour_ratio`). Measured:
brighton drifted +1.7 m per image 0.01, the real layouts' altitudes drifted 0.1 m per image over
a constant height 0.0; the real terrain-following layouts agung-2 and freetown-1 1.26 and 1.32
(the trend makes neighbouring lines disagree more, not less)."""


def trend_neighbour_ratio(
    x_m: Sequence[float],
    y_m: Sequence[float],
    time_s: Sequence[float],
    height_m: Sequence[float],
    flight_gap_s: float,
) -> float | None:
    """How much of the height difference between neighbouring positions shot at other times
    the flight's altitude trend explains: the median ``|dh|`` over pairs of nearest neighbours
    (six per position, not the next two shots of the same flight) after each flight's Theil-Sen
    line in shot order is taken out, over the same median before.

    A GPS altitude that drifts with time makes neighbouring lines disagree by the drift between
    their shots, and taking the trend out makes them agree (ratio near 0). A terrain-following
    flight's altitude follows the ground: neighbouring lines agree already, and taking out the
    "trend" its lines up or down the slope show makes them disagree (ratio near or above 1).

    Returns:
        The ratio; None for fewer than 8 positions or neighbours that agree to 1 cm already.
    """
    import numpy as np
    from scipy.spatial import cKDTree

    from prefect_odm.survey.gps_quality import theil_sen_slope

    t = np.asarray(time_s, dtype=np.float64)
    order = np.argsort(t, kind="stable")
    x, y, h = (np.asarray(v, dtype=np.float64)[order] for v in (x_m, y_m, height_m))
    if len(h) < 8:
        return None
    flight = np.concatenate([[0], np.cumsum(np.diff(t[order]) > flight_gap_s)])
    shot = np.zeros(len(h))
    detrended = h.copy()
    for f in np.unique(flight):
        m = flight == f
        shot[m] = np.arange(int(m.sum()))
        if m.sum() >= 3:
            detrended[m] = h[m] - theil_sen_slope(h[m])[0] * shot[m]
    xy = np.column_stack([x, y])
    k = min(7, len(h))
    near = np.asarray(cKDTree(xy).query(xy, k=k)[1], dtype=np.intp)
    i, j = np.repeat(np.arange(len(h)), k - 1), near[:, 1:].ravel()
    apart = (flight[i] != flight[j]) | (np.abs(shot[i] - shot[j]) > 2)
    i, j = i[apart], j[apart]
    before = float(np.median(np.abs(h[i] - h[j]))) if len(i) else 0.0
    if before < 0.01:
        return None
    return float(np.median(np.abs(detrended[i] - detrended[j]))) / before


def gps_altitude_refusal(
    warnings: Sequence[GpsWarning],
    tilt_deg: float,
    *,
    max_tilt_deg: float = MAX_PRIOR_TILT_DEG,
    neighbour_ratio: float | None = None,
) -> str | None:
    """One line refusing a run whose GPS altitude would tilt every block, or None.

    Refused when the plan found an altitude trend (:func:`gps_warnings`), the altitude priors'
    plane (:func:`altitude_prior_tilt_deg`) slopes more than ``max_tilt_deg``, and the trend is
    a drift: taking it out makes neighbouring lines agree (``neighbour_ratio``, from
    :func:`trend_neighbour_ratio`, at most :data:`MAX_TREND_NEIGHBOUR_RATIO`; None: not
    measured, refused as a drift). The compute would end at the block gate, or with a tilted
    product. Decided before anything is uploaded. A terrain-following flight (its altitude
    follows the ground, so neighbouring lines agree as recorded) is not refused: its priors
    slope with the ground, and structure from motion keeps them.
    """
    trend = next((w for w in warnings if w.kind == "altitude_trend"), None)
    if trend is None or tilt_deg <= max_tilt_deg:
        return None
    if neighbour_ratio is not None and neighbour_ratio > MAX_TREND_NEIGHBOUR_RATIO:
        return None
    agree = (
        ""
        if neighbour_ratio is None
        else f"; taking the trend out leaves {neighbour_ratio:.0%} of the altitude differences "
        "between neighbouring lines, so the altitude follows the time, not the ground"
    )
    return (
        f"GPS altitude unusable: {trend.message}; the altitude priors slope {tilt_deg:.1f} deg "
        f"(gate {max_tilt_deg:g} deg), so every block would come out tilted{agree}. Ways out: "
        "correct the images' GPS altitude (e.g. take-off altitude + RelativeAltitude) and run "
        "again, or process a flight whose altitude holds"
    )


def plan_gps_refusal(plan: SplitPlan, survey: Survey) -> str | None:
    """:func:`gps_altitude_refusal` for a plan: the take-off height (GPS minus relative altitude)
    when every image has a relative altitude, else the GPS altitude, over the plan's camera
    positions (its projected CRS); the images' capture times tell a drift from the ground."""
    from prefect_odm.survey.gps_records import GpsQualityOptions

    relative = {im.name: im.relative_altitude_m for im in survey.images}
    placed = [c for c in plan.cameras if c.z_m is not None]
    with_relative = all(relative.get(c.name) is not None for c in placed)
    heights = [
        float(c.z_m or 0.0) - (float(relative.get(c.name) or 0.0) if with_relative else 0.0)
        for c in placed
    ]
    x_m, y_m = [c.x_m for c in placed], [c.y_m for c in placed]
    tilt = altitude_prior_tilt_deg(x_m, y_m, heights)
    if gps_altitude_refusal(plan.gps_warnings, tilt) is None:
        return None  # no trend, or level priors: the neighbours need not be asked
    times = {im.name: im.capture_time for im in survey.images}
    seconds = [t.timestamp() for c in placed if (t := times.get(c.name)) is not None]
    ratio = None
    if len(seconds) == len(placed):
        gap_s = GpsQualityOptions().flight_gap_s
        ratio = trend_neighbour_ratio(x_m, y_m, seconds, heights, gap_s)
    return gps_altitude_refusal(plan.gps_warnings, tilt, neighbour_ratio=ratio)


MIN_SFM_SUBMODEL_IMAGES = 8
"""The fewest images a submodel of a split reconstructs reliably by structure from motion with
the built-in engine, measured on brighton (benchmarks/RESULTS.md "h40s"). Every split with a
smaller submodel was reconstructed and then refused by the merge's gates: 3 images (the block
check, ``--split 3 --split-overlap-m 0``), 6 (``--split 6 --split-overlap-m 5``: seams 1.2 and
2.2 m apart in height, submodel-000 tilted 2.4 deg against ODM's cloud, corrected by 2.66 deg
> ``max_rotation_deg``) and 7 (``--split 5 --split-overlap-m 10``: scale changes 2.1-2.6 % >
``max_scale_change``); the smallest of 8 and 9 (``--split 6 --split-overlap-m 10``, ``--split
8 --split-overlap-m 0``) merge. ODM and OpenSfM set no minimum (ODM passes ``max(2, --split)``
as OpenSfM's ``submodel_size``, default 80 images)."""


def small_block_refusal(submodels: Sequence[HasImages], pipeline: str) -> str | None:
    """The one-line refusal of a plan whose smallest submodel is too small for its pipeline.

    Args:
        submodels: the plan's submodels (core plus overlap images each).
        pipeline: ``sfm`` (structure from motion) or ``direct`` (GPS-placed, any size).

    Returns:
        None for a single submodel (the survey as the user gave it), the ``direct`` pipeline, or
        every submodel at least :data:`MIN_SFM_SUBMODEL_IMAGES` images; else the line naming
        the smallest submodel and the ways on.
    """
    if pipeline == "direct" or len(submodels) < 2:
        return None
    smallest = min(submodels, key=lambda s: (len(s.image_names), s.id))
    if len(smallest.image_names) >= MIN_SFM_SUBMODEL_IMAGES:
        return None
    return (
        f"{smallest.id} would reconstruct {len(smallest.image_names)} images by structure from "
        f"motion, fewer than the {MIN_SFM_SUBMODEL_IMAGES} a submodel needs to reconstruct "
        "reliably: use a larger --split, a wider --split-overlap-m, or --pipeline direct"
    )


def check_split_overlap(split_overlap_m: float) -> None:
    """Refuse a split overlap outside 0 to
    :data:`~prefect_odm.settings.MAX_ASKED_SPLIT_OVERLAP_M` metres (non-finite included).

    Raises:
        PlanningError: the overlap is out of that range.
    """
    if not 0 <= split_overlap_m <= MAX_ASKED_SPLIT_OVERLAP_M:
        raise PlanningError(
            f"split_overlap_m must be 0 to {MAX_ASKED_SPLIT_OVERLAP_M:g} m, not {split_overlap_m!r}"
        )
