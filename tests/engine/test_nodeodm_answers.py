"""Where the engine answers as NodeODM 2.2.4 does (issue 13, item 6), engine-only details.

The shared protocol tests (``tests/test_node_compat.py``) check the same routes against both the
engine and a real NodeODM; these cover the body encodings and the option vocabulary in depth.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import requests

from prefect_odm.engine.launch import EngineProcess
from prefect_odm.nodes.option_check import check_options, nodeodm_understands_domain

from .conftest import EngineFactory, upload_task, wait_status

pytestmark = pytest.mark.integration

UNKNOWN = "7f5e0a52-5d0c-4c6e-9a53-3f1b1c2d3e4f"
PENDING_UUID = "2ed6657d-e927-568b-95e1-2665a8aea6a2"


def _post(engine: EngineProcess, route: str, encoding: str, body: dict[str, Any]) -> Any:
    url = f"{engine.url}/task/{route}"
    if encoding == "json":
        return requests.post(url, json=body, timeout=10).json()
    if encoding == "multipart":
        files = {k: (None, v if isinstance(v, str) else json.dumps(v)) for k, v in body.items()}
        return requests.post(url, files=files, timeout=10).json()
    return requests.post(url, data=body, timeout=10).json()


@pytest.mark.parametrize("encoding", ["json", "urlencoded", "multipart"])
def test_actions_read_every_body_encoding(
    engine_factory: EngineFactory, few_images: list[Path], encoding: str
) -> None:
    engine = engine_factory(faults={"slow_seconds": 30})
    uuid = upload_task(engine.url, few_images[:1])
    wait_status(engine.url, uuid, {20})
    assert _post(engine, "cancel", encoding, {"uuid": uuid}) == {"success": True}
    assert _post(engine, "cancel", encoding, {"uuid": uuid}) == {"success": True}  # again
    assert _post(engine, "remove", encoding, {"uuid": uuid}) == {"success": True}
    for route in ("cancel", "remove", "restart"):
        assert _post(engine, route, encoding, {"uuid": UNKNOWN}) == {
            "success": False,
            "error": f"{UNKNOWN} not found",
        }
        assert _post(engine, route, encoding, {}) == {"error": "uuid param missing."}


@pytest.mark.parametrize("as_text", [True, False], ids=["options-text", "options-list"])
def test_restart_json_body_options_as_text_or_list(
    engine: EngineProcess, few_images: list[Path], as_text: bool
) -> None:
    uuid = upload_task(engine.url, few_images[:1])
    wait_status(engine.url, uuid, {40})
    options: Any = [
        {"name": "rerun-from", "value": "odm_orthophoto"},
        {"name": "dsm", "value": "1"},
    ]
    body = {"uuid": uuid, "options": json.dumps(options) if as_text else options}
    assert _post(engine, "restart", "json", body) == {"success": True}
    info = wait_status(engine.url, uuid, {40})
    assert {"name": "rerun-from", "value": "odm_orthophoto"} in info["options"]
    assert {"name": "dsm", "value": True} in info["options"]
    bad = {"uuid": uuid, "options": [{"name": "pipeline", "value": "magic"}]}
    refused = _post(engine, "restart", "json", bad)
    assert refused["success"] is False and "pipeline" in refused["error"]


def test_cancel_of_a_completed_task_is_refused(
    engine: EngineProcess, few_images: list[Path]
) -> None:
    """NodeODM turns a COMPLETED task into a CANCELED one; the engine keeps its products."""
    uuid = upload_task(engine.url, few_images[:1])
    wait_status(engine.url, uuid, {40})
    refused = _post(engine, "cancel", "urlencoded", {"uuid": uuid})
    assert refused == {"success": False, "error": "Task already finished"}
    assert wait_status(engine.url, uuid, {40})["status"] == {"code": 40}


def test_init_again_replaces_a_pending_task_and_keeps_its_uploads(
    engine: EngineProcess, few_images: list[Path]
) -> None:
    def init(name: str, options: list[dict[str, Any]]) -> Any:
        fields = {"name": (None, name), "options": (None, json.dumps(options))}
        return requests.post(
            f"{engine.url}/task/new/init",
            files=fields,
            headers={"set-uuid": PENDING_UUID},
            timeout=10,
        ).json()

    assert init("first", [{"name": "dsm", "value": True}]) == {"uuid": PENDING_UUID}
    for path in few_images[:2]:
        with open(path, "rb") as fh:
            up = requests.post(
                f"{engine.url}/task/new/upload/{PENDING_UUID}",
                files={"images": (path.name, fh)},
                timeout=30,
            ).json()
        assert up == {"success": True}
    # a bad re-init changes nothing
    assert "error" in init("bad", [{"name": "pipeline", "value": "magic"}])
    assert init("second", [{"name": "dtm", "value": "1"}]) == {"uuid": PENDING_UUID}
    commit = requests.post(f"{engine.url}/task/new/commit/{PENDING_UUID}", timeout=30).json()
    assert commit == {"uuid": PENDING_UUID}
    info = wait_status(engine.url, PENDING_UUID, {40})
    assert info["name"] == "second" and info["imagesCount"] == 2
    assert info["options"] == [{"name": "dtm", "value": True}]
    assert init("third", []) == {"error": f"Invalid set-uuid: {PENDING_UUID}"}


def test_options_use_nodeodm_vocabulary(engine_factory: EngineFactory) -> None:
    """The real pipeline's list (no task is committed, nothing is processed)."""
    engine = engine_factory(real=True)
    options = requests.get(f"{engine.url}/options", timeout=10).json()
    by_name = {o["name"]: o for o in options}
    assert all(nodeodm_understands_domain(o["domain"]) for o in options)
    assert {o["domain"] for o in options if o["type"] == "bool"} == {""}
    assert all(o["value"] in o["domain"] for o in options if o["type"] == "enum")
    assert by_name["rerun-from"]["domain"][0] == ""
    assert by_name["orthophoto-resolution"]["domain"] == "float > 0.0"
    assert by_name["max-concurrency"]["domain"] == "integer > 0"
    assert by_name["matcher-neighbors"]["domain"] == "positive integer"
    # our client's checker and the engine agree on every value tried here
    cases: list[tuple[str, Any, bool]] = [
        ("dsm", "1", True),
        ("dsm", "0", True),
        ("dsm", "true", True),
        ("dsm", False, True),
        ("dsm", "perhaps", False),
        ("matcher-neighbors", 0, True),  # NodeODM's "positive" is >= 0
        ("matcher-neighbors", -1, False),
        ("orthophoto-resolution", 0, False),
        ("orthophoto-resolution", 0.5, True),
        ("max-concurrency", 0, False),
        ("max-concurrency", 1, True),
        ("rerun-from", "", True),
    ]
    for name, value, ok in cases:
        assert (check_options({name: value}, options) == []) is ok, (name, value)
        res = requests.post(
            f"{engine.url}/task/new/init",
            files={"options": (None, json.dumps([{"name": name, "value": value}]))},
            timeout=10,
        ).json()
        assert ("uuid" in res) is ok, (name, value, res)
