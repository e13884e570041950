"""In-process progress events (the command line listens, flows and tasks emit) and the board of
submodel states both the command line and the live submodel table show (pure).

Events are small frozen records, one class per kind (:data:`ProgressEvent` is their union), so
mypy checks every producer's fields and every consumer's reads; emitting with no listener costs
nothing. A listener that raises is dropped from nothing and breaks nothing: its error is logged.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NotRequired, TypedDict, Unpack

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class StageEvent:
    """The run entered a stage (``scan``, ``plan``, ``process``, ``merge``, ``merge reused``,
    ``done``)."""

    name: str


@dataclass(frozen=True)
class PlanEvent:
    """The plan is known: its submodel ids, in plan order."""

    submodels: tuple[str, ...]


@dataclass(frozen=True)
class SubmodelEvent:
    """A submodel's state changed or its node reported progress.

    Attributes:
        submodel_id: e.g. ``submodel-003``.
        state: lower-case state in words (``uploading``, ``processing``, ``reused``,
            ``rerun from openmvs``, ...).
        fraction: its progress, 0 to 1.
        node: the node it runs on, as shown (``None``: not said by this event).
    """

    submodel_id: str
    state: str
    fraction: float
    node: str | None = None


@dataclass(frozen=True)
class SubmodelRunEvent:
    """A flow run of a submodel started: ``runs`` runs so far (the UI's Retry adds one)."""

    submodel_id: str
    runs: int


@dataclass(frozen=True)
class MergeEvent:
    """The merge of ``product`` has done ``done`` of ``total`` blocks (or points chunks)."""

    product: str
    done: int
    total: int


@dataclass(frozen=True)
class WarningEvent:
    """A warning for the operator before compute (bad GPS, heavy overlap)."""

    text: str


ProgressEvent = (
    StageEvent | PlanEvent | SubmodelEvent | SubmodelRunEvent | MergeEvent | WarningEvent
)
"""Every kind of progress event."""

Listener = Callable[[ProgressEvent], None]

_lock = threading.Lock()
_listeners: list[Listener] = []


def subscribe(listener: Listener) -> Callable[[], None]:
    """Register ``listener``; returns a function that unregisters it."""
    with _lock:
        _listeners.append(listener)

    def unsubscribe() -> None:
        with _lock:
            if listener in _listeners:
                _listeners.remove(listener)

    return unsubscribe


def emit(event: ProgressEvent) -> None:
    """Send an event to every listener (e.g. ``emit(StageEvent("merge"))``)."""
    with _lock:
        listeners = list(_listeners)
    for listener in listeners:
        try:
            listener(event)
        except Exception:  # a broken progress bar must not break a reconstruction
            logger.exception("progress listener failed on %s", type(event).__name__)


DONE_STATES = frozenset({"completed", "cached"})
"""Submodel states that count as done (a stored result exists)."""

FAILED_STATES = frozenset({"failed", "crashed", "cancelled"})
"""Submodel states that count as failed (until a retry starts)."""

REATTACHED = "re-attached"
"""The state of a submodel whose task the node had already finished (products downloaded)."""

WAITING_STATES = frozenset({"waiting", "scheduled", "pending", "late"})
"""Submodel states that count as waiting (planned, not started)."""


@dataclass
class SubmodelRow:
    """What is known of one submodel of a run (one line of the live table).

    Attributes:
        submodel_id: e.g. ``submodel-003``.
        state: lower-case state (``waiting``, ``uploading``, ``processing``, ``failed``,
            ``retrying``, ``completed``, ``cached``, ...).
        node: the node it runs or ran on, as shown (public URL or ``built-in engine``).
        fraction: the node's progress, 0 to 1.
        runs: flow runs of the submodel so far (the UI's Retry adds one).
        attempts: node tasks the last run used (transient failures and out-of-memory retries).
        seconds: processing time, seconds (``None`` while unknown).
        history: earlier outcomes in words, oldest first (``run 1 failed: ...``).
        error: the last failure in words (empty when none).
        started: ``time.monotonic()`` when it started processing (``None`` while waiting).
        cluster: where it was routed (a cluster, or the global queue) and ran, in words (empty
            without a cluster directory).
        route: why it was routed there (the router's reason; empty without a directory).
        reattached: its task had finished on the node before this run asked (a run killed
            after the node finished, or the built-in engine's task folder, which every run on
            the machine shares): its products were downloaded, nothing processed.
    """

    submodel_id: str
    state: str = "waiting"
    node: str = ""
    fraction: float = 0.0
    runs: int = 0
    attempts: int = 0
    seconds: float | None = None
    history: list[str] = field(default_factory=list)
    error: str = ""
    started: float | None = None
    cluster: str = ""
    route: str = ""
    reattached: bool = False

    def elapsed_seconds(self, now: float | None = None) -> float:
        """Seconds since it started (0 while waiting)."""
        if self.started is None:
            return 0.0
        return (time.monotonic() if now is None else now) - self.started


@dataclass(frozen=True)
class BoardCounts:
    """Submodels of a run by state: ``done`` includes ``cached`` (a stored result reused) and
    ``reattached`` (done from a task the node had finished before the run asked)."""

    planned: int
    done: int
    cached: int
    failed: int
    running: int
    waiting: int
    reattached: int = 0

    def summary(self) -> str:
        """``"2 of 3 submodels done (1 cached), 1 failed, 0 running, 0 waiting"``; with
        re-attached tasks ``"3 of 3 submodels done (0 cached, 3 re-attached to finished
        tasks), ..."``."""
        again = f", {self.reattached} re-attached to finished tasks" if self.reattached else ""
        return (
            f"{self.done} of {self.planned} submodels done ({self.cached} cached{again}), "
            f"{self.failed} failed, {self.running} running, {self.waiting} waiting"
        )

    @property
    def percent_done(self) -> float:
        """Done against planned, percent (100 only when every submodel is done)."""
        return 100.0 * self.done / self.planned if self.planned else 100.0


class RowFields(TypedDict, total=False):
    """Fields of a :class:`SubmodelRow` a caller may set (see there)."""

    state: str
    node: str
    fraction: float
    runs: int
    attempts: int
    seconds: float | None
    history: list[str]
    error: str
    cluster: str
    route: str
    reattached: bool


class TableRow(TypedDict):
    """One row of the live submodel table artifact (:meth:`SubmodelBoard.table`)."""

    submodel: str
    state: str
    node: str
    runs: int
    attempts: int
    seconds: float | str
    history: str
    error: str
    cluster: NotRequired[str]
    route: NotRequired[str]


class SubmodelBoard:
    """The state of every planned submodel of a run, fed by progress events or by the caller.

    Thread-safe. The command line draws it; the flows publish it as the live submodel table.
    """

    def __init__(self, planned: list[str]) -> None:
        """One waiting row per planned submodel id, in the given order."""
        self._lock = threading.Lock()
        self.rows: dict[str, SubmodelRow] = {sid: SubmodelRow(sid) for sid in planned}

    def update(self, submodel_id: str, **fields: Unpack[RowFields]) -> bool:
        """Set fields of a submodel's row (unknown ids are added); returns whether it changed.

        A state leaving the waiting states starts the row's clock.
        """
        with self._lock:
            row = self.rows.setdefault(submodel_id, SubmodelRow(submodel_id))
            before = dict(vars(row))
            for name, value in fields.items():
                setattr(row, name, value)
            state = fields.get("state")
            if state is not None and state not in WAITING_STATES and row.started is None:
                row.started = time.monotonic()
            return vars(row) != before

    def apply(self, event: SubmodelEvent) -> bool:
        """Apply a submodel event (its state, fraction and node when it names one); returns
        whether the row changed. A ``reused`` submodel shows as ``cached``; a ``re-attached``
        one (:data:`REATTACHED`) is marked so, and counted so once done."""
        state = "cached" if event.state == "reused" else event.state
        if state in (REATTACHED, "uploading"):  # an upload: a new task, processed here
            self.update(event.submodel_id, reattached=state == REATTACHED)
        if event.node:
            return self.update(
                event.submodel_id, state=state, fraction=event.fraction, node=event.node
            )
        return self.update(event.submodel_id, state=state, fraction=event.fraction)

    def counts(self) -> BoardCounts:
        """How many submodels are in each kind of state."""
        with self._lock:
            states = [r.state for r in self.rows.values()]
            again = sum(r.reattached and r.state == "completed" for r in self.rows.values())
        done = sum(s in DONE_STATES for s in states)
        failed = sum(s in FAILED_STATES for s in states)
        waiting = sum(s in WAITING_STATES for s in states)
        return BoardCounts(
            planned=len(states),
            done=done,
            cached=sum(s == "cached" for s in states),
            failed=failed,
            running=len(states) - done - failed - waiting,
            waiting=waiting,
            reattached=again,
        )

    def in_flight(self) -> list[SubmodelRow]:
        """Rows neither waiting, done nor failed, in plan order."""
        with self._lock:
            rows = list(self.rows.values())
        stopped = DONE_STATES | FAILED_STATES | WAITING_STATES
        return [r for r in rows if r.state not in stopped]

    def table(self) -> list[TableRow]:
        """One dictionary per submodel, for a table artifact (history joined with ``; ``)."""
        with self._lock:
            rows = list(self.rows.values())
        routed = any(r.cluster for r in rows)
        table: list[TableRow] = []
        for r in rows:
            row: TableRow = {
                "submodel": r.submodel_id,
                "state": r.state,
                "node": r.node or "not known",
                "runs": r.runs,
                "attempts": r.attempts,
                "seconds": "not known" if r.seconds is None else round(r.seconds, 1),
                "history": "; ".join(r.history) or "none",
                "error": r.error or "none",
            }
            if routed:  # the columns of a run routed among clusters
                row["cluster"] = r.cluster or "not routed"
                row["route"] = r.route or "none"
            table.append(row)
        return table
