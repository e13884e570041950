"""The NodeODM protocol, spoken by our client (``prefect_odm.nodes.client.NodeClient``) to two servers.

Every test runs against BOTH backends, never skipped (``tests/node_backends.py``):

* ``engine``: the built-in engine started as a real server on 127.0.0.1 (stand-in pipeline);
* ``nodeodm``: OpenDroneMap's real NodeODM 2.2.4 in test mode (``tests/peers.py``).

NodeODM's test mode returns the same canned products for every task, whatever was uploaded, so
these tests assert on the protocol and the bookkeeping, never on pixels.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from node_helpers import (
    POLL_SECONDS,
    NodeFactory,
    create,
    images,
    new_uuid,
    running_and_queued,
    wait_for,
)

from prefect_odm.errors import NodeError, ProcessingFailedError
from prefect_odm.nodes.backend import differing_option, find_tasks, live_attempt, task_uuid
from prefect_odm.nodes.capacity import node_capacity
from prefect_odm.nodes.client import (
    CANCELED,
    COMPLETED,
    RUNNING,
    NodeClient,
    TaskState,
)
from prefect_odm.nodes.health import HealthBook, HealthPolicy, order_nodes
from prefect_odm.nodes.option_check import check_options

pytestmark = pytest.mark.integration
pytest_plugins = ("node_backends",)  # the backend and start_node fixtures


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
        assert key in info.raw, (key, info)
    assert info.max_parallel_tasks == 3
    assert info.raw["maxParallelTasks"] == 3
    assert info.raw["maxImages"] is None
    assert info.raw["taskQueueCount"] == 0
    assert info.total_memory_bytes is not None and info.total_memory_bytes > 0
    capacity = node_capacity(info.raw)
    assert capacity.total_memory_bytes is not None and capacity.total_memory_bytes > 0
    assert capacity.max_parallel_tasks == 3
    assert capacity.cpu_cores is not None and capacity.cpu_cores >= 1


def test_options_list_is_checkable(start_node: NodeFactory) -> None:
    """Every entry of /options has a shape our option check understands."""
    options = [o.raw for o in start_node().client().options()]
    assert options
    # NodeODM puts every enum's default into its domain (odmInfo.js: domain.unshift(value))
    outside = {
        o["name"]: o["value"]
        for o in options
        if o["type"] == "enum" and o["value"] not in o["domain"]
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
    uuid = create(client, 3)
    assert uuid in client.task_list()
    state = client.wait(uuid, poll_interval_seconds=POLL_SECONDS, max_wait_seconds=120)
    assert state.status == COMPLETED
    assert state.images_count == 3
    assert state.info["name"] == "protocol-test"
    dest = client.download(uuid, tmp_path / "out")
    assert (dest / "odm_orthophoto" / "odm_orthophoto.tif").is_file()
    assert not list(dest.glob(".*.part"))


def test_find_tasks_asks_each_node_once_and_only_for_what_it_lists(
    start_node: NodeFactory,
) -> None:
    """Two nodes, a task on one: ``find_tasks`` finds it there (one ``/task/list`` per node,
    then ``/task/{uuid}/info`` only for listed UUIDs) and ``live_attempt`` picks its attempt;
    a node whose list fails is asked for each UUID instead, and one that refuses everything (a
    wrong token) is passed over."""
    holder, other = start_node(token="s3cret-token"), start_node()
    clients = {"a": holder.client(token="s3cret-token"), "b": other.client()}
    fingerprint = "f" * 64
    uuid, absent = task_uuid(fingerprint, 2), task_uuid(fingerprint, 0)
    clients["a"].create_task(uuid, images(1), {}, name="protocol-test", retry_base_seconds=0.05)
    assert clients["a"].wait(uuid, poll_interval_seconds=POLL_SECONDS).status == COMPLETED
    asked: list[str] = []

    class Counting:
        def __init__(self, inner: NodeClient, list_fails: bool = False) -> None:
            self.inner, self.list_fails = inner, list_fails

        def task_list(self) -> list[str]:
            asked.append("list")
            if self.list_fails:
                raise NodeError("GET /task/list: not supported", node_url=self.inner.url)
            return self.inner.task_list()

        def task_state(self, u: str, **kw: object) -> TaskState | None:
            asked.append(u)
            return self.inner.task_state(u)

    counted = {k: Counting(c) for k, c in clients.items()}
    found = find_tasks(counted, [absent, uuid])  # type: ignore[arg-type]
    assert set(found) == {("a", uuid)} and found[("a", uuid)].status == COMPLETED
    assert sorted(asked) == sorted(["list", "list", uuid])
    assert live_attempt(clients, fingerprint, 4) == 2  # type: ignore[arg-type]
    asked.clear()
    no_list = {"a": Counting(clients["a"], list_fails=True)}
    assert set(find_tasks(no_list, [absent, uuid])) == {("a", uuid)}  # type: ignore[arg-type]
    assert sorted(asked) == sorted(["list", absent, uuid])
    refused = {"a": holder.client(token="wrong-token"), "b": other.client()}
    assert find_tasks(refused, [uuid]) == {}  # type: ignore[arg-type]


def test_token_is_required_and_never_echoed(start_node: NodeFactory) -> None:
    node = start_node(token="s3cret-token")
    assert node.client().info().raw["version"]
    with pytest.raises(NodeError) as refused:
        node.client(token="wrong-token").task_list()
    assert "Invalid authentication token" in str(refused.value)
    assert "wrong-token" not in str(refused.value)
    uuid = create(node.client(), 1)
    assert node.client().wait(uuid, poll_interval_seconds=POLL_SECONDS).status == COMPLETED


def test_uploads_in_batches_store_every_image_once(start_node: NodeFactory) -> None:
    """Several files per upload request (5 requests for 18 images): NodeODM's ``multer`` array
    and the engine store each, under its own name, exactly once."""
    client = start_node().client()
    uuid = create(client, 18, parallel_uploads=2, upload_batch_files=4)
    state = client.wait(uuid, poll_interval_seconds=POLL_SECONDS, max_wait_seconds=120)
    assert state.status == COMPLETED
    assert state.images_count == 18


def test_dropped_uploads_are_retried(start_node: NodeFactory) -> None:
    node = start_node(drop_uploads=True)
    client = node.client()
    uuid = create(client, 4, max_retries=12, parallel_uploads=2)
    state = client.wait(uuid, poll_interval_seconds=POLL_SECONDS)
    assert state.status == COMPLETED
    assert state.images_count == 4


def test_failed_task_is_a_processing_failure(start_node: NodeFactory) -> None:
    node = start_node(fail_tasks=True)
    client = node.client()
    uuid = create(client, 1)
    with pytest.raises(ProcessingFailedError) as failed:
        client.wait(uuid, poll_interval_seconds=POLL_SECONDS)
    assert failed.value.task_uuid == uuid


def test_health_book_moves_work_off_a_failing_node(start_node: NodeFactory) -> None:
    """A node that fails every task at once, beside a healthy one (issue 13, item 3).

    The failing node is keyed lower, so the old tie-break (lower URL) would give it every
    submodel. After its first fast failure the breaker puts it last, the failed submodel is
    retried once on the healthy node, and every submodel completes there.

    This drives :mod:`prefect_odm.nodes.health` by hand, as ``pool``/``submodels`` will once
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
    report = {r.url: r for r in book.report()}
    assert report["http://0-failing"].health == "suspected"
    assert report["http://1-healthy"].tasks_completed == 3


