"""The router's rules as invariants over random cluster fleets (hypothesis), plus the cases the
issue names: overflow at 80 %, locality before cost, and the global queue never handed to a
cluster the submodel may not use."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prefect_odm.clusters.directory import ClusterDirectory, ClusterSpec
from prefect_odm.clusters.router import (
    ClusterState,
    SubmodelDemand,
    has_room,
    route,
    route_all,
    why_not_eligible,
)
from prefect_odm.errors import RoutingError

GROUPS = ("city", "research", "ops")
REGIONS = ("eu", "us", "ap")
ENGINES = ("odm 3.5", "prefect-odm-engine 0.2")


@st.composite
def clusters(draw: st.DrawFn) -> list[ClusterState]:
    count = draw(st.integers(1, 6))
    fleet = []
    for i in range(count):
        cap = draw(st.one_of(st.none(), st.floats(4, 512)))
        fleet.append(
            ClusterState(
                name=f"c{i}",
                work_queue=f"c{i}",
                memory_capacity_gib=cap,
                largest_node_gib=draw(st.one_of(st.none(), st.floats(2, 128))),
                memory_in_use_gib=draw(st.floats(0, 600)),
                cost_per_node_hour=draw(st.sampled_from([0.0, 0.5, 1.0, 2.5])),
                region=draw(st.one_of(st.none(), st.sampled_from(REGIONS))),
                data_regions=tuple(draw(st.sets(st.sampled_from(REGIONS), max_size=2))),
                groups=tuple(draw(st.sets(st.sampled_from(GROUPS), max_size=2))),
                engine_identity=draw(st.one_of(st.none(), st.sampled_from(ENGINES))),
                down=draw(st.booleans()),
                reads_global=draw(st.booleans()),
            )
        )
    return fleet


demands = st.builds(
    SubmodelDemand,
    submodel_id=st.just("submodel-001"),
    memory_gib=st.floats(0.5, 100),
    groups=st.sets(st.sampled_from(GROUPS), max_size=2).map(tuple),
    engine_identity=st.one_of(st.none(), st.sampled_from(ENGINES)),
    data_region=st.one_of(st.none(), st.sampled_from(REGIONS)),
    local_region=st.one_of(st.none(), st.sampled_from(REGIONS)),
)


def _tier(c: ClusterState, d: SubmodelDemand) -> int:
    if d.data_region is not None and d.data_region in c.data_regions:
        return 0
    if d.local_region is not None and c.region == d.local_region:
        return 1
    return 2


@settings(max_examples=400, deadline=None)
@given(fleet=clusters(), demand=demands)
def test_the_router_keeps_its_three_promises(fleet: list[ClusterState], demand: SubmodelDemand):
    eligible = [c for c in fleet if why_not_eligible(c, demand) is None]
    if not eligible:
        with pytest.raises(RoutingError, match="no cluster can take"):
            route(demand, fleet, global_queue="global")
        return
    decision = route(demand, fleet, global_queue="global")
    by_name = {c.name: c for c in fleet}
    # Whoever may end up processing it: the chosen cluster, or every reader of the global queue.
    takers = (
        [by_name[decision.cluster]]
        if decision.cluster is not None
        else [c for c in fleet if c.reads_global and not c.down]
    )
    assert takers
    for c in takers:
        # 1. never a cluster outside the submodel's groups
        assert not c.groups or set(c.groups) & set(demand.groups)
        # 2. never a node smaller than the estimate
        assert c.largest_node_gib is not None and c.largest_node_gib >= demand.memory_gib - 1e-6
        assert not c.down
    roomy = [c for c in eligible if has_room(c, demand.memory_gib, 0.8)]
    if roomy:
        assert decision.cluster is not None
        chosen = by_name[decision.cluster]
        assert chosen in roomy
        # 3. never a dearer cluster while a cheaper eligible one of the same locality has room
        # (and nothing of a nearer locality has room)
        assert _tier(chosen, demand) == min(_tier(c, demand) for c in roomy)
        same = [c for c in roomy if _tier(c, demand) == _tier(chosen, demand)]
        assert chosen.cost_per_node_hour == min(c.cost_per_node_hour for c in same)
    else:
        assert decision.cluster is None or decision.cluster in decision.eligible


@settings(max_examples=200, deadline=None)
@given(fleet=clusters(), demand=demands)
def test_the_decision_does_not_depend_on_the_fleets_order(
    fleet: list[ClusterState], demand: SubmodelDemand
) -> None:
    try:
        forward = route(demand, fleet, global_queue="global")
    except RoutingError:
        with pytest.raises(RoutingError):
            route(demand, list(reversed(fleet)), global_queue="global")
        return
    assert route(demand, list(reversed(fleet)), global_queue="global") == forward


def _two(in_use_a: float) -> list[ClusterState]:
    a = ClusterState("a", "a", 100.0, 32.0, in_use_a, cost_per_node_hour=1.0, region="eu")
    b = ClusterState("b", "b", 100.0, 32.0, 0.0, cost_per_node_hour=2.0, region="us")
    return [a, b]


def test_a_cluster_at_80_percent_sends_new_submodels_to_the_global_queue() -> None:
    demand = SubmodelDemand("submodel-003", 4.0, local_region="eu")
    assert route(demand, _two(79.0), global_queue="global").cluster == "a"
    b_full = [_two(80.0)[0], ClusterState("b", "b", 100.0, 32.0, 90.0, cost_per_node_hour=2.0)]
    decision = route(demand, b_full, global_queue="global")
    assert (decision.cluster, decision.work_queue) == (None, "global")
    assert "overflow" in decision.reason and "a 80%" in decision.reason
    # B has room: the dearer B, not the full local A, and the reason says so.
    decision = route(demand, _two(80.0), global_queue="global")
    assert decision.cluster == "b" and decision.reason.startswith("cheapest with room")


def test_the_global_queue_is_not_used_when_a_cluster_reading_it_may_not_take_the_submodel():
    a = ClusterState("a", "a", 100.0, 32.0, 95.0)
    big = ClusterState("big", "big", 100.0, 64.0, 95.0)
    reserved = ClusterState("reserved", "reserved", 100.0, 64.0, 0.0, groups=("city",))
    decision = route(SubmodelDemand("s", 40.0), [a, big, reserved], global_queue="global")
    assert decision.cluster == "big" and decision.reason.startswith("waits on big")


def test_route_all_counts_its_own_decisions() -> None:
    demands = [SubmodelDemand(f"submodel-{i:03d}", 10.0) for i in range(12)]
    decisions = route_all(demands, _two(0.0), global_queue="global")
    # a (cheaper) takes submodels until it reaches 80 GiB, then b, then the global queue.
    assert [d.cluster for d in decisions] == ["a"] * 8 + ["b"] * 4


def test_no_eligible_cluster_is_one_line_naming_each_reason() -> None:
    small = ClusterState("small", "small", 16.0, 8.0)
    odm = ClusterState("odm", "odm", 64.0, 64.0, engine_identity="odm 3.5")
    demand = SubmodelDemand("submodel-002", 12.0, engine_identity="prefect-odm-engine 0.2")
    with pytest.raises(RoutingError) as info:
        route(demand, [small, odm], global_queue="global")
    text = str(info.value)
    assert "\n" not in text and "small (largest node 8.0 GiB < 12.0 GiB)" in text
    assert "odm (runs odm 3.5, not prefect-odm-engine 0.2)" in text


def test_the_directory_refuses_repeated_names_and_queues() -> None:
    spec = {"name": "a", "work_pool": "odm", "nodes": ["http://127.0.0.1:3000"]}
    with pytest.raises(ValueError, match="names repeat"):
        ClusterDirectory(clusters=[ClusterSpec(**spec), ClusterSpec(**spec)])
    with pytest.raises(ValueError, match="global or dead-letter"):
        ClusterDirectory(clusters=[ClusterSpec(**{**spec, "work_queue": "global"})])
    with pytest.raises(ValueError, match="NodeODM block"):
        ClusterSpec(**{**spec, "nodes": ["http://127.0.0.1:3000/?token=secret"]})
    directory = ClusterDirectory(clusters=[ClusterSpec(**spec)])
    assert directory.get("a").queue == "a"
    assert directory.get("a").memory_limit_name == "prefect-odm-memory-gib-a"
