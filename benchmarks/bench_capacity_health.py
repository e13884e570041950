"""How fast ``prefect-odm capacity serve`` answers ``/health`` while many submodel runs wait
(issue 32: "within 1 s while 100 submodels wait"), on a real PostgreSQL-backed Prefect server.

One PostgreSQL 15 + ``prefect server start`` on 127.0.0.1, one process work pool with no worker,
a cluster directory of one cluster (no nodes). The same ``capacity serve`` process (refresh every
1 s) is timed twice in this process:

* baseline: ``/health`` with no run waiting;
* loaded: ``/health`` with ``--waiting`` scheduled submodel runs in the cluster's queue (each
  tagged ``memory-gib:2``), the server refreshing its figures from Prefect's API meanwhile.

For scale it also times one direct ``POST /flow_runs/count`` to Prefect with the same filters.
Prints the median and maximum of ``--requests`` requests for each and the ratio loaded / baseline.

Run: ``python benchmarks/bench_capacity_health.py [--waiting 100] [--requests 50]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # the servers the tests start

from odm_server import free_port, prefect_server_process, stop_group  # noqa: E402
from postgres_server import start_postgres  # noqa: E402

POOL = "bench-cap"
QUEUE = "bench-a"


def _time(url: str, n: int) -> list[float]:
    """Seconds of ``n`` GETs of ``url`` one after the other (each must answer 200)."""
    times = []
    with httpx.Client(timeout=30) as http:
        for _ in range(n):
            t0 = time.perf_counter()
            res = http.get(url)
            times.append(time.perf_counter() - t0)
            res.raise_for_status()
    return times


def _serve(env: dict[str, str], log: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    out = open(log, "ab")  # noqa: SIM115 - closed with the process
    proc = subprocess.Popen(
        [sys.executable, "-m", "prefect_odm.cli", "capacity", "serve", "--directory", "bench",
         "--port", str(port), "--refresh-seconds", "1"],
        env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"capacity serve exited: {log.read_text()}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    stop_group(proc)
    raise SystemExit(f"capacity serve did not answer: {log.read_text()}")


def _wait_depth(url: str, depth: int) -> None:
    """Wait until ``/health`` reports ``depth`` waiting runs (its figures refreshed)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if httpx.get(f"{url}/health", timeout=10).json().get("queue_depth") == depth:
            return
        time.sleep(0.5)
    raise SystemExit(f"/health never reported {depth} waiting runs")


def _line(name: str, times: list[float]) -> str:
    return (
        f"{name:<34} median {statistics.median(times) * 1000:7.1f} ms  "
        f"max {max(times) * 1000:7.1f} ms  ({len(times)} requests)"
    )


def main() -> None:
    """Start the stack, time ``/health`` empty and loaded, print the figures and the ratio."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--waiting", type=int, default=100, help="submodel runs waiting")
    parser.add_argument("--requests", type=int, default=50, help="requests timed per variant")
    args = parser.parse_args()

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.settings import PREFECT_API_URL, temporary_settings
    from prefect_odm.blocks import ClusterDirectoryBlock

    from prefect_odm.clusters.directory import ClusterSpec

    root = Path(tempfile.mkdtemp(prefix="bench-capacity-"))
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
        with (
            prefect_server_process(root / "prefect-home", env) as api,
            temporary_settings({PREFECT_API_URL: api}),
        ):
            with get_client(sync_client=True) as client:
                client.create_work_pool(WorkPoolCreate(name=POOL, type="process"), overwrite=True)
                flow_id = client.create_flow_from_name("process_submodel")
                deployment_id = client.create_deployment(
                    flow_id, "bench", work_pool_name=POOL, work_queue_name=QUEUE
                )
            ClusterDirectoryBlock(
                clusters=[ClusterSpec(name=QUEUE, work_pool=POOL, nodes=[], memory_gib=64)]
            ).save("bench", overwrite=True)
            serve_env = {**env, "PREFECT_API_URL": api}
            proc, url = _serve(serve_env, root / "capacity.log")
            try:
                _time(f"{url}/health", 5)  # warm up
                baseline = _time(f"{url}/health", args.requests)
                with get_client(sync_client=True) as client:
                    for _ in range(args.waiting):
                        client.create_flow_run_from_deployment(
                            deployment_id, tags=["memory-gib:2"], work_queue_name=QUEUE
                        )
                _wait_depth(url, args.waiting)
                loaded = _time(f"{url}/health", args.requests)
                body = {
                    "flow_runs": {"state": {"type": {"any_": ["SCHEDULED", "PENDING"]}}},
                    "work_pools": {"name": {"any_": [POOL]}},
                    "work_pool_queues": {"name": {"any_": [QUEUE]}},
                }
                direct = []
                with httpx.Client(timeout=30) as http:
                    for _ in range(args.requests):
                        t0 = time.perf_counter()
                        count = http.post(f"{api}/flow_runs/count", json=body).json()
                        direct.append(time.perf_counter() - t0)
                health = httpx.get(f"{url}/health", timeout=10).json()
            finally:
                stop_group(proc)
    print("PostgreSQL + Prefect server on 127.0.0.1, capacity serve refreshing every 1 s")
    print(_line("baseline /health, 0 waiting", baseline))
    print(_line(f"/health, {args.waiting} waiting", loaded))
    print(_line(f"Prefect /flow_runs/count ({count})", direct))
    print(f"/health reported queue_depth {health['queue_depth']}, status {health['status']}")
    print(
        f"ratio loaded / baseline: median "
        f"{statistics.median(loaded) / statistics.median(baseline):.2f}, "
        f"max {max(loaded) / max(baseline):.2f}"
    )


if __name__ == "__main__":
    main()
