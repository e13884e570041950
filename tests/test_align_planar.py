"""A similarity in the plane per submodel closes a loop of overlaps that shifts alone cannot
(issue 30: brighton ``--split 6 --split-overlap-m 10``, whose three overlaps' offsets did not
sum to zero), and it composes with the height refinement into one correction."""

from __future__ import annotations

import numpy as np
import pytest

from prefect_odm.align import AlignmentOptions, DemOverlap, align_heights
from prefect_odm.align.height_tilt import after_shifts
from prefect_odm.align.planar import HorizontalOffsets, align_horizontal

IDS = ["submodel-000", "submodel-001", "submodel-002"]
# three 120 m submodels about a common middle, each overlapping both others (a loop)
CENTRES = np.array([[500_040.0, 4_000_040.0], [500_080.0, 4_000_040.0], [500_060.0, 4_000_075.0]])
# each submodel's error in the plane: shift (m), turn (deg), scale change
ERRORS = [((0.3, -0.2), 0.4, 0.010), ((-0.1, 0.25), -0.3, -0.012), ((0.05, 0.1), 0.2, 0.004)]


def _error(i: int, xy: np.ndarray) -> np.ndarray:
    """Where submodel ``i``'s products put ground points ``xy`` ``(n, 2)``."""
    (tx, ty), turn_deg, ds = ERRORS[i]
    a = np.radians(turn_deg)
    m = (1.0 + ds) * np.array([[np.cos(a), -np.sin(a)], [np.sin(a), np.cos(a)]])
    out: np.ndarray = CENTRES[i] + (tx, ty) + (xy - CENTRES[i]) @ m.T
    return out


def _loop(rng: np.random.Generator, noise_m: float) -> tuple[list[HorizontalOffsets], dict]:
    """Features in each pairwise overlap (a 40 m square between the two centres) as each
    submodel shows them; returns the offsets and the ground points per overlap."""
    offsets, ground = [], {}
    for i, j in ((0, 1), (0, 2), (1, 2)):
        mid = (CENTRES[i] + CENTRES[j]) / 2
        xy = mid + rng.uniform(-20.0, 20.0, (150, 2))
        first, second = _error(i, xy), _error(j, xy)
        dxy = second - first + rng.normal(0.0, noise_m, first.shape)
        offsets.append(HorizontalOffsets(IDS[i], IDS[j], first, dxy))
        ground[(i, j)] = xy
    return offsets, ground


def _seams(result, ground: dict) -> list[float]:  # type: ignore[no-untyped-def]
    """Per overlap, the length of the median offset left between the corrected products."""
    out = []
    for (i, j), xy in ground.items():
        a = result.transform(IDS[i]).apply_points(np.c_[_error(i, xy), np.zeros(len(xy))])
        b = result.transform(IDS[j]).apply_points(np.c_[_error(j, xy), np.zeros(len(xy))])
        out.append(float(np.hypot(*np.median(b[:, :2] - a[:, :2], axis=0))))
    return out


def test_turn_and_scale_close_the_loop_shifts_alone_cannot() -> None:
    offsets, ground = _loop(np.random.default_rng(3), noise_m=0.1)
    # shifts alone, as the refinement solved them before: one offset per overlap
    shifts_only = align_heights(IDS, CENTRES, [
        DemOverlap(o.first, o.second, o.xy[:, 0], o.xy[:, 1], np.zeros(len(o.xy)),
                   np.tile(np.median(o.dxy, axis=0), (len(o.xy), 1)))
        for o in offsets
    ])  # fmt: skip
    # the loop's offsets do not sum to zero: a shift alone leaves a seam
    assert max(_seams(shifts_only, ground)) > 0.15
    result = align_horizontal(IDS, CENTRES, offsets)
    assert max(_seams(result, ground)) < 0.04  # 0.1 m noise per offset: 0.01 m per median
    # the relative turns and scales are recovered (the block's mean is the gauge's)
    turns = [np.degrees(np.arctan2(t.horizontal[2], t.horizontal[0])) for t in result.transforms]
    scales = [t.scale_change for t in result.transforms]
    for k in (1, 2):
        assert turns[k] - turns[0] == pytest.approx(-(ERRORS[k][1] - ERRORS[0][1]), abs=0.02)
        assert scales[k] - scales[0] == pytest.approx(-(ERRORS[k][2] - ERRORS[0][2]), abs=1e-3)
    # the gauge: every submodel has 300 offsets, so the plain mean scale is held (to w^2 / 2)
    assert abs(np.mean(scales)) < 1e-4
    assert all(o.rms_after_m < 0.2 < o.rms_before_m for o in result.overlaps)


