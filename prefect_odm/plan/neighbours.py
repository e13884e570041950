"""What the alignment will have to tie each pair of neighbouring submodels with (pure core).

The merge's alignment gates (:func:`prefect_odm.align.check_report`) refuse a run in which a
submodel is tied to no neighbour: a pair is tied by its cameras when it shares at least
``AlignmentOptions.min_shared_cameras`` images (:func:`prefect_odm.align.align_submodels`), or by
the refinement from the DSMs and orthophotos (``refine_from_products``) when their DSMs overlap
on at least that many samples. Both can be seen in the plan, before any compute:

* **shared images**: the images both submodels process (core of one, overlap of the other);
* **footprint overlap**: the area where the two submodels' ground footprints (their cameras'
  hull buffered by half an image footprint, ``Submodel.footprint``) overlap. It bounds the DSMs'
  common area from above (structure from motion reconstructs less than the footprint, the
  ``direct`` pipeline exactly the ground the cameras see), so a pair whose footprints do not
  overlap cannot be tied by its products, and one whose footprints do is never refused here.

:func:`neighbour_pairs` measures every pair whose core areas share a boundary (the merge's
seams); :func:`settle_overlap` then keeps the asked overlap, widens it (when the operator did not
set it), or refuses the split in one line naming the pair and the overlap needed (when the
operator did). The thresholds are the alignment's own (:class:`AlignmentNeeds.of`), so the plan
never refuses what the merge would accept. Issue 30: brighton at ``--split 6 --split-overlap-m
10`` shares 2-3 images per pair and is tied by its products; a 600-image grid flown 36 x 27 m
apart at 10 m shares none.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import shapely
from numpy.typing import NDArray
from shapely.geometry.base import BaseGeometry

from prefect_odm.align.report import AlignmentOptions
from prefect_odm.models import MergeOptions, NeighbourPair
from prefect_odm.plan.core_areas import camera_hulls

#: Coarsest DSM cell either engine writes, metres: a footprint overlap of
#: ``min_shared_cameras`` such cells gives the refinement that many DSM samples.
MAX_DSM_CELL_M = 1.0
#: Step by which the planner widens the split overlap, metres.
OVERLAP_STEP_M = 5.0
#: Widest split overlap the planner tries, metres (then it refuses and asks for a larger split).
MAX_SPLIT_OVERLAP_M = 200.0
#: Steps without a newly tied pair after which the planner stops widening an overlap that the
#: merge would already accept (every submodel tied): a gap no overlap bridges costs 3 plans, not 30.
WIDEN_PATIENCE_STEPS = 3
#: Shortest shared boundary (metres) that makes two core areas neighbours (not a corner).
MIN_BORDER_M = 1e-3


@dataclass(frozen=True)
class AlignmentNeeds:
    """What the merge's alignment needs to tie a pair of neighbours.

    Attributes:
        min_shared_images: fewest shared images the camera step ties a pair with
            (``AlignmentOptions.min_shared_cameras``).
        by_products: the refinement from DSMs and orthophotos runs
            (``AlignmentOptions.refine_from_products``), so overlapping products tie a pair.
    """

    min_shared_images: int
    by_products: bool

    @property
    def min_footprint_overlap_m2(self) -> float:
        """Footprint overlap giving the refinement ``min_shared_images`` DSM samples, m^2."""
        return self.min_shared_images * MAX_DSM_CELL_M**2

    @classmethod
    def of(cls, merge: MergeOptions | None) -> AlignmentNeeds | None:
        """The needs of a merge with ``merge`` (defaults when None); None when nothing can be
        refused: the alignment is off, or its failures are accepted up front
        (``accept_alignment``)."""
        merge = merge or MergeOptions()
        if not merge.align or merge.accept_alignment:
            return None
        alignment: AlignmentOptions = merge.alignment
        return cls(alignment.min_shared_cameras, alignment.refine_from_products)

    def tied_by(self, shared_images: int, footprint_overlap_m2: float) -> str:
        """``"cameras"``, ``"products"`` or ``"none"``: what ties a pair with these figures."""
        if shared_images >= self.min_shared_images:
            return "cameras"
        if self.by_products and footprint_overlap_m2 >= self.min_footprint_overlap_m2:
            return "products"
        return "none"


def _footprints(
    xy: NDArray[np.float64], members: Sequence[NDArray[np.intp]], half_footprint_m: float
) -> list[BaseGeometry]:
    """Each part's ground footprint: its cameras' hull buffered by ``half_footprint_m``."""
    footprints: list[BaseGeometry] = shapely.buffer(
        camera_hulls(xy, members), half_footprint_m, quad_segs=8
    ).tolist()
    return footprints


def neighbour_pairs(
    x_m: NDArray[np.float64],
    y_m: NDArray[np.float64],
    members: Sequence[NDArray[np.intp]],
    core_areas: Sequence[BaseGeometry],
    ids: Sequence[str],
    half_footprint_m: float,
    needs: AlignmentNeeds,
) -> list[NeighbourPair]:
    """Every pair of submodels whose core areas share a boundary, with its figures.

    Args:
        x_m, y_m: camera positions, plan CRS metres, shape ``(n,)``.
        members: per submodel, the indices of the cameras it processes (core plus overlap).
        core_areas: per submodel, its core area in the plan CRS.
        ids: per submodel, its id.
        half_footprint_m: half an image's ground footprint, metres.
        needs: the alignment's thresholds (what ties a pair).

    Returns:
        The pairs sorted by ids, ``first < second``; footprint overlaps rounded to 0.01 m^2.
    """
    xy = np.column_stack([np.asarray(x_m, np.float64), np.asarray(y_m, np.float64)])
    footprints = _footprints(xy, members, half_footprint_m)
    tree = shapely.STRtree(list(core_areas))
    left, right = tree.query(list(core_areas), predicate="intersects")
    out: list[NeighbourPair] = []
    for a, b in zip(left.tolist(), right.tolist(), strict=True):
        if a >= b:
            continue
        border = shapely.intersection(core_areas[a], core_areas[b])
        if border.length < MIN_BORDER_M and border.area <= 0:
            continue
        shared = len(np.intersect1d(members[a], members[b], assume_unique=True))
        area = round(float(shapely.intersection(footprints[a], footprints[b]).area), 2)
        first, second = sorted((ids[a], ids[b]))
        tied = needs.tied_by(shared, area)
        out.append(NeighbourPair.model_validate(
            {"first": first, "second": second, "shared_images": shared,
             "footprint_overlap_m2": area, "tied_by": tied}
        ))  # fmt: skip
    out.sort(key=lambda p: (p.first, p.second))
    return out


def untied_submodels(pairs: Sequence[NeighbourPair], ids: Sequence[str]) -> list[str]:
    """The submodels no pair ties to the block (what the merge's ``min_overlaps`` gate refuses);
    empty for a single submodel."""
    if len(ids) < 2:
        return []
    tied = {sid for p in pairs if p.tied_by != "none" for sid in (p.first, p.second)}
    return [sid for sid in ids if sid not in tied]


@dataclass(frozen=True)
class OverlapDecision:
    """The split overlap the plan uses, and why.

    Attributes:
        split_overlap_m: the overlap to plan with, metres.
        widened_from_m: the asked overlap when the planner widened it, else None.
        note: one line saying it widened the overlap, or None.
        refusal: one line refusing the split (naming the pair and the overlap needed), or None.
    """

    split_overlap_m: float
    widened_from_m: float | None = None
    note: str | None = None
    refusal: str | None = None


PairsAt = Callable[[float], tuple[list[NeighbourPair], list[str]]]
"""``split_overlap_m -> (neighbour pairs, submodel ids)`` of the plan with that overlap."""


def _images(n: int) -> str:
    return f"{n} image{'' if n == 1 else 's'}"


def _what(needs: AlignmentNeeds) -> str:
    """What ties a pair, in words: ``"3"`` or ``"3 (or overlapping products)"``."""
    return f"{needs.min_shared_images}" + (
        " (or overlapping products)" if needs.by_products else ""
    )


def _weakest(pairs: Sequence[NeighbourPair], sid: str) -> NeighbourPair | None:
    """The untied submodel's best pair (most shared images, then most footprint overlap)."""
    mine = [p for p in pairs if sid in (p.first, p.second)]
    return max(mine, key=lambda p: (p.shared_images, p.footprint_overlap_m2), default=None)


def _refusal(
    pairs: Sequence[NeighbourPair], sid: str, needs: AlignmentNeeds, needed_m: float | None
) -> str:
    pair = _weakest(pairs, sid)
    what = _what(needs)
    if pair is None:
        head = f"{sid} has no neighbouring submodel"
    else:
        head = f"{pair.first} / {pair.second} share {_images(pair.shared_images)}"
    way = (
        f"use --split-overlap-m {needed_m:g} or more"
        if needed_m is not None
        else f"no split overlap up to {MAX_SPLIT_OVERLAP_M:g} m ties it: use a larger --split"
    )
    return f"{head}; the alignment needs {what}: {way}"


def _untied_pairs(pairs: Sequence[NeighbourPair], ids: Sequence[str]) -> int:
    """How many pairs of neighbours nothing ties."""
    return sum(p.tied_by == "none" for p in pairs)


def _first_overlap(
    pairs_at: PairsAt,
    start_m: float,
    unmet: Callable[[list[NeighbourPair], list[str]], int],
    patience: int | None = None,
    start_unmet: float = math.inf,
) -> tuple[float, list[NeighbourPair]] | None:
    """The first overlap above ``start_m`` on the :data:`OVERLAP_STEP_M` grid (up to
    :data:`MAX_SPLIT_OVERLAP_M`) whose plan leaves ``unmet`` at zero, with its pairs; None:
    none, or ``patience`` steps in a row without an ``unmet`` below ``start_unmet`` and every
    earlier step's (when given)."""
    step = math.floor(start_m / OVERLAP_STEP_M) + 1
    best, stale = start_unmet, 0
    while step * OVERLAP_STEP_M <= MAX_SPLIT_OVERLAP_M:
        width = step * OVERLAP_STEP_M
        pairs, ids = pairs_at(width)
        count = unmet(pairs, ids)
        if count == 0:
            return width, pairs
        best, stale = (count, 0) if count < best else (best, stale + 1)
        if patience is not None and stale >= patience:
            return None
        step += 1
    return None


def settle_overlap(
    pairs_at: PairsAt,
    split_overlap_m: float,
    *,
    given: bool,
    needs: AlignmentNeeds | None,
) -> tuple[OverlapDecision, list[NeighbourPair]]:
    """Keep, widen or refuse the split overlap so that the merge can align every submodel.

    Args:
        pairs_at: the plan's neighbour pairs and ids at a given overlap (:data:`PairsAt`).
        split_overlap_m: the overlap asked for (or the default), metres.
        given: the operator set it (``--split-overlap-m``): then it is kept, or the split is
            refused when a submodel could not be aligned; else the planner widens it by
            :data:`OVERLAP_STEP_M` (up to :data:`MAX_SPLIT_OVERLAP_M`) until every pair of
            neighbours is tied (giving up after :data:`WIDEN_PATIENCE_STEPS` steps without
            progress when every submodel is tied already), or at least every submodel (what
            the gates judge).
        needs: the alignment's thresholds; None (alignment off or accepted up front): kept.

    Returns:
        The decision and the neighbour pairs of the overlap it keeps.
    """
    pairs, ids = pairs_at(split_overlap_m)
    if needs is None or len(ids) < 2:
        return OverlapDecision(split_overlap_m), pairs
    untied = untied_submodels(pairs, ids)
    every_pair = all(p.tied_by != "none" for p in pairs)
    if not untied and (given or every_pair):
        return OverlapDecision(split_overlap_m), pairs

    def untied_count(p: list[NeighbourPair], i: list[str]) -> int:
        return len(untied_submodels(p, i))

    if not given:
        # Every pair tied, for every seam; when the merge would already accept the split, the
        # search stops after WIDEN_PATIENCE_STEPS steps that tie no more pairs (a gap in the
        # survey that no overlap bridges).
        patience = None if untied else WIDEN_PATIENCE_STEPS
        now = _untied_pairs(pairs, ids)
        found = _first_overlap(pairs_at, split_overlap_m, _untied_pairs, patience, now)
        goal = "every pair of neighbouring submodels"
        if found is None and untied:
            found = _first_overlap(pairs_at, split_overlap_m, untied_count)
            goal = "every submodel to a neighbour"
        if found is not None:
            width, wider = found
            note = (
                f"split overlap widened from {split_overlap_m:g} m to {width:g} m so that the "
                f"alignment can tie {goal} (it needs {needs.min_shared_images} shared images"
                f"{' or overlapping products' if needs.by_products else ''})"
            )
            return OverlapDecision(width, split_overlap_m, note), wider
        if not untied:
            return OverlapDecision(split_overlap_m), pairs
        refusal = _refusal(pairs, untied[0], needs, None)
        return OverlapDecision(split_overlap_m, refusal=refusal), pairs
    needed = _first_overlap(pairs_at, split_overlap_m, untied_count)
    refusal = _refusal(pairs, untied[0], needs, None if needed is None else needed[0])
    return OverlapDecision(split_overlap_m, refusal=refusal), pairs
