"""One triangulation for the widths the overlap widening tries (issue 33): the search may share
a frame between clips, the plan kept is the plan of its width."""

from __future__ import annotations

import numpy as np
import shapely
from plan_surveys import grid_survey

from prefect_odm.align.report import AlignmentOptions
from prefect_odm.models import MergeOptions
from prefect_odm.plan.core_areas import FrameCache, core_areas, multipoint, overlap_members
from prefect_odm.plan.planning import plan_split

CAMERAS_ONLY = MergeOptions(alignment=AlignmentOptions(refine_from_products=False))


def _positions(seed: int = 3) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.round(rng.uniform(0.0, 800.0, (600, 2)), 3)


def test_a_shared_frame_gives_the_same_cells_and_members() -> None:
    """A frame built for a 50 m clip serves a 100 m one: same core areas (up to floating point)
    and exactly the same members as with the 100 m clip's own frame."""
    xy = _positions()
    labels = (xy[:, 0] // 200).astype(np.int32) * 4 + (xy[:, 1] // 200).astype(np.int32)
    hull = multipoint(xy).convex_hull
    narrow, wide = shapely.buffer(hull, 50.0), shapely.buffer(hull, 100.0)
    shared = FrameCache(share_ring=True)
    shared.get(xy, narrow)
    frame = shared.get(xy, wide)
    assert not shared.exact and frame.closes(wide)
    own = FrameCache().get(xy, wide)
    a = core_areas(xy, labels, 16, wide, frame)
    b = core_areas(xy, labels, 16, wide, own)
    for pa, pb in zip(a, b, strict=True):
        assert shapely.symmetric_difference(pa, pb).area < 1e-6 * pb.area
    for width in (20.0, 55.0):
        ma = overlap_members(xy, labels, a, width, frame)
        mb = overlap_members(xy, labels, b, width, own)
        assert all(np.array_equal(x, y) for x, y in zip(ma, mb, strict=True))


def test_a_frame_does_not_close_a_far_larger_clip() -> None:
    """A ring made for a small clip does not claim to close one many times larger (it is rebuilt)."""
    xy = _positions()
    hull = multipoint(xy).convex_hull
    cache = FrameCache(share_ring=True)
    small = cache.get(xy, shapely.buffer(hull, 1.0))
    huge = shapely.buffer(hull, 5000.0)
    assert not small.closes(huge)
    again = cache.get(xy, huge)
    assert cache.exact and again is not small and again.closes(huge)


def test_the_widened_plan_is_the_plan_of_its_width() -> None:
    """Low flights (small footprint: the clip buffer follows the width) widened from 50 m: the
    plan kept equals the plan asked for at that width, submodels and cameras alike."""
    low = grid_survey(10, 12, line_spacing_m=80.0, shot_spacing_m=60.0, height_m=25.0)
    widened = plan_split(low, split=12, merge_options=CAMERAS_ONLY)
    assert widened.split_overlap_asked_m == 50.0 and widened.split_overlap_m > 50.0
    given = plan_split(
        low, split=12, split_overlap_m=widened.split_overlap_m, merge_options=CAMERAS_ONLY
    )
    assert widened.submodels == given.submodels and widened.cameras == given.cameras
    assert widened.neighbours == given.neighbours and widened.fingerprint == given.fingerprint
