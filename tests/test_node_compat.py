"""Where the built-in engine must answer as NodeODM does (issue 13, item 6), over raw HTTP and
against both backends; and ClusterODM's answers, replayed by a loopback stand-in (no ClusterODM
here), read by our client.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import peers
import pytest
import requests
from node_helpers import (
    IMAGES,
    POLL_SECONDS,
    Node,
    NodeFactory,
    new_uuid,
    running_and_queued,
)

from prefect_odm.errors import NodeError
from prefect_odm.nodes.client import (
    NodeClient,
)
from prefect_odm.nodes.messages import is_unknown_task_error
from prefect_odm.nodes.option_check import nodeodm_understands_domain

pytestmark = pytest.mark.integration
pytest_plugins = ("node_backends",)  # the backend and start_node fixtures


# -- the built-in engine must answer as NodeODM does (issue 13, item 6) ---------------------------


def _raw_task(
    node: Node, *, uuid: str | None = None, name: str = "raw", commit: bool = True
) -> str:
    headers = {"set-uuid": uuid} if uuid else {}
    res = requests.post(
        f"{node.url}/task/new/init",
        files={"name": (None, name), "options": (None, "[]")},
        headers=headers,
        params=node.params,
        timeout=10,
    ).json()
    assert "uuid" in res, res
    with open(IMAGES[0], "rb") as fh:
        up = requests.post(
            f"{node.url}/task/new/upload/{res['uuid']}",
            files={"images": (IMAGES[0].name, fh)},
            params=node.params,
            timeout=30,
        )
    assert up.json() == {"success": True}, up.text
    if commit:
        done = requests.post(
            f"{node.url}/task/new/commit/{res['uuid']}", params=node.params, timeout=30
        )
        assert done.json() == {"uuid": res["uuid"]}, done.text
    return str(res["uuid"])


def test_restart_accepts_a_json_body(start_node: NodeFactory) -> None:
    node = start_node()
    client = node.client()
    uuid = _raw_task(node)
    client.wait(uuid, poll_interval_seconds=POLL_SECONDS)
    stages = next(o for o in client.options() if o.name == "rerun-from").domain
    assert stages is not None
    stage = [s for s in stages if s][-1]
    body = {"uuid": uuid, "options": json.dumps([{"name": "rerun-from", "value": stage}])}
    res = requests.post(f"{node.url}/task/restart", json=body, params=node.params, timeout=10)
    assert res.json() == {"success": True}
    state = client.wait(uuid, poll_interval_seconds=POLL_SECONDS)
    assert {"name": "rerun-from", "value": stage} in state.info["options"]


@pytest.mark.parametrize("encoding", ["urlencoded", "json"])
@pytest.mark.parametrize("route", ["cancel", "remove", "restart"])
def test_unknown_task_answers_success_false(
    start_node: NodeFactory, route: str, encoding: str
) -> None:
    """Both body encodings NodeODM reads (pyodm sends urlencoded)."""
    node = start_node()
    unknown = new_uuid()
    body_arg = {"json": {"uuid": unknown}} if encoding == "json" else {"data": {"uuid": unknown}}
    res = requests.post(f"{node.url}/task/{route}", params=node.params, timeout=10, **body_arg)
    body = res.json()
    assert body["success"] is False, body
    assert is_unknown_task_error(body["error"], unknown), body


def test_second_init_with_the_same_set_uuid_overwrites_a_pending_task(
    start_node: NodeFactory,
) -> None:
    """NodeODM (observed): a second init of an uncommitted task replaces its fields and keeps the
    files already uploaded; once committed, the UUID is refused."""
    node = start_node()
    uuid = new_uuid()
    _raw_task(node, uuid=uuid, name="first", commit=False)
    again = requests.post(
        f"{node.url}/task/new/init",
        files={"name": (None, "second"), "options": (None, "[]")},
        headers={"set-uuid": uuid},
        params=node.params,
        timeout=10,
    ).json()
    assert again == {"uuid": uuid}
    done = requests.post(f"{node.url}/task/new/commit/{uuid}", params=node.params, timeout=30)
    assert done.json() == {"uuid": uuid}, done.text
    state = node.client().wait(uuid, poll_interval_seconds=POLL_SECONDS)
    assert state.info["name"] == "second"
    assert state.images_count == 1
    refused = requests.post(
        f"{node.url}/task/new/init",
        files={"name": (None, "third")},
        headers={"set-uuid": uuid},
        params=node.params,
        timeout=10,
    ).json()
    assert "error" in refused and "set-uuid" in refused["error"], refused


def test_cancel_of_a_cancelled_task_succeeds(start_node: NodeFactory) -> None:
    """NodeODM answers ``success: true`` to a cancel of an already cancelled task."""
    node = start_node(parallel=1, task_seconds=4)
    _, second = running_and_queued(node.client())
    assert node.client().cancel(second) is True
    res = requests.post(
        f"{node.url}/task/cancel", data={"uuid": second}, params=node.params, timeout=10
    )
    assert res.json() == {"success": True}


def test_options_domains_are_nodeodm_domains(start_node: NodeFactory) -> None:
    """Every ``/options`` domain is one NodeODM's (and ClusterODM's) validator can check, so
    ClusterODM can front the node and a NodeODM client can validate against the list."""
    options = [o.raw for o in start_node().client().options()]
    odd = {o["name"]: o["domain"] for o in options if not nodeodm_understands_domain(o["domain"])}
    assert odd == {}


# -- ClusterODM's answers (no ClusterODM here: a loopback stand-in replays libs/proxy.js) --------


class _ClusterODMStandIn(BaseHTTPRequestHandler):
    """Answers as ClusterODM (HEAD 69181e2) does for tasks it has no route for, and 401 for a
    wrong token."""

    def _send(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        path, _, query = self.path.partition("?")
        if "token=good" not in query:
            self.send_response(401, "unauthorized")
            self.end_headers()
            return
        parts = path.strip("/").split("/")
        if parts[0] == "task" and len(parts) >= 3:
            action = "/".join(parts[2:])
            error = f"Invalid route for taskId {parts[1]}:{action}, no task table entry."
            self._send(200, {"error": error})
        else:
            self._send(404, {})

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def clusterodm_stand_in() -> Iterator[str]:
    server = ThreadingHTTPServer((peers.LOOPBACK, 0), _ClusterODMStandIn)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://{peers.LOOPBACK}:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_clusterodm_unknown_task_is_none(clusterodm_stand_in: str) -> None:
    """Issue 13: ClusterODM's "no task table entry." is an unknown task, not a failure."""
    assert NodeClient(clusterodm_stand_in, token="good").task_state(new_uuid()) is None


def test_clusterodm_bad_token(clusterodm_stand_in: str) -> None:
    with pytest.raises(NodeError) as refused:
        NodeClient(clusterodm_stand_in, token="bad").task_state(new_uuid())
    assert "Unauthorized" in str(refused.value) and "token=bad" not in str(refused.value)
