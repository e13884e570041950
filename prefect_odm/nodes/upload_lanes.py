"""One bounded lane of upload requests per node, shared by every upload of the process.

Each new task's upload used to open its own pool of 4 requests: 60 submodels in flight on 20
NodeODM nodes sent 240 requests at once to 20 node.js processes, each upload took 44.7 s
(twice a task's 20 s) and half the task slots idled (issue 33). A node here receives at most
``PREFECT_ODM_NODE_UPLOAD_REQUESTS`` upload requests at once from this process, whatever the
number of submodels in flight, and the lane serves the upload that entered first before the
next: the node's tasks start in commit order, so the task a free slot waits for is uploaded
first instead of sharing the node with a queued task's upload. The pool places submodels
largest first, so the lane's order follows it.

The lane's worker threads start on demand (at most its bound) and end after
:data:`IDLE_SECONDS` without work: the upload threads of the process are at most the bound
times the nodes uploading, not 4 per submodel in flight.
"""

from __future__ import annotations

import heapq
import itertools
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from prefect_odm.settings import get_settings

IDLE_SECONDS = 5.0
"""A lane's worker thread ends after this long without a request to send, seconds."""

_entries = itertools.count()


def upload_ticket() -> int:
    """The order of one upload in every lane of the process: lower is served first."""
    return next(_entries)


@dataclass(order=True)
class _Request:
    ticket: int
    seq: int
    call: Callable[[], Any] = field(compare=False)
    future: Future[Any] = field(compare=False)


class UploadLane:
    """The upload requests of this process to one node: at most ``requests`` at once, served
    by upload ticket (:func:`upload_ticket`), then by submission.

    Args:
        node_url: the node's URL (safe to log; names the worker threads).
        requests: most requests sent at once (>= 1).
    """

    def __init__(self, node_url: str, requests: int) -> None:
        """An idle lane: no thread until the first request."""
        self.node_url = node_url
        self.requests = max(1, requests)
        self._queue: list[_Request] = []
        self._cond = threading.Condition()
        self._workers = 0
        self._idle = 0
        self._seq = itertools.count()

    @property
    def workers(self) -> int:
        """Worker threads alive now."""
        with self._cond:
            return self._workers

    def submit(self, ticket: int, call: Callable[[], Any]) -> Future[Any]:
        """Queue one request; it runs on a lane thread once the lane has room and no request of
        a lower ticket waits.

        Args:
            ticket: the upload's :func:`upload_ticket`.
            call: sends the request; what it returns or raises completes the future.

        Returns:
            The request's future; cancelling it before it starts drops the request.
        """
        future: Future[Any] = Future()
        with self._cond:
            heapq.heappush(self._queue, _Request(ticket, next(self._seq), call, future))
            self._cond.notify()
            if len(self._queue) > self._idle and self._workers < self.requests:
                self._workers += 1
                threading.Thread(
                    target=self._work, name=f"upload-{self.node_url}", daemon=True
                ).start()
        return future

    def _work(self) -> None:
        while True:
            with self._cond:
                while not self._queue:
                    self._idle += 1
                    woken = self._cond.wait(IDLE_SECONDS)
                    self._idle -= 1
                    if not woken and not self._queue:
                        self._workers -= 1
                        return
                request = heapq.heappop(self._queue)
            if not request.future.set_running_or_notify_cancel():
                continue
            try:
                result = request.call()
            except BaseException as exc:  # noqa: BLE001 - handed to the waiting upload
                request.future.set_exception(exc)
            else:
                request.future.set_result(result)


_lanes: dict[str, UploadLane] = {}
_lanes_lock = threading.Lock()


def node_upload_requests() -> int:
    """``PREFECT_ODM_NODE_UPLOAD_REQUESTS``: upload requests one node receives at once from
    this process (default 2)."""
    return get_settings().node_upload_requests


def lane_for(node_url: str) -> UploadLane:
    """The process's lane of ``node_url`` (created at first use, bound read then).

    A bound changed in the environment applies to lanes created after; a lane whose bound
    differs from the setting now is replaced once idle (tests change it at run time).
    """
    wanted = node_upload_requests()
    with _lanes_lock:
        lane = _lanes.get(node_url)
        if lane is None or (lane.requests != wanted and lane.workers == 0):
            lane = _lanes[node_url] = UploadLane(node_url, wanted)
        return lane
