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

import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast
from uuid import UUID

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.client.orchestration import SyncPrefectClient
from prefect.client.schemas import OrchestrationResult
from prefect.client.schemas.objects import FlowRun, State
from prefect.context import get_run_context
from prefect.deployments import run_deployment
from prefect.states import AwaitingRetry
from prefect_odm.tasks.artifacts import LiveSubmodelTable

from prefect_odm import progress, storage
from prefect_odm.errors import DeploymentRunError
from prefect_odm.layout import OutputLayout
from prefect_odm.models import SplitPlan, SubmodelResult
from prefect_odm.nodes.refs import submodel_run_name
from prefect_odm.progress import RowFields, SubmodelBoard
from prefect_odm.run_policy import load_stored_result

SUBMODEL_DEPLOYMENT = "process_submodel/process-submodel"
"""The deployment ``prefect.yaml`` defines for submodels (``flow name/deployment name``)."""


POLL_INTERVAL_SECONDS = 2.0
"""How often a parent polls its children's states (``run_deployment``'s own default is 5 s)."""

API_PAGE_LIMIT = 200
"""The most runs the Prefect API answers in one read (its own limit)."""

_FINAL_FAILED = {"FAILED", "CRASHED", "CANCELLED"}

__all__ = [
    "POLL_INTERVAL_SECONDS",
    "SUBMODEL_DEPLOYMENT",
    "ChildRunFeed",
    "DeploymentRunError",
    "SubmodelChildren",
    "board_state",
    "child_runs",
    "read_runs",
    "result_of",
    "retry_flow_run",
    "run_history",
    "show_child_history",
    "start_submodel_run",
    "state_text",
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
    node_pool: str | None = None,
    run_name: str | None = None,
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
        nodes: NodeODM node URLs for the child, without credentials (the child finds tokens in
            ``PREFECT_ODM_NODE_TOKEN(S)`` on its worker); none: the worker's built-in engine.
        force: process again even when a stored result exists.
        work_queue_name: queue of the child run (the urgent queue for urgent runs); ``None``:
            the deployment's default queue.
        node_pool: the ``NodeODMPool`` block the child loads (its tokens never become
            parameters); given instead of ``nodes``.
        run_name: the child's name (default: the submodel id).

    Raises:
        DeploymentRunError: the run could not be retried.
    """
    logger = get_run_logger()
    parent_id = _parent_flow_run_id()
    parameters: dict[str, object] = {
        "plan_url": plan_url,
        "submodel_id": submodel_id,
        "output": output,
        "nodes": None if node_pool else nodes,
        "force": force,
    }
    if node_pool:
        parameters["node_pool"] = node_pool
    # Called from a sync task, run_deployment runs its sync implementation; the union in its
    # type is Prefect's sync/async dispatch.
    child = cast(
        FlowRun,
        run_deployment(
            deployment,
            parameters=parameters,
            idempotency_key=f"{parent_id}-{submodel_id}",
            work_queue_name=work_queue_name,
            flow_run_name=run_name or submodel_id,
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
    on_poll: Callable[[dict[str, FlowRun]], None] | None = None,
) -> dict[str, FlowRun]:
    """Poll the flow runs until every one is in a final state (one API call per poll).

    Args:
        run_ids: key (e.g. submodel id) -> flow run id.
        poll_interval_seconds: polling interval.
        on_final: called as ``on_final(key, flow_run)`` once per run when it ends.
        timeout_seconds: give up after this long (``None``: wait as long as it takes).
        on_poll: called after every poll with key -> flow run of every run read (live views).

    Returns:
        key -> the finished flow run.

    Raises:
        DeploymentRunError: ``timeout_seconds`` passed with runs still unfinished.
    """
    by_id = {UUID(v): k for k, v in run_ids.items()}
    done: dict[str, FlowRun] = {}
    deadline = None if timeout_seconds is None else time.monotonic() + timeout_seconds
    while len(done) < len(by_id):
        runs = read_runs({k: v for k, v in run_ids.items() if k not in done})
        if on_poll is not None:
            on_poll(runs)
        for key, run in runs.items():
            if run.state is not None and run.state.is_final():
                done[key] = run
                if on_final is not None:
                    on_final(key, run)
        if len(done) < len(by_id):
            if deadline is not None and time.monotonic() > deadline:
                left = sorted(k for k in by_id.values() if k not in done)
                raise DeploymentRunError(f"runs still unfinished after {timeout_seconds} s: {left}")
            time.sleep(poll_interval_seconds)
    return done


def read_runs(run_ids: dict[str, str]) -> dict[str, FlowRun]:
    """Key -> the flow run now, for key -> flow run id (one API call per
    :data:`API_PAGE_LIMIT` runs; a run the server does not know is left out)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    by_id = {UUID(v): k for k, v in run_ids.items()}
    ids = list(by_id)
    with get_client(sync_client=True) as client:
        runs = [
            run
            for n in range(0, len(ids), API_PAGE_LIMIT)
            for run in client.read_flow_runs(
                flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=ids[n : n + API_PAGE_LIMIT])),
                limit=API_PAGE_LIMIT,
            )
        ]
    return {by_id[run.id]: run for run in runs}


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
        message = state_text(run.state) or run.state.name or "failed"
    return SubmodelResult(
        submodel_id=submodel_id,
        fingerprint=submodel.fingerprint,
        status="failed",
        error=f"deployment run {run.name} ({run.id}) {run.state.name}: {message}".split("\n")[0],
    )


