"""Upload requests bounded per node, across every upload of the process (issue 33).

A real HTTP proxy on 127.0.0.1 stands between our client and a real node (the built-in engine
and NodeODM 2.2.4 in test mode, ``node_backends``) and counts the upload requests it is
sending to the node at once: with many tasks uploading to one node, the node never has more
than ``PREFECT_ODM_NODE_UPLOAD_REQUESTS`` of them, and the uploads go in the order they
began. A whole run of many submodels on one engine behind the proxy is held to the bound too.
"""

from __future__ import annotations

import http.client
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from node_helpers import NodeFactory, create, wait_for

from prefect_odm.engine.launch import start_engine
from prefect_odm.models import MergeOptions, ProcessingOptions
from prefect_odm.nodes.client import COMPLETED, NodeClient

pytestmark = pytest.mark.integration
pytest_plugins = ("node_backends",)  # the backend and start_node fixtures

HOP_HEADERS = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "host"}


class CountingProxy:
    """Forwards every request to ``target`` and counts the upload requests in flight."""

    def __init__(self, target: str) -> None:
        self.target = urlsplit(target)
        self.lock = threading.Lock()
        self.in_flight = 0
        self.peak = 0
        self.uploads = 0
        self.upload_tasks: list[str] = []  # the task UUID of each upload request, as begun
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *_: object) -> None:
                pass

            def do_GET(self) -> None:
                proxy.forward(self)

            def do_POST(self) -> None:
                proxy.forward(self)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def forward(self, handler: BaseHTTPRequestHandler) -> None:
        body = _read_body(handler)
        upload = handler.command == "POST" and handler.path.startswith("/task/new/upload/")
        if upload:
            with self.lock:
                self.in_flight += 1
                self.peak = max(self.peak, self.in_flight)
                self.uploads += 1
                self.upload_tasks.append(handler.path.split("?")[0].rsplit("/", 1)[-1])
        try:
            conn = http.client.HTTPConnection(self.target.hostname, self.target.port, timeout=120)
            headers = {k: v for k, v in handler.headers.items() if k.lower() not in HOP_HEADERS}
            headers["Content-Length"] = str(len(body))
            conn.request(handler.command, handler.path, body=body, headers=headers)
            res = conn.getresponse()
            answer = res.read()
            conn.close()
        finally:
            if upload:
                with self.lock:
                    self.in_flight -= 1
        handler.send_response(res.status)
        for k, v in res.getheaders():
            if k.lower() not in HOP_HEADERS and k.lower() != "content-length":
                handler.send_header(k, v)
        handler.send_header("Content-Length", str(len(answer)))
        handler.end_headers()
        handler.wfile.write(answer)


def _read_body(handler: BaseHTTPRequestHandler) -> bytes:
    if handler.headers.get("Transfer-Encoding", "").lower() == "chunked":
        chunks = []
        while True:
            size = int(handler.rfile.readline().split(b";")[0].strip(), 16)
            chunk = handler.rfile.read(size)
            handler.rfile.readline()
            if size == 0:
                return b"".join(chunks)
            chunks.append(chunk)
    return handler.rfile.read(int(handler.headers.get("Content-Length") or 0))


@contextmanager
def counting_proxy(target: str) -> Iterator[CountingProxy]:
    proxy = CountingProxy(target)
    thread = threading.Thread(target=proxy.server.serve_forever, daemon=True)
    thread.start()
    try:
        yield proxy
    finally:
        proxy.server.shutdown()
        proxy.server.server_close()


def switches(tasks: list[str]) -> int:
    """How often the upload requests, in the order the node received them, change task."""
    return sum(1 for a, b in zip(tasks, tasks[1:], strict=False) if a != b)


@pytest.mark.parametrize("bound", [1, 2])
def test_many_tasks_uploading_to_one_node_never_send_it_more_than_the_bound(
    start_node: NodeFactory, monkeypatch: pytest.MonkeyPatch, bound: int
) -> None:
    """Six tasks of 12 images start their uploads at once, each cut for 4 requests at once
    (24 at once before): the node sees at most ``bound`` upload requests at once, uses the
    bound, every task completes with its 12 images, and the uploads go one after the other
    (a task's requests are not interleaved with a later task's, beyond the bound's overlap
    at each hand-over)."""
    monkeypatch.setenv("PREFECT_ODM_NODE_UPLOAD_REQUESTS", str(bound))
    node = start_node(parallel=2)
    tasks = 6
    with counting_proxy(node.url) as proxy:
        client = NodeClient(proxy.url, token=node.token, timeout_seconds=60)
        with ThreadPoolExecutor(max_workers=tasks) as pool:
            uuids = list(
                pool.map(
                    lambda _: create(client, 12, parallel_uploads=4, upload_batch_files=2),
                    range(tasks),
                )
            )
        states = [wait_for(client, u, {COMPLETED}, timeout_seconds=300) for u in uuids]
    assert [s.status for s in states] == [COMPLETED] * tasks
    assert [s.images_count for s in states] == [12] * tasks
    assert proxy.uploads == tasks * 6  # 12 images in requests of 2
    assert proxy.peak == bound, proxy.peak
    assert switches(proxy.upload_tasks) <= bound * (tasks - 1), proxy.upload_tasks


def test_a_run_of_many_submodels_on_one_node_keeps_to_the_bound(
    monkeypatch: pytest.MonkeyPatch, prefect_api, brighton_images, tmp_path: Path, odm_home
) -> None:
    """A whole run, at least 6 submodels on one engine of 2 task slots behind the proxy (3
    uploading at once: 2 slots and one queued task): the node never has more than 2 upload
    requests at once, and every submodel completes."""
    from prefect_odm.flows import reconstruct

    monkeypatch.setenv("PREFECT_ODM_NODE_UPLOAD_REQUESTS", "2")
    with (
        start_engine(tmp_path / "node", method="direct", max_parallel_tasks=2) as engine,
        counting_proxy(engine.url) as proxy,
    ):
        manifest = reconstruct(
            images=str(brighton_images),
            output=str(tmp_path / "out"),
            nodes=[proxy.url],
            options=ProcessingOptions(pipeline="direct"),
            split=3,
            split_overlap_m=5,
            merge_options=MergeOptions(accept_alignment=True),
        )
    assert len(manifest.submodels) >= 6
    assert all(r.status == "completed" for r in manifest.submodels)
    assert proxy.uploads >= len(manifest.submodels)
    assert 1 <= proxy.peak <= 2, proxy.peak


def test_upload_progress_is_reported_from_the_waiting_thread_never_a_lane_thread(
    start_node: NodeFactory,
) -> None:
    """The progress callback may call the Prefect API (a submodel's progress artifact): it runs
    in the thread that waits for the upload, so a slow API never holds a lane (at 10k images
    the lane threads spent 0.57 of their samples in such calls, issue 33). It still sees every
    batch: the counts rise to the total, the last one is the total."""
    client = start_node().client()
    caller = threading.current_thread().name
    seen: list[tuple[str, int, int]] = []
    uuid = create(
        client,
        6,
        parallel_uploads=2,
        upload_batch_files=2,
        progress=lambda done, total: seen.append((threading.current_thread().name, done, total)),
    )
    assert wait_for(client, uuid, {COMPLETED}, timeout_seconds=300).images_count == 6
    assert {name for name, _, _ in seen} == {caller}
    counts = [done for _, done, _ in seen]
    assert counts == sorted(counts) and counts[-1] == 6 and len(counts) >= 2
    assert {total for _, _, total in seen} == {6}
