"""Each cluster's live figures, from Prefect's public API and its nodes' ``/info``.

* **Queue depth**: ``POST /flow_runs/count`` of the runs in the cluster's work pool and own queue
  whose state is ``SCHEDULED`` or ``PENDING`` (waiting for a worker).
* **Oldest waiting age**: now minus the earliest ``expected_start_time`` of those runs, seconds
  (0 when none waits, and never negative: a run scheduled for later has not waited yet).
* **Wanted memory**: the memory estimate of every waiting or ``RUNNING`` submodel run of the
  queue, GiB. A run says it by its ``memory_gib`` parameter, a ``memory-gib:<GiB>`` tag, or else
  (how ``tasks/deployment.py`` submits submodels: ``plan_url`` and ``submodel_id`` parameters)
  the ``estimated_memory_gib`` of that submodel in the stored ``plan.json`` (read once per plan).
  A run none of these describe counts 0 and is named in ``unknown_memory_runs``.
* **Nodes**: ``GET /info`` of each node (2 s time-out): nodes up of total, memory capacity
  (the directory's ``memory_gib``, else the nodes' usable memory, 90 % of their ``totalMemory``).
* **Ready**: the cluster's work queue is ``READY`` (a worker polled it lately; Prefect marks it
  ``NOT_READY`` about three heartbeats after the last worker stops) and some node answers.

A run taken from the global overflow queue keeps that queue's name; the ``process_submodel`` run
tags itself ``cluster:<name>`` when it starts on a cluster (:func:`cluster_tag`), and the
cluster's wanted and running memory count its ``RUNNING`` runs of the global queue so tagged.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import httpx

from prefect_odm.clusters.directory import ClusterDirectory, ClusterSpec
from prefect_odm.clusters.figures import ClusterFigures
from prefect_odm.nodes.backend import NodeInfo
from prefect_odm.nodes.capacity import node_capacity, node_memory_gib

INFO_TIMEOUT_SECONDS = 2.0
"""How long one node's ``/info`` may take before it counts as down."""

PAGE = 200
"""Runs read per API call (the API's own limit)."""

MEMORY_TAG_PREFIX = "memory-gib:"
"""Tag prefix of a run's memory estimate, e.g. ``memory-gib:12.5``."""

WAITING_STATES = ("SCHEDULED", "PENDING")
RUNNING_STATES = ("RUNNING",)

CLUSTER_TAG_PREFIX = "cluster:"
"""Tag prefix of the cluster a submodel run ran on, e.g. ``cluster:eu``."""


def cluster_tag(name: str) -> str:
    """The tag a submodel run carries once it runs on cluster ``name``."""
    return f"{CLUSTER_TAG_PREFIX}{name}"


def tagged_cluster(tags: Iterable[str]) -> str | None:
    """The cluster a run's tags say it ran on, or ``None``."""
    for tag in tags:
        if tag.startswith(CLUSTER_TAG_PREFIX):
            return tag.removeprefix(CLUSTER_TAG_PREFIX)
    return None


@dataclass(frozen=True)
class NodeFigures:
    """What the nodes' ``/info`` answered: ``up`` of ``total`` nodes, memory in GiB, and the
    engine identities of the nodes up (``"{engine} {engineVersion}"``, sorted)."""

    up: int
    total: int
    usable_memory_gib: float | None
    available_memory_gib: float | None
    largest_node_gib: float | None
    engines: tuple[str, ...] = ()


