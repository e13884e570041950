"""Nodes that do not answer at the start of a run are set aside, not fatal (issue 14).

A dead node (nothing listens on its port) and a hung one (its port accepts connections and never
answers) among a live built-in engine: the start waits only for the probe time-out, the run
completes on the live node, and a set-aside node that comes up later is taken into placement.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from prefect_odm.engine.launch import free_port, start_engine
from prefect_odm.errors import InputError
from prefect_odm.models import ProcessingOptions
from prefect_odm.nodes import cluster as cluster_module
from prefect_odm.nodes.client import NodeClient
from prefect_odm.nodes.cluster import connect_nodes
from prefect_odm.plan.planning import memory_model_for

PROBE_TIMEOUT_SECONDS = 3.0


@pytest.fixture
def hung_url() -> Iterator[str]:
    """A port that accepts TCP connections (the kernel's backlog) and never answers."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"


@pytest.fixture
def dead_url() -> str:
    return f"http://127.0.0.1:{free_port()}"


class _Said(logging.Handler):
    """Keeps what one logger says; caplog's root handler is lost when Prefect configures logging
    (dictConfig replaces the root's handlers) during the test, which depends on test order."""

    def __init__(self) -> None:
        super().__init__(level=logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture
def cluster_said() -> Iterator[list[str]]:
    handler = _Said()
    cluster_logger = logging.getLogger(cluster_module.__name__)
    cluster_logger.addHandler(handler)
    try:
        yield handler.messages
    finally:
        cluster_logger.removeHandler(handler)


def test_dead_and_hung_nodes_are_set_aside_within_the_probe_timeout(
    tmp_path: Path, dead_url: str, hung_url: str, cluster_said: list[str]
) -> None:
    with start_engine(tmp_path / "live", method="direct") as live:
        started = time.monotonic()
        cluster = connect_nodes(
            [dead_url, live.url, hung_url], probe_timeout_seconds=PROBE_TIMEOUT_SECONDS
        )
        waited = time.monotonic() - started
        good = NodeClient(live.url).url
        down = {n.key: n.down for n in cluster.pool.nodes}
        assert down == {dead_url: True, good: False, hung_url: True}
        assert list(cluster.memory_by_node) == [good]
        # An external engine node is the built-in engine: its memory model, not ODM's 3.3x one.
        assert memory_model_for(cluster.engine_identity) == "builtin"
        cluster.check_options({"pipeline": "direct"})  # asks only the live node
        cluster.cancelled.set()
    # The hung node's request goes on in the background; the start does not wait for it
    # (a generous bound: the client's own request time-out is 30 s).
    assert waited < PROBE_TIMEOUT_SECONDS + 10
    said = [m for m in cluster_said if "set aside" in m]
    assert any(dead_url in m for m in said)
    assert any(hung_url in m and f"within {PROBE_TIMEOUT_SECONDS:g} s" in m for m in said)


def test_no_node_answering_is_one_line_naming_each(dead_url: str, hung_url: str) -> None:
    with pytest.raises(InputError) as info:
        connect_nodes([dead_url, hung_url], probe_timeout_seconds=PROBE_TIMEOUT_SECONDS)
    text = str(info.value)
    assert "\n" not in text and text.startswith("no node answers")
    assert dead_url in text and hung_url in text


def test_a_hung_node_leaves_no_thread_the_exit_waits_for(hung_url: str) -> None:
    """A command refusing a hung node exits at the probe time-out, not at the node's HTTP
    time-out: the probe of a silent node goes on on a daemon thread, which the interpreter does
    not join at exit (a ``ThreadPoolExecutor`` worker is joined: 32 s for a 10 s probe)."""
    import threading

    with pytest.raises(InputError, match="no answer to /info within 0.5 s"):
        cluster_module.check_nodes_answer([hung_url], timeout_seconds=0.5)
    probes = [t for t in threading.enumerate() if t.name == "probe" and t.is_alive()]
    assert probes, "the hung node's probe should still be waiting on its request"
    assert all(t.daemon for t in probes)


def test_a_set_aside_node_that_comes_up_takes_work(tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with start_engine(tmp_path / "live", method="direct") as live:
        cluster = connect_nodes([live.url, url], reprobe_interval_seconds=0.5)
        try:
            node = next(n for n in cluster.pool.nodes if n.key == url)
            assert node.down
            with start_engine(tmp_path / "late", port=port, method="direct"):
                deadline = time.monotonic() + 60
                while node.down and time.monotonic() < deadline:
                    time.sleep(0.2)
                assert not node.down and node.max_parallel_tasks >= 1 and node.memory_gib > 0
        finally:
            cluster.cancelled.set()


@pytest.mark.integration
def test_a_run_with_a_dead_and_a_hung_node_completes_on_the_live_one(
    prefect_api, brighton_images, tmp_path: Path, odm_home, dead_url: str, hung_url: str
) -> None:
    from prefect_odm.flows import reconstruct

    with start_engine(tmp_path / "live", method="direct") as live:
        manifest = reconstruct(
            images=str(brighton_images),
            output=str(tmp_path / "out"),
            nodes=[dead_url, live.url, hung_url],
            split=5,
            split_overlap_m=15,
            options=ProcessingOptions(pipeline="direct"),
        )
    good = NodeClient(live.url).url
    assert {r.status for r in manifest.submodels} == {"completed"}
    assert {r.node_url for r in manifest.submodels} == {good}
    assert sum(r.attempts for r in manifest.submodels) == len(manifest.submodels)
