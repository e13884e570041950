"""``prefect-odm capacity serve`` and ``prefect-odm clusters`` against a real ``prefect server``
backed by a real PostgreSQL, and a real built-in engine node: the figures equal a count made
directly through Prefect's REST API and one made in PostgreSQL itself, and ``/health`` answers
while 100 submodel runs wait (how fast: ``benchmarks/bench_capacity_health.py``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from odm_server import free_port, prefect_server_process, stop_group
from postgres_server import Postgres, start_postgres
from prefect_odm.blocks import ClusterDirectoryBlock

from prefect_odm.clusters.directory import ClusterSpec

pytestmark = pytest.mark.integration

POOL = "cap-pool"
"""A pool of its own: no worker of the session takes these runs."""

WAITING = 100
RUNNING = 3


def _count(api: str, queue: str, states: list[str]) -> int:
    """``POST /flow_runs/count`` with the pool, queue and state filters, straight over HTTP."""
    body = {
        "flow_runs": {"state": {"type": {"any_": states}}},
        "work_pools": {"name": {"any_": [POOL]}},
        "work_pool_queues": {"name": {"any_": [queue]}},
    }
    res = httpx.post(f"{api}/flow_runs/count", json=body, timeout=30)
    res.raise_for_status()
    return int(res.json())


def _filter_runs(api: str, queue: str, states: list[str]) -> list[dict[str, Any]]:
    runs: list[dict[str, Any]] = []
    while True:
        body = {
            "flow_runs": {"state": {"type": {"any_": states}}},
            "work_pools": {"name": {"any_": [POOL]}},
            "work_pool_queues": {"name": {"any_": [queue]}},
            "limit": 200,
            "offset": len(runs),
        }
        res = httpx.post(f"{api}/flow_runs/filter", json=body, timeout=30)
        res.raise_for_status()
        page = res.json()
        runs += page
        if len(page) < 200:
            return runs


@pytest.fixture(scope="module")
def pg_prefect(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Postgres]]:
    """A ``prefect server`` on a fresh PostgreSQL (its API URL, and the database to count in);
    this module's in-process clients talk to it."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    root = tmp_path_factory.mktemp("capacity-pg")
    with start_postgres(root / "pg") as pg:
        pg.sql("postgres", "CREATE DATABASE prefect")
        env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
        env.update(
            {
                "PREFECT_HOME": str(root / "prefect-home"),
                "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
                "PREFECT_UI_ENABLED": "false",
                "PREFECT_API_DATABASE_CONNECTION_URL": pg.url("prefect"),
            }
        )
        with prefect_server_process(root / "prefect-home", env) as api_url:
            with temporary_settings({PREFECT_API_URL: api_url}):
                yield api_url, pg


@pytest.fixture(scope="module")
def prefect_api(pg_prefect: tuple[str, Postgres]) -> str:
    return pg_prefect[0]


def _sql_waiting(pg: Postgres, queue: str) -> tuple[int, float]:
    """Waiting runs of ``queue`` and the age of the oldest (s), counted in PostgreSQL itself."""
    row = pg.sql(
        "prefect",
        "SELECT count(*), coalesce(extract(epoch FROM now() - min(fr.expected_start_time)), 0) "
        "FROM flow_run fr JOIN work_queue wq ON fr.work_queue_id = wq.id "
        "JOIN work_pool wp ON wq.work_pool_id = wp.id "
        f"WHERE wp.name = '{POOL}' AND wq.name = '{queue}' "
        "AND fr.state_type IN ('SCHEDULED', 'PENDING')",
    )
    count, age = row.split("|")
    return int(count), float(age)