def node_figures(
    urls: Sequence[str],
    tokens: Mapping[str, str | None] | None = None,
    configured_gib: Mapping[str, float | None] | None = None,
    timeout_seconds: float = INFO_TIMEOUT_SECONDS,
) -> NodeFigures:
    """Ask each node's ``GET /info`` (NodeODM API) once.

    Args:
        urls: node URLs without tokens.
        tokens: URL -> token (sent as ``?token=`` to that node only).
        configured_gib: URL -> memory a pool block sets for the node (wins over ``/info``).
        timeout_seconds: per node; a node slower than this, refusing or answering an error is down.

    Returns:
        Nodes up of total; the sum of the up nodes' usable memory (``None`` when none is known);
        the sum of their ``availableMemory``; the largest up node's usable memory.
    """
    up = 0
    usable: list[float] = []
    available: list[float] = []
    engines: set[str] = set()
    with httpx.Client(timeout=timeout_seconds) as http:
        for url in urls:
            token = (tokens or {}).get(url)
            try:
                res = http.get(
                    f"{url.rstrip('/')}/info", params={"token": token} if token else None
                )
                res.raise_for_status()
                info = res.json()
            except (httpx.HTTPError, ValueError):
                continue
            if not isinstance(info, dict):
                continue
            up += 1
            engines.add(NodeInfo.from_json(info).identity)
            cap = node_capacity(info)
            gib = node_memory_gib(cap, (configured_gib or {}).get(url))
            if gib is not None:
                usable.append(gib)
            if cap.available_memory_bytes is not None:
                available.append(cap.available_memory_bytes / 1024**3)
    return NodeFigures(
        up=up,
        total=len(urls),
        usable_memory_gib=round(sum(usable), 3) if usable else None,
        available_memory_gib=round(sum(available), 3) if available else None,
        largest_node_gib=max(usable) if usable else None,
        engines=tuple(sorted(engines)),
    )


def run_memory_gib(
    parameters: Mapping[str, Any],
    tags: Iterable[str],
    plan_memory: Callable[[str, str], float | None],
) -> float | None:
    """One submodel run's memory estimate, GiB, or ``None`` when nothing says it.

    In order: the ``memory_gib`` parameter, a ``memory-gib:<GiB>`` tag, the plan's estimate of
    the run's ``submodel_id`` read through ``plan_memory(plan_url, submodel_id)``.
    """
    value = parameters.get("memory_gib")
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    for tag in tags:
        if tag.startswith(MEMORY_TAG_PREFIX):
            try:
                gib = float(tag.removeprefix(MEMORY_TAG_PREFIX))
            except ValueError:
                continue
            if math.isfinite(gib) and gib >= 0:
                return gib
    plan_url, submodel_id = parameters.get("plan_url"), parameters.get("submodel_id")
    if isinstance(plan_url, str) and isinstance(submodel_id, str):
        return plan_memory(plan_url, submodel_id)
    return None


class PlanMemory:
    """``estimated_memory_gib`` of submodels in stored ``plan.json`` files, each read once
    (a stored plan never changes; one that cannot be read is asked again next time)."""

    def __init__(self) -> None:
        """Start with no plan read."""
        self._plans: dict[str, dict[str, float]] = {}

    def __call__(self, plan_url: str, submodel_id: str) -> float | None:
        """The submodel's ``estimated_memory_gib`` in the plan at ``plan_url`` (None: unknown)."""
        if plan_url not in self._plans:
            from prefect_odm.storage import read_json

            try:
                plan = read_json(plan_url)
                self._plans[plan_url] = {
                    str(s["id"]): float(s["estimated_memory_gib"]) for s in plan["submodels"]
                }
            except (OSError, ValueError, KeyError, TypeError):
                return None
        return self._plans[plan_url].get(submodel_id)


@dataclass(frozen=True)
class QueueFigures:
    """A work queue's runs: depth, oldest waiting age (s), memory of waiting and running ones."""

    queue_depth: int
    oldest_waiting_seconds: float
    wanted_memory_gib: float
    running_memory_gib: float
    unknown_memory_runs: tuple[str, ...]
    queue_ready: bool


def _filters(cluster: ClusterSpec, queue_name: str) -> tuple[Any, Any]:
    """Prefect's work pool and work queue filters of ``queue_name`` in the cluster's pool."""
    from prefect.client.schemas.filters import (
        WorkPoolFilter,
        WorkPoolFilterName,
        WorkQueueFilter,
        WorkQueueFilterName,
    )

    return (
        WorkPoolFilter(name=WorkPoolFilterName(any_=[cluster.work_pool])),
        WorkQueueFilter(name=WorkQueueFilterName(any_=[queue_name])),
    )


