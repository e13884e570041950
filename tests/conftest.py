"""Shared fixtures: the real survey data in ../shared/data, used in place."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from odm_server import BIN, POOL, PrefectServer, free_port, stop_group, wait_healthy  # noqa: F401

# Tests talk to 127.0.0.1 only: no telemetry from the Prefect servers they start.
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")

REPO = Path(__file__).resolve().parents[1]
DATA = (REPO / ".." / "shared" / "data").resolve()

SHARED_SESSION_RUNS = {"brighton_split": "brighton-split"}
"""Session fixtures that reconstruct a survey: every test file using one runs on the same
pytest-xdist worker, so the survey is reconstructed once for the suite."""


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Group the tests for ``--dist loadgroup``: by file (module fixtures made once), the files
    sharing a reconstructing session fixture together, and ``tests/prefect/`` (one deployment
    and one worker for the session) as one group."""
    by_file: dict[Path, str] = {}
    for item in items:
        path = Path(str(item.path))
        if path not in by_file:
            by_file[path] = str(path.relative_to(REPO))
        fixtures = getattr(item, "fixturenames", ())
        for fixture, group in SHARED_SESSION_RUNS.items():
            if fixture in fixtures:
                by_file[path] = group
        if path.parent.name == "prefect":
            by_file[path] = "tests/prefect"
    for item in items:
        item.add_marker(pytest.mark.xdist_group(by_file[Path(str(item.path))]))


def pytest_xdist_node_collection_finished(node: object, ids: list[str]) -> None:
    """Stop a run whose tests lost their groups: pytest-xdist's ``loadgroup`` marks a group by a
    suffix on each node id, which pytest 9.2 drops (pytest-xdist issue 1386); the suite then ran
    each module's reconstruction once per worker that drew one of its tests."""
    config = getattr(node, "config", None)
    if config is None or config.getvalue("dist") != "loadgroup":
        return
    lost = [nodeid for nodeid in ids if "@" not in nodeid]
    if lost:
        raise pytest.UsageError(
            f"--dist loadgroup: {len(lost)} of {len(ids)} tests lost their xdist_group (first "
            f"{lost[0]}): this pytest and pytest-xdist cannot group them (pytest-xdist issue 1386)"
        )


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """``../shared/data`` beside the repository (fails loudly when it is missing)."""
    assert DATA.is_dir(), f"survey data not found at {DATA}"
    return DATA


@pytest.fixture(scope="session")
def brighton_images(data_dir: Path) -> Path:
    return data_dir / "brighton_beach_1600" / "images"


@pytest.fixture(scope="session")
def seneca_images(data_dir: Path) -> Path:
    return data_dir / "seneca_1200" / "images"


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
            # the UI is served for the browser test (tests/prefect/test_ui_browser.py)
            "PREFECT_UI_ENABLED": "true",
            "PREFECT_UI_API_URL": api_url,
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
        wait_healthy(api_url, proc, log)
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
def prefect_api(prefect_server):
    """The API URL of the session's one Prefect server (every test talks to the same server:
    Prefect's background threads keep the API URL they started with)."""
    return prefect_server.api_url


@pytest.fixture()
def odm_home(tmp_path_factory, monkeypatch):
    """A private home for the embedded engine's data."""
    home = tmp_path_factory.mktemp("prefect-odm-home")
    monkeypatch.setenv("PREFECT_ODM_HOME", str(home))
    return home


@pytest.fixture(scope="session")
def s3_endpoint():
    """A moto S3 server on 127.0.0.1; AWS_* variables point s3fs/boto at it for the session."""
    import socket

    from moto.server import ThreadedMotoServer

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    url = f"http://127.0.0.1:{port}"
    mp = pytest.MonkeyPatch()
    for key, value in {
        "AWS_ENDPOINT_URL": url,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        mp.setenv(key, value)
    try:
        yield url
    finally:
        mp.undo()
        server.stop()


@pytest.fixture(scope="session")
def brighton_split(prefect_api, brighton_images, tmp_path_factory):
    """brighton reconstructed with --split 10 --split-overlap-m 20 (two submodels), once for
    the session: the alignment tests read its cameras and products and never write to it."""
    from prefect_odm.flows import reconstruct

    from prefect_odm.models import SplitPlan

    out = tmp_path_factory.mktemp("brighton-align")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PREFECT_ODM_HOME", str(tmp_path_factory.mktemp("odm-home")))
        manifest = reconstruct(
            images=str(brighton_images), output=str(out), split=10, split_overlap_m=20
        )
    survey_dir = Path(manifest.products["orthophoto"]).parents[1]
    plan = SplitPlan.model_validate_json((survey_dir / "plan" / "plan.json").read_text())
    return manifest, survey_dir, plan
