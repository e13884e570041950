"""The documented multi-machine setup: a Prefect server backed by a real PostgreSQL (issue 14).

PostgreSQL and ``prefect server start`` run on 127.0.0.1; ``prefect-odm reconstruct`` runs as a
user runs it, with ``PREFECT_API_URL`` pointing at that server. The flow runs it made are read
back from PostgreSQL itself, so the test fails if the server quietly used SQLite.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from odm_server import BIN, free_port, stop_group, wait_healthy
from postgres_server import start_postgres

pytestmark = pytest.mark.integration


def test_reconstruct_against_a_postgresql_backed_prefect_server(
    tmp_path: Path, brighton_images: Path
) -> None:
    with start_postgres(tmp_path / "pg") as pg:
        pg.sql("postgres", "CREATE DATABASE prefect")
        home = tmp_path / "prefect-home"
        port = free_port()
        api_url = f"http://127.0.0.1:{port}/api"
        env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
        env.update(
            {
                "PREFECT_HOME": str(home),
                "PREFECT_ODM_HOME": str(tmp_path / "odm-home"),
                "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
                "PREFECT_UI_ENABLED": "false",
                "PREFECT_API_DATABASE_CONNECTION_URL": pg.url("prefect"),
            }
        )
        home.mkdir()
        log = home / "server.log"
        with open(log, "ab") as out:
            server = subprocess.Popen(
                [
                    str(BIN / "prefect"),
                    "server",
                    "start",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(port),
                ],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            wait_healthy(api_url, server, log, timeout_seconds=180)
            run_env = {k: v for k, v in env.items() if k != "PREFECT_API_DATABASE_CONNECTION_URL"}
            run_env["PREFECT_API_URL"] = api_url
            started = time.monotonic()
            res = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "prefect_odm.cli",
                    "reconstruct",
                    str(brighton_images),
                    "--output",
                    str(tmp_path / "out"),
                    "--split",
                    "5",
                    "--split-overlap-m",
                    "15",
                    "--pipeline",
                    "direct",
                ],
                env=run_env,
                capture_output=True,
                text=True,
                timeout=900,
            )
            assert res.returncode == 0, res.stderr[-3000:]
            print(
                f"reconstruct on the PostgreSQL-backed server: {time.monotonic() - started:.1f} s"
            )
            rows = pg.sql(
                "prefect", "SELECT state_type, count(*) FROM flow_run GROUP BY state_type"
            ).splitlines()
            counts = dict(row.split("|") for row in rows)
            submodels = len(list((tmp_path / "out").glob("*/submodels/*/result.json")))
            assert submodels >= 2
            # The parent and one child flow run per submodel, all completed, stored in PostgreSQL.
            assert counts == {"COMPLETED": str(submodels + 1)}
        finally:
            stop_group(server)