def _runs_filter(states: Sequence[str], tag: str | None = None) -> Any:
    """A flow run filter of these state types (and this tag)."""
    from prefect.client.schemas.filters import (
        FlowRunFilter,
        FlowRunFilterState,
        FlowRunFilterStateType,
        FlowRunFilterTags,
    )
    from prefect.client.schemas.objects import StateType

    types = [StateType(s) for s in states]
    return FlowRunFilter(
        state=FlowRunFilterState(type=FlowRunFilterStateType(any_=types)),
        tags=FlowRunFilterTags(all_=[tag]) if tag else None,
    )


def _run_memory(
    client: Any,
    flow_run_filter: Any,
    filters: tuple[Any, Any],
    plan_memory: Callable[[str, str], float | None],
) -> tuple[float, float, list[str]]:
    """(memory of the runs, of those running, names of runs whose memory nothing says), GiB,
    read in pages of :data:`PAGE` runs."""
    from prefect.client.schemas.sorting import FlowRunSort

    wanted = running = 0.0
    unknown: list[str] = []
    offset = 0
    while True:
        runs = client.read_flow_runs(
            flow_run_filter=flow_run_filter,
            work_pool_filter=filters[0],
            work_queue_filter=filters[1],
            sort=FlowRunSort.ID_DESC,
            limit=PAGE,
            offset=offset,
        )
        for run in runs:
            gib = run_memory_gib(run.parameters or {}, run.tags or (), plan_memory)
            if gib is None:
                unknown.append(run.name)
                continue
            wanted += gib
            if run.state_type is not None and run.state_type.value in RUNNING_STATES:
                running += gib
        if len(runs) < PAGE:
            return wanted, running, unknown
        offset += PAGE


def queue_figures(
    client: Any,
    cluster: ClusterSpec,
    plan_memory: Callable[[str, str], float | None],
    global_queue: str | None = None,
) -> QueueFigures:
    """Count and read the cluster's queue through Prefect's API (``client``: a sync Prefect
    client). A queue that does not exist yet is empty and not ready; a paused one is not ready.
    With ``global_queue``, the cluster's wanted and running memory include the runs of that
    queue running on it (tagged :func:`cluster_tag`)."""
    from prefect.client.schemas.objects import WorkQueueStatus
    from prefect.client.schemas.sorting import FlowRunSort
    from prefect.exceptions import ObjectNotFound

    own = _filters(cluster, cluster.queue)
    try:
        status = client.read_work_queue_by_name(cluster.queue, work_pool_name=cluster.work_pool)
        ready = status.status == WorkQueueStatus.READY
    except ObjectNotFound:
        ready = False
    waiting = _runs_filter(WAITING_STATES)
    depth = int(
        client.count_flow_runs(
            flow_run_filter=waiting, work_pool_filter=own[0], work_queue_filter=own[1]
        )
    )
    oldest = 0.0
    if depth:
        first = client.read_flow_runs(
            flow_run_filter=waiting,
            work_pool_filter=own[0],
            work_queue_filter=own[1],
            sort=FlowRunSort.EXPECTED_START_TIME_ASC,
            limit=1,
        )
        start = first[0].expected_start_time if first else None
        if start is not None:
            oldest = max(0.0, (datetime.now(UTC) - start).total_seconds())
    active = _runs_filter(WAITING_STATES + RUNNING_STATES)
    wanted, running, unknown = _run_memory(client, active, own, plan_memory)
    if global_queue is not None and cluster.reads_global:
        taken = _runs_filter(RUNNING_STATES, tag=cluster_tag(cluster.name))
        more = _run_memory(client, taken, _filters(cluster, global_queue), plan_memory)
        wanted, running, unknown = wanted + more[0], running + more[1], unknown + more[2]
    return QueueFigures(
        queue_depth=depth,
        oldest_waiting_seconds=round(oldest, 3),
        wanted_memory_gib=round(wanted, 3),
        running_memory_gib=round(running, 3),
        unknown_memory_runs=tuple(unknown),
        queue_ready=ready,
    )


