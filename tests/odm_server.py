"""A real ``prefect server start`` for the test session (imported by the conftests)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

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


def wait_healthy(url: str, proc: subprocess.Popen, log: Path, timeout_seconds: float = 90) -> None:
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


@contextmanager
def prefect_server_process(
    home: Path, env: dict[str, str], timeout_seconds: float = 180
) -> Iterator[str]:
    """``prefect server start`` on a free 127.0.0.1 port with ``env`` (its database from
    ``PREFECT_API_DATABASE_CONNECTION_URL`` when set), logging to ``home/server.log``; yields
    the API URL once it answers, and stops the server's process group afterwards."""
    home.mkdir(parents=True, exist_ok=True)
    port = free_port()
    log = home / "server.log"
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(port)],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        api_url = f"http://127.0.0.1:{port}/api"
        wait_healthy(api_url, proc, log, timeout_seconds=timeout_seconds)
        yield api_url
    finally:
        stop_group(proc)


def reconstruct_command(images: Path, out: Path, *extra: str) -> list[str]:
    """``prefect-odm reconstruct`` of ``images`` into ``out`` as the small loopback tests run
    it (split 5, 15 m overlap, the direct pipeline), plus ``extra`` arguments."""
    return [
        sys.executable,
        "-m",
        "prefect_odm.cli",
        "reconstruct",
        str(images),
        "--output",
        str(out),
        *extra,
        "--split",
        "5",
        "--split-overlap-m",
        "15",
        "--pipeline",
        "direct",
    ]
