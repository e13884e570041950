"""Shared fixtures: the real survey data in ../shared/data, used in place."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# Tests talk to 127.0.0.1 only: no telemetry from the Prefect servers they start.
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")

REPO = Path(__file__).resolve().parents[1]
DATA = (REPO / ".." / "shared" / "data").resolve()


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
def prefect_api():
    """A real Prefect API (SQLite) for the whole session, started once (~12 s).

    Yields the API URL so subprocesses (the command line) can use the same server.
    """
    from prefect.settings import (
        PREFECT_API_URL,
        PREFECT_FLOWS_HEARTBEAT_FREQUENCY,
        temporary_settings,
    )
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        # The heartbeat costs ~1 s per flow run and nothing watches it here.
        with temporary_settings({PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}):
            yield PREFECT_API_URL.value()


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
