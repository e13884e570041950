"""When one submodel run stops: its run is cancelled, its deadline passed, or its flow run was
cancelled on the server (a parent failing it over while its worker may be gone).

:class:`SubmodelStop` gives the submodel runner an event of its own (the runner cancels its node
task and raises ``RunCancelledError`` once it is set) and says why it was set. The deadline
counts from the moment the submodel got its node (its first ``uploading`` or ``processing``
event, or a ``rerun from`` restart): time spent waiting for memory or a node is not processing
time. One thread watches every stop of the process (``_Watcher``).
"""

from __future__ import annotations

import threading
import time
from types import TracebackType
from typing import Literal
from uuid import UUID

from prefect_odm import progress

POLL_SECONDS = 0.5
"""How often the cluster's event and the deadline are looked at, seconds."""

SERVER_POLL_SECONDS = 5.0
"""How often the flow run's own state is read from the server, seconds."""

StopReason = Literal["cancelled", "timed out", "cancelled on the server"]


class SubmodelStop:
    """A per-submodel stop event, set by the first of: ``run_cancelled`` (the run's cluster is
    cancelled), the deadline (``deadline_seconds`` after the submodel got its node), or this
    flow run found ``CANCELLING``/``CANCELLED`` on the server (``flow_run_id``).

    Use it as a context manager around the runner; read :attr:`reason` after a
    ``RunCancelledError``.
    """

    def __init__(
        self,
        submodel_id: str,
        run_cancelled: threading.Event,
        deadline_seconds: float | None = None,
        flow_run_id: UUID | None = None,
        server_poll_seconds: float = SERVER_POLL_SECONDS,
    ) -> None:
        """Set up the stop for one submodel; nothing is watched before ``with`` enters it.

        Args:
            submodel_id: The submodel whose progress events start its deadline clock.
            run_cancelled: The event of the run's cluster (or whole run) being cancelled.
            deadline_seconds: Processing time allowed on the node, seconds; None: no deadline.
            flow_run_id: This submodel's flow run, whose server state is polled; None: not polled.
            server_poll_seconds: How often the server state is read, seconds.
        """
        self.submodel_id = submodel_id
        self.run_cancelled = run_cancelled
        self.deadline_seconds = deadline_seconds
        self.flow_run_id = flow_run_id
        self.server_poll_seconds = server_poll_seconds
        self.event = threading.Event()
        self.reason: StopReason | None = None
        self.detail = ""
        self.started: float | None = None
        self._next_server = 0.0
        self._unsubscribe: object = None

    def _listen(self, event: progress.ProgressEvent) -> None:
        if not isinstance(event, progress.SubmodelEvent) or event.submodel_id != self.submodel_id:
            return
        on_node = event.state in ("uploading", "processing") or event.state.startswith("rerun")
        if on_node and self.started is None:
            self.started = time.monotonic()

    def _set(self, reason: StopReason, detail: str) -> None:
        if not self.event.is_set():
            self.reason, self.detail = reason, detail
            self.event.set()

    def _cancelled_on_server(self) -> str | None:
        """The run's state name when the server has it cancelling or cancelled, else None."""
        from prefect.client.orchestration import get_client

        assert self.flow_run_id is not None
        try:
            with get_client(sync_client=True) as client:
                state = client.read_flow_run(self.flow_run_id).state
        except Exception:  # noqa: BLE001 - an API hiccup is asked again next time
            return None
        if state is not None and state.type.value in ("CANCELLING", "CANCELLED"):
            return state.message or state.name
        return None

    def _check(self, now: float) -> None:
        """One look: the run's event, the deadline, and (at its cadence) the server state."""
        if self.event.is_set():
            return
        if self.run_cancelled.is_set():
            self._set("cancelled", "the run was cancelled")
        deadline = self.deadline_seconds
        if deadline is not None and self.started is not None:
            if now - self.started > deadline:
                self._set("timed out", f"timed out after {deadline:g} s on its node")
        if self.flow_run_id is not None and now >= self._next_server:
            self._next_server = now + self.server_poll_seconds
            said = self._cancelled_on_server()
            if said is not None:
                self._set("cancelled on the server", said)

    def __enter__(self) -> SubmodelStop:
        """Subscribe to the submodel's progress events and join the process's watcher."""
        self._unsubscribe = progress.subscribe(self._listen)
        self._next_server = time.monotonic() + self.server_poll_seconds
        _WATCHER.add(self)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Leave the process's watcher and unsubscribe from progress events; nothing is raised."""
        _WATCHER.discard(self)
        unsubscribe = self._unsubscribe
        if callable(unsubscribe):
            unsubscribe()


class _Watcher:
    """One thread for every :class:`SubmodelStop` of the process (there was one per submodel
    in flight: 60 at 10k images on 20 nodes, issue 33); it ends once no stop is watched."""

    def __init__(self) -> None:
        self._stops: set[SubmodelStop] = set()
        self._lock = threading.Lock()
        self._running = False

    def add(self, stop: SubmodelStop) -> None:
        with self._lock:
            self._stops.add(stop)
            if not self._running:
                self._running = True
                threading.Thread(target=self._loop, name="submodel-stops", daemon=True).start()

    def discard(self, stop: SubmodelStop) -> None:
        with self._lock:
            self._stops.discard(stop)

    def _loop(self) -> None:
        while True:
            with self._lock:
                stops = list(self._stops)
                if not stops:
                    self._running = False
                    return
            now = time.monotonic()
            for stop in stops:
                try:
                    stop._check(now)
                except Exception:  # noqa: BLE001 - one stop's trouble never ends the others' watch
                    continue
            time.sleep(POLL_SECONDS)


_WATCHER = _Watcher()
