"""A real ``prefect server start`` (SQLite, private PREFECT_HOME) with the deployments of
``prefect.yaml`` deployed from a clean copy of the repository, and a process worker.

Everything listens on 127.0.0.1; every process is started in its own session and its whole
process group is killed in teardown.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
POOL = "odm"
BIN = Path(sys.executable).parent


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stop_group(proc: subprocess.Popen, timeout_seconds: float = 15) -> None:
    """SIGTERM the process group started with ``start_new_session``, then SIGKILL it."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=timeout_seconds)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


@dataclass
class PrefectServer:
    """A running server plus the environment its clients need."""

    api_url: str
    home: Path
    env: dict[str, str]
    proc: subprocess.Popen
    workers: list[subprocess.Popen] = field(default_factory=list)
    timings_seconds: dict[str, float] = field(default_factory=dict)

    def cli(
        self, *args: str, cwd: Path | None = None, timeout: float = 120
    ) -> subprocess.CompletedProcess:
        """Run the ``prefect`` command line against this server; fails the test on an error."""
        res = subprocess.run(
            [str(BIN / "prefect"), *args],
            cwd=cwd,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        assert res.returncode == 0, f"prefect {' '.join(args)} failed:\n{res.stdout}\n{res.stderr}"
        return res

    def start_worker(
        self, log: Path, extra_env: dict[str, str] | None = None, pool: str = POOL
    ) -> subprocess.Popen:
        """A process worker on ``pool`` (polls every second); stopped in the session teardown."""
        env = {
            **self.env,
            "PREFECT_WORKER_QUERY_SECONDS": "1",
            "PREFECT_WORKER_PREFETCH_SECONDS": "5",
        }
        env.update(extra_env or {})
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                [str(BIN / "prefect"), "worker", "start", "--pool", pool, "--type", "process"],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.workers.append(proc)
        return proc


def _wait_healthy(url: str, proc: subprocess.Popen, log: Path, timeout_seconds: float = 90) -> None:
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"prefect server exited: {log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as res:
                if res.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.3)
    raise RuntimeError(
        f"prefect server did not answer in {timeout_seconds} s: {log.read_text()[-3000:]}"
    )


def clean_copy(dest: Path) -> Path:
    """Copy the files git would ship (tracked plus untracked-not-ignored) to ``dest``."""
    listed = (
        subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
            cwd=REPO,
            capture_output=True,
            check=True,
        )
        .stdout.decode()
        .split("\0")
    )
    for rel in filter(None, listed):
        src = REPO / rel
        if src.is_file():
            target = dest / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, target)
    return dest


@pytest.fixture(scope="session")
def prefect_server(tmp_path_factory) -> Iterator[PrefectServer]:
    """``prefect server start`` on a free loopback port; in-process clients point at it too."""
    from prefect.settings import (
        PREFECT_API_URL,
        PREFECT_FLOWS_HEARTBEAT_FREQUENCY,
        temporary_settings,
    )

    home = tmp_path_factory.mktemp("prefect-home")
    port = free_port()
    api_url = f"http://127.0.0.1:{port}/api"
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("PREFECT_") or k.startswith("PREFECT_ODM_")
    }
    env.pop("PREFECT_ODM_ENGINE_FAULTS", None)
    env.update(
        {
            "PREFECT_HOME": str(home),
            "PREFECT_API_URL": api_url,
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "PREFECT_UI_ENABLED": "false",
            "PREFECT_LOGGING_LEVEL": "INFO",
            "PREFECT_ODM_HOME": str(home / "odm"),
            # proactive triggers (the crash automation) evaluated every few seconds
            "PREFECT_SERVER_SERVICES_TRIGGERS_ENABLED": "true",
        }
    )
    log = home / "server.log"
    t0 = time.monotonic()
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(port)],
            env={k: v for k, v in env.items() if k != "PREFECT_API_URL"},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    server = PrefectServer(api_url=api_url, home=home, env=env, proc=proc)
    try:
        _wait_healthy(api_url, proc, log)
        server.timings_seconds["server_start"] = time.monotonic() - t0
        server.cli("work-pool", "create", POOL, "--type", "process")
        with temporary_settings(
            {PREFECT_API_URL: api_url, PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}
        ):
            yield server
    finally:
        for worker in server.workers:
            stop_group(worker)
        stop_group(proc)


@pytest.fixture(scope="session")
def deployed(prefect_server: PrefectServer, tmp_path_factory) -> Path:
    """``prefect deploy --all`` from a clean copy of the repository (the copy's path)."""
    from prefect_odm.cli_ops import create_work_queues

    copy = clean_copy(tmp_path_factory.mktemp("clone") / "prefect-odm")
    t0 = time.monotonic()
    res = prefect_server.cli("--no-prompt", "deploy", "--all", cwd=copy, timeout=300)
    prefect_server.timings_seconds["deploy_all"] = time.monotonic() - t0
    (prefect_server.home / "deploy.log").write_text(res.stdout + res.stderr)
    create_work_queues(POOL)
    return copy


@pytest.fixture(scope="session")
def worker(prefect_server: PrefectServer, deployed: Path) -> subprocess.Popen:
    """One process worker on the pool for the session."""
    return prefect_server.start_worker(prefect_server.home / "worker.log")
