"""Units of the capacity figures: where a run's memory estimate comes from, and the service's
cache keeping its last figures (and saying so in ``/health``) when a refresh fails."""

from __future__ import annotations

from fastapi.testclient import TestClient

from prefect_odm.clusters.capacity import run_memory_gib
from prefect_odm.clusters.directory import ClusterDirectory, ClusterSpec
from prefect_odm.clusters.figures import ClusterFigures
from prefect_odm.clusters.service import FiguresCache, create_app


def _plan(url: str, submodel_id: str) -> float | None:
    return {("p.json", "submodel-001"): 7.5}.get((url, submodel_id))


def test_a_runs_memory_comes_from_its_parameter_then_its_tag_then_its_plan() -> None:
    plan_params = {"plan_url": "p.json", "submodel_id": "submodel-001"}
    assert run_memory_gib({"memory_gib": 3, **plan_params}, ["memory-gib:4"], _plan) == 3.0
    assert run_memory_gib(plan_params, ["x", "memory-gib:4.25"], _plan) == 4.25
    assert run_memory_gib(plan_params, ["memory-gib:nan", "memory-gib:-1"], _plan) == 7.5
    assert run_memory_gib({"memory_gib": True, **plan_params}, [], _plan) == 7.5
    assert run_memory_gib({"plan_url": "p.json", "submodel_id": "submodel-002"}, [], _plan) is None
    assert run_memory_gib({}, [], _plan) is None


def test_a_failed_refresh_keeps_the_last_figures_and_marks_health_stale() -> None:
    directory = ClusterDirectory(clusters=[ClusterSpec(name="a", work_pool="odm")])
    answers: list[list[ClusterFigures] | Exception] = [
        [ClusterFigures("a", 12.0, 4.0, 3, 60.0, True, 64.0, 2, 2)],
        ConnectionError("Prefect is down"),
    ]

    def read(_: ClusterDirectory) -> list[ClusterFigures]:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    cache = FiguresCache(directory, read)
    http = TestClient(create_app(cache))
    assert http.get("/health").json()["status"] == "stale"  # nothing read yet
    assert http.get("/clusters").json() == []
    cache.refresh()
    health = http.get("/health").json()
    assert (health["status"], health["ready"], health["queue_depth"]) == ("ok", ["a"], 3)
    cache.refresh()
    health = http.get("/health").json()
    assert health["status"] == "stale" and "Prefect is down" in health["last_error"]
    assert http.get("/clusters/a").json()["wanted_memory_gib"] == 12.0
    assert 'prefect_odm_cluster_ready{cluster="a"} 1' in http.get("/metrics").text
