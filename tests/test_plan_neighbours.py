"""Issue 30 item 2: the plan decides what the merge's alignment would refuse.

Each pair of neighbouring submodels is measured (shared images, footprint overlap); a split the
alignment could not tie is refused at the plan when the operator set the overlap, or the overlap
is widened when they did not. The figures are checked against the plan's own submodels, the
outcomes against the alignment's own thresholds (``AlignmentOptions``).
"""

from __future__ import annotations

import random
import re
from pathlib import Path

import numpy as np
import pytest
import shapely
from plan_surveys import grid_survey
from shapely.geometry import shape

from prefect_odm.align.report import AlignmentOptions
from prefect_odm.errors import PlanningError
from prefect_odm.models import MergeOptions, NeighbourPair, ProcessingOptions, SplitPlan, Survey
from prefect_odm.plan.checks import MIN_SFM_SUBMODEL_IMAGES
from prefect_odm.plan.neighbours import (
    MAX_SPLIT_OVERLAP_M,
    OVERLAP_STEP_M,
    WIDEN_PATIENCE_STEPS,
    AlignmentNeeds,
    OverlapDecision,
    settle_overlap,
    untied_submodels,
)
from prefect_odm.plan.planning import plan_split
from prefect_odm.survey.layouts import layout_survey, read_layout
from prefect_odm.survey.scan import scan_images

CAMERAS_ONLY = MergeOptions(alignment=AlignmentOptions(refine_from_products=False))
NEEDED = re.compile(r"use --split-overlap-m (\d+(?:\.\d+)?) or more")


def check_figures(plan: SplitPlan) -> None:
    """Every recorded pair's figures, recomputed from the plan's submodels, and its verdict
    from the alignment's default thresholds."""
    min_shared = AlignmentOptions().min_shared_cameras
    by_id = {sm.id: sm for sm in plan.submodels}
    assert [(p.first, p.second) for p in plan.neighbours] == sorted(
        {(p.first, p.second) for p in plan.neighbours}
    )
    for p in plan.neighbours:
        a, b = by_id[p.first], by_id[p.second]
        assert p.first < p.second
        assert p.shared_images == len(set(a.image_names) & set(b.image_names))
        # Neighbours: their core areas share a boundary, not just a corner.
        border = shapely.intersection(shape(a.core_area), shape(b.core_area))
        assert border.length > 0.1
        overlap = shapely.intersection(shape(a.footprint), shape(b.footprint)).area
        assert p.footprint_overlap_m2 == pytest.approx(overlap, rel=0.02, abs=5.0)
        if p.shared_images >= min_shared:
            assert p.tied_by == "cameras"


def needed_overlap(error: PlanningError) -> float:
    found = NEEDED.search(str(error))
    assert found, str(error)
    return float(found.group(1))


# ----------------------------------------------------------------------------- the rule


def _pairs(shared: list[int]) -> list[NeighbourPair]:
    """A chain submodel-000 - 001 - 002 ... with these shared images and no product overlap."""
    return [
        NeighbourPair(
            first=f"submodel-{i:03d}",
            second=f"submodel-{i + 1:03d}",
            shared_images=s,
            footprint_overlap_m2=0.0,
            tied_by="cameras" if s >= 3 else "none",
        )  # fmt: skip
        for i, s in enumerate(shared)
    ]


