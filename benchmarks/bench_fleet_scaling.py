"""A fleet scaled on wanted memory against a fixed fleet (issue 34).

brighton (direct pipeline at 20 cm, ``--split 5``: four submodels) runs as deployment runs on
a process worker of a ``prefect server`` on 127.0.0.1, its nodes a node file; the KEDA/HPA
stand-in of tests/keda_standin.py reads ``prefect-odm capacity serve``'s wanted memory and
scales built-in engines (``max_parallel_tasks=1``, one GiB of target per pod) as the rendered
ScaledObject says (tests/fleet_run.py). Two runs in this process:

* baseline: a fixed fleet of 3 engines (``minReplicaCount = maxReplicaCount = 3``);
* scaled: 1 to 3 engines, an 8 s scale-down window, one pod per 4 s, a 3 s pre-stop quiet time.

Printed for each: the run's time, when the wanted memory first exceeded the minimum fleet, when
the scale-up was decided, when the new engines were ready and took their first task, each
removed engine's tasks at its removal and how long its pre-stop wait held it, engine-seconds
held during the run (a removed engine until it stopped), and tasks per engine; then the ratios
scaled / baseline of run time and engine-seconds.

    python benchmarks/bench_fleet_scaling.py [--scaled-first]

The first run of the process pays for a cold server and worker; ``--scaled-first`` swaps the
order to show how much.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # the stand-in and the servers the tests start

from fleet_run import POOL, figures, prepare_deployment, run_on_fleet  # noqa: E402
from odm_server import BIN, prefect_server_process, stop_group  # noqa: E402

IMAGES = REPO.parent / "shared" / "data" / "brighton_beach_1600" / "images"


def start_worker(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """A process worker on the fleet's pool, polling every second."""
    worker_env = {
        **env,
        "PREFECT_WORKER_QUERY_SECONDS": "1",
        "PREFECT_WORKER_PREFETCH_SECONDS": "5",
    }
    with open(log, "ab") as out:
        return subprocess.Popen(
            [str(BIN / "prefect"), "worker", "start", "--pool", POOL, "--type", "process"],
            env=worker_env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip


def main() -> None:
    from prefect.settings import PREFECT_API_URL, temporary_settings

    order = [("baseline: fixed 3", (3, 3)), ("scaled 1-3", (1, 3))]
    if "--scaled-first" in sys.argv[1:]:
        order.reverse()

    with tempfile.TemporaryDirectory(prefix="bench-fleet-") as tmp:
        work = Path(tmp)
        env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
        env.update(
            PREFECT_HOME=str(work / "prefect"),
            PREFECT_ODM_HOME=str(work / "odm"),
            PREFECT_SERVER_ANALYTICS_ENABLED="false",
            PREFECT_UI_ENABLED="false",
        )
        os.environ["PREFECT_ODM_HOME"] = env["PREFECT_ODM_HOME"]
        with prefect_server_process(work / "server", env) as api_url:
            env["PREFECT_API_URL"] = api_url
            with temporary_settings({PREFECT_API_URL: api_url}):
                prepare_deployment()
                worker = start_worker(env, work / "worker.log")
                try:
                    runs = {}
                    for name, replicas in order:
                        (work / name[:5]).mkdir()
                        run = run_on_fleet(IMAGES, work / name[:5], env, replicas)
                        assert all(r.status == "completed" for r in run.manifest.submodels)
                        runs[name] = figures(run)
                        print(f"{name}: {json.dumps(runs[name])}", flush=True)
                finally:
                    stop_group(worker)
    base, scaled = runs["baseline: fixed 3"], runs["scaled 1-3"]
    print(
        f"scaled / baseline: run time {scaled['run_s'] / base['run_s']:.2f}, "
        f"engine-seconds {scaled['engine_seconds'] / base['engine_seconds']:.2f}; "
        f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
    )


if __name__ == "__main__":
    main()
