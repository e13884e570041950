"""Which cluster a submodel goes to, and why: a pure function of the clusters' state.

The rule (the city-scale split-merge design's, with ClusterODM's piling and missing least-cost
priority in mind, ClusterODM#23, #66, #96):

1. **Eligible** clusters: the submodel's user shares one of the cluster's groups (or the cluster
   serves everyone), the cluster runs the engine the submodel's fingerprint was made for, its
   largest node holds the submodel's estimated memory, and it is not known to be down (nor
   excluded by a failover).
2. **Has room**: memory in use (waiting and running submodels) is under ``overflow_fraction``
   (80 %) of its capacity, and the submodel fits beside it (never overcommitted).
3. Among eligible clusters with room, the data-near ones (the submodel's data region is one of the
   cluster's) and then the local ones (same region) first; within each tier the cheapest per
   node-hour, then the emptiest, then by name. Locality comes before cost: moving a survey's
   images costs more than a dearer node-hour. Outside those tiers no dearer cluster is ever
   chosen while a cheaper eligible one has room.
4. No eligible cluster has room: the **global overflow queue**, read by every cluster's workers
   after their own, provided every cluster that reads it is eligible (otherwise an ineligible
   cluster could take it: one down, whose worker may live while its nodes are dead, or one the
   submodel was failed over from, counts as ineligible); else the eligible cluster with the
   most room left waits in its own queue.

No eligible cluster at all is a :class:`~prefect_odm.errors.RoutingError` naming why each
cluster was left out.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from prefect_odm.errors import RoutingError

EPSILON_GIB = 1e-9


@dataclass(frozen=True)
class ClusterState:
    """What the router knows of one cluster now.

    ``memory_capacity_gib`` and ``largest_node_gib`` are ``None`` when unknown (a cluster whose
    largest node is unknown is not eligible: the router never risks a node smaller than the
    estimate). ``memory_in_use_gib`` counts waiting and running submodels routed there.
    """

    name: str
    work_queue: str
    memory_capacity_gib: float | None
    largest_node_gib: float | None
    memory_in_use_gib: float = 0.0
    cost_per_node_hour: float = 0.0
    region: str | None = None
    data_regions: tuple[str, ...] = ()
    groups: tuple[str, ...] = ()
    engine_identity: str | None = None
    down: bool = False
    reads_global: bool = True

    def used_fraction(self) -> float:
        """Memory in use over capacity (1.0 when the capacity is unknown or zero)."""
        cap = self.memory_capacity_gib
        return 1.0 if not cap else self.memory_in_use_gib / cap


@dataclass(frozen=True)
class SubmodelDemand:
    """What a submodel asks of a cluster.

    ``groups`` are its user's groups (empty: a user of no group, who may use only the clusters
    that serve everyone); ``engine_identity`` is the one its fingerprint holds (``None``: any).
    """

    submodel_id: str
    memory_gib: float
    groups: tuple[str, ...] = ()
    engine_identity: str | None = None
    data_region: str | None = None
    local_region: str | None = None


@dataclass(frozen=True)
class RouteDecision:
    """Where a submodel goes: a cluster's own queue, or the global queue (``cluster=None``)."""

    submodel_id: str
    cluster: str | None
    work_queue: str
    reason: str
    eligible: tuple[str, ...] = field(default=())

    def as_record(self) -> dict[str, object]:
        """The decision as the manifest and the live table keep it."""
        return {
            "cluster": self.cluster,
            "work_queue": self.work_queue,
            "reason": self.reason,
            "eligible": list(self.eligible),
        }


def why_not_eligible(cluster: ClusterState, demand: SubmodelDemand) -> str | None:
    """Why ``cluster`` cannot take the submodel at all, or ``None`` when it can."""
    if cluster.down:
        return "down"
    if cluster.groups and not set(cluster.groups) & set(demand.groups):
        return f"serves groups {', '.join(cluster.groups)} only"
    if (
        demand.engine_identity is not None
        and cluster.engine_identity is not None
        and cluster.engine_identity != demand.engine_identity
    ):
        return f"runs {cluster.engine_identity}, not {demand.engine_identity}"
    if cluster.largest_node_gib is None:
        return "largest node unknown"
    if cluster.largest_node_gib + EPSILON_GIB < demand.memory_gib:
        return f"largest node {cluster.largest_node_gib:.1f} GiB < {demand.memory_gib:.1f} GiB"
    return None


def has_room(cluster: ClusterState, demand_gib: float, overflow_fraction: float) -> bool:
    """Whether ``cluster`` is under ``overflow_fraction`` of its memory and ``demand_gib`` fits
    beside what it holds."""
    cap = cluster.memory_capacity_gib
    if not cap:
        return False
    under = cluster.memory_in_use_gib < overflow_fraction * cap - EPSILON_GIB
    fits = cluster.memory_in_use_gib + demand_gib <= cap + EPSILON_GIB
    return under and fits