def test_a_wrong_offset_is_left_out() -> None:
    offsets, ground = _loop(np.random.default_rng(5), noise_m=0.05)
    bad = offsets[0].dxy.copy()
    bad[:10] += 8.0  # ten wrong matches, 8 m off
    offsets[0] = HorizontalOffsets(offsets[0].first, offsets[0].second, offsets[0].xy, bad)
    result = align_horizontal(IDS, CENTRES, offsets)
    assert max(_seams(result, ground)) < 0.02
    assert result.overlaps[0].n_used <= len(bad) - 10


def test_the_plane_step_and_the_heights_compose_into_one_correction() -> None:
    offsets, _ = _loop(np.random.default_rng(7), noise_m=0.05)
    first = align_horizontal(IDS, CENTRES, offsets)
    # heights solved on the products so moved: a plane and a bowl per submodel
    rng = np.random.default_rng(8)
    overlaps = []
    for i, j in ((0, 1), (0, 2), (1, 2)):
        xy = (CENTRES[i] + CENTRES[j]) / 2 + rng.uniform(-20.0, 20.0, (200, 2))
        dz = 0.3 * (j - i) + 0.002 * (xy[:, 0] - 500_060.0) + rng.normal(0.0, 0.02, 200)
        overlaps.append(DemOverlap(IDS[i], IDS[j], xy[:, 0], xy[:, 1], dz))
    second = align_heights(IDS, CENTRES, overlaps)
    both = after_shifts(first, second)
    pts = np.c_[CENTRES[0] + rng.uniform(-60.0, 60.0, (50, 2)), rng.uniform(0.0, 30.0, 50)]
    for sid in IDS:
        one = both.transform(sid)
        steps = second.transform(sid).apply_points(first.transform(sid).apply_points(pts))
        np.testing.assert_allclose(one.apply_points(pts), steps, atol=1e-6)
        # the raster form moves every cell as the points move
        fix = one.raster_correction(0.0)
        (a, b, c), (d, e, f) = fix.affine
        np.testing.assert_allclose(a * pts[:, 0] + b * pts[:, 1] + c, steps[:, 0], atol=1e-6)
        np.testing.assert_allclose(d * pts[:, 0] + e * pts[:, 1] + f, steps[:, 1], atol=1e-6)
        z = fix.corrected_heights(pts[:, 0], pts[:, 1], pts[:, 2])
        np.testing.assert_allclose(z, steps[:, 2], atol=1e-6)


def test_no_offsets_is_the_identity() -> None:
    result = align_horizontal(IDS, CENTRES, [], AlignmentOptions())
    assert all(t.max_correction_m == 0.0 and t.scale_change == 0.0 for t in result.transforms)
    assert result.overlaps == []


def test_the_correction_gates_of_a_candidate_stage_are_named() -> None:
    from prefect_odm.align.stages import correction_failures

    offsets, _ = _loop(np.random.default_rng(11), noise_m=0.02)
    small = align_horizontal(IDS, CENTRES, offsets)
    assert correction_failures([small], AlignmentOptions()) == []
    # the same solve judged against a 0.5 % scale gate: the 1-2 % relative scales fail it
    tight = AlignmentOptions(max_scale_change=0.005)
    failed = correction_failures([small], tight)
    assert failed and {f.figure for f in failed} == {"max_scale_change"}
    assert {f.subject for f in failed} <= set(IDS)
