"""Fixtures for the built-in engine tests: real brighton images and engines on 127.0.0.1."""

from __future__ import annotations

import importlib
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from prefect_odm.engine.launch import EngineProcess, start_engine

REPO_ROOT = Path(__file__).resolve().parents[2]
DATA_DIR = REPO_ROOT / ".." / "shared" / "data"
BRIGHTON_IMAGES = DATA_DIR / "brighton_beach_1600" / "images"


def real_pipeline_available() -> bool:
    """True when prefect_odm.engine.pipeline (and what it needs) imports."""
    try:
        importlib.import_module("prefect_odm.engine.pipeline")
    except ImportError:
        return False
    return True


@pytest.fixture(scope="session")
def brighton_image_files() -> list[Path]:
    """All 18 brighton images, sorted by name."""
    images = sorted(BRIGHTON_IMAGES.glob("*.JPG")) + sorted(BRIGHTON_IMAGES.glob("*.jpg"))
    assert images, f"brighton images not found under {BRIGHTON_IMAGES}"
    return sorted(images)


@pytest.fixture(scope="session")
def few_images(brighton_image_files: list[Path]) -> list[Path]:
    """Three real brighton images (small uploads for protocol tests)."""
    return brighton_image_files[:3]


EngineFactory = Callable[..., EngineProcess]


@pytest.fixture
def engine_factory(tmp_path: Path) -> Iterator[EngineFactory]:
    """Start engines (stand-in pipeline unless ``real=True``); every one is stopped afterwards.

    Keyword arguments: ``data_dir`` (default ``tmp_path/"engine"``), ``faults`` (dict merged
    with ``{"stand_in_pipeline": True}`` unless ``real``), ``real`` and any argument of
    :func:`start_engine`.
    """
    started: list[EngineProcess] = []

    def factory(
        *,
        data_dir: Path | None = None,
        faults: dict[str, Any] | None = None,
        real: bool = False,
        **kwargs: Any,
    ) -> EngineProcess:
        config = dict(faults or {})
        if not real:
            config.setdefault("stand_in_pipeline", True)
        env = dict(kwargs.pop("extra_env", None) or {})
        if config:
            env["PREFECT_ODM_ENGINE_FAULTS"] = json.dumps(config)
        engine = start_engine(data_dir or tmp_path / "engine", extra_env=env, **kwargs)
        started.append(engine)
        return engine

    yield factory
    for engine in started:
        if engine.alive():
            engine.stop()


@pytest.fixture
def engine(engine_factory: EngineFactory) -> EngineProcess:
    """One engine with the stand-in pipeline and no token."""
    return engine_factory()


def wait_status(
    url: str, uuid: str, codes: set[int], *, timeout_seconds: float = 60, token: str | None = None
) -> dict[str, Any]:
    """Poll ``/task/{uuid}/info`` until its status code is in ``codes``; returns the info."""
    params = {"token": token} if token else {}
    deadline = time.monotonic() + timeout_seconds
    info: dict[str, Any] = {}
    while time.monotonic() < deadline:
        info = requests.get(f"{url}/task/{uuid}/info", params=params, timeout=10).json()
        if info.get("status", {}).get("code") in codes:
            return info
        time.sleep(0.1)
    raise AssertionError(f"task {uuid} did not reach {codes} in {timeout_seconds} s: {info}")


def init_task(url: str, name: str, uuid: str) -> dict[str, Any]:
    """POST ``/task/new/init`` with a task name and a ``set-uuid``; returns the JSON answer."""
    answer: dict[str, Any] = requests.post(
        f"{url}/task/new/init",
        files={"name": (None, name)},
        headers={"set-uuid": uuid},
        timeout=10,
    ).json()
    return answer


def upload_task(
    url: str,
    files: list[Path],
    *,
    options: list[dict[str, Any]] | None = None,
    uuid: str | None = None,
    name: str = "test",
    extra_fields: dict[str, str] | None = None,
    token: str | None = None,
) -> str:
    """Create a task over raw HTTP (init, one upload per file, commit); returns its UUID."""
    params = {"token": token} if token else {}
    headers = {"set-uuid": uuid} if uuid else {}
    fields = {"name": (None, name), "options": (None, json.dumps(options or []))}
    for key, value in (extra_fields or {}).items():
        fields[key] = (None, value)
    res = requests.post(
        f"{url}/task/new/init", files=fields, headers=headers, params=params, timeout=10
    ).json()
    assert "uuid" in res, res
    for path in files:
        with open(path, "rb") as fh:
            up = requests.post(
                f"{url}/task/new/upload/{res['uuid']}",
                files={"images": (path.name, fh)},
                params=params,
                timeout=30,
            )
        assert up.json() == {"success": True}, up.text
    commit = requests.post(f"{url}/task/new/commit/{res['uuid']}", params=params, timeout=30)
    assert commit.json() == {"uuid": res["uuid"]}, commit.text
    return str(res["uuid"])
