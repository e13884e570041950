"""The NodeODM protocol, spoken by our client (``prefect_odm.nodeodm.NodeClient``) to two servers.

Every test runs against BOTH backends, never skipped:

* ``engine``: the built-in engine started as a real server on 127.0.0.1 (stand-in pipeline);
* ``nodeodm``: OpenDroneMap's real NodeODM 2.2.4 in test mode (``tests/peers.py``).

NodeODM's test mode returns the same canned products for every task, whatever was uploaded, so
these tests assert on the protocol and the bookkeeping, never on pixels. A later section holds
the places where the built-in engine must answer as NodeODM does (issue 13, item 6), checked
over raw HTTP; the last one replays ClusterODM's answers from a loopback stand-in.
"""

from __future__ import annotations

import json
import threading
import time
import uuid as uuidlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import peers
import pytest
import requests

from prefect_odm.engine.launch import EngineProcess, start_engine
from prefect_odm.errors import NodeError, ProcessingFailedError
from prefect_odm.node_capacity import node_capacity
from prefect_odm.node_health import HealthBook, HealthPolicy, order_nodes
from prefect_odm.node_messages import is_unknown_task_error
from prefect_odm.nodeodm import (
    CANCELED,
    COMPLETED,
    QUEUED,
    RUNNING,
    NodeClient,
    TaskState,
    task_uuid,
)
from prefect_odm.option_check import check_options, nodeodm_understands_domain

pytestmark = pytest.mark.integration

BACKENDS = ("engine", "nodeodm")
IMAGES = sorted((peers.SHARED / "data" / "brighton_beach_1600" / "images").glob("*.JPG"))
POLL_SECONDS = 0.2


@dataclass
class Node:
    """A running node of either backend, with what a test may do to it."""

    backend: str
    url: str
    token: str | None
    kill: Callable[[], None]
    restart: Callable[[], None]
    stop: Callable[[], None]
    durable: bool
    """The task table survives SIGKILL (the engine's does; NodeODM's only at SIGTERM/hourly)."""

    def client(self, *, token: str | None = None) -> NodeClient:
        """Our client for this node (with this node's token unless another is given)."""
        return NodeClient(
            self.url, token=self.token if token is None else token, timeout_seconds=15
        )

    @property
    def params(self) -> dict[str, str]:
        """Query parameters for raw HTTP requests."""
        return {"token": self.token} if self.token else {}


@dataclass
class _Flags:
    token: str | None = None
    drop_uploads: bool = False
    parallel: int = 2
    task_seconds: float = 0.0
    fail_tasks: bool = False
    extra: list[str] = field(default_factory=list)


def _start_engine(work: Path, flags: _Flags) -> Node:
    faults: dict[str, Any] = {"stand_in_pipeline": True}
    if flags.drop_uploads:
        faults["upload_error_every"] = 2
    if flags.task_seconds:
        faults["slow_seconds"] = flags.task_seconds
    if flags.fail_tasks:
        faults["fail_task_name"] = "."
    env = {"PREFECT_ODM_ENGINE_FAULTS": json.dumps(faults)}
    holder: list[EngineProcess] = []

    def start(port: int | None = None) -> None:
        holder.append(
            start_engine(
                work, port=port, token=flags.token, max_parallel_tasks=flags.parallel, extra_env=env
            )
        )

    def restart() -> None:
        holder[-1].kill()
        start(holder[-1].port)

    def kill() -> None:
        holder[-1].kill()

    def stop() -> None:
        if holder[-1].alive():
            holder[-1].stop()

    start()
    return Node("engine", holder[-1].url, flags.token, kill, restart, stop, durable=True)


def _start_nodeodm(work: Path, flags: _Flags) -> Node:
    args = ["-q", str(flags.parallel), *flags.extra]
    if flags.drop_uploads:
        args.append("--test_drop_uploads")
    if flags.task_seconds:
        args += ["--test_seconds", str(int(flags.task_seconds))]
    if flags.fail_tasks:
        args.append("--test_fail_tasks")
    node = peers.start_nodeodm(work, args, token=flags.token)

    def restart() -> None:
        node.restart()

    return Node("nodeodm", node.url, flags.token, node.kill, restart, node.stop, durable=False)


NodeFactory = Callable[..., Node]


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    """The backend under test."""
    return str(request.param)


