"""The smallest structure-from-motion submodel the planner accepts (``MIN_SFM_SUBMODEL_IMAGES``).

A new user's ``--split 6 --split-overlap-m 5`` on brighton planned three 6-image submodels
sharing no image; all three were reconstructed, then the merge refused them ("submodel-000:
rotation deg 2.66 > max_rotation_deg=2"): that submodel is tilted 2.4 deg against ODM's cloud and
the refinement measured it right (benchmarks/RESULTS.md "h40s"), so the submodel, not the gate,
was wrong. ``--split 5 --split-overlap-m 10`` (7-8 images, 2-3 shared) failed the scale gate
at the merge the same way. Such plans are refused at their start; the README's Quickstart and
the splits the suite reconstructs by structure from motion are not.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from prefect_odm.errors import PlanningError
from prefect_odm.models import ProcessingOptions, Survey
from prefect_odm.plan.checks import MIN_SFM_SUBMODEL_IMAGES
from prefect_odm.plan.planning import plan_split
from prefect_odm.survey.scan import scan_images


@pytest.fixture(scope="module")
def brighton(data_dir: Path) -> Survey:
    return scan_images(str(data_dir / "brighton_beach_1600" / "images"))


@pytest.mark.parametrize(("split", "overlap_m", "images"), [(6, 5, 6), (5, 10, 7)])
def test_splits_that_failed_at_the_merge_are_refused_at_the_plan_naming_the_cause_and_fix(
    brighton: Survey, split: int, overlap_m: float, images: int
) -> None:
    with pytest.raises(PlanningError) as raised:
        plan_split(brighton, split=split, split_overlap_m=overlap_m)
    assert str(raised.value) == (
        f"{brighton.source}: submodel-000 would reconstruct {images} images by structure from "
        f"motion, fewer than the {MIN_SFM_SUBMODEL_IMAGES} a submodel needs to reconstruct reliably: "
        "use a larger --split, a wider --split-overlap-m, or --pipeline direct"
    )
    # the direct pipeline places each image by its GPS: any size is planned
    direct = plan_split(brighton, split=split, split_overlap_m=overlap_m,
                        options=ProcessingOptions(pipeline="direct"))  # fmt: skip
    assert min(len(s.image_names) for s in direct.submodels) == images


@pytest.mark.parametrize(
    ("split", "overlap_m"),
    [
        (10, 20),  # the README's Quickstart: 2 x 12 images
        (8, 0),  # tests/test_align_zero_overlap.py: 2 x 9, no image shared
        (6, 10),  # tests/test_merge_matrix.py's narrow overlap: 8-9 images (3 shared)
        (5, 15),  # tests/test_plan_cache.py: 9-12 images
        (5, 50),  # tests/test_merge_matrix.py on NodeODM
        (8, 5),  # --split 6 --split-overlap-m 5 with a larger split (or the overlap above)
    ],
)
def test_the_quickstart_and_the_suites_splits_are_planned(
    brighton: Survey, split: int, overlap_m: float
) -> None:
    plan = plan_split(brighton, split=split, split_overlap_m=overlap_m)
    assert min(len(s.image_names) for s in plan.submodels) >= MIN_SFM_SUBMODEL_IMAGES