def _run_one(client: NodeClient) -> TaskState:
    return client.wait(create(client, 1), poll_interval_seconds=POLL_SECONDS)


# -- cancel, remove, restart ----------------------------------------------------------------------


def test_cancel_of_a_queued_task_sticks(start_node: NodeFactory) -> None:
    """One task slot, the first task held RUNNING for a few seconds: the second stays QUEUED.

    Only a QUEUED task is cancelled here: NodeODM's test mode does not keep a cancel of a RUNNING
    task (its sleep ends and flips the task to COMPLETED), so that case cannot be tested on it.
    """
    node = start_node(parallel=1, task_seconds=4)
    client = node.client()
    first, second = running_and_queued(client)
    assert client.cancel(second) is True
    assert client.wait(first, poll_interval_seconds=POLL_SECONDS).status == COMPLETED
    time.sleep(1.0)  # the slot is free: a cancel that did not stick would start the task now
    state = client.task_state(second)
    assert state is not None and state.status == CANCELED


def test_remove_forgets_the_task(start_node: NodeFactory) -> None:
    client = start_node().client()
    uuid = create(client, 1)
    client.wait(uuid, poll_interval_seconds=POLL_SECONDS)
    assert client.remove(uuid) is True
    assert client.task_state(uuid) is None
    assert uuid not in client.task_list()


