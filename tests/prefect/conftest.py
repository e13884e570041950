"""A real ``prefect server start`` (SQLite, private PREFECT_HOME) with the deployments of
``prefect.yaml`` deployed from a clean copy of the repository, and a process worker.

Everything listens on 127.0.0.1; every process is started in its own session and its whole
process group is killed in teardown.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest
from odm_server import POOL, PrefectServer, free_port, stop_group  # noqa: F401

REPO = Path(__file__).resolve().parents[2]


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
def deployed(prefect_server: PrefectServer, tmp_path_factory) -> Path:
    """``prefect deploy --all`` from a clean copy of the repository (the copy's path)."""
    from prefect_odm.cli.ops import create_work_queues

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