@pytest.fixture
def start_node(backend: str, tmp_path: Path) -> Iterator[NodeFactory]:
    """Start nodes of ``backend`` (keyword flags of :class:`_Flags`); all stopped afterwards."""
    if backend == "nodeodm":
        peers.require_node()  # fails, with a clear message, when node or npm is missing
    started: list[Node] = []

    def factory(**flags: Any) -> Node:
        work = tmp_path / f"{backend}-{len(started)}"
        start = _start_engine if backend == "engine" else _start_nodeodm
        node = start(work, _Flags(**flags))
        started.append(node)
        return node

    yield factory
    for node in started:
        node.stop()


def _images(n: int) -> list[str]:
    assert len(IMAGES) >= n, f"brighton images not found under {peers.SHARED / 'data'}"
    return [str(p) for p in IMAGES[:n]]


def _new_uuid() -> str:
    return task_uuid(uuidlib.uuid4().hex, 0)


def _create(
    client: NodeClient, n: int = 2, options: dict[str, Any] | None = None, **kw: Any
) -> str:
    return client.create_task(
        _new_uuid(), _images(n), options or {}, name="protocol-test", retry_base_seconds=0.05, **kw
    )


def _wait_for(
    client: NodeClient, uuid: str, codes: set[int], timeout_seconds: float = 60
) -> TaskState:
    deadline = time.monotonic() + timeout_seconds
    state = client.task_state(uuid)
    while time.monotonic() < deadline:
        state = client.task_state(uuid)
        if state is not None and state.status in codes:
            return state
        time.sleep(POLL_SECONDS)
    raise AssertionError(f"task {uuid} did not reach {codes} in {timeout_seconds} s: {state}")


def _running_and_queued(client: NodeClient) -> tuple[str, str]:
    """Two tasks on a node with one slot: the first RUNNING, the second QUEUED behind it."""
    first = _create(client, 1)
    _wait_for(client, first, {RUNNING})
    second = _create(client, 1)
    _wait_for(client, second, {QUEUED}, timeout_seconds=10)
    return first, second


# -- node level -----------------------------------------------------------------------------------


def test_info_fields(start_node: NodeFactory) -> None:
    node = start_node(parallel=3)
    info = node.client().info()
    for key in (
        "version",
        "taskQueueCount",
        "totalMemory",
        "availableMemory",
        "cpuCores",
        "maxImages",
        "maxParallelTasks",
        "engine",
        "engineVersion",
    ):
        assert key in info, (key, info)
    assert info["maxParallelTasks"] == 3
    assert info["maxImages"] is None
    assert info["taskQueueCount"] == 0
    capacity = node_capacity(info)
    assert capacity.total_memory_bytes is not None and capacity.total_memory_bytes > 0
    assert capacity.max_parallel_tasks == 3
    assert capacity.cpu_cores is not None and capacity.cpu_cores >= 1


def test_options_list_is_checkable(start_node: NodeFactory) -> None:
    """Every entry of /options has a shape our option check understands."""
    options = start_node().client().options()
    assert options
    # NodeODM puts every enum's default into its domain (odmInfo.js: domain.unshift(value))
    outside = {o["name"]: o["value"] for o in options if o["type"] == "enum"}
    outside = {
        k: v
        for k, v in outside.items()
        if v not in next(o["domain"] for o in options if o["name"] == k)
    }
    assert outside == {}, "enum defaults missing from their domain"
    defaults = {o["name"]: o["value"] for o in options if o["type"] != "string" or o["value"]}
    # every default is valid against its own entry (the check reads the list as the node does)
    assert check_options(defaults, options) == []
    enum = next(o for o in options if o["type"] == "enum")
    errors = check_options({enum["name"]: "no-such-choice", "no-such-option": 1}, options)
    assert [e.name for e in errors] == [enum["name"], "no-such-option"]


# -- one task, the main path ----------------------------------------------------------------------


def test_create_upload_commit_poll_download(start_node: NodeFactory, tmp_path: Path) -> None:
    node = start_node()
    client = node.client()
    uuid = _create(client, 3)
    assert uuid in client.task_list()
    state = client.wait(uuid, poll_interval_seconds=POLL_SECONDS, max_wait_seconds=120)
    assert state.status == COMPLETED
    assert state.images_count == 3
    assert state.info["name"] == "protocol-test"
    dest = client.download(uuid, tmp_path / "out")
    assert (dest / "odm_orthophoto" / "odm_orthophoto.tif").is_file()
    assert not list(dest.glob(".*.part"))