def test_restart_with_rerun_from(start_node: NodeFactory) -> None:
    """A late option change: restart the finished task with ``rerun-from`` and new options."""
    client = start_node().client()
    uuid = create(client, 2)
    client.wait(uuid, poll_interval_seconds=POLL_SECONDS)
    stages = next(o for o in client.options() if o.name == "rerun-from").domain
    assert stages is not None
    stage = [s for s in stages if s][-1]
    assert client.restart(uuid, {"rerun-from": stage}) is True
    state = client.wait(uuid, poll_interval_seconds=POLL_SECONDS)
    assert state.status == COMPLETED
    assert {"name": "rerun-from", "value": stage} in state.info["options"]


def test_a_task_holds_the_options_it_was_given_until_a_restart_changes_them(
    start_node: NodeFactory,
) -> None:
    """What a re-attach checks (``differing_option``): the node answers a task's options as it
    was given them, typed its own way, and a restart with other options replaces them."""
    client = start_node().client()
    given = {"orthophoto-resolution": 5.0, "dsm": True}
    uuid = create(client, 2, given)
    state = client.wait(uuid, poll_interval_seconds=POLL_SECONDS)
    assert state.options and differing_option(state.options, given) is None
    stages = next(o for o in client.options() if o.name == "rerun-from").domain
    assert stages is not None
    stage = [s for s in stages if s][-1]
    finer = {**given, "orthophoto-resolution": 10.0}
    assert client.restart(uuid, {**finer, "rerun-from": stage}) is True
    state = client.wait(uuid, poll_interval_seconds=POLL_SECONDS)
    assert differing_option(state.options, given) == ("orthophoto-resolution", 10, 5.0)
    assert differing_option(state.options, finer) is None


def test_unknown_task(start_node: NodeFactory) -> None:
    client = start_node().client()
    unknown = new_uuid()
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
    uuid = create(client, 2)
    wait_for(client, uuid, {RUNNING})
    node.kill()
    node.restart()
    state = client.task_state(uuid)
    if node.durable:
        assert state is not None
    else:
        assert state is None
        client.create_task(uuid, images(2), {}, name="protocol-test", retry_base_seconds=0.05)
    assert client.wait(uuid, poll_interval_seconds=POLL_SECONDS).status == COMPLETED


def test_bad_option_is_refused_before_upload(start_node: NodeFactory) -> None:
    client = start_node().client()
    options = [o.raw for o in client.options()]
    enum = next(o for o in options if o["type"] == "enum")
    bad = {enum["name"]: "no-such-choice"}
    errors = check_options(bad, options)
    assert [e.name for e in errors] == [enum["name"]]
    assert "no-such-choice" in str(errors[0])
    with pytest.raises(NodeError) as refused:  # the node refuses it too, at init
        create(client, 1, bad)
    assert enum["name"] in str(refused.value)


def test_upload_cut_short_by_a_kill_is_never_a_broken_task(start_node: NodeFactory) -> None:
    """A run killed during the upload leaves an uncommitted upload under the task UUID. The
    rerun's upload under that UUID would hold some images twice: both nodes keep the old files
    across a new init (NodeODM 2.2.4's ``tmp/<uuid>``, the engine's pending task folder) and
    rename the second copies (``X_.JPG``). The client sees more images than it sent, removes
    the task, and :class:`StaleTaskError` sends the submodel to its next UUID."""
    import requests

    from prefect_odm.errors import StaleTaskError

    node = start_node()
    client = node.client()
    uuid = new_uuid()
    files = images(3)
    client._init_task(uuid, {}, name="killed-upload", outputs=())
    for path in files[:2]:  # the kill lands after two of three images
        with open(path, "rb") as fh:
            res = requests.post(
                client._upload_url(uuid), files={"images": (Path(path).name, fh)}, timeout=30
            )
        assert res.json().get("success"), res.text
    assert client.task_state(uuid) is None  # never committed: unknown to the API

    with pytest.raises(StaleTaskError, match="5 images for 3 uploaded") as raised:
        client.create_task(uuid, files, {}, name="rerun", retry_base_seconds=0.05)
    assert uuid in str(raised.value) and node.url in str(raised.value)
    assert client.task_state(uuid) is None  # the broken task was removed
    uuid = create(client, 3)  # the next attempt's UUID is clean
    state = client.task_state(uuid)
    assert state is not None and state.images_count == 3
    assert client.task_list() == [uuid]  # one task for the submodel, nothing half made
