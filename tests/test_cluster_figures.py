"""The capacity figures' JSON keys (the contract issue 34's manifests read) and their Prometheus
text, parsed back by the Prometheus client's own parser."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from prefect_odm.clusters.figures import ClusterFigures, prometheus_text
from prefect_odm.clusters.router import ClusterState


def _figures() -> list[ClusterFigures]:
    return [
        ClusterFigures("b", 12.5, 4.0, 3, 41.5, False, 64.0, 0, 2),
        ClusterFigures("a", 80.0, 80.0, 0, 0.0, True, 100.0, 2, 2),
    ]


def test_the_json_carries_what_an_autoscaler_reads() -> None:
    record = _figures()[0].to_json()
    assert {
        "cluster": "b",
        "wanted_memory_gib": 12.5,
        "running_memory_gib": 4.0,
        "queue_depth": 3,
        "oldest_waiting_seconds": 41.5,
        "ready": False,
    }.items() <= record.items()


def test_the_prometheus_text_parses_back_to_the_same_figures() -> None:
    samples = {
        (s.name, s.labels["cluster"]): s.value
        for family in text_string_to_metric_families(prometheus_text(_figures()))
        for s in family.samples
    }
    assert samples[("prefect_odm_cluster_wanted_memory_gib", "b")] == 12.5
    assert samples[("prefect_odm_cluster_queue_depth", "b")] == 3
    assert samples[("prefect_odm_cluster_oldest_waiting_seconds", "b")] == 41.5
    assert samples[("prefect_odm_cluster_ready", "b")] == 0
    assert samples[("prefect_odm_cluster_ready", "a")] == 1
    assert len(samples) == 12


def test_figures_feed_the_router() -> None:
    state = ClusterState("b", "b", 64.0, 32.0)
    used = _figures()[0].used_by(state)
    assert used.memory_in_use_gib == 12.5 and used.down