def test_token_is_required_and_never_echoed(start_node: NodeFactory) -> None:
    node = start_node(token="s3cret-token")
    assert node.client().info()["version"]
    with pytest.raises(NodeError) as refused:
        node.client(token="wrong-token").task_list()
    assert "Invalid authentication token" in str(refused.value)
    assert "wrong-token" not in str(refused.value)
    uuid = _create(node.client(), 1)
    assert node.client().wait(uuid, poll_interval_seconds=POLL_SECONDS).status == COMPLETED


def test_dropped_uploads_are_retried(start_node: NodeFactory) -> None:
    node = start_node(drop_uploads=True)
    client = node.client()
    uuid = _create(client, 4, max_retries=12, parallel_uploads=2)
    state = client.wait(uuid, poll_interval_seconds=POLL_SECONDS)
    assert state.status == COMPLETED
    assert state.images_count == 4


def test_failed_task_is_a_processing_failure(start_node: NodeFactory) -> None:
    node = start_node(fail_tasks=True)
    client = node.client()
    uuid = _create(client, 1)
    with pytest.raises(ProcessingFailedError) as failed:
        client.wait(uuid, poll_interval_seconds=POLL_SECONDS)
    assert failed.value.task_uuid == uuid


def test_health_book_moves_work_off_a_failing_node(start_node: NodeFactory) -> None:
    """A node that fails every task at once, beside a healthy one (issue 13, item 3).

    The failing node is keyed lower, so the old tie-break (lower URL) would give it every
    submodel. After its first fast failure the breaker puts it last, the failed submodel is
    retried once on the healthy node, and every submodel completes there.

    This drives :mod:`prefect_odm.node_health` by hand, as ``pool``/``submodels`` will once
    it is wired in; the survey-level test comes with that wiring.
    """
    failing, healthy = start_node(fail_tasks=True), start_node()
    clients = {"http://0-failing": failing.client(), "http://1-healthy": healthy.client()}
    book = HealthBook(clients, policy=HealthPolicy(fast_failure_seconds=30))
    placed: list[str] = []
    for _ in range(3):
        for retries in range(2):
            url = order_nodes(dict.fromkeys(clients, 0.0), book)[0]
            placed.append(url)
            book.task_started(url)
            started = time.monotonic()
            try:
                _run_one(clients[url])
            except ProcessingFailedError as exc:
                book.task_failed(url, time.monotonic() - started, str(exc))
                assert book.retry_elsewhere(url, retries)
                continue
            book.task_completed(url)
            break
    assert placed == [
        "http://0-failing",
        "http://1-healthy",
        "http://1-healthy",
        "http://1-healthy",
    ]
    report = {r["url"]: r for r in book.report()}
    assert report["http://0-failing"]["health"] == "suspected"
    assert report["http://1-healthy"]["tasks_completed"] == 3


def _run_one(client: NodeClient) -> TaskState:
    return client.wait(_create(client, 1), poll_interval_seconds=POLL_SECONDS)


# -- cancel, remove, restart ----------------------------------------------------------------------


def test_cancel_of_a_queued_task_sticks(start_node: NodeFactory) -> None:
    """One task slot, the first task held RUNNING for a few seconds: the second stays QUEUED.

    Only a QUEUED task is cancelled here: NodeODM's test mode does not keep a cancel of a RUNNING
    task (its sleep ends and flips the task to COMPLETED), so that case cannot be tested on it.
    """
    node = start_node(parallel=1, task_seconds=4)
    client = node.client()
    first, second = _running_and_queued(client)
    assert client.cancel(second) is True
    assert client.wait(first, poll_interval_seconds=POLL_SECONDS).status == COMPLETED
    time.sleep(1.0)  # the slot is free: a cancel that did not stick would start the task now
    state = client.task_state(second)
    assert state is not None and state.status == CANCELED


def test_remove_forgets_the_task(start_node: NodeFactory) -> None:
    client = start_node().client()
    uuid = _create(client, 1)
    client.wait(uuid, poll_interval_seconds=POLL_SECONDS)
    assert client.remove(uuid) is True
    assert client.task_state(uuid) is None
    assert uuid not in client.task_list()


