"""The pure parts of routing a run among clusters: the deadlines' time model, the area rule,
the clusters a survey may use and the engine its plan is made for, the router's global queue
after a failover, the per-submodel stop and the routing records in the manifest."""

from __future__ import annotations

import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prefect_odm import progress
from prefect_odm.clusters.capacity import ClusterProbe, cluster_tag, tagged_cluster
from prefect_odm.clusters.deadlines import (
    BUILTIN_SECONDS_PER_IMAGE_MEGAPIXEL,
    MAX_DEADLINE_SECONDS,
    MIN_DEADLINE_SECONDS,
    DeadlineRule,
)
from prefect_odm.clusters.directory import ClusterDirectory, ClusterSpec
from prefect_odm.clusters.figures import ClusterFigures
from prefect_odm.clusters.records import RouteRecord, RoutingOptions, RoutingSummary
from prefect_odm.clusters.router import ClusterState, SubmodelDemand, route
from prefect_odm.clusters.routing import (
    area_split,
    cluster_states,
    plan_engine,
    split_memory_gib,
    survey_states,
)
from prefect_odm.errors import RoutingError
from prefect_odm.progress import SubmodelBoard

ENGINE = "prefect-odm-engine 0.2.0"


@settings(max_examples=200, deadline=None)
@given(
    images=st.integers(0, 5000),
    megapixels=st.floats(0.1, 60),
    timeout=st.one_of(st.none(), st.floats(0.01, 1e6)),
    builtin=st.booleans(),
)
def test_the_deadline_is_bounded_and_grows_with_the_pixels(
    images: int, megapixels: float, timeout: float | None, builtin: bool
) -> None:
    rule = DeadlineRule.for_engine(ENGINE if builtin else "odm 3.5.5")
    deadline = rule.deadline_seconds(images, megapixels, timeout)
    if timeout is not None:
        assert deadline == max(1.0, timeout)  # an explicit timeout replaces the model
        return
    assert MIN_DEADLINE_SECONDS <= deadline <= MAX_DEADLINE_SECONDS
    assert rule.deadline_seconds(images + 100, megapixels) >= deadline


def test_the_builtin_engine_has_its_own_measured_rate() -> None:
    rule = DeadlineRule.for_engine(ENGINE)
    assert rule.seconds_per_image_megapixel == BUILTIN_SECONDS_PER_IMAGE_MEGAPIXEL
    # 1,000 images of 12 MP: 4 x 2 s x 12,000 image-MP = 26.7 h, bounded to 6 h
    assert rule.deadline_seconds(1000, 12.0) == MAX_DEADLINE_SECONDS
    assert rule.deadline_seconds(10, 1.44) == MIN_DEADLINE_SECONDS


def test_the_area_rule_splits_only_surveys_larger_than_it() -> None:
    # 18 images over 16,200 m^2: 900 m^2 an image
    assert area_split(18, 16_200.0, 40, None) is None  # no rule
    assert area_split(18, 16_200.0, 5, 5_000.0) is None  # 5 images cover 4,500 m^2: kept
    assert area_split(18, 16_200.0, 40, 5_000.0) == 5  # one task would cover it all
    assert area_split(18, 16_200.0, 40, 100.0) == 2  # never below two images


def _state(name: str, **kw: object) -> ClusterState:
    fields: dict[str, object] = {
        "work_queue": name,
        "memory_capacity_gib": 64.0,
        "largest_node_gib": 32.0,
        "engine_identity": ENGINE,
    }
    fields.update(kw)
    return ClusterState(name=name, **fields)  # type: ignore[arg-type]


def test_the_survey_uses_the_preferred_clusters_engine_and_their_largest_nodes() -> None:
    options = RoutingOptions(directory="d", groups=["city"], data_region="eu-west-1")
    states = [
        _state("cheap", cost_per_node_hour=0.5, largest_node_gib=16.0),
        _state("near", cost_per_node_hour=2.0, data_regions=("eu-west-1",)),
        _state("odm", engine_identity="odm 3.5.5", largest_node_gib=128.0, cost_per_node_hour=3.0),
        _state("reserved", groups=("research",)),
        _state("dead", down=True),
    ]
    usable = survey_states(states, options)
    assert [s.name for s in usable] == ["near", "cheap", "odm"]  # data-near first, then cost
    assert plan_engine(usable) == ENGINE
    assert split_memory_gib(usable, ENGINE) == [32.0, 16.0]  # the ODM cluster's node is not
    with pytest.raises(RoutingError) as info:
        survey_states([states[3], states[4]], options)
    assert "reserved (serves groups research only)" in str(info.value)
    assert "dead (down)" in str(info.value) and "\n" not in str(info.value)


