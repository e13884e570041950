"""Prefect tasks around scanning and planning (thin wrappers over the core)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from prefect import task
from prefect.cache_policies import NO_CACHE

from prefect_odm.models import MergeOptions, ProcessingOptions, SplitPlan, Survey


@task(name="scan_survey", cache_policy=NO_CACHE, task_run_name="scan_survey")
def scan_survey(images: str, policy: Literal["exclude", "fail"] = "exclude") -> Survey:
    """Scan the images at ``images`` (folder or fsspec URL) into a :class:`Survey`."""
    from prefect_odm.survey.scan import scan_images

    return scan_images(images, policy=policy)


@task(name="plan_submodels", cache_policy=NO_CACHE, task_run_name="plan_submodels")
def plan_submodels(
    survey: Survey,
    split: int | Literal["auto"],
    split_overlap_m: float | None,
    options: ProcessingOptions,
    engine_identity: str,
    node_memory_gib: Sequence[float] = (),
    merge_options: MergeOptions | None = None,
) -> SplitPlan:
    """Split the survey into submodels (see :func:`prefect_odm.plan.planning.plan_split`).

    Each of the plan's warnings (wasteful overlap, merged duplicates, GPS problems seen before
    compute) is sent as a ``warning`` progress event, which the command line prints as
    ``warning: ...`` before any submodel runs (the flow logs them to the run). ``split_overlap_m``
    None lets the planner widen the default overlap. The plan of ``prefect-odm reconstruct``'s
    edge is reused when it planned the same survey the same way (:func:`plan_split_once`). A
    split the merge's alignment (``merge_options``) could not tie raises ``PlanningError``
    before anything is uploaded.
    """
    from prefect_odm import progress
    from prefect_odm.plan.cache import plan_split_once

    plan = plan_split_once(
        survey,
        split=split,
        split_overlap_m=split_overlap_m,
        options=options,
        engine_identity=engine_identity,
        node_memory_gib=node_memory_gib,
        merge_options=merge_options,
    )
    for warning in plan.warnings:
        progress.emit(progress.WarningEvent(text=warning))
    return plan
