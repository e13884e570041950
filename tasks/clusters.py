"""The nodes a ``process_submodel`` run uses: the cluster its inline parent shares, a pool
block's nodes, node URLs, or the built-in engine started for the run.

Concurrent inline subflows must share one placement pool, or each would think it had the nodes
to itself. The parent shares its cluster through a context variable (:func:`sharing_cluster`),
which Prefect's thread-pool task runner copies into every task and subflow it starts: nothing is
registered process-wide, so two runs in one process never see each other's cluster.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from prefect_odm.blocks import load_pool_block

from prefect_odm.nodes.cluster import Cluster, connect_nodes, embedded_engine
from prefect_odm.settings import get_settings

_shared: ContextVar[tuple[Cluster, ...]] = ContextVar("prefect_odm_shared_cluster", default=())


@contextmanager
def sharing_cluster(*clusters: Cluster) -> Iterator[None]:
    """Let ``process_submodel`` runs in this process place work through these clusters' pools
    (a run given the nodes of one of them uses its pool; several: a run routed among clusters).

    Concurrent inline subflows must share one placement pool, or each would think it had the
    nodes to itself.
    """
    token = _shared.set(clusters)
    try:
        yield
    finally:
        _shared.reset(token)


@contextmanager
def cluster_for(
    nodes: list[str] | None, pipeline: str, node_pool: str | None = None
) -> Iterator[Cluster]:
    """The nodes a submodel run uses: the pool block's, else ``nodes`` (the cluster a parent
    shares when it has the same nodes, else connected here), else the node beside the flow in
    its pod (``PREFECT_ODM_POD_NODE``, set by the Kubernetes job template), else the built-in
    engine started for the block.

    Raises:
        InputError: no such pool block, or a node is not usable.
    """
    settings = None
    if not nodes and not node_pool and get_settings().pod_node:
        nodes = [str(get_settings().pod_node)]  # the node sidecar of a Kubernetes job
    if node_pool:
        nodes, settings = load_pool_block(node_pool)
    if nodes:
        for shared in _shared.get():
            if shared.serves(nodes):
                yield shared
                return
        yield connect_nodes(nodes, settings=settings)
        return
    with embedded_engine(pipeline) as cluster:
        yield cluster
