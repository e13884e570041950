"""Several clusters on 127.0.0.1 for the routing, failover and dead-letter tests: one
PostgreSQL-backed ``prefect server`` with one process work pool, the ``process-submodel``
deployment, and per cluster a built-in engine and a real process worker reading
``[own queue, global]`` with ``PREFECT_ODM_CLUSTER`` in its environment.

Every process runs in its own session; :func:`kill_tree` SIGKILLs a process and everything it
started (a worker's flow-run processes, an engine's task processes), as a machine that dies.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
from odm_server import BIN, prefect_server_process, stop_group
from postgres_server import start_postgres

from prefect_odm.engine.launch import EngineProcess, start_engine

POOL = "clusters"
DEPLOYMENT = "process_submodel/process-submodel"
TESTS = Path(__file__).resolve().parent


@dataclass
class Stack:
    """The server: its API URL and the environment its clients (CLI runs, workers) need."""

    api_url: str
    root: Path
    env: dict[str, str]

    def child_env(self, name: str, **extra: str) -> dict[str, str]:
        """An environment for a process of its own machine: its own PREFECT_HOME and
        PREFECT_ODM_HOME under ``root/name``."""
        home = self.root / name
        home.mkdir(parents=True, exist_ok=True)
        return {
            **self.env,
            "PREFECT_HOME": str(home / "prefect"),
            "PREFECT_ODM_HOME": str(home / "odm"),
            **extra,
        }


@contextmanager
def prefect_on_postgres(root: Path) -> Iterator[Stack]:
    """PostgreSQL, then ``prefect server start`` on it (the foreman every 2 s, a queue not
    polled for 10 s NOT_READY, leases on disk), the pool and the deployments; in-process
    clients point at it."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with start_postgres(root / "pg") as pg:
        pg.sql("postgres", "CREATE DATABASE prefect")
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith("PREFECT_") or k.startswith("PREFECT_ODM_")
        }
        for key in (
            "PREFECT_ODM_ENGINE_FAULTS",
            "PREFECT_ODM_CLUSTER",
            "PREFECT_ODM_SUBMODEL_DEPLOYMENT",
        ):
            env.pop(key, None)
        server_env = {
            **env,
            "PREFECT_HOME": str(root / "server-home"),
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "PREFECT_UI_ENABLED": "false",
            "PREFECT_API_DATABASE_CONNECTION_URL": pg.url("prefect"),
            "PREFECT_SERVER_SERVICES_FOREMAN_LOOP_SECONDS": "2",
            "PREFECT_SERVER_SERVICES_FOREMAN_WORK_QUEUE_LAST_POLLED_TIMEOUT_SECONDS": "10",
            "PREFECT_SERVER_SERVICES_TRIGGERS_ENABLED": "true",
            "PREFECT_SERVER_CONCURRENCY_LEASE_STORAGE": (
                "prefect.server.concurrency.lease_storage.filesystem"
            ),
        }
        with prefect_server_process(root / "server-home", server_env) as api_url:
            env.update(
                {
                    "PREFECT_API_URL": api_url,
                    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
                    "PREFECT_LOGGING_LEVEL": "INFO",
                }
            )
            with temporary_settings({PREFECT_API_URL: api_url}):
                _deploy(root)
                yield Stack(api_url, root, env)


def _deploy(root: Path) -> None:
    """The process work pool, the ``process-submodel`` deployment (the installed package's
    module entrypoint) and the test's ``hold`` flow (a run that keeps a worker busy)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate

    workdir = {"prefect.deployments.steps.set_working_directory": {"directory": str(TESTS)}}
    with get_client(sync_client=True) as client:
        client.create_work_pool(WorkPoolCreate(name=POOL, type="process"), overwrite=True)
        flow_id = client.create_flow_from_name("process_submodel")
        client.create_deployment(
            flow_id,
            "process-submodel",
            entrypoint="prefect_odm.flows.process_submodel:process_submodel",
            work_pool_name=POOL,
            pull_steps=[workdir],
            enforce_parameter_schema=False,
        )
        hold_id = client.create_flow_from_name("hold")
        client.create_deployment(
            hold_id,
            "hold",
            entrypoint="cluster_hold_flow.py:hold",
            path=str(TESTS),
            work_pool_name=POOL,
            pull_steps=[workdir],
            enforce_parameter_schema=False,
        )


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid`` and every process it started, children first found (a dead machine)."""
    try:
        parent = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return
    procs = [parent, *parent.children(recursive=True)]
    for proc in procs:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(procs, timeout=10)


@dataclass
class Cluster:
    """One cluster: its engine and its worker."""

    name: str
    engine: EngineProcess
    worker: subprocess.Popen[bytes] | None
    data_dir: Path
    faults: dict[str, Any] = field(default_factory=dict)

    def kill(self) -> None:
        """kill -9 the worker and the engine, with every process they started."""
        if self.worker is not None:
            kill_tree(self.worker.pid)
            self.worker.wait()
        kill_tree(self.engine.pid)
        self.engine.kill()


