"""The plan and survey a process's submodel flows share (prefect_odm.plan.cache)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from prefect_odm import storage
from prefect_odm.layout import plan_file
from prefect_odm.plan.cache import MAX_PLANS, _cache, load_plan_and_survey
from prefect_odm.plan.planning import plan_split
from prefect_odm.survey.scan import scan_images


def store(folder: Path, images: Path, split: int) -> str:
    survey = scan_images(str(images))
    plan = plan_split(survey, split=split, split_overlap_m=15)
    plan_url = str(folder / "plan" / "plan.json")
    storage.write_json_atomic(plan_url, plan.model_dump(mode="json"))
    storage.write_json_atomic(
        plan_file(str(folder / "plan"), "survey"), survey.model_dump(mode="json")
    )
    return plan_url


def test_plan_is_read_once_and_again_when_rewritten(brighton_images, tmp_path):
    _cache.clear()
    url = store(tmp_path, brighton_images, split=5)
    plan, survey = load_plan_and_survey(url)
    assert len(survey.images) == 18 and len(plan.submodels) >= 3
    again = load_plan_and_survey(url)
    assert again[0] is plan and again[1] is survey  # the same objects: not read again
    store(tmp_path, brighton_images, split=9)  # a new plan under the same name
    stat = os.stat(url)
    os.utime(url, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    rewritten, _ = load_plan_and_survey(url)
    assert rewritten is not plan and len(rewritten.submodels) < len(plan.submodels)


def test_missing_plan_raises_and_cache_stays_bounded(brighton_images, tmp_path):
    _cache.clear()
    with pytest.raises(FileNotFoundError):
        load_plan_and_survey(str(tmp_path / "nowhere" / "plan.json"))
    url = store(tmp_path / "a", brighton_images, split=5)
    for i in range(MAX_PLANS + 2):
        copy = tmp_path / f"copy{i}"
        copy.mkdir()
        (copy / "plan.json").write_bytes(Path(url).read_bytes())
        (copy / "survey.json").write_bytes(Path(url).with_name("survey.json").read_bytes())
        load_plan_and_survey(str(copy / "plan.json"))
    assert len(_cache) == MAX_PLANS


def test_the_same_survey_planned_the_same_way_is_planned_once(brighton_images, tmp_path):
    """reconstruct's edge plans, then its flow plans the same survey again: one plan."""
    from prefect_odm.models import ProcessingOptions
    from prefect_odm.plan.cache import plan_split_once

    survey = scan_images(str(brighton_images))
    asked = dict(
        split=5,
        split_overlap_m=15.0,
        options=ProcessingOptions(),
        engine_identity="unknown",
        node_memory_gib=[],
        merge_options=None,
    )
    first = plan_split_once(survey, **asked, keep=True)
    assert first == plan_split(survey, split=5, split_overlap_m=15.0)
    # A rescan's survey (an equal copy, another object) gets the same plan object, once: the
    # flow takes what the edge kept, and nothing stays in the process after it.
    assert plan_split_once(scan_images(str(brighton_images)), **asked) is first
    again = plan_split_once(survey, **asked)
    assert again is not first and again == first
    kept = plan_split_once(survey, **asked, keep=True)
    assert plan_split_once(survey, **{**asked, "node_memory_gib": ()}) is kept
    # Another argument, or a survey that differs in one image, is planned again.
    other = plan_split_once(survey, **{**asked, "split": 9})
    assert other is not first and len(other.submodels) < len(first.submodels)
    first = plan_split_once(survey, **asked, keep=True)
    moved = survey.model_copy(
        update={
            "images": [survey.images[0].model_copy(update={"name": "x.jpg"})] + survey.images[1:]
        }
    )
    replanned = plan_split_once(moved, **asked)
    assert replanned is not first and "x.jpg" in {c.name for c in replanned.cameras}
