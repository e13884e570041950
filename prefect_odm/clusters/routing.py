"""From a run's plan and the clusters' probes to the router's inputs, and back to records (pure).

* :func:`cluster_states`: each cluster's :class:`~prefect_odm.clusters.router.ClusterState`
  from its directory entry and its probe (figures, largest node, engine, down or not);
* :func:`survey_states`: the clusters a survey may use before it is planned (groups, not down),
  :func:`plan_engine` the engine identity its plan is made for (the first of them in the
  router's order: data-near, local, cheapest), :func:`split_memory_gib` the largest node of
  each cluster that runs it, for ``--split auto`` and the one-task-or-split-merge choice;
* :func:`area_split`: the optional area rule;
* :func:`demand_for` and :func:`record_of`: a submodel's demand, a decision as a manifest record.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from prefect_odm.clusters.capacity import ClusterProbe
from prefect_odm.clusters.directory import ClusterDirectory
from prefect_odm.clusters.records import RouteRecord, RoutingOptions
from prefect_odm.clusters.router import (
    ClusterState,
    RouteDecision,
    SubmodelDemand,
    eligible_clusters,
    why_not_eligible,
)
from prefect_odm.models import Submodel


def cluster_states(
    directory: ClusterDirectory, probes: Sequence[ClusterProbe], *, workers: bool = True
) -> list[ClusterState]:
    """Each cluster's state for the router: memory in use is the memory wanted by its waiting
    and running submodels (its figures), down when its probe says so; with ``workers`` off (an
    inline run, which needs no worker), down only when none of its nodes answers."""
    by_name = {p.figures.cluster: p for p in probes}
    states: list[ClusterState] = []
    for spec in directory.clusters:
        probe = by_name[spec.name]
        states.append(
            ClusterState(
                name=spec.name,
                work_queue=spec.queue,
                memory_capacity_gib=probe.figures.memory_capacity_gib,
                largest_node_gib=probe.largest_node_gib,
                memory_in_use_gib=probe.figures.wanted_memory_gib,
                cost_per_node_hour=spec.cost_per_node_hour,
                region=spec.region,
                data_regions=tuple(spec.data_regions),
                groups=tuple(spec.groups),
                engine_identity=probe.engine_identity,
                down=probe.down_reason is not None if workers else probe.figures.nodes_up == 0,
                reads_global=spec.reads_global,
            )
        )
    return states


def _preference(state: ClusterState, options: RoutingOptions) -> tuple[int, float, str]:
    """The router's order without memory: data-near, local, others; then cost, then name."""
    if options.data_region is not None and options.data_region in state.data_regions:
        tier = 0
    elif options.local_region is not None and state.region == options.local_region:
        tier = 1
    else:
        tier = 2
    return tier, state.cost_per_node_hour, state.name


def survey_states(states: Sequence[ClusterState], options: RoutingOptions) -> list[ClusterState]:
    """The clusters the run's user may use that are up and whose largest node and engine are
    known, in the router's order of preference.

    Raises:
        RoutingError: none (one line naming why each was left out).
    """
    anyone = SubmodelDemand(submodel_id="survey", memory_gib=0.0, groups=tuple(options.groups))
    usable = eligible_clusters(
        states,
        lambda s: (
            why_not_eligible(s, anyone) or ("engine unknown" if s.engine_identity is None else None)
        ),
        f"cluster directory {options.directory}: no cluster can take this survey",
    )
    return sorted(usable, key=lambda s: _preference(s, options))


def plan_engine(usable: Sequence[ClusterState]) -> str:
    """The engine identity the plan is made for: the most preferred usable cluster's (a
    submodel's fingerprint holds it, so only clusters running it stay eligible)."""
    identity = usable[0].engine_identity
    assert identity is not None
    return identity


def split_memory_gib(usable: Sequence[ClusterState], engine_identity: str) -> list[float]:
    """The largest node of each usable cluster running ``engine_identity``, GiB: what
    ``--split auto`` sizes submodels by, and what decides one task against split-merge."""
    return [
        float(s.largest_node_gib)
        for s in usable
        if s.engine_identity == engine_identity and s.largest_node_gib is not None
    ]


def area_split(
    image_count: int, survey_area_m2: float, planned_split: int, split_area_m2: float | None
) -> int | None:
    """The split the area rule asks for, or ``None`` when it asks nothing.

    A survey of ``image_count`` images over ``survey_area_m2`` planned with ``planned_split``
    images per submodel keeps its split when each submodel covers at most ``split_area_m2``;
    else the split is the images of that area at the survey's mean density (at least 2).
    """
    if split_area_m2 is None or survey_area_m2 <= 0 or image_count <= 0:
        return None
    per_image_m2 = survey_area_m2 / image_count
    if planned_split * per_image_m2 <= split_area_m2:
        return None
    return max(2, math.floor(split_area_m2 / per_image_m2))


def demand_for(submodel: Submodel, options: RoutingOptions, engine_identity: str) -> SubmodelDemand:
    """What ``submodel`` asks of a cluster: its memory estimate, the user's groups, the plan's
    engine and the regions of the run."""
    return SubmodelDemand(
        submodel_id=submodel.id,
        memory_gib=submodel.estimated_memory_gib,
        groups=tuple(options.groups),
        engine_identity=engine_identity,
        data_region=options.data_region,
        local_region=options.local_region,
    )


def record_of(decision: RouteDecision, route: int, excluded: Sequence[str] = ()) -> RouteRecord:
    """The manifest's record of a decision (its outcome still ``waiting``)."""
    return RouteRecord(
        submodel_id=decision.submodel_id,
        route=route,
        cluster=decision.cluster,
        work_queue=decision.work_queue,
        reason=decision.reason,
        eligible=list(decision.eligible),
        excluded=sorted(excluded),
    )