def test_cluster_states_take_memory_in_use_and_readiness_from_the_probes() -> None:
    directory = ClusterDirectory(
        clusters=[ClusterSpec(name="a", work_pool="p", cost_per_node_hour=1.5, groups=["g"])]
    )
    figures = ClusterFigures("a", 12.0, 4.0, 3, 10.0, False, 40.0, 1, 2)
    probe = ClusterProbe(figures, 20.0, ENGINE, "queue a of pool p not ready")
    (state,) = cluster_states(directory, [probe])
    assert (state.memory_in_use_gib, state.memory_capacity_gib, state.largest_node_gib) == (
        12.0, 40.0, 20.0,
    )  # fmt: skip
    assert state.down and state.groups == ("g",) and state.cost_per_node_hour == 1.5


def test_after_a_failover_the_global_queue_is_not_used_while_the_cluster_left_reads_it() -> None:
    # a failed the submodel; b and c are full. The global queue would hand it back to a.
    fleet = [_state("a"), _state("b", memory_in_use_gib=60.0), _state("c", memory_in_use_gib=60.0)]
    demand = SubmodelDemand("submodel-001", 4.0)
    decision = route(demand, fleet, global_queue="global", exclude=["a"])
    assert decision.cluster in ("b", "c") and decision.reason.startswith("waits on")
    # a reads no global queue: overflow is safe
    fleet[0] = _state("a", reads_global=False)
    decision = route(demand, fleet, global_queue="global", exclude=["a"])
    assert (decision.cluster, decision.work_queue) == (None, "global")


def test_a_run_records_its_cluster_in_a_tag() -> None:
    assert tagged_cluster(["prefect-odm", cluster_tag("eu-large")]) == "eu-large"
    assert tagged_cluster(["memory-gib:4"]) is None


def test_the_routing_summary_round_trips_through_the_manifest_json() -> None:
    record = RouteRecord(
        submodel_id="submodel-001", route=2, cluster=None, work_queue="global",
        reason="overflow: ...", eligible=["a", "b"], excluded=["c"], ran_on="b",
        outcome="completed",
    )  # fmt: skip
    summary = RoutingSummary(directory="d", decisions=[record], split_basis="engine x")
    assert RoutingSummary.model_validate_json(summary.model_dump_json()) == summary


def test_the_live_table_shows_the_route_only_for_a_routed_run() -> None:
    board = SubmodelBoard(["submodel-000", "submodel-001"])
    assert "cluster" not in board.table()[0]
    board.update("submodel-001", cluster="b (from global)", route="overflow: ...")
    rows = board.table()
    assert rows[1]["cluster"] == "b (from global)" and rows[0]["cluster"] == "not routed"


def test_the_stop_times_out_only_after_the_submodel_got_its_node() -> None:
    from prefect_odm.tasks.submodel_stop import SubmodelStop

    run_cancelled = threading.Event()
    with SubmodelStop("submodel-001", run_cancelled, deadline_seconds=0.5) as stop:
        time.sleep(1.2)  # waiting for memory and a node: not processing time
        assert not stop.event.is_set()
        progress.emit(progress.SubmodelEvent("submodel-001", "uploading", 0.0, node="n"))
        assert stop.event.wait(5)
    assert stop.reason == "timed out" and stop.detail == "timed out after 0.5 s on its node"
    with SubmodelStop("submodel-002", run_cancelled) as other:
        run_cancelled.set()
        assert other.event.wait(5)
    assert other.reason == "cancelled"


def test_routing_flags_without_a_directory_are_one_line_exit_2(
    brighton_images, tmp_path, capsys, monkeypatch
) -> None:
    from prefect_odm.cli.main import main

    monkeypatch.delenv("PREFECT_ODM_CLUSTER_DIRECTORY", raising=False)
    code = main(
        ["reconstruct", str(brighton_images), "-o", str(tmp_path / "out"), "--groups", "city"]
    )
    err = capsys.readouterr().err
    assert code == 2 and err.strip() == (
        "prefect-odm: error: --groups needs --clusters (a cluster directory block)"
    )
    assert not (tmp_path / "out").exists()