def test_settle_keeps_refuses_or_widens_on_a_chain() -> None:
    needs = AlignmentNeeds(3, by_products=False)
    ids = [f"submodel-{i:03d}" for i in range(3)]

    def pairs_at(width_m: float) -> tuple[list[NeighbourPair], list[str]]:
        # Shared images grow with the overlap: 1 per 10 m on the first seam, 1 per 5 m on the second.
        return _pairs([int(width_m // 10), int(width_m // 5)]), ids

    kept, _ = settle_overlap(pairs_at, 30.0, given=True, needs=needs)
    assert kept.refusal is None and kept.split_overlap_m == 30.0
    refused, _ = settle_overlap(pairs_at, 10.0, given=True, needs=needs)
    assert refused.refusal == (
        "submodel-000 / submodel-001 share 1 image; the alignment needs 3: "
        "use --split-overlap-m 30 or more"
    )
    widened, pairs = settle_overlap(pairs_at, 10.0, given=False, needs=needs)
    assert widened.refusal is None
    assert (widened.split_overlap_m, widened.widened_from_m) == (30.0, 10.0)
    assert widened.note is not None and "widened from 10 m to 30 m" in widened.note
    assert all(p.tied_by == "cameras" for p in pairs)
    # Nothing is refused where the merge would not judge the alignment.
    off, _ = settle_overlap(pairs_at, 10.0, given=True, needs=None)
    assert off.refusal is None and off.split_overlap_m == 10.0


def test_settle_asks_for_a_larger_split_when_no_overlap_ties() -> None:
    needs = AlignmentNeeds(3, by_products=True)
    ids = ["submodel-000", "submodel-001"]
    calls: list[float] = []

    def pairs_at(width_m: float) -> tuple[list[NeighbourPair], list[str]]:
        calls.append(width_m)
        return _pairs([0]), ids

    decision, _ = settle_overlap(pairs_at, 50.0, given=False, needs=needs)
    assert decision.refusal is not None
    assert decision.refusal.startswith("submodel-000 / submodel-001 share 0 images")
    assert "(or overlapping products)" in decision.refusal
    assert f"no split overlap up to {MAX_SPLIT_OVERLAP_M:g} m" in decision.refusal
    assert max(calls) == MAX_SPLIT_OVERLAP_M  # bounded


def test_widening_gives_up_on_a_gap_the_merge_accepts() -> None:
    """Every submodel tied, one pair never (a gap no overlap bridges): the planner stops after
    WIDEN_PATIENCE_STEPS steps without a newly tied pair and keeps the asked overlap."""
    needs = AlignmentNeeds(3, by_products=False)
    ids = ["submodel-000", "submodel-001", "submodel-002"]
    gap = NeighbourPair(
        first="submodel-000", second="submodel-002", shared_images=0,
        footprint_overlap_m2=0.0, tied_by="none",
    )  # fmt: skip
    calls: list[float] = []

    def pairs_at(width_m: float) -> tuple[list[NeighbourPair], list[str]]:
        calls.append(width_m)
        return [*_pairs([5, 5]), gap], ids

    decision, _ = settle_overlap(pairs_at, 50.0, given=False, needs=needs)
    assert decision == OverlapDecision(50.0)
    assert calls == [50.0, 55.0, 60.0, 65.0][: 1 + WIDEN_PATIENCE_STEPS]


def test_untied_is_the_gates_rule() -> None:
    pairs = _pairs([5, 0])  # 000-001 tied, 001-002 not: 002 has no tie
    ids = ["submodel-000", "submodel-001", "submodel-002"]
    assert untied_submodels(pairs, ids) == ["submodel-002"]
    assert untied_submodels([], ["submodel-000"]) == []


def test_needs_come_from_the_merge_options() -> None:
    assert AlignmentNeeds.of(None) == AlignmentNeeds(3, True)
    assert AlignmentNeeds.of(CAMERAS_ONLY) == AlignmentNeeds(3, False)
    five = MergeOptions(alignment=AlignmentOptions(min_shared_cameras=5))
    assert AlignmentNeeds.of(five) == AlignmentNeeds(5, True)
    assert AlignmentNeeds.of(MergeOptions(align=False)) is None
    assert AlignmentNeeds.of(MergeOptions(accept_alignment=True)) is None


# ----------------------------------------------------------------------------- the grid survey


@pytest.fixture(scope="module")
def grid() -> Survey:
    return grid_survey()


def test_grid_at_10_m_is_tied_by_its_products(grid: Survey) -> None:
    """600 images 36 x 27 m apart, --split 25 --split-overlap-m 10: no camera is within 10 m of
    a neighbour's core area, but the 150 m footprints overlap, so the refinement from the DSMs
    and orthophotos ties every pair (what ``check_report`` judges): not refused."""
    plan = plan_split(grid, split=25, split_overlap_m=10)
    assert len(plan.submodels) == 24 and plan.split_overlap_m == 10
    check_figures(plan)
    assert plan.neighbours and all(p.tied_by == "products" for p in plan.neighbours)
    assert max(p.shared_images for p in plan.neighbours) < 3
    assert min(p.footprint_overlap_m2 for p in plan.neighbours) > 1000.0


def test_grid_at_10_m_is_refused_when_only_cameras_tie(grid: Survey) -> None:
    """Without the refinement from products, the camera step alone must tie each submodel:
    refused naming the pair and the overlap needed; that overlap plans, one step less not."""
    with pytest.raises(PlanningError) as caught:
        plan_split(grid, split=25, split_overlap_m=10, merge_options=CAMERAS_ONLY)
    text = str(caught.value)
    assert "\n" not in text
    assert re.search(
        r"submodel-\d{3} / submodel-\d{3} share \d+ images?; the alignment needs 3", text
    )
    needed = needed_overlap(caught.value)
    assert needed > 10
    plan = plan_split(grid, split=25, split_overlap_m=needed, merge_options=CAMERAS_ONLY)
    check_figures(plan)
    assert not untied_submodels(plan.neighbours, [sm.id for sm in plan.submodels])
    if needed - OVERLAP_STEP_M > 10:
        with pytest.raises(PlanningError):
            plan_split(
                grid, split=25, split_overlap_m=needed - OVERLAP_STEP_M, merge_options=CAMERAS_ONLY
            )


def test_grid_overlap_not_given_is_widened_when_only_cameras_tie() -> None:
    """A sparser grid (80 x 60 m, 150 m footprints), overlap not set: the default 50 m leaves
    pairs untied by cameras, so the planner widens it, in steps, and says so in one line."""
    sparse = grid_survey(10, 12, line_spacing_m=80.0, shot_spacing_m=60.0)
    plan = plan_split(sparse, split=12, merge_options=CAMERAS_ONLY)
    assert plan.split_overlap_asked_m == 50.0
    assert plan.split_overlap_m > 50.0 and plan.split_overlap_m % OVERLAP_STEP_M == 0
    assert all(p.tied_by == "cameras" for p in plan.neighbours)
    notes = [w for w in plan.warnings if "split overlap widened" in w]
    assert len(notes) == 1 and f"to {plan.split_overlap_m:g} m" in notes[0]
    # One step less leaves a pair untied by its cameras.
    narrower = plan_split(sparse, split=12, split_overlap_m=plan.split_overlap_m - OVERLAP_STEP_M)
    assert any(p.shared_images < 3 for p in narrower.neighbours)
    # Given the same overlap, nothing is widened.
    again = plan_split(
        sparse, split=12, split_overlap_m=plan.split_overlap_m, merge_options=CAMERAS_ONLY
    )
    assert again.split_overlap_asked_m is None and again.split_overlap_m == plan.split_overlap_m


def test_neighbour_figures_are_deterministic(grid: Survey) -> None:
    shuffled = grid.model_copy(update={"images": random.Random(3).sample(grid.images, 600)})
    a = plan_split(grid, split=25, split_overlap_m=10)
    b = plan_split(shuffled, split=25, split_overlap_m=10)
    assert a.model_dump_json() == b.model_dump_json()
    assert a.neighbours == b.neighbours and a.fingerprint == b.fingerprint


# ----------------------------------------------------------------------------- real surveys


@pytest.mark.parametrize("pipeline", ["sfm", "direct"])
def test_brighton_split_6_at_10_m_is_not_refused(data_dir: Path, pipeline: str) -> None:
    """Issue 30's acceptance: brighton --split 6 --split-overlap-m 10 (2-3 overlap images per
    submodel) must complete with seams aligned; its products tie every pair."""
    survey = scan_images(str(data_dir / "brighton_beach_1600" / "images"))
    options = ProcessingOptions.model_validate({"pipeline": pipeline})
    plan = plan_split(survey, split=6, split_overlap_m=10, options=options)
    assert len(plan.submodels) == 3
    check_figures(plan)
    assert plan.neighbours
    assert not untied_submodels(plan.neighbours, [sm.id for sm in plan.submodels])
    assert all(p.tied_by != "none" for p in plan.neighbours)


@pytest.mark.parametrize("overlap_m", [10.0, 20.0, 50.0])
@pytest.mark.parametrize("name", ["agung-2", "freetown-1"])
def test_real_layouts(data_dir: Path, name: str, overlap_m: float) -> None:
    """The real flight layouts (1,817 and 1,452 positions) at --split 100: with the default
    alignment every seam is tied (by cameras or products) at 10, 20 and 50 m; with cameras
    only, an overlap is refused exactly when a submodel shares fewer than 3 images with every
    neighbour, and the overlap the refusal names plans."""
    survey = layout_survey(read_layout(data_dir / "layouts" / name))
    plan = plan_split(survey, split=100, split_overlap_m=overlap_m)
    check_figures(plan)
    ids = [sm.id for sm in plan.submodels]
    assert len(ids) > 10 and not untied_submodels(plan.neighbours, ids)
    untied_by_cameras = [
        sid
        for sid in ids
        if not any(p.shared_images >= 3 for p in plan.neighbours if sid in (p.first, p.second))
    ]
    if not untied_by_cameras:
        plan_split(survey, split=100, split_overlap_m=overlap_m, merge_options=CAMERAS_ONLY)
        return
    with pytest.raises(PlanningError) as caught:
        plan_split(survey, split=100, split_overlap_m=overlap_m, merge_options=CAMERAS_ONLY)
    needed = needed_overlap(caught.value)
    assert needed > overlap_m
    wide = plan_split(survey, split=100, split_overlap_m=needed, merge_options=CAMERAS_ONLY)
    assert not untied_submodels(wide.neighbours, [sm.id for sm in wide.submodels])


def test_layout_outcomes_by_overlap(data_dir: Path) -> None:
    """Cameras only, the 1,817-position layout: refused at 10 m (seams share fewer than 3
    images), planned at 50 m; shared images per seam grow with the overlap."""
    survey = layout_survey(read_layout(data_dir / "layouts" / "agung-2"))
    medians = []
    for overlap_m in (10.0, 20.0, 50.0):
        plan = plan_split(survey, split=100, split_overlap_m=overlap_m)
        medians.append(float(np.median([p.shared_images for p in plan.neighbours])))
    assert medians == sorted(medians) and medians[-1] > medians[0]
    with pytest.raises(PlanningError):
        plan_split(survey, split=100, split_overlap_m=10, merge_options=CAMERAS_ONLY)
    plan_split(survey, split=100, split_overlap_m=50, merge_options=CAMERAS_ONLY)


# ----------------------------------------------------------------------------- the command line


@pytest.fixture(scope="module")
def two_groups(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """brighton with its eastern 9 images moved 600 m east: two groups whose footprints do not
    meet, so no overlap lets the alignment tie them."""
    from exif_gps_edit import split_copy

    folder = tmp_path_factory.mktemp("two-groups") / "images"
    assert len(split_copy(data_dir / "brighton_beach_1600" / "images", folder, 600.0)) == 9
    return folder


def _refusal_lines(capsys: pytest.CaptureFixture[str]) -> list[str]:
    printed = capsys.readouterr()
    return [ln for ln in (printed.out + printed.err).splitlines() if "the alignment needs" in ln]


@pytest.mark.parametrize("command", ["plan", "reconstruct"])
def test_a_split_that_cannot_be_aligned_stops_at_the_plan(
    two_groups: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    """``prefect-odm plan`` and ``prefect-odm reconstruct`` (the flow) refuse, exit 2, in one
    line naming the pair, before anything is written or processed."""
    from prefect_odm.cli import main

    out = tmp_path / "out"
    args = [command, str(two_groups), "--output", str(out), "--split", "9"]
    code = main([*args, "--split-overlap-m", "20"])
    lines = _refusal_lines(capsys)
    assert code == 2
    assert len(lines) == 1
    assert "submodel-000 / submodel-001 share 0 images; the alignment needs 3" in lines[0]
    assert "use a larger --split" in lines[0]
    assert not list(out.rglob("plan.json")) and not list(out.rglob("submodels/*/*"))


def test_plan_report_lists_the_seams(grid: Survey) -> None:
    from prefect_odm.plan.picture import plan_markdown

    plan = plan_split(grid, split=25, split_overlap_m=10)
    md = plan_markdown(plan, grid)
    rows = [ln for ln in md.splitlines() if re.match(r"\| submodel-\d{3} / submodel-\d{3} \|", ln)]
    assert len(rows) == len(plan.neighbours)
    first = plan.neighbours[0]
    assert rows[0] == (
        f"| {first.first} / {first.second} | {first.shared_images} | "
        f"{first.footprint_overlap_m2:,.0f} | products |"
    )
    sparse = grid_survey(10, 12, line_spacing_m=80.0, shot_spacing_m=60.0)
    widened = plan_split(sparse, split=12, merge_options=CAMERAS_ONLY)
    assert "widened from 50 m to" in plan_markdown(widened, sparse)


@pytest.mark.parametrize("pipeline", ["sfm", "direct"])
def test_submodels_too_small_for_structure_from_motion_are_refused_at_the_plan(
    data_dir: Path, pipeline: str
) -> None:
    """A new user's ``--split 3 --split-overlap-m 0`` on brighton: 3-image submodels, each failed
    its block check after compute blaming the GPS. Structure from motion is refused at the plan
    naming the submodel; the direct pipeline places any size by GPS and plans it."""
    survey = scan_images(str(data_dir / "brighton_beach_1600" / "images"))
    options = ProcessingOptions(pipeline=pipeline)
    if pipeline == "direct":
        plan = plan_split(survey, split=3, split_overlap_m=0, options=options)
        assert min(len(s.image_names) for s in plan.submodels) < MIN_SFM_SUBMODEL_IMAGES
        return
    with pytest.raises(PlanningError, match=r"submodel-\d{3} would reconstruct \d images"):
        plan_split(survey, split=3, split_overlap_m=0, options=options)


def test_an_overlap_wider_than_a_kilometre_is_refused_by_the_planner(grid: Survey) -> None:
    """The Python API refuses what the command line refuses (the geometry overflowed at 1e100 m)."""
    with pytest.raises(PlanningError, match="split_overlap_m must be 0 to 1000 m"):
        plan_split(grid, split=25, split_overlap_m=1e100)
