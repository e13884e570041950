"""The ``calibrate_cameras`` task: one camera calibration shared by a plan's submodels.

Called by the ``reconstruct`` flow once the plan is published and accepted, before any submodel
runs (:func:`with_shared_calibration`): when the plan needs one
(:func:`prefect_odm.plan.calibration.needs_calibration`: two submodels or more, structure from
motion, no ``cameras`` option), a small reconstruction calibrates the cameras, the plan is made
again with its ``cameras.json`` as the ``cameras`` option (so it enters every submodel's
fingerprint) and published again.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Literal

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from prefect_odm import progress
from prefect_odm.layout import OutputLayout
from prefect_odm.models import MergeOptions, SplitPlan, Survey
from prefect_odm.nodes.cluster import Cluster, embedded_engine
from prefect_odm.plan.calibration import CALIBRATION_OPTION, needs_calibration


@dataclass(frozen=True)
class PlanRequest:
    """What the flow planned with besides the survey and the options (the plan is made again
    with the calibration among the options): see :func:`prefect_odm.plan.planning.plan_split`."""

    split: int | Literal["auto"]
    split_overlap_m: float | None
    engine_identity: str
    node_memory_gib: Sequence[float]
    merge_options: MergeOptions | None


@contextmanager
def _nodes(cluster: Cluster | None, pipeline: str) -> Iterator[Cluster]:
    """The run's cluster, or the built-in engine started for the calibration."""
    if cluster is not None:
        yield cluster
        return
    with embedded_engine(pipeline) as engine:
        yield engine


@task(name="calibrate_cameras", cache_policy=NO_CACHE, task_run_name="calibrate_cameras")
def calibrate_cameras(
    plan: SplitPlan, survey: Survey, layout: OutputLayout, cluster: Cluster | None
) -> str:
    """The ``cameras.json`` text for the plan's submodels
    (:func:`prefect_odm.nodes.calibration.calibrate_cameras`), on the run's nodes or the
    built-in engine."""
    from prefect_odm.nodes.calibration import calibrate_cameras as _calibrate

    logger = get_run_logger()
    with _nodes(cluster, plan.options.pipeline) as nodes:
        return _calibrate(plan, survey, layout, nodes.pool, nodes.clients, log=logger.info)


def with_shared_calibration(
    plan: SplitPlan,
    survey: Survey,
    layout: OutputLayout,
    cluster: Cluster | None,
    asked: PlanRequest,
) -> SplitPlan:
    """``plan``, or, when its submodels should share a camera calibration, the plan made again
    as ``asked`` with the calibration as the ``cameras`` option, published.

    Raises:
        ProcessingFailedError: the calibration failed (its line names the task and the node).
    """
    from prefect_odm.tasks.report import publish_plan

    from prefect_odm.plan.planning import plan_split as make_plan

    if not needs_calibration(plan):
        return plan
    progress.emit(progress.StageEvent(name="calibration"))
    cameras = calibrate_cameras(plan, survey, layout, cluster)
    extra = {**plan.options.extra, CALIBRATION_OPTION: cameras}
    shared = make_plan(
        survey,
        split=asked.split,
        split_overlap_m=asked.split_overlap_m,
        options=plan.options.model_copy(update={"extra": extra}),
        engine_identity=asked.engine_identity,
        node_memory_gib=asked.node_memory_gib,
        merge_options=asked.merge_options,
    )
    publish_plan(shared, survey, layout)
    get_run_logger().info(
        "camera calibration shared by the %d submodels (the cameras option)", len(shared.submodels)
    )
    return shared