def test_restart_with_rerun_from(start_node: NodeFactory) -> None:
    """A late option change: restart the finished task with ``rerun-from`` and new options."""
    client = start_node().client()
    uuid = _create(client, 2)
    client.wait(uuid, poll_interval_seconds=POLL_SECONDS)
    stages = next(o for o in client.options() if o["name"] == "rerun-from")["domain"]
    stage = [s for s in stages if s][-1]
    assert client.restart(uuid, {"rerun-from": stage}) is True
    state = client.wait(uuid, poll_interval_seconds=POLL_SECONDS)
    assert state.status == COMPLETED
    assert {"name": "rerun-from", "value": stage} in state.info["options"]


def test_unknown_task(start_node: NodeFactory) -> None:
    client = start_node().client()
    unknown = _new_uuid()
    assert client.task_state(unknown) is None
    for action in (client.cancel, client.remove, client.restart):
        with pytest.raises(NodeError) as refused:
            action(unknown)
        assert "not found" in str(refused.value)


def test_killed_node_forgets_or_keeps_the_task(start_node: NodeFactory) -> None:
    """kill -9 and restart on the same folder and port: NodeODM forgets tasks created since its
    last table dump (the client then sees ``None`` and resubmits under the same UUID); the engine
    keeps them."""
    node = start_node(task_seconds=3)
    client = node.client()
    uuid = _create(client, 2)
    _wait_for(client, uuid, {RUNNING})
    node.kill()
    node.restart()
    state = client.task_state(uuid)
    if node.durable:
        assert state is not None
    else:
        assert state is None
        client.create_task(uuid, _images(2), {}, name="protocol-test", retry_base_seconds=0.05)
    assert client.wait(uuid, poll_interval_seconds=POLL_SECONDS).status == COMPLETED


def test_bad_option_is_refused_before_upload(start_node: NodeFactory) -> None:
    client = start_node().client()
    options = client.options()
    enum = next(o for o in options if o["type"] == "enum")
    bad = {enum["name"]: "no-such-choice"}
    errors = check_options(bad, options)
    assert [e.name for e in errors] == [enum["name"]]
    assert "no-such-choice" in str(errors[0])
    with pytest.raises(NodeError) as refused:  # the node refuses it too, at init
        _create(client, 1, bad)
    assert enum["name"] in str(refused.value)


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
    stage = [
        s for s in next(o for o in client.options() if o["name"] == "rerun-from")["domain"] if s
    ][-1]
    body = {"uuid": uuid, "options": json.dumps([{"name": "rerun-from", "value": stage}])}
    res = requests.post(f"{node.url}/task/restart", json=body, params=node.params, timeout=10)
    assert res.json() == {"success": True}
    state = client.wait(uuid, poll_interval_seconds=POLL_SECONDS)
    assert {"name": "rerun-from", "value": stage} in state.info["options"]


@pytest.mark.parametrize("route", ["cancel", "remove", "restart"])
def test_unknown_task_answers_success_false(start_node: NodeFactory, route: str) -> None:
    node = start_node()
    unknown = _new_uuid()
    res = requests.post(
        f"{node.url}/task/{route}", data={"uuid": unknown}, params=node.params, timeout=10
    )
    body = res.json()
    assert body["success"] is False, body
    assert is_unknown_task_error(body["error"], unknown), body


def test_second_init_with_the_same_set_uuid_overwrites_a_pending_task(
    start_node: NodeFactory,
) -> None:
    """NodeODM (observed): a second init of an uncommitted task replaces its fields and keeps the
    files already uploaded; once committed, the UUID is refused."""
    node = start_node()
    uuid = _new_uuid()
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
    _, second = _running_and_queued(node.client())
    assert node.client().cancel(second) is True
    res = requests.post(
        f"{node.url}/task/cancel", data={"uuid": second}, params=node.params, timeout=10
    )
    assert res.json() == {"success": True}


def test_options_domains_are_nodeodm_domains(start_node: NodeFactory) -> None:
    """Every ``/options`` domain is one NodeODM's (and ClusterODM's) validator can check, so
    ClusterODM can front the node and a NodeODM client can validate against the list."""
    options = start_node().client().options()
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
    assert NodeClient(clusterodm_stand_in, token="good").task_state(_new_uuid()) is None


def test_clusterodm_bad_token(clusterodm_stand_in: str) -> None:
    with pytest.raises(NodeError) as refused:
        NodeClient(clusterodm_stand_in, token="bad").task_state(_new_uuid())
    assert "Unauthorized" in str(refused.value) and "token=bad" not in str(refused.value)