def _tier(cluster: ClusterState, demand: SubmodelDemand) -> int:
    """0 next to the data, 1 local, 2 elsewhere."""
    if demand.data_region is not None and demand.data_region in cluster.data_regions:
        return 0
    if demand.local_region is not None and cluster.region == demand.local_region:
        return 1
    return 2


_TIER_WORDS = ("next to its data", "local", "cheapest with room")


def eligible_clusters(
    clusters: Sequence[ClusterState],
    why_not: Callable[[ClusterState], str | None],
    what: str,
) -> list[ClusterState]:
    """The clusters ``why_not`` finds no reason against, in their order.

    Raises:
        RoutingError: none: ``what``, then each cluster with its reason, in one line.
    """
    eligible: list[ClusterState] = []
    refused: list[str] = []
    for cluster in clusters:
        why = why_not(cluster)
        if why is None:
            eligible.append(cluster)
        else:
            refused.append(f"{cluster.name} ({why})")
    if not eligible:
        raise RoutingError(f"{what}: " + ("; ".join(refused) or "no clusters"))
    return eligible


def route(
    demand: SubmodelDemand,
    clusters: Sequence[ClusterState],
    *,
    global_queue: str,
    overflow_fraction: float = 0.8,
    exclude: Sequence[str] = (),
) -> RouteDecision:
    """Route one submodel (see the module's rule).

    Args:
        demand: the submodel's memory estimate (GiB), its user's groups, engine and regions.
        clusters: every cluster's state now.
        global_queue: the overflow queue every cluster with ``reads_global`` reads.
        overflow_fraction: share of a cluster's memory under which it takes new work.
        exclude: clusters left out (a failover routes again without the cluster that failed).

    Returns:
        The decision with its reason in words.

    Raises:
        RoutingError: no cluster is eligible (the message names why for each).
    """
    eligible = eligible_clusters(
        clusters,
        lambda c: "failed over" if c.name in exclude else why_not_eligible(c, demand),
        f"{demand.submodel_id}: no cluster can take {demand.memory_gib:.1f} GiB",
    )
    names = tuple(sorted(c.name for c in eligible))
    roomy = [c for c in eligible if has_room(c, demand.memory_gib, overflow_fraction)]
    if roomy:
        best = min(
            roomy,
            key=lambda c: (_tier(c, demand), c.cost_per_node_hour, c.used_fraction(), c.name),
        )
        words = _TIER_WORDS[_tier(best, demand)]
        reason = (
            f"{words}: {best.memory_in_use_gib:.1f} of {best.memory_capacity_gib:.1f} GiB in use "
            f"(< {overflow_fraction:.0%}), {best.cost_per_node_hour:g}/node-hour"
        )
        return RouteDecision(demand.submodel_id, best.name, best.work_queue, reason, names)
    full = ", ".join(f"{c.name} {c.used_fraction():.0%}" for c in sorted(eligible, key=_by_name))
    # Every reader counts, down or failed over from too: a cluster whose nodes are down while
    # its worker lives still takes runs from the global queue.
    readers = [c for c in clusters if c.reads_global]
    if readers and all(c.name in names for c in readers):
        reason = f"overflow: every eligible cluster at or over {overflow_fraction:.0%} ({full})"
        return RouteDecision(demand.submodel_id, None, global_queue, reason, names)
    emptiest = min(eligible, key=lambda c: (c.used_fraction(), c.cost_per_node_hour, c.name))
    reason = (
        f"waits on {emptiest.name}: every eligible cluster at or over {overflow_fraction:.0%} "
        f"({full}) and the global queue is read by clusters it may not use"
    )
    return RouteDecision(demand.submodel_id, emptiest.name, emptiest.work_queue, reason, names)


def _by_name(cluster: ClusterState) -> str:
    return cluster.name


def route_all(
    demands: Sequence[SubmodelDemand],
    clusters: Sequence[ClusterState],
    *,
    global_queue: str,
    overflow_fraction: float = 0.8,
) -> list[RouteDecision]:
    """Route submodels one after the other, each decision adding its memory to the cluster it
    chose (a submodel sent to the global queue adds to none: any reader may take it).

    Raises:
        RoutingError: some submodel has no eligible cluster.
    """
    state = {c.name: c for c in clusters}
    decisions: list[RouteDecision] = []
    for demand in demands:
        decision = route(
            demand,
            list(state.values()),
            global_queue=global_queue,
            overflow_fraction=overflow_fraction,
        )
        if decision.cluster is not None:
            chosen = state[decision.cluster]
            state[chosen.name] = replace(
                chosen, memory_in_use_gib=chosen.memory_in_use_gib + demand.memory_gib
            )
        decisions.append(decision)
    return decisions