def start_worker(
    stack: Stack, name: str, queue: str, limit: int | None = None, pool: str = POOL
) -> subprocess.Popen[bytes]:
    """``prefect worker start --pool <pool> --work-queue <queue> --work-queue global`` with
    ``PREFECT_ODM_CLUSTER=<name>`` (polls every second, heartbeats every 2 s)."""
    env = stack.child_env(
        f"worker-{name}",
        PREFECT_ODM_CLUSTER=name,
        PREFECT_WORKER_QUERY_SECONDS="1",
        PREFECT_WORKER_PREFETCH_SECONDS="5",
        PREFECT_WORKER_HEARTBEAT_SECONDS="2",
    )
    cmd = [str(BIN / "prefect"), "worker", "start", "--pool", pool, "--type", "process",
           "--work-queue", queue, "--work-queue", "global", "--name", f"worker-{name}"]  # fmt: skip
    if limit is not None:
        cmd += ["--limit", str(limit)]
    log = open(stack.root / f"worker-{name}.log", "ab")  # noqa: SIM115 - closed with the process
    return subprocess.Popen(
        cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )


def start_cluster(
    stack: Stack,
    name: str,
    label: str,
    faults: dict[str, Any] | None = None,
    limit: int | None = None,
    worker: bool = True,
) -> Cluster:
    """A built-in engine (2 tasks at once, ``faults`` injected; its own data folder for the
    test ``label``) and a worker (at most ``limit`` runs at once; none for an inline run) for
    cluster ``name``."""
    data_dir = stack.root / f"engine-{label}-{name}"
    engine = start_engine(data_dir, max_parallel_tasks=2, extra_env=_faults_env(faults))
    process = start_worker(stack, name, name, limit) if worker else None
    return Cluster(name, engine, process, data_dir, dict(faults or {}))


def _faults_env(faults: dict[str, Any] | None) -> dict[str, str]:
    return {"PREFECT_ODM_ENGINE_FAULTS": json.dumps(faults)} if faults else {}


def restart_engine(cluster: Cluster, faults: dict[str, Any] | None = None) -> None:
    """Stop the cluster's engine and start it again on the same port and data folder."""
    cluster.engine.stop()
    cluster.engine = start_engine(
        cluster.data_dir,
        port=cluster.engine.port,
        max_parallel_tasks=2,
        extra_env=_faults_env(faults),
    )
    cluster.faults = dict(faults or {})


def stop_cluster(cluster: Cluster) -> None:
    if cluster.worker is not None:
        stop_group(cluster.worker)
    if cluster.engine.alive():
        cluster.engine.stop()


def engine_tasks(data_dir: Path) -> list[dict[str, Any]]:
    """The tasks of an engine's durable table (``tasks.json``), read from its data folder: a
    dead engine's too."""
    path = data_dir / "tasks.json"
    if not path.exists():
        return []
    table = json.loads(path.read_text())
    rows = table["tasks"] if isinstance(table, dict) else table
    return list(rows.values()) if isinstance(rows, dict) else list(rows)


def live_tasks(url: str) -> list[dict[str, Any]]:
    """``/task/list`` of a live engine with each task's ``/info``."""
    with urllib.request.urlopen(f"{url}/task/list", timeout=10) as res:
        uuids = [t["uuid"] for t in json.loads(res.read())]
    out = []
    for uuid in uuids:
        with urllib.request.urlopen(f"{url}/task/{uuid}/info", timeout=10) as res:
            out.append(json.loads(res.read()))
    return out


def reconstruct(
    stack: Stack, images: Path, out: Path, directory: str, *extra: str, deployment: bool = True
) -> subprocess.Popen[bytes]:
    """``prefect-odm reconstruct`` of brighton (split 6, 15 m overlap, the direct pipeline,
    10 cm) routed with ``directory``, each submodel a deployment run (else inline); started,
    not waited for."""
    cmd = [sys.executable, "-m", "prefect_odm.cli", "reconstruct", str(images), "--output", str(out),
           "--split", "6", "--split-overlap-m", "15", "--pipeline", "direct",
           "--orthophoto-resolution", "10", "--clusters", directory, *extra]  # fmt: skip
    extra_env = {"PREFECT_ODM_SUBMODEL_DEPLOYMENT": DEPLOYMENT} if deployment else {}
    env = stack.child_env(f"parent-{out.name}", **extra_env)
    log = open(out.parent / f"{out.name}.log", "ab")  # noqa: SIM115 - closed with the process
    return subprocess.Popen(
        cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )


def finished(proc: subprocess.Popen[bytes], log: Path, timeout_seconds: float = 400) -> str:
    """Wait for a command; its output (the test fails with it when the command failed)."""
    try:
        proc.wait(timeout=timeout_seconds)
    except subprocess.TimeoutExpired:
        stop_group(proc)
    text = log.read_text(errors="replace")
    assert proc.returncode == 0, f"exit {proc.returncode}:\n{text[-6000:]}"
    return text


def wait_until(what: str, check: Any, timeout_seconds: float = 120, every: float = 0.5) -> Any:
    """Poll ``check()`` until it returns something true; that value."""
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout_seconds} s waiting for {what}")
