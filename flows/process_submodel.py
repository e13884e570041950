"""The ``process_submodel`` flow: one submodel on the node pool, as its own flow run.

Run inline as a subflow of ``reconstruct`` (notebooks, the command line) or as a deployment run
(workers on other machines; the UI's Retry button). Its parameters are small: a reference to the
stored plan and the submodel id, never the image list.
"""

from __future__ import annotations

import threading
from contextlib import AbstractContextManager
from typing import Any
from uuid import UUID

from prefect import flow, get_run_logger
from prefect.client.schemas.objects import State
from prefect.states import Cancelled
from prefect_odm.tasks.admission import DEFAULT_LIMIT_NAME, ensure_memory_limit, memory_slots
from prefect_odm.tasks.artifacts import cached_state, rename_this_run, submodel_progress
from prefect_odm.tasks.cluster_runs import (
    RunCluster,
    record_cluster,
    resolve_cluster,
    stopped_result,
    tag_this_run,
)
from prefect_odm.tasks.clusters import cluster_for
from prefect_odm.tasks.submodel_stop import SubmodelStop
from pydantic import Field

from prefect_odm.errors import InputError, RunCancelledError, SubmodelFailedError
from prefect_odm.layout import OutputLayout
from prefect_odm.models import SplitPlan, SubmodelResult, Survey
from prefect_odm.nodes.cluster import Cluster
from prefect_odm.nodes.refs import refuse_credentials, submodel_run_name
from prefect_odm.nodes.runner import SubmodelRunner
from prefect_odm.plan.cache import load_plan_and_survey


@flow(name="process_submodel", flow_run_name="{submodel_id}", validate_parameters=True)
def process_submodel(
    plan_url: str,
    submodel_id: str,
    output: str,
    nodes: list[str] | None = None,
    force: bool = False,
    memory_limit_name: str = DEFAULT_LIMIT_NAME,
    node_pool: str | None = None,
    cluster_directory: str | None = None,
    cluster: str | None = None,
    deadline_seconds: float | None = Field(None, gt=0),
) -> SubmodelResult | State[Any]:
    """Process one submodel of a stored plan, or reuse its stored result.

    The run is named after the survey and the submodel (``brighton_beach_1600-3f2a9c1d-
    submodel-002``); a reused result ends it in the ``Cached`` state (a Completed state whose
    message holds the fingerprint).

    Args:
        plan_url: location of the run's ``plan/plan.json`` (``survey.json`` sits beside it).
        submodel_id: e.g. ``submodel-003``.
        output: the run's output root (local path or fsspec URL).
        nodes: NodeODM node URLs without credentials (tokens: a ``NodeODMPool`` block or
            ``PREFECT_ODM_NODE_TOKEN(S)``); none starts the built-in engine for this run.
        force: process again even when a stored result with the same fingerprint exists.
        node_pool: name of a saved ``NodeODMPool`` block to use instead of ``nodes``.
        memory_limit_name: Prefect global concurrency limit whose slots stand for the pool's
            memory in GiB (created or resized to the pool's memory when the run starts).
        cluster_directory: a cluster directory block: the run uses the nodes and the memory
            limit of the cluster it is on (a deployment run: its worker's
            ``PREFECT_ODM_CLUSTER``, else ``cluster``) and tags itself ``cluster:<name>``.
        cluster: the cluster the run was routed to (``None``: the global queue).
        deadline_seconds: cancel the node task after this long on its node ("timed out").

    Returns:
        The submodel's result (in a ``Cached`` state when reused; ``Cancelled`` when its
        parent cancelled it on the server). Transient node failures are retried, on another
        node when one is down.

    Raises:
        InputError: a node URL carries a credential; the cluster's nodes run another engine
            than the plan's.
        SubmodelFailedError: the submodel failed for good or timed out; carries the result with
            the node's last output lines.
    """
    refuse_credentials(nodes)
    plan, survey = load_plan_and_survey(plan_url)  # once per process, not per submodel
    layout = OutputLayout(output, plan.survey_fingerprint)
    rename_this_run(submodel_run_name(survey.source, plan.survey_fingerprint, submodel_id))
    run_id = _deployment_run_id()
    on = _where(cluster_directory, cluster, nodes, node_pool, memory_limit_name, run_id)
    if on.name is not None:
        tag_this_run(on.name)
    with cluster_for(on.nodes, plan.options.pipeline, on.node_pool) as pool:
        pool.check_options(plan.options.to_nodeodm())
        if cluster_directory:
            _check_engine(on, pool, plan)
        size = on.memory_gib or sum(pool.node_memory_gib)
        ensure_memory_limit(on.memory_limit_name, max(1, int(size)))
        stop = SubmodelStop(submodel_id, pool.cancelled, deadline_seconds, run_id)
        runner = _runner(plan, survey, layout, pool, on.memory_limit_name, stop.event)
        with submodel_progress(submodel_id), stop:
            try:
                result = runner.run(submodel_id, force=force)
            except RunCancelledError:
                if stop.reason in (None, "cancelled"):
                    raise
                result = stopped_result(plan, submodel_id, stop.detail, on.name)
                if stop.reason == "cancelled on the server":
                    return Cancelled(message=result.error)
    if on.name is not None:
        result = record_cluster(result, on.name, layout)
    if result.status == "failed":
        # Fail the flow run, so the UI shows it failed and offers Retry on it.
        raise SubmodelFailedError(result)
    if result.status == "reused":
        return cached_state(submodel_id, result.fingerprint, data=result)
    return result


def _where(
    directory: str | None,
    routed: str | None,
    nodes: list[str] | None,
    node_pool: str | None,
    memory_limit_name: str,
    run_id: UUID | None,
) -> RunCluster:
    """The nodes and memory limit of the run: the directory's cluster it is on (a deployment
    run: its worker's, else the one routed to; inline: the one routed to), else the nodes it
    was given."""
    if directory:
        return resolve_cluster(directory, routed, worker_first=run_id is not None)
    return RunCluster(routed, nodes, node_pool, memory_limit_name, None)


def _check_engine(on: RunCluster, pool: Cluster, plan: SplitPlan) -> None:
    """Refuse a cluster whose nodes run another engine than the plan's (its fingerprints would
    not hold).

    Raises:
        InputError: naming both engines.
    """
    if pool.engine_identity != plan.engine_identity:
        raise InputError(
            f"cluster {on.name} runs {pool.engine_identity}, but the plan was made for "
            f"{plan.engine_identity}: its fingerprints would not hold"
        )


def _deployment_run_id() -> UUID | None:
    """This flow run's id when it is a deployment run (its worker may be gone when its parent
    cancels it, so it watches its own state), else ``None``."""
    from prefect.context import FlowRunContext

    ctx = FlowRunContext.get()
    run = ctx.flow_run if ctx is not None else None
    if run is None or run.deployment_id is None:
        return None
    return UUID(str(run.id))


def _runner(
    plan: SplitPlan,
    survey: Survey,
    layout: OutputLayout,
    pool: Cluster,
    memory_limit_name: str,
    stop: threading.Event,
) -> SubmodelRunner:
    """The submodel runner on ``pool``, admitted by ``memory_limit_name``'s slots, stopped by
    ``stop``."""

    def admit(sid: str, memory_gib: float) -> AbstractContextManager[object]:
        return memory_slots(
            memory_limit_name, memory_gib, what=f"{plan.survey_fingerprint[:12]}/{sid}"
        )

    return SubmodelRunner(
        plan,
        survey,
        layout,
        pool.pool,
        pool.clients,
        admit=admit,
        log=get_run_logger().info,
        cancelled=stop,
    )