_EXCEPTION_PREFIX = re.compile(r"^(Flow run encountered an exception\.?:?\s*)?(\w+Error:\s*)?")


def state_text(state: State[Any] | None) -> str:
    """A run state's message in words, without Prefect's ``Flow run encountered an exception``
    and the exception class (``"Injected failure"``)."""
    if state is None:
        return ""
    message = (state.message or "").split("\n")[0]
    return _EXCEPTION_PREFIX.sub("", message).strip()


def run_history(client: SyncPrefectClient, run: FlowRun) -> list[str]:
    """The outcomes of a flow run's tries, oldest first, in words (``"run 1 Failed: Injected
    failure"``, ``"run 2 Completed"``): one per final state in its state history, so the
    failures before a retry stay visible."""
    states = sorted(client.read_flow_run_states(run.id), key=lambda s: s.timestamp)
    out: list[str] = []
    for state in states:
        if state.is_final():
            text = state_text(state)
            out.append(f"run {len(out) + 1} {state.name}" + (f": {text}" if text else ""))
    return out


def child_runs(parent_flow_run_id: UUID | str) -> dict[str, FlowRun]:
    """Submodel id -> the ``process_submodel`` run a parent run started (found again after the
    parent is retried, with its whole state history on the server)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentFlowRunId

    flow_filter = FlowRunFilter(
        parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[UUID(str(parent_flow_run_id))])
    )
    runs: list[FlowRun] = []
    with get_client(sync_client=True) as client:
        while True:  # the API answers at most API_PAGE_LIMIT runs per call
            page = client.read_flow_runs(
                flow_run_filter=flow_filter, limit=API_PAGE_LIMIT, offset=len(runs)
            )
            runs += page
            if len(page) < API_PAGE_LIMIT:
                break
    return {
        str(r.parameters["submodel_id"]): r for r in runs if "submodel_id" in (r.parameters or {})
    }


_STATE_WORDS = {
    "SCHEDULED": "waiting",
    "PENDING": "starting",
    "RUNNING": "running",
    "PAUSED": "paused",
    "CANCELLING": "cancelling",
}


def board_state(state: State[Any] | None) -> str:
    """A child run's state as a submodel state of the board (``cached`` for a Cached run,
    ``retrying`` while a retry waits for a worker)."""
    if state is None:
        return "waiting"
    if state.name == "Cached":
        return "cached"
    if state.name == "AwaitingRetry":
        return "retrying"
    return _STATE_WORDS.get(state.type.value, state.type.value.lower())


class ChildRunFeed:
    """Feeds the board from the child runs a parent polls: state, runs, time and history
    (read from the server once per new state of a child).

    Args:
        board: the submodels' states.
        publish: called once after a poll that changed the board (the live table).
    """

    def __init__(self, board: SubmodelBoard, publish: Callable[[], None]) -> None:
        """Start with no child state seen."""
        self.board = board
        self.publish = publish
        self._seen: dict[str, object] = {}

    def __call__(self, runs: dict[str, FlowRun]) -> None:
        """Record each child whose state changed since the last poll; publish once if any did."""
        from prefect.client.orchestration import get_client

        changed = False
        with get_client(sync_client=True) as client:
            for sid, run in runs.items():
                state_id = run.state.id if run.state is not None else None
                if self._seen.get(sid) == state_id:
                    continue
                self._seen[sid] = state_id
                changed |= self._update(client, sid, run)
        if changed:
            self.publish()

    def _update(self, client: SyncPrefectClient, sid: str, run: FlowRun) -> bool:
        history = run_history(client, run)
        state = board_state(run.state)
        failed = state in ("failed", "crashed", "cancelled")
        fields: RowFields = {
            "state": state,
            "runs": max(run.run_count, len(history)),
            "seconds": run.total_run_time.total_seconds() if run.run_count else None,
            "history": history,
            "error": state_text(run.state) if failed else "",
        }
        if state in ("completed", "cached"):
            fields["fraction"] = 1.0
        return self.board.update(sid, **fields)


def show_child_history(table: LiveSubmodelTable) -> None:
    """Put the tries of the children this parent run started before it was retried on the
    board: runs, failures before success and times stay visible; reused submodels keep
    showing ``cached``."""
    from prefect.runtime import flow_run

    children = child_runs(flow_run.id)
    if not children:
        return
    cached = {sid for sid, row in table.board.rows.items() if row.state == "cached"}
    ChildRunFeed(table.board, lambda: None)(children)
    for sid in cached & set(children):
        table.board.update(sid, state="cached")
    table.publish(now=True)


@dataclass(frozen=True)
class SubmodelChildren:
    """How a parent runs its pending submodels as deployment runs.

    Attributes:
        deployment: ``"flow/deployment"`` of the ``process_submodel`` deployment.
        queue: work queue of the children (``None``: the deployment's default).
        nodes: node URLs without credentials (``None``: each worker's built-in engine).
        node_pool: the ``NodeODMPool`` block the children load instead of ``nodes``.
        force: process again even when stored results exist.
    """

    deployment: str
    queue: str | None
    nodes: list[str] | None
    node_pool: str | None
    force: bool

    def run(
        self, pending: list[str], plan: SplitPlan, layout: OutputLayout, table: LiveSubmodelTable
    ) -> dict[str, SubmodelResult]:
        """One deployment run per pending submodel (created from tasks, so each is linked to
        the parent and can be retried from the UI), named after the survey and submodel, then
        wait for all of them while the live table follows them."""
        logger = get_run_logger()
        source = str(storage.read_json(layout.survey_json)["source"])
        futures = [
            start_submodel_run.submit(
                self.deployment,
                layout.plan_json,
                sid,
                layout.root,
                list(self.nodes) if self.nodes else None,
                self.force,
                self.queue,
                node_pool=self.node_pool,
                run_name=submodel_run_name(source, plan.survey_fingerprint, sid),
            )
            for sid in pending
        ]
        run_ids = {sid: f.result() for sid, f in zip(pending, futures, strict=True)}

        def on_final(sid: str, run: FlowRun) -> None:
            state = run.state.name if run.state and run.state.name else "?"
            logger.info("%s: deployment run %s ended %s", sid, run.name, state)
            progress.emit(
                progress.SubmodelEvent(submodel_id=sid, state=state.lower(), fraction=1.0)
            )

        feed = ChildRunFeed(table.board, table.publish)
        runs = wait_for_runs(run_ids, on_final=on_final, on_poll=feed)
        results = {sid: result_of(runs[sid], plan, sid, layout.root) for sid in pending}
        builtin = not self.nodes and not self.node_pool
        for sid, result in results.items():
            if result.node_url:
                node = "built-in engine" if builtin else result.node_url
                table.board.update(sid, node=node, attempts=result.attempts)
        table.publish(now=True)
        return results
