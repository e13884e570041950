"""Submodels as deployment runs: each submodel is a ``process-submodel`` flow run a worker takes.

The task :func:`start_submodel_run` and the Prefect-client helpers around it (retry, wait,
result); which deployment and work queue to use is run policy
(:func:`prefect_odm.run_policy.configured_submodel_deployment`, ``work_queue_for``).

``reconstruct`` uses this mode when it is given ``submodel_deployment`` or when
``PREFECT_ODM_SUBMODEL_DEPLOYMENT`` names one (the ``reconstruct`` deployment in ``prefect.yaml``
sets the parameter). Every child is created by :func:`start_submodel_run`, a Prefect *task*,
so the child is linked to the parent run in the UI (``run_deployment`` from a plain thread is not),
with the idempotency key ``{parent_run_id}-{submodel_id}``: a retried parent gets its existing
children back instead of starting new ones.

The rerun story: a child fails -> the operator presses Retry on it in the UI (the run goes to
``AwaitingRetry``; :func:`retry_flow_run` does the same from Python) -> it succeeds and stores its
``result.json`` -> the operator retries the parent, which finds every stored result and merges. A
parent retried while a child is still failed retries that child itself (the idempotency key would
otherwise hand back the failed run for ever).

Children receive the stored plan's URL and their submodel id, never the image list, so parameters
and events stay small at 10,000 images. Results travel through the output storage
(``load_stored_result``), not through Prefect's result persistence.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, cast
from uuid import UUID

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.client.schemas import OrchestrationResult
from prefect.client.schemas.objects import FlowRun
from prefect.context import get_run_context
from prefect.deployments import run_deployment
from prefect.states import AwaitingRetry

from prefect_odm.errors import DeploymentRunError
from prefect_odm.layout import OutputLayout
from prefect_odm.models import SplitPlan, SubmodelResult
from prefect_odm.submodels import load_stored_result

SUBMODEL_DEPLOYMENT = "process_submodel/process-submodel"
"""The deployment ``prefect.yaml`` defines for submodels (``flow name/deployment name``)."""


POLL_INTERVAL_SECONDS = 2.0
"""How often a parent polls its children's states (``run_deployment``'s own default is 5 s)."""

_FINAL_FAILED = {"FAILED", "CRASHED", "CANCELLED"}

__all__ = [
    "POLL_INTERVAL_SECONDS",
    "SUBMODEL_DEPLOYMENT",
    "DeploymentRunError",
    "result_of",
    "retry_flow_run",
    "start_submodel_run",
    "wait_for_runs",
]


def retry_flow_run(flow_run_id: UUID | str, message: str = "Retry from the UI") -> str:
    """Put a finished flow run back to ``AwaitingRetry``, as the UI's Retry button does.

    The run keeps its id; a worker (or ``serve``) picks it up again. Only deployment runs can be
    retried this way.

    Returns:
        The orchestration status (``"ACCEPT"`` when the run was rescheduled).

    Raises:
        DeploymentRunError: the server rejected the transition.
    """
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        result: OrchestrationResult[Any] = client.set_flow_run_state(
            flow_run_id, AwaitingRetry(message=message)
        )
    status = str(getattr(result.status, "value", result.status))
    if status != "ACCEPT":
        details = getattr(result.details, "reason", "")
        raise DeploymentRunError(
            f"flow run {flow_run_id}: retry was not accepted ({status}: {details})"
        )
    return status


@task(name="start_submodel_run", cache_policy=NO_CACHE, task_run_name="deploy-{submodel_id}")
def start_submodel_run(
    deployment: str,
    plan_url: str,
    submodel_id: str,
    output: str,
    nodes: list[str] | None,
    force: bool,
    work_queue_name: str | None = None,
) -> str:
    """Create (or find) the submodel's deployment run and return its flow run id.

    Must run as a Prefect task inside the parent flow run: the child is linked to it, and its
    idempotency key is ``{parent flow run id}-{submodel_id}`` so a retried parent finds it again.
    A found child that ended failed, crashed or cancelled is retried (as the UI's Retry button).

    Args:
        deployment: ``"flow name/deployment name"`` of the ``process_submodel`` deployment.
        plan_url: the stored ``plan/plan.json`` (the child reads the survey beside it).
        submodel_id: e.g. ``submodel-001``.
        output: the run's output root; workers must see the same storage.
        nodes: NodeODM node URLs for the child; none: the worker's built-in engine.
        force: process again even when a stored result exists.
        work_queue_name: queue of the child run (the urgent queue for urgent runs); ``None``:
            the deployment's default queue.

    Raises:
        DeploymentRunError: the run could not be retried.
    """
    logger = get_run_logger()
    parent_id = _parent_flow_run_id()
    parameters: dict[str, object] = {
        "plan_url": plan_url,
        "submodel_id": submodel_id,
        "output": output,
        "nodes": nodes,
        "force": force,
    }
    # Called from a sync task, run_deployment runs its sync implementation; the union in its
    # type is Prefect's sync/async dispatch.
    child = cast(
        FlowRun,
        run_deployment(
            deployment,
            parameters=parameters,
            idempotency_key=f"{parent_id}-{submodel_id}",
            work_queue_name=work_queue_name,
            flow_run_name=submodel_id,
            timeout=0,
        ),
    )
    state = child.state
    logger.info(
        "%s: deployment run %s (%s), queue %s, %s",
        submodel_id,
        child.name,
        child.id,
        child.work_queue_name,
        state.name if state else "?",
    )
    if state is not None and state.is_final() and state.type.value in _FINAL_FAILED:
        # A retried parent got its failed child back through the idempotency key.
        logger.info("%s: child run %s ended %s; retrying it", submodel_id, child.id, state.name)
        retry_flow_run(child.id, message="Retried by its parent run")
    return str(child.id)


def _parent_flow_run_id() -> UUID:
    """The flow run of the task this is called from.

    Raises:
        DeploymentRunError: not called from inside a Prefect task run.
    """
    ctx = get_run_context()
    task_run = getattr(ctx, "task_run", None)
    if task_run is None:
        raise DeploymentRunError("start_submodel_run must run as a task inside a flow run")
    return cast(UUID, task_run.flow_run_id)


def wait_for_runs(
    run_ids: dict[str, str],
    poll_interval_seconds: float = POLL_INTERVAL_SECONDS,
    on_final: Callable[[str, FlowRun], None] | None = None,
    timeout_seconds: float | None = None,
) -> dict[str, FlowRun]:
    """Poll the flow runs until every one is in a final state (one API call per poll).

    Args:
        run_ids: key (e.g. submodel id) -> flow run id.
        poll_interval_seconds: polling interval.
        on_final: called as ``on_final(key, flow_run)`` once per run when it ends.
        timeout_seconds: give up after this long (``None``: wait as long as it takes).

    Returns:
        key -> the finished flow run.

    Raises:
        DeploymentRunError: ``timeout_seconds`` passed with runs still unfinished.
    """
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    by_id = {UUID(v): k for k, v in run_ids.items()}
    done: dict[str, FlowRun] = {}
    deadline = None if timeout_seconds is None else time.monotonic() + timeout_seconds
    with get_client(sync_client=True) as client:
        while len(done) < len(by_id):
            pending = [i for i, k in by_id.items() if k not in done]
            runs = client.read_flow_runs(
                flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=pending)), limit=len(pending)
            )
            for run in runs:
                if run.state is not None and run.state.is_final():
                    key = by_id[run.id]
                    done[key] = run
                    if on_final is not None:
                        on_final(key, run)
            if len(done) < len(by_id):
                if deadline is not None and time.monotonic() > deadline:
                    left = sorted(k for k in by_id.values() if k not in done)
                    raise DeploymentRunError(
                        f"runs still unfinished after {timeout_seconds} s: {left}"
                    )
                time.sleep(poll_interval_seconds)
    return done


def result_of(run: FlowRun, plan: SplitPlan, submodel_id: str, output: str) -> SubmodelResult:
    """The submodel result of a finished child run, read from the output storage.

    A completed child left its ``result.json``; anything else becomes a ``failed`` result that
    names the child run and its state message.
    """
    submodel = plan.submodel(submodel_id)
    assert run.state is not None
    if run.state.is_completed():
        stored = load_stored_result(OutputLayout(output, plan.survey_fingerprint), submodel)
        if stored is not None:
            return stored
        message = "the run completed but its stored result is missing"
    else:
        message = run.state.message or run.state.name or "failed"
    return SubmodelResult(
        submodel_id=submodel_id,
        fingerprint=submodel.fingerprint,
        status="failed",
        error=f"deployment run {run.name} ({run.id}) {run.state.name}: {message}".split("\n")[0],
    )
