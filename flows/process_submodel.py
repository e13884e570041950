"""The ``process_submodel`` flow: one submodel on the node pool, as its own flow run.

Run inline as a subflow of ``reconstruct`` (notebooks, the command line) or as a deployment run
(workers on other machines; the UI's Retry button). Its parameters are small: a reference to the
stored plan and the submodel id, never the image list.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager

from prefect import flow, get_run_logger
from prefect_odm.tasks.admission import DEFAULT_LIMIT_NAME, ensure_memory_limit, memory_slots

from prefect_odm import storage
from prefect_odm.cluster import Cluster, connect_nodes, embedded_engine
from prefect_odm.errors import SubmodelFailedError
from prefect_odm.layout import OutputLayout
from prefect_odm.models import SplitPlan, SubmodelResult, Survey
from prefect_odm.submodels import SubmodelRunner

_active: dict[tuple[str, ...], Cluster] = {}
_active_lock = threading.Lock()


@contextmanager
def sharing_cluster(cluster: Cluster) -> Iterator[None]:
    """Let ``process_submodel`` runs in this process place work through ``cluster``'s pool.

    Concurrent inline subflows must share one placement pool, or each would think it had the
    nodes to itself.
    """
    key = tuple(sorted(cluster.clients))
    with _active_lock:
        _active[key] = cluster
    try:
        yield
    finally:
        with _active_lock:
            _active.pop(key, None)


@contextmanager
def _cluster_for(
    nodes: list[str] | None, pipeline: str, node_pool: str | None = None
) -> Iterator[Cluster]:
    from prefect_odm.cluster import load_pool_block, split_token

    settings = None
    if node_pool:
        nodes, settings = load_pool_block(node_pool)
    if nodes:
        key = tuple(sorted(split_token(u)[0] for u in nodes))
        with _active_lock:
            shared = _active.get(key)
        if shared is not None:
            yield shared
            return
        yield connect_nodes(nodes, settings=settings)
        return
    with embedded_engine(pipeline) as cluster:
        yield cluster


@contextmanager
def _progress_artifact(submodel_id: str) -> Iterator[None]:
    """A progress artifact for this submodel run, fed by the runner's progress events (at most
    one update every 2 s, and every change of state)."""
    from prefect.artifacts import create_progress_artifact, update_progress_artifact

    from prefect_odm import progress

    artifact_id = create_progress_artifact(progress=0.0, description=f"{submodel_id}: starting")
    last = {"t": 0.0, "state": ""}

    def listen(event: dict[str, object]) -> None:
        if event.get("kind") != "submodel" or event.get("id") != submodel_id:
            return
        now = time.monotonic()
        state = str(event.get("state", ""))
        if state == last["state"] and now - float(last["t"]) < 2.0:
            return
        last.update(t=now, state=state)
        fraction = float(event.get("fraction", 0.0))  # type: ignore[arg-type]
        update_progress_artifact(
            artifact_id, progress=round(100.0 * fraction, 1), description=f"{submodel_id}: {state}"
        )

    unsubscribe = progress.subscribe(listen)
    try:
        yield
    finally:
        unsubscribe()


@flow(name="process_submodel", flow_run_name="{submodel_id}", validate_parameters=True)
def process_submodel(
    plan_url: str,
    submodel_id: str,
    output: str,
    nodes: list[str] | None = None,
    force: bool = False,
    memory_limit_name: str = DEFAULT_LIMIT_NAME,
    node_pool: str | None = None,
) -> SubmodelResult:
    """Process one submodel of a stored plan, or reuse its stored result.

    Args:
        plan_url: location of the run's ``plan/plan.json`` (``survey.json`` sits beside it).
        submodel_id: e.g. ``submodel-003``.
        output: the run's output root (local path or fsspec URL).
        nodes: NodeODM node URLs; none starts the built-in engine for this run.
        force: process again even when a stored result with the same fingerprint exists.
        node_pool: name of a saved ``NodeODMPool`` block to use instead of ``nodes``.
        memory_limit_name: Prefect global concurrency limit whose slots stand for the pool's
            memory in GiB (created or resized to the pool's memory when the run starts).

    Returns:
        The submodel's result. Transient node failures are retried, on another node when one is
        down.

    Raises:
        SubmodelFailedError: the submodel failed for good; carries the result with the node's
            last output lines.
    """
    logger = get_run_logger()
    plan = SplitPlan.model_validate(storage.read_json(plan_url))
    survey = Survey.model_validate(storage.read_json(plan_url.rsplit("/", 1)[0] + "/survey.json"))
    layout = OutputLayout(output, plan.survey_fingerprint)
    with _cluster_for(nodes, plan.options.pipeline, node_pool) as cluster:
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
        with _progress_artifact(submodel_id):
            result = runner.run(submodel_id, force=force)
    if result.status == "failed":
        # Fail the flow run, so the UI shows it failed and offers Retry on it.
        raise SubmodelFailedError(result)
    return result
