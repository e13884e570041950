"""The documented multi-machine setup: a Prefect server backed by a real PostgreSQL (issue 14).

PostgreSQL and ``prefect server start`` run on 127.0.0.1; ``prefect-odm reconstruct`` runs as a
user runs it, with ``PREFECT_API_URL`` pointing at that server. The flow runs it made are read
back from PostgreSQL itself, so the test fails if the server quietly used SQLite.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest
from odm_server import prefect_server_process, reconstruct_command
from postgres_server import start_postgres

pytestmark = pytest.mark.integration


def test_reconstruct_against_a_postgresql_backed_prefect_server(
    tmp_path: Path, brighton_images: Path
) -> None:
    with start_postgres(tmp_path / "pg") as pg:
        pg.sql("postgres", "CREATE DATABASE prefect")
        home = tmp_path / "prefect-home"
        env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
        env.update(
            {
                "PREFECT_HOME": str(home),
                "PREFECT_ODM_HOME": str(tmp_path / "odm-home"),
                "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
                "PREFECT_UI_ENABLED": "false",
            }
        )
        server_env = {**env, "PREFECT_API_DATABASE_CONNECTION_URL": pg.url("prefect")}
        with prefect_server_process(home, server_env) as api_url:
            started = time.monotonic()
            res = subprocess.run(
                reconstruct_command(brighton_images, tmp_path / "out"),
                env={**env, "PREFECT_API_URL": api_url},
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
