"""The ``process_submodel`` flow: one submodel on the node pool, as its own flow run.

Run inline as a subflow of ``reconstruct`` (notebooks, the command line) or as a deployment run
(workers on other machines; the UI's Retry button). Its parameters are small: a reference to the
stored plan and the submodel id, never the image list.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

from prefect import flow, get_run_logger
from prefect.client.schemas.objects import State
from prefect_odm.tasks.admission import DEFAULT_LIMIT_NAME, ensure_memory_limit, memory_slots
from prefect_odm.tasks.artifacts import cached_state, rename_this_run, submodel_progress
from prefect_odm.tasks.clusters import cluster_for

from prefect_odm.errors import SubmodelFailedError
from prefect_odm.layout import OutputLayout
from prefect_odm.models import SubmodelResult
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

    Returns:
        The submodel's result (in a ``Cached`` state when reused). Transient node failures are
        retried, on another node when one is down.

    Raises:
        InputError: a node URL carries a credential.
        SubmodelFailedError: the submodel failed for good; carries the result with the node's
            last output lines.
    """
    refuse_credentials(nodes)
    logger = get_run_logger()
    plan, survey = load_plan_and_survey(plan_url)  # once per process, not per submodel
    layout = OutputLayout(output, plan.survey_fingerprint)
    rename_this_run(submodel_run_name(survey.source, plan.survey_fingerprint, submodel_id))
    with cluster_for(nodes, plan.options.pipeline, node_pool) as cluster:
        cluster.check_options(plan.options.to_nodeodm())
        ensure_memory_limit(memory_limit_name, max(1, int(sum(cluster.node_memory_gib))))

        def admit(sid: str, memory_gib: float) -> AbstractContextManager[object]:
            return memory_slots(
                memory_limit_name, memory_gib, what=f"{plan.survey_fingerprint[:12]}/{sid}"
            )

        runner = SubmodelRunner(
            plan,
            survey,
            layout,
            cluster.pool,
            cluster.clients,
            admit=admit,
            log=logger.info,
            cancelled=cluster.cancelled,
        )
        with submodel_progress(submodel_id):
            result = runner.run(submodel_id, force=force)
    if result.status == "failed":
        # Fail the flow run, so the UI shows it failed and offers Retry on it.
        raise SubmodelFailedError(result)
    if result.status == "reused":
        return cached_state(submodel_id, result.fingerprint, data=result)
    return result