@pytest.fixture(scope="module")
def waiting_runs(prefect_api: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """100 scheduled submodel runs in queue ``cap-a`` (half described by a stored plan, half by
    a ``memory-gib`` tag, one scheduled two minutes ago), 3 running, 2 in queue ``cap-b``."""
    from prefect.client.orchestration import get_client
    from prefect.states import Running, Scheduled

    plan_dir = tmp_path_factory.mktemp("plan")
    plan_url = str(plan_dir / "plan.json")
    estimates = {f"submodel-{i:03d}": 1.0 + (i % 7) * 0.75 for i in range(60)}
    submodels = [{"id": k, "estimated_memory_gib": v} for k, v in estimates.items()]
    Path(plan_url).write_text(json.dumps({"submodels": submodels}))
    with get_client(sync_client=True) as client:
        from prefect.client.schemas.actions import WorkPoolCreate

        client.create_work_pool(WorkPoolCreate(name=POOL, type="process"), overwrite=True)
        flow_id = client.create_flow_from_name("process_submodel")
        deployment_id = client.create_deployment(
            flow_id,
            "capacity-test",
            work_pool_name=POOL,
            work_queue_name="cap-a",
            enforce_parameter_schema=False,
        )
        made: list[tuple[str, str]] = []
        for i in range(WAITING + RUNNING):
            sid = f"submodel-{i % 60:03d}"
            by_tag = i % 2 == 1
            run = client.create_flow_run_from_deployment(
                deployment_id,
                parameters={} if by_tag else {"plan_url": plan_url, "submodel_id": sid},
                tags=[f"memory-gib:{estimates[sid]}"] if by_tag else [],
                state=Scheduled(scheduled_time=datetime.now(UTC) - timedelta(seconds=120))
                if i == 5
                else None,
                work_queue_name="cap-a",
            )
            if i >= WAITING:
                client.set_flow_run_state(run.id, Running(), force=True)
            made.append((sid, "running" if i >= WAITING else "waiting"))
        for _ in range(2):
            client.create_flow_run_from_deployment(
                deployment_id, tags=["memory-gib:40"], work_queue_name="cap-b"
            )
        _poll_queues(client)
    wanted = sum(estimates[s] for s, _ in made)
    running = sum(estimates[s] for s, kind in made if kind == "running")
    return {"wanted_gib": wanted, "running_gib": running, "plan_url": plan_url}


def _poll_queues(client: Any) -> None:
    """A worker's poll (nothing is due this far back): Prefect marks the queues READY, as it
    does for a live worker."""
    client.get_scheduled_flow_runs_for_work_pool(
        POOL, ["cap-a", "cap-b"], scheduled_before=datetime(2000, 1, 1, tzinfo=UTC)
    )


def _serve(env: dict[str, str], directory: str, tmp: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    log = open(tmp / "capacity.log", "ab")  # noqa: SIM115 - closed with the process
    proc = subprocess.Popen(
        [sys.executable, "-m", "prefect_odm.cli", "capacity", "serve", "--directory", directory,
         "--port", str(port), "--refresh-seconds", "1"],
        env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        assert proc.poll() is None, (tmp / "capacity.log").read_text()
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    stop_group(proc)
    raise AssertionError(f"capacity serve did not answer: {(tmp / 'capacity.log').read_text()}")


def _env(prefect_api: str) -> dict[str, str]:
    return {**os.environ, "PREFECT_API_URL": prefect_api, "PREFECT_SERVER_ANALYTICS_ENABLED": "0"}


def test_capacity_serve_figures_equal_a_direct_count_and_health_is_fast(
    pg_prefect: tuple[str, Postgres],
    prefect_api: str,
    waiting_runs: dict[str, Any],
    tmp_path: Path,
) -> None:
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    ClusterDirectoryBlock(
        clusters=[
            ClusterSpec(name="cap-a", work_pool=POOL, nodes=[dead], memory_gib=64),
            ClusterSpec(name="cap-b", work_pool=POOL, nodes=[]),
        ]
    ).save("capacity-test", overwrite=True)
    proc, url = _serve(_env(prefect_api), "capacity-test", tmp_path)
    try:
        a = httpx.get(f"{url}/clusters/cap-a", timeout=5).json()
        waiting_a = _count(prefect_api, "cap-a", ["SCHEDULED", "PENDING"])
        running_a = _count(prefect_api, "cap-a", ["RUNNING"])
        assert waiting_a == WAITING and running_a == RUNNING  # the setup is what it says
        assert a["queue_depth"] == waiting_a
        sql_depth, sql_age = _sql_waiting(pg_prefect[1], "cap-a")
        assert sql_depth == a["queue_depth"]
        assert 120 <= a["oldest_waiting_seconds"] <= sql_age + 1e-3
        assert a["wanted_memory_gib"] == pytest.approx(waiting_runs["wanted_gib"], abs=1e-3)
        assert a["running_memory_gib"] == pytest.approx(waiting_runs["running_gib"], abs=1e-3)
        runs = _filter_runs(prefect_api, "cap-a", ["SCHEDULED", "PENDING"])
        oldest = min(datetime.fromisoformat(r["expected_start_time"]) for r in runs)
        age = (datetime.now(UTC) - oldest).total_seconds()
        assert 120 <= a["oldest_waiting_seconds"] <= age + 1e-3
        # the queue was polled (READY) but its one node is down: not ready
        assert (a["nodes_up"], a["nodes_total"], a["ready"]) == (0, 1, False)
        assert a["memory_capacity_gib"] == 64
        b = httpx.get(f"{url}/clusters/cap-b", timeout=5).json()
        assert b["queue_depth"] == _count(prefect_api, "cap-b", ["SCHEDULED", "PENDING"]) == 2
        assert b["wanted_memory_gib"] == 80 and b["memory_capacity_gib"] is None
        assert [c["cluster"] for c in httpx.get(f"{url}/clusters", timeout=5).json()] == [
            "cap-a", "cap-b"
        ]  # fmt: skip
        missing = httpx.get(f"{url}/clusters/nowhere", timeout=5)
        assert missing.status_code == 404 and "known: cap-a, cap-b" in missing.text
        metrics = httpx.get(f"{url}/metrics", timeout=5)
        assert metrics.headers["content-type"].startswith("text/plain")
        assert f'prefect_odm_cluster_queue_depth{{cluster="cap-a"}} {WAITING}' in metrics.text
        # /health while 100 submodels wait (its latency: benchmarks/bench_capacity_health.py)
        health = httpx.get(f"{url}/health", timeout=5)
        assert health.status_code == 200
        assert health.json()["status"] == "ok" and health.json()["queue_depth"] == WAITING + 2
    finally:
        stop_group(proc)


def test_clusters_table_shows_a_live_built_in_engine_node(
    prefect_api: str, waiting_runs: dict[str, Any], tmp_path: Path
) -> None:
    from prefect.client.orchestration import get_client

    from prefect_odm.engine.launch import start_engine

    dead = f"http://127.0.0.1:{free_port()}"
    with get_client(sync_client=True) as client:
        _poll_queues(client)
    with start_engine(tmp_path / "node") as node:
        info = httpx.get(f"{node.url}/info", timeout=5).json()
        ClusterDirectoryBlock(
            clusters=[
                ClusterSpec(name="cap-a", work_pool=POOL, nodes=[node.url, dead]),
                ClusterSpec(name="cap-b", work_pool=POOL, nodes=[dead]),
            ]
        ).save("clusters-test", overwrite=True)
        proc = subprocess.run(
            [sys.executable, "-m", "prefect_odm.cli", "clusters", "--directory", "clusters-test"],
            env={**_env(prefect_api), "COLUMNS": "200"},
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert proc.returncode == 0, proc.stderr
    print(proc.stdout)
    rows = {line.split("│")[1].strip(): line for line in proc.stdout.splitlines() if "cap-" in line}
    cells_a = [c.strip() for c in rows["cap-a"].split("│")[1:-1]]
    cells_b = [c.strip() for c in rows["cap-b"].split("│")[1:-1]]
    usable = round(info["totalMemory"] / 1024**3 * 0.9, 2)
    assert cells_a[1] == "1/2" and cells_a[2] == f"{usable:.1f}"
    assert cells_a[3] == f"{waiting_runs['wanted_gib']:.1f}"
    assert cells_a[6] == str(WAITING) and cells_a[7].endswith(" min") and cells_a[8] == "READY"
    assert cells_b[1] == "0/1" and cells_b[2] == "?" and cells_b[8] == "NOT READY"
    missing = subprocess.run(
        [sys.executable, "-m", "prefect_odm.cli", "clusters", "--directory", "no-such"],
        env=_env(prefect_api), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert missing.returncode == 2
    assert (
        missing.stderr.strip() == "prefect-odm: error: no cluster directory block named 'no-such'"
    )


def test_a_run_taken_from_the_global_queue_counts_for_the_cluster_it_runs_on(
    pg_prefect: tuple[str, Postgres], prefect_api: str, waiting_runs: dict[str, Any]
) -> None:
    """A submodel run of the global queue tags itself ``cluster:<name>`` once it runs: its
    memory is that cluster's (wanted and running); a run still waiting there is no cluster's.
    The tagged run is counted in PostgreSQL too."""
    from prefect.client.orchestration import get_client
    from prefect.states import Running

    from prefect_odm.clusters.capacity import PlanMemory, cluster_tag, queue_figures

    with get_client(sync_client=True) as client:
        deployment = client.read_deployment_by_name("process_submodel/capacity-test")
        taken = client.create_flow_run_from_deployment(
            deployment.id, tags=["memory-gib:6", cluster_tag("cap-c")], work_queue_name="global"
        )
        client.set_flow_run_state(taken.id, Running(), force=True)
        client.create_flow_run_from_deployment(
            deployment.id, tags=["memory-gib:3"], work_queue_name="global"
        )
        spec = ClusterSpec(name="cap-c", work_pool=POOL, nodes=[])
        counted = queue_figures(client, spec, PlanMemory(), global_queue="global")
        alone = queue_figures(client, spec, PlanMemory())
    assert (counted.wanted_memory_gib, counted.running_memory_gib) == (6.0, 6.0)
    assert counted.queue_depth == 0 and alone.wanted_memory_gib == 0.0
    rows = pg_prefect[1].sql(
        "prefect",
        "SELECT count(*) FROM flow_run fr JOIN work_queue wq ON fr.work_queue_id = wq.id "
        "WHERE wq.name = 'global' AND fr.state_type = 'RUNNING' AND fr.tags ? 'cluster:cap-c'",
    )
    assert rows == "1"
