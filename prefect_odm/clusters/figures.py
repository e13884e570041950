"""The capacity figures of a cluster, as JSON and as Prometheus text (pure).

This is the contract an autoscaler (KEDA's metrics-api scaler), a dashboard or the Kubernetes
manifests read from ``GET /clusters/{name}`` and ``GET /metrics``; the service that fills it from
Prefect's API and the nodes' ``/info`` is separate. Memory in GiB, ages in seconds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace

from prefect_odm.clusters.router import ClusterState

METRIC_PREFIX = "prefect_odm_cluster"


@dataclass(frozen=True)
class ClusterFigures:
    """One cluster's figures now.

    ``wanted_memory_gib`` is the estimated memory of the submodels waiting in its queue plus those
    running on it; ``running_memory_gib`` the running ones alone; ``queue_depth`` the submodels
    waiting in its own queue; ``oldest_waiting_seconds`` the age of the oldest of them (0 when
    none waits); ``ready`` whether its queue has a live worker and some node answers.
    """

    cluster: str
    wanted_memory_gib: float
    running_memory_gib: float
    queue_depth: int
    oldest_waiting_seconds: float
    ready: bool
    memory_capacity_gib: float | None = None
    nodes_up: int = 0
    nodes_total: int = 0

    def to_json(self) -> dict[str, object]:
        """The JSON object of ``GET /clusters/{name}``."""
        return asdict(self)

    def used_by(self, state: ClusterState) -> ClusterState:
        """``state`` with these figures' memory in use and readiness (for the router)."""
        return replace(state, memory_in_use_gib=self.wanted_memory_gib, down=not self.ready)


_METRICS = (
    ("wanted_memory_gib", "gauge", "Memory wanted by waiting and running submodels, GiB."),
    ("running_memory_gib", "gauge", "Memory of running submodels, GiB."),
    ("queue_depth", "gauge", "Submodels waiting in the cluster's own queue."),
    ("oldest_waiting_seconds", "gauge", "Age of the oldest waiting submodel, seconds."),
    ("ready", "gauge", "1 when the cluster's queue has a live worker and a node answers."),
    ("nodes_up", "gauge", "Nodes answering /info."),
)


def prometheus_text(figures: Sequence[ClusterFigures]) -> str:
    """The figures in Prometheus' text exposition format (version 0.0.4), one sample per
    cluster and metric, labelled ``cluster``."""
    lines: list[str] = []
    for field, kind, help_text in _METRICS:
        name = f"{METRIC_PREFIX}_{field}"
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
        for f in sorted(figures, key=lambda f: f.cluster):
            value = float(getattr(f, field))
            lines.append(f'{name}{{cluster="{f.cluster}"}} {value:g}')
    return "\n".join(lines) + "\n"
