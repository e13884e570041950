"""Split planning: balanced submodels in metres, core areas, overlap in metres (pure core).

The algorithm, in the plan's projected CRS (one UTM zone for the whole survey, metres):

1. **Canonical order.** Positions are sorted by ``(x, y, identity rank)`` before anything else,
   so a shuffled or renamed input yields the same arrays and therefore the same plan.
2. **Target sizes** (:mod:`prefect_odm.plan.partition`). ``k`` submodels with sizes as equal as possible and within +-20 % of
   ``split`` (:func:`~prefect_odm.plan.partition.target_sizes`). Only when no such ``k`` exists (``1.2 split < n < 1.6 split``)
   one submodel takes the remainder; a remainder smaller than ``min_submodel_images`` is spread
   over the others instead (a tiny cluster joins its neighbours).
3. **Balanced partition by recursive bisection** (:func:`~prefect_odm.plan.partition.partition_positions`): the list of target
   sizes is halved, the points are cut across their longer principal axis at the count quantile
   of the first half, and both halves recurse. Sizes are met exactly; every cut is a straight
   line, so submodels are compact and contiguous. This is orthogonal recursive bisection as used
   for balanced spatial domain decomposition (Berger & Bokhari 1987, "A partitioning strategy for
   nonuniform problems on multiprocessors", IEEE Trans. Computers C-36(5)), with the principal
   axis instead of a coordinate axis. Cost O(n log n log k).
4. **Core areas** (:func:`prefect_odm.plan.core_areas.core_areas`): the union of the Voronoi cells of each submodel's
   cameras, i.e. exactly the region :mod:`prefect_odm.ownership` assigns to it (nearest core
   camera), clipped to the camera hull buffered by ``clip_buffer_m``. Built from the Delaunay
   triangulation (Voronoi edges = segments between circumcentres of adjacent triangles whose
   shared edge joins cameras of different submodels), polygonized per submodel.
5. **Overlap in metres** (:func:`prefect_odm.plan.core_areas.overlap_members`): every camera within ``split_overlap_m`` of a
   submodel's core area is added to that submodel; the added count is reported.
6. **Load balance** (:func:`_balanced_split`): when the largest submodel processes (core plus
   overlap) more than :data:`REBALANCE_TRIGGER` times the mean, the core sizes are resized
   (:func:`~prefect_odm.plan.partition.rebalanced_sizes`) and steps 3-5 run again, up to
   :data:`REBALANCE_ROUNDS` times; inner cores shrink and edge cores grow.

7. **Neighbours the alignment can tie** (:mod:`prefect_odm.plan.neighbours`, on a survey): each
   pair of submodels whose core areas share a boundary is measured (shared images, footprint
   overlap) and judged with the merge's alignment thresholds; an unset overlap is widened until
   every pair is tied, a set one that leaves a submodel untied is refused.

This module runs the steps on raw positions (:func:`plan_from_positions`) and on a scanned survey
(:func:`plan_split`, which adds memory estimates, fingerprints and GeoJSON geometry). Holes in
the coverage are found by :mod:`prefect_odm.plan.coverage_gaps`. Nothing here imports Prefect or does
I/O.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Literal

import numpy as np
import shapely
from numpy.typing import ArrayLike, NDArray
from shapely.geometry.base import BaseGeometry

from prefect_odm.errors import PlanningError
from prefect_odm.geo import half_footprint_m, project_lonlat
from prefect_odm.models import (
    ImageRecord,
    MergeOptions,
    NeighbourPair,
    ProcessingOptions,
    SplitPlan,
    Survey,
)
from prefect_odm.plan.altitudes import altitude_correction
from prefect_odm.plan.checks import check_split_overlap, gps_warnings, small_block_refusal
from prefect_odm.plan.core_areas import FrameCache, core_areas, multipoint, overlap_members
from prefect_odm.plan.memory import MemoryModel, max_images_within
from prefect_odm.plan.neighbours import (
    AlignmentNeeds,
    OverlapDecision,
    neighbour_pairs,
    settle_overlap,
)
from prefect_odm.plan.partition import (
    canonical_order,
    default_min_submodel_images,
    partition_positions,
    rebalanced_sizes,
    target_sizes,
)
from prefect_odm.plan.plan_records import (
    camera_positions,
    plan_fingerprint,
    submodel_records,
    with_altitudes,
)
from prefect_odm.plan.position_plan import PositionPlan, merge_duplicate_parts
from prefect_odm.settings import DEFAULT_SPLIT, DEFAULT_SPLIT_OVERLAP_M

logger = logging.getLogger(__name__)

__all__ = [
    "BUILTIN_ENGINE_PREFIXES",
    "PositionPlan",
    "memory_model_for",
    "merge_duplicate_parts",
    "plan_from_positions",
    "plan_split",
]

#: Engine identities (lower-case prefixes) whose memory is estimated with the built-in model.
BUILTIN_ENGINE_PREFIXES = ("builtin", "prefect-odm-engine", "prefect-odm ")
#: Core sizes are rebalanced when the largest submodel processes more than this times the mean.
REBALANCE_TRIGGER = 1.1
#: Most rebalancing rounds (each a bisection, core areas and overlap).
REBALANCE_ROUNDS = 8
#: Rebalancing stops at a largest submodel of this times the mean (or 2 rounds without progress).
REBALANCE_GOOD = 1.05


def plan_from_positions(
    x_m: ArrayLike,
    y_m: ArrayLike,
    *,
    split: int = DEFAULT_SPLIT,
    split_overlap_m: float = DEFAULT_SPLIT_OVERLAP_M,
    min_submodel_images: int | None = None,
    tie_rank: ArrayLike | None = None,
    clip_buffer_m: float = 100.0,
    geometry: bool = True,
    balance_load: bool = True,
    frames: FrameCache | None = None,
) -> PositionPlan:
    """Plan submodels on raw projected positions (the engine of :func:`plan_split`).

    Args:
        x_m, y_m: camera positions in a projected CRS, metres, shape ``(n,)``.
        split: average submodel size in images.
        split_overlap_m: overlap width in metres.
        min_submodel_images: see :func:`target_sizes`.
        tie_rank: ``(n,)`` integers breaking ties between identical positions (e.g. the rank of
            each image's content identity); without it ties fall back to input order.
        clip_buffer_m: buffer of the camera hull that core areas are clipped to, metres.
        geometry: compute core areas and the metre overlap; without it, members are core only.
        balance_load: rebalance the core sizes so that the submodels process about the same
            number of images, core plus overlap (:func:`_balanced_split`); without it (or
            without ``geometry``) the cores have the sizes of
            :func:`~prefect_odm.plan.partition.target_sizes`.
        frames: the triangulation of earlier plans of the same positions, reused when the
            clip is the same too.

    Returns:
        The :class:`PositionPlan`; identical for any permutation of the input (given tie ranks).

    Raises:
        PlanningError: no positions, non-finite positions, a bad ``split`` or overlap.
    """
    x = np.asarray(x_m, dtype=np.float64)
    y = np.asarray(y_m, dtype=np.float64)
    n = len(x)
    if n == 0:
        raise PlanningError("nothing to plan: no camera positions")
    if not (np.all(np.isfinite(x)) and np.all(np.isfinite(y))):
        raise PlanningError("camera positions must be finite numbers")
    check_split_overlap(split_overlap_m)
    rank = None if tie_rank is None else np.asarray(tie_rank, dtype=np.int64)
    order = canonical_order(x, y, rank)
    # Work in local coordinates around a rounded origin: exact offsets, better precision.
    origin = np.array([math.floor(float(np.min(x))), math.floor(float(np.min(y)))])
    xy = np.column_stack([x[order] - origin[0], y[order] - origin[1]])
    sizes = target_sizes(n, split, min_submodel_images)
    areas: list[BaseGeometry] | None = None
    clip: BaseGeometry | None = None
    if geometry:
        hull = multipoint(xy).convex_hull
        clip = shapely.buffer(hull, max(clip_buffer_m, 1.0), quad_segs=8)
        min_size = (
            default_min_submodel_images(split)
            if min_submodel_images is None
            else min_submodel_images
        )
        labels_sorted, local_areas, members_sorted = _balanced_split(
            xy, sizes, clip, split_overlap_m, min(min_size, min(sizes)), balance_load, frames
        )
        areas = [shapely.transform(a, lambda c: c + origin) for a in local_areas]
        clip = shapely.transform(clip, lambda c: c + origin)
    else:
        labels_sorted = _part_labels(xy, sizes)
        k = int(labels_sorted.max()) + 1
        members_sorted = [np.flatnonzero(labels_sorted == p) for p in range(k)]
    labels = np.empty(n, dtype=np.int32)
    labels[order] = labels_sorted
    members = [np.sort(order[m]) for m in members_sorted]
    return PositionPlan(labels=labels, members=members, core_areas=areas, clip=clip)


def memory_model_for(engine_identity: str) -> MemoryModel:
    """``"builtin"`` when every engine of the pool is the built-in one (:data:`BUILTIN_ENGINE_PREFIXES`:
    embedded, or a node that reports ``engine: prefect-odm`` in ``/info``), else ``"odm"``.

    A pool's identity joins its engines with ``" | "``; one ODM node among engine nodes keeps the
    (3.3x larger) ODM model, since a submodel may be placed on it.
    """
    engines = [part.strip().lower() for part in engine_identity.split("|")]
    builtin = all(part.startswith(BUILTIN_ENGINE_PREFIXES) for part in engines)
    return "builtin" if builtin else "odm"


def _split_size(
    split: int | Literal["auto"],
    options: ProcessingOptions,
    node_memory_gib: Sequence[float],
    megapixels: float,
    split_overlap_m: float,
    memory_model: MemoryModel,
) -> int:
    """The asked split in images; ``"auto"``: the most images the largest node holds, less room
    for the overlap and the size tolerance."""
    if split != "auto":
        split_n = int(split)
        if split_n < 1:
            raise PlanningError(f"split must be >= 1 image, got {split}")
        return split_n
    if not node_memory_gib:
        raise PlanningError(
            "split='auto' needs the memory of the available nodes (node_memory_gib)"
        )
    largest = max(node_memory_gib)
    fits = max_images_within(largest, megapixels, options.to_nodeodm(), model=memory_model)
    if fits < 2:
        raise PlanningError(
            f"no submodel fits in the largest node ({largest:g} GiB): "
            f"even 1 image of {megapixels:.1f} MP needs more"
        )
    # Leave room for the overlap images and the +20 % size tolerance.
    headroom = 1.2 * (1.0 + min(1.0, split_overlap_m / 100.0))
    return max(1, int(fits / headroom))


def _positions(
    images: Sequence[ImageRecord], epsg: int
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """The images' GPS positions in the plan CRS ``epsg``, metres, each ``(n,)``."""
    lon = np.array([im.longitude for im in images])
    lat = np.array([im.latitude for im in images])
    return project_lonlat(lon, lat, epsg)


def _half_footprint(images: Sequence[ImageRecord]) -> float:
    """Half the ground footprint of one image, metres, from the median flight height and lens."""
    heights = [
        im.relative_altitude_m
        for im in images
        if im.relative_altitude_m is not None and im.relative_altitude_m > 0
    ]
    f35 = [im.focal_length_35mm for im in images if im.focal_length_35mm]
    return half_footprint_m(
        float(np.median(heights)) if heights else None, float(np.median(f35)) if f35 else None
    )


def _part_labels(xy: NDArray[np.float64], sizes: Sequence[int]) -> NDArray[np.int32]:
    """Core part of each (canonically ordered) position: the bisection with ``sizes``, with
    identical positions in one part and emptied parts dropped (labels stay in order)."""
    labels = partition_positions(xy, sizes)
    # Identical positions must share a part (ownership cannot tell them apart).
    same = np.flatnonzero(np.all(xy[1:] == xy[:-1], axis=1)) + 1
    for i in same:
        labels[i] = labels[i - 1]
    # Parts emptied by that (many images at one spot) are dropped, keeping the order.
    _, inverse = np.unique(labels, return_inverse=True)
    return inverse.astype(np.int32)


_Split = tuple[NDArray[np.int32], list[BaseGeometry], list[NDArray[np.intp]]]


def _balanced_split(
    xy: NDArray[np.float64],
    sizes: Sequence[int],
    clip: BaseGeometry,
    split_overlap_m: float,
    min_size: int,
    balance_load: bool = True,
    frames: FrameCache | None = None,
) -> _Split:
    """Labels, core areas and members (core + overlap) of the split, its load balanced.

    With equal cores, a submodel inside the survey takes overlap images from every side and one
    on the edge from a few (1.8x the images at ``--split 100``). When the largest submodel
    processes more than :data:`REBALANCE_TRIGGER` times the mean, the core sizes are
    rebalanced (:func:`prefect_odm.plan.partition.rebalanced_sizes`) up to :data:`REBALANCE_ROUNDS`
    times (stopping at :data:`REBALANCE_GOOD` or after two rounds without progress), and the
    split whose largest submodel is smallest is kept (ties: the first). On the real layouts of
    1,817 and 1,452 positions the largest submodel goes from 1.34-1.35x the mean to 1.03-1.11x
    at ``--split 100`` and from 1.44x to 1.06-1.07x at ``--split 50``, images processed per
    image within 4 % (``python benchmarks/bench_plan_balance.py``).
    """
    n = len(xy)
    frame = (frames or FrameCache()).get(xy, clip) if len(sizes) > 1 else None  # every round

    def split_with(part_sizes: Sequence[int]) -> tuple[_Split, NDArray[np.int64]]:
        key, memo = ("labels", tuple(part_sizes)), {} if frame is None else frame.memo  # round 1
        labels = memo[key] = memo[key] if key in memo else _part_labels(xy, part_sizes)
        k = int(labels.max()) + 1
        areas = core_areas(xy, labels, k, clip, frame)
        members = overlap_members(xy, labels, areas, split_overlap_m, frame)
        return (labels, areas, members), np.array([len(m) for m in members], dtype=np.int64)

    best, loads = split_with(sizes)
    if not balance_load or len(sizes) < 2 or loads.max() <= REBALANCE_TRIGGER * loads.mean():
        return best
    best_key = (int(loads.max()), int(loads.max() - loads.min()))
    weights = [float(v) for v in sizes]
    stale = 0
    for _ in range(REBALANCE_ROUNDS):
        if len(loads) != len(weights):  # identical positions emptied a part: keep what we have
            break
        trial_sizes, weights = rebalanced_sizes(weights, [int(v) for v in loads], n, min_size)
        trial, loads = split_with(trial_sizes)
        key = (int(loads.max()), int(loads.max() - loads.min()))
        if key < best_key:
            best, best_key, stale = trial, key, 0
        else:
            stale += 1
        if loads.max() <= REBALANCE_GOOD * loads.mean() or stale == 2:
            break
    return best


def _settled_plan(
    x: NDArray[np.float64],
    y: NDArray[np.float64],
    split_n: int,
    min_size: int,
    half_fp: float,
    needs: AlignmentNeeds | None,
    asked_m: float,
    *,
    given: bool,
    source: str,
) -> tuple[OverlapDecision, list[NeighbourPair], PositionPlan, list[str]]:
    """The position plan at the overlap :func:`~prefect_odm.plan.neighbours.settle_overlap` keeps.

    Returns the decision, the neighbour pairs, the plan at the decided overlap and its warnings
    (the decision's note first; each is logged).

    Raises:
        PlanningError: the decision refuses the overlap (one line starting with ``source``).
    """
    # width -> (plan, warnings, made with its own frame): the search shares one triangulation
    plans: dict[float, tuple[PositionPlan, list[str], bool]] = {}
    search_frames, own_frames = FrameCache(share_ring=True), FrameCache()

    def plan_at(width_m: float, own_frame: bool = False) -> tuple[PositionPlan, list[str]]:
        if width_m not in plans or (own_frame and not plans[width_m][2]):
            frames = own_frames if own_frame else search_frames
            frames.exact = True  # a single submodel asks for no frame
            pplan = plan_from_positions(
                x, y, split=split_n, split_overlap_m=width_m, min_submodel_images=min_size,
                tie_rank=np.arange(len(x)),
                clip_buffer_m=max(3.0 * half_fp, 2.0 * width_m, 50.0), frames=frames,
            )  # fmt: skip
            plans[width_m] = (*merge_duplicate_parts(pplan, width_m), frames.exact)
        return plans[width_m][:2]

    def pairs_at(width_m: float) -> tuple[list[NeighbourPair], list[str]]:
        pplan = plan_at(width_m)[0]
        ids = [f"submodel-{i:03d}" for i in range(pplan.k)]
        assert pplan.core_areas is not None
        judge = needs or AlignmentNeeds.of(MergeOptions())
        assert judge is not None
        return neighbour_pairs(x, y, pplan.members, pplan.core_areas, ids, half_fp, judge), ids

    decision, pairs = settle_overlap(pairs_at, asked_m, given=given, needs=needs)
    if decision.refusal is not None:
        raise PlanningError(f"{source}: {decision.refusal}")
    pplan, warnings = plan_at(decision.split_overlap_m, own_frame=True)
    warnings = ([decision.note] if decision.note else []) + warnings
    for text in warnings:
        logger.warning("%s", text)
    return decision, pairs, pplan, warnings


def _asked_overlap_m(split_overlap_m: float | None) -> float:
    """The overlap asked for, metres (the default when None).

    Raises:
        PlanningError: negative or not finite.
    """
    asked_m = DEFAULT_SPLIT_OVERLAP_M if split_overlap_m is None else float(split_overlap_m)
    if not (asked_m >= 0 and math.isfinite(asked_m)):
        raise PlanningError(f"split_overlap_m must be finite and >= 0, got {split_overlap_m}")
    return asked_m


def _with_checks(
    plan: SplitPlan,
    images: list[ImageRecord],
    x: NDArray[np.float64],
    y: NDArray[np.float64],
    warnings: list[str],
    pairs: list[NeighbourPair],
    widened_from_m: float | None,
    survey_source: str,
) -> SplitPlan:
    """``plan`` with its GPS checks, warnings, neighbour pairs and fingerprint filled in; its
    camera altitudes corrected where the GPS altitude is unreliable
    (:func:`~prefect_odm.plan.altitudes.altitude_correction`).

    Raises:
        PlanningError: a split into submodels too small for structure from motion.
    """
    if refusal := small_block_refusal(plan.submodels, plan.options.pipeline):
        raise PlanningError(f"{survey_source}: {refusal}")
    gps, lines = gps_warnings([(im.name, im) for im in images], x, y)
    correction = altitude_correction(images, gps)
    if correction is not None:
        plan = with_altitudes(plan, images, correction[1])
        lines.append(correction[0].message)
        logger.warning("%s", correction[0].message)
    extra = {
        "warnings": warnings + lines,
        "gps_warnings": gps,
        "neighbours": pairs,
        "split_overlap_asked_m": widened_from_m,
        "altitude_correction": None if correction is None else correction[0],
    }
    return plan.model_copy(update={"fingerprint": plan_fingerprint(plan, images), **extra})


def plan_split(
    survey: Survey,
    *,
    split: int | Literal["auto"] = DEFAULT_SPLIT,
    split_overlap_m: float | None = None,
    min_submodel_images: int | None = None,
    options: ProcessingOptions | None = None,
    engine_identity: str = "unknown",
    node_memory_gib: Sequence[float] = (),
    memory_model: MemoryModel | None = None,
    merge_options: MergeOptions | None = None,
) -> SplitPlan:
    """Partition a scanned survey into submodels.

    Args:
        survey: the scanned survey (accepted images only are planned).
        split: average core images per submodel, or ``"auto"`` to choose it from the memory model
            and the largest of ``node_memory_gib``.
        split_overlap_m: overlap width in metres; every camera within it of a submodel's core area
            is processed by that submodel too. None (not set by the operator): the default
            (:data:`~prefect_odm.settings.DEFAULT_SPLIT_OVERLAP_M`), widened by the planner until
            the alignment can tie every pair of neighbours
            (:func:`~prefect_odm.plan.neighbours.settle_overlap`).
        min_submodel_images: smallest submodel (default ``max(5, split // 4)``).
        options: processing options (fingerprints, memory estimate).
        engine_identity: engine name/version, part of each submodel fingerprint.
        node_memory_gib: memory of each available node, GiB; when given, a submodel whose
            estimated peak exceeds every node is an error.
        memory_model: memory anchor table (default ``"builtin"`` when ``engine_identity`` starts
            with one of :data:`BUILTIN_ENGINE_PREFIXES`, else ``"odm"``).
        merge_options: the merge the run will make: what ties a pair of neighbours (defaults).

    Returns:
        The :class:`~prefect_odm.models.SplitPlan` in ``survey.crs_epsg``; identical (byte for
        byte as JSON) for shuffled input; with :func:`~prefect_odm.plan.checks.gps_warnings`
        and the figures of every pair of neighbours (``neighbours``).

    Raises:
        PlanningError: no images, a bad ``split``, ``"auto"`` without node memory, a submodel
            larger than any node, or (``split_overlap_m`` set) a submodel the merge's alignment
            could not tie to any neighbour: one line naming the pair and the overlap needed; a
            submodel too small for structure from motion (:func:`.checks.small_block_refusal`).
    """
    options = options or ProcessingOptions.model_validate({})
    given = split_overlap_m is not None
    asked_m = _asked_overlap_m(split_overlap_m)
    memory_model = memory_model_for(engine_identity) if memory_model is None else memory_model
    images = sorted(survey.images, key=lambda im: (im.identity, im.name))
    if not images:
        raise PlanningError(f"{survey.source}: no accepted image to plan")
    x, y = _positions(images, survey.crs_epsg)
    megapixels = float(np.mean([im.width * im.height / 1e6 for im in images]))
    split_n = _split_size(split, options, node_memory_gib, megapixels, asked_m, memory_model)
    min_size = (
        default_min_submodel_images(split_n)
        if min_submodel_images is None
        else int(min_submodel_images)
    )
    half_fp = _half_footprint(images)
    decision, pairs, pplan, warnings = _settled_plan(
        x, y, split_n, min_size, half_fp, AlignmentNeeds.of(merge_options), asked_m,
        given=given, source=survey.source,
    )  # fmt: skip
    ids = [f"submodel-{i:03d}" for i in range(pplan.k)]
    submodels = submodel_records(
        images, x, y, pplan, ids, half_fp, options, engine_identity, node_memory_gib, memory_model
    )
    plan = SplitPlan(
        survey_fingerprint=survey.fingerprint,
        crs_epsg=survey.crs_epsg,
        split=split_n,
        split_overlap_m=float(decision.split_overlap_m),
        min_submodel_images=min_size,
        options=options,
        engine_identity=engine_identity,
        submodels=submodels,
        cameras=camera_positions(images, x, y, pplan.labels, ids),
        fingerprint="",
    )
    return _with_checks(plan, images, x, y, warnings, pairs, decision.widened_from_m, survey.source)
