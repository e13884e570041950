"""No single Prefect API error fails a run (issue 14).

A proxy in front of the session's real ``prefect server`` answers ``503`` to 20% of API requests
for a minute (as a SQLite-backed server does for a locked database) while ``prefect-odm
reconstruct`` runs through it on an external built-in engine node: the run completes and every
submodel is processed once (one ``POST /task/new/init`` each on the node).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
from flaky_api_proxy import FlakyProxy
from odm_server import reconstruct_command

from prefect_odm.engine.launch import start_engine

pytestmark = pytest.mark.integration


def _inits(data_dir: Path) -> int:
    log = data_dir / "requests.log"
    lines = log.read_text().splitlines() if log.exists() else []
    return sum(
        1
        for r in map(json.loads, lines)
        if r["method"] == "POST" and r["path"].startswith("/task/new/init")
    )


def test_a_run_through_an_api_that_answers_503_to_a_fifth_of_requests_completes(
    prefect_server, brighton_images: Path, tmp_path: Path
) -> None:
    upstream = prefect_server.api_url.removesuffix("/api")
    with (
        start_engine(tmp_path / "node", method="direct", max_parallel_tasks=2) as node,
        FlakyProxy(upstream, failure_rate=0.2, window_seconds=60.0) as proxy,
    ):
        env = {**prefect_server.env, "PREFECT_API_URL": proxy.api_url}
        env.pop("PREFECT_ODM_ENGINE_FAULTS", None)
        env["PREFECT_ODM_HOME"] = str(tmp_path / "odm-home")
        proxy.start_failing()
        started = time.monotonic()
        res = subprocess.run(
            reconstruct_command(brighton_images, tmp_path / "out", "--nodes", node.url),
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
            cwd=os.getcwd(),
        )
        seconds = time.monotonic() - started
        inits = _inits(node.data_dir)
    print(
        f"run through the flaky proxy: {seconds:.1f} s, {proxy.counts.failed} requests answered "
        f"503 of {proxy.counts.failed + proxy.counts.forwarded}: {proxy.counts.failed_paths}"
    )
    assert res.returncode == 0, res.stderr[-3000:]
    (manifest_path,) = (tmp_path / "out").glob("*/manifest.json")
    manifest = json.loads(manifest_path.read_text())
    statuses = [s["status"] for s in manifest["submodels"]]
    assert len(statuses) >= 2 and set(statuses) == {"completed"}
    assert inits == len(statuses), f"{inits} task inits for {len(statuses)} submodels"
    assert proxy.counts.failed >= 10, "the proxy failed too few requests to test anything"