def cluster_nodes(
    cluster: ClusterSpec,
) -> tuple[list[str], dict[str, str | None], dict[str, float | None]]:
    """The cluster's node URLs, tokens and configured memory (from its ``NodeODM Pool`` block
    when it names one).

    Raises:
        InputError: the named pool block does not exist.
    """
    if cluster.node_pool is None:
        return list(cluster.nodes), {}, {}
    from prefect_odm.blocks.nodes import load_pool_block

    urls, settings = load_pool_block(cluster.node_pool)
    return (
        urls,
        {u: s.token for u, s in settings.items()},
        {u: s.memory_gib for u, s in settings.items()},
    )


@dataclass(frozen=True)
class ClusterProbe:
    """One cluster now, as the router needs it: its figures, its largest node up (GiB), the
    engine its nodes run (``" | "``-joined when they differ; ``None`` when none answers) and
    why it is down (``None`` when ready)."""

    figures: ClusterFigures
    largest_node_gib: float | None
    engine_identity: str | None
    down_reason: str | None


def cluster_probe(
    client: Any,
    cluster: ClusterSpec,
    plan_memory: Callable[[str, str], float | None],
    global_queue: str | None = None,
) -> ClusterProbe:
    """One cluster's figures and node facts now (a sync Prefect client; nodes over HTTP).

    Raises:
        InputError: the cluster names a pool block that does not exist.
    """
    urls, tokens, configured = cluster_nodes(cluster)
    nodes = node_figures(urls, tokens, configured)
    queue = queue_figures(client, cluster, plan_memory, global_queue)
    figures = ClusterFigures(
        cluster=cluster.name,
        wanted_memory_gib=queue.wanted_memory_gib,
        running_memory_gib=queue.running_memory_gib,
        queue_depth=queue.queue_depth,
        oldest_waiting_seconds=queue.oldest_waiting_seconds,
        ready=queue.queue_ready and nodes.up > 0,
        memory_capacity_gib=cluster.memory_gib or nodes.usable_memory_gib,
        nodes_up=nodes.up,
        nodes_total=nodes.total,
    )
    down = None
    if not queue.queue_ready:
        down = f"queue {cluster.queue} of pool {cluster.work_pool} not ready (no worker polls it)"
    elif nodes.up == 0:
        down = f"no node answers /info (0 of {nodes.total})"
    return ClusterProbe(
        figures=figures,
        largest_node_gib=cluster.largest_node_gib or nodes.largest_node_gib,
        engine_identity=cluster.engine_identity or (" | ".join(nodes.engines) or None),
        down_reason=down,
    )


def cluster_figures(
    client: Any,
    cluster: ClusterSpec,
    plan_memory: Callable[[str, str], float | None],
    global_queue: str | None = None,
) -> ClusterFigures:
    """One cluster's figures now (see :func:`cluster_probe`).

    Raises:
        InputError: the cluster names a pool block that does not exist.
    """
    return cluster_probe(client, cluster, plan_memory, global_queue).figures


def directory_probes(
    directory: ClusterDirectory, plan_memory: Callable[[str, str], float | None] | None = None
) -> list[ClusterProbe]:
    """Every cluster's probe now, in the directory's order (one Prefect client for all)."""
    from prefect.client.orchestration import get_client

    memory = plan_memory or PlanMemory()
    with get_client(sync_client=True) as client:
        return [
            cluster_probe(client, c, memory, directory.global_queue) for c in directory.clusters
        ]


def directory_figures(
    directory: ClusterDirectory, plan_memory: Callable[[str, str], float | None] | None = None
) -> list[ClusterFigures]:
    """Every cluster's figures now, in the directory's order (one Prefect client for all)."""
    return [p.figures for p in directory_probes(directory, plan_memory)]
