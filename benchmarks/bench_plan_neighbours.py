"""Benchmark: how long the plan takes to refuse, widen or keep a split the alignment must tie
(issue 30: "refused at the plan in under 10 s naming the overlap it needs").

On the 600-image grid of ``tests/plan_surveys.py`` (36 m between lines, 27 m between shots, 150 m
footprints) at ``--split 25``, and on the real layouts (``../shared/data/layouts``: 1,817 and 1,452
positions) at ``--split 100``, prints the wall time of ``plan_split`` per case and its outcome:

* ``10 m given, default alignment``: kept (the refinement from DSMs and orthophotos ties the pairs);
* ``10 m given, cameras only`` (``refine_from_products=False``): refused, naming the overlap needed;
* ``not given, cameras only``: the default 50 m, widened when a seam shares too few images.

Two more surveys show the widening's cost: a sparse grid (120 images 80 x 60 m apart, widened
in 5 m steps) and the 600-image grid cut into two blocks 1 km apart: the seam across the gap is
never tied, every submodel is (within its block), so the widening gives up after
``WIDEN_PATIENCE_STEPS`` steps without a newly tied pair and keeps 50 m.

The baseline, in the same process: the same plan with the alignment off (``MergeOptions(align=False)``:
no pair is judged, only measured once), so the ratio is the check's own cost, widening included.

Usage: python benchmarks/bench_plan_neighbours.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

from prefect_odm.align.report import AlignmentOptions
from prefect_odm.errors import PlanningError
from prefect_odm.models import MergeOptions, SplitPlan, Survey
from prefect_odm.plan.planning import plan_split
from prefect_odm.survey.layouts import layout_survey, read_layout

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from plan_surveys import grid_survey  # noqa: E402

DATA = ROOT.parent / "shared" / "data"
CAMERAS_ONLY = MergeOptions(alignment=AlignmentOptions(refine_from_products=False))
OFF = MergeOptions(align=False)


def best_of(repeat: int, run: Callable[[], str]) -> tuple[float, str]:
    """The fastest of ``repeat`` runs, seconds, and the outcome of the last."""
    times, outcome = [], ""
    for _ in range(repeat):
        t0 = time.perf_counter()
        outcome = run()
        times.append(time.perf_counter() - t0)
    return min(times), outcome


def outcome_of(survey: Survey, split: int, overlap_m: float | None, merge: MergeOptions) -> str:
    """``plan_split``' outcome in words."""
    try:
        plan: SplitPlan = plan_split(
            survey, split=split, split_overlap_m=overlap_m, merge_options=merge
        )
    except PlanningError as exc:
        return f"refused: {str(exc).split(': ', 1)[1]}"
    widened = (
        ""
        if plan.split_overlap_asked_m is None
        else f" (widened from {plan.split_overlap_asked_m:g})"
    )
    ties = sorted({p.tied_by for p in plan.neighbours})
    return (
        f"kept {len(plan.submodels)} submodels at {plan.split_overlap_m:g} m{widened}, "
        f"{len(plan.neighbours)} seams tied by {'/'.join(ties) or '-'}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    surveys = [
        ("grid 600", grid_survey(), 25),
        ("sparse 120", grid_survey(10, 12, line_spacing_m=80.0, shot_spacing_m=60.0), 12),
        ("2 blocks", grid_survey(gap_m=1000.0), 25),
    ]
    for name in ("agung-2", "freetown-1"):
        surveys.append((name, layout_survey(read_layout(DATA / "layouts" / name)), 100))
    plan_split(surveys[0][1], split=25, split_overlap_m=10)  # imports and caches warm
    cases = [
        ("10 m given, default alignment", 10.0, MergeOptions()),
        ("10 m given, cameras only", 10.0, CAMERAS_ONLY),
        ("not given, cameras only", None, CAMERAS_ONLY),
    ]
    for label, survey, split in surveys:
        for case, overlap_m, merge in cases:
            base_s, _ = best_of(
                args.repeat, partial(outcome_of, survey, split, overlap_m or 50.0, OFF)
            )
            took_s, outcome = best_of(
                args.repeat, partial(outcome_of, survey, split, overlap_m, merge)
            )
            print(
                f"{label:>10} --split {split:<3} {case:<30} {took_s:6.3f} s "
                f"(alignment off {base_s:6.3f} s, ratio {took_s / base_s:4.2f}x): {outcome}",
                flush=True,
            )


if __name__ == "__main__":
    main()
