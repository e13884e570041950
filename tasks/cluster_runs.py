"""A ``process_submodel`` run on one cluster of a cluster directory: which cluster it is on,
the record of it on the server and in ``result.json``, and the outcome of a stopped run.

A run routed to a cluster's own queue is on that cluster; a run from the global overflow queue
is on the cluster of the worker that took it, which says so in its environment
(``PREFECT_ODM_CLUSTER``, passed by a process worker to the runs it starts). The run tags itself
``cluster:<name>`` as it starts, so the parent and the capacity figures see where it ran.
"""

from __future__ import annotations

from dataclasses import dataclass

from prefect_odm import storage
from prefect_odm.clusters.capacity import cluster_tag, tagged_cluster
from prefect_odm.clusters.directory import ClusterSpec
from prefect_odm.errors import InputError
from prefect_odm.layout import OutputLayout
from prefect_odm.models import SplitPlan, SubmodelResult
from prefect_odm.settings import get_settings


@dataclass(frozen=True)
class RunCluster:
    """The cluster a submodel run uses: its name (``None``: no cluster directory), nodes (URLs
    or a pool block), the memory limit whose slots stand for its GiB, and its configured memory
    (``None``: its nodes')."""

    name: str | None
    nodes: list[str] | None
    node_pool: str | None
    memory_limit_name: str
    memory_gib: float | None


def resolve_cluster(
    directory_name: str, routed: str | None, worker_first: bool = True
) -> RunCluster:
    """The cluster this run is on: the worker's ``PREFECT_ODM_CLUSTER``, else the cluster it
    was routed to (``worker_first`` off, an inline run: the cluster routed to first).

    Raises:
        InputError: no such directory or cluster, or a run of the global queue on a worker
            that does not say its cluster.
    """
    from prefect_odm.blocks.clusters import load_cluster_directory

    directory = load_cluster_directory(directory_name)
    worker = get_settings().cluster
    name = (worker or routed) if worker_first else (routed or worker)
    if name is None:
        raise InputError(
            f"this run came from the global queue {directory.global_queue!r}, but its worker "
            "does not say which cluster it is on: start it with PREFECT_ODM_CLUSTER=<name>"
        )
    try:
        spec: ClusterSpec = directory.get(name)
    except KeyError as exc:
        raise InputError(f"cluster directory {directory_name!r}: {exc.args[0]}") from None
    return RunCluster(
        name=spec.name,
        nodes=list(spec.nodes) or None,
        node_pool=spec.node_pool,
        memory_limit_name=spec.memory_limit_name,
        memory_gib=spec.memory_gib,
    )


def tag_this_run(cluster: str) -> None:
    """Add ``cluster:<cluster>`` to the current flow run's tags (replacing another cluster's
    tag: a retried run may have been on another cluster); a no-op outside a flow run."""
    from prefect.client.orchestration import get_client
    from prefect.context import FlowRunContext

    ctx = FlowRunContext.get()
    if ctx is None or ctx.flow_run is None:
        return
    tags = [t for t in (ctx.flow_run.tags or []) if tagged_cluster([t]) is None]
    tags.append(cluster_tag(cluster))
    with get_client(sync_client=True) as client:
        client.update_flow_run(ctx.flow_run.id, tags=tags)
    ctx.flow_run.tags = tags


def record_cluster(result: SubmodelResult, cluster: str, layout: OutputLayout) -> SubmodelResult:
    """The result with the cluster that processed it; a completed one's ``result.json`` is
    written again with it (atomically: it stays the submodel's done-marker)."""
    if result.status != "completed":
        return result.model_copy(update={"cluster": result.cluster or cluster})
    result = result.model_copy(update={"cluster": cluster})
    storage.write_json_atomic(
        layout.submodel_result(result.submodel_id, result.fingerprint),
        result.model_dump(mode="json"),
    )
    return result


def stopped_result(
    plan: SplitPlan, submodel_id: str, why: str, cluster: str | None
) -> SubmodelResult:
    """The failed result of a run its deadline or a cancellation stopped (the node task was
    cancelled): ``why`` is the reason in words, e.g. ``"timed out after 600 s on its node"``."""
    submodel = plan.submodel(submodel_id)
    return SubmodelResult(
        submodel_id=submodel_id,
        fingerprint=submodel.fingerprint,
        status="failed",
        cluster=cluster,
        error=f"{submodel_id}: {why}; its node task was cancelled",
    )
