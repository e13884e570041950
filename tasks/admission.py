"""Memory-aware admission across processes: a Prefect global concurrency limit of GiB slots.

Each submodel takes ``ceil(estimated peak memory in GiB)`` slots of a global concurrency limit
whose size is the pool's memory, strictly: a misspelt or missing limit fails instead of
silently running unlimited. The limit is created (or resized) when a run starts. Each submodel
asks the API from its own thread (:mod:`.slot_leases`), not through Prefect's ``concurrency()``,
whose one queue per process held every submodel behind one slow answer (issue 33).

Slots held by a process that was killed: a self-hosted server with the filesystem lease storage
(``PREFECT_SERVER_CONCURRENCY_LEASE_STORAGE=prefect.server.concurrency.lease_storage.filesystem``)
gives them back when the lease expires (``lease_duration_seconds``, 60 s here). Prefect's
temporary (embedded) server and its in-memory lease storage never do, so every holder also
writes a ledger entry on this machine (``$PREFECT_ODM_HOME/slots/``: limit name, slots, pid and
the pid's start time); before taking slots, entries of processes that no longer exist are
released and removed. ``prefect-odm slots`` shows the limit, its holders and can reset it.
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

import psutil
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import (
    GlobalConcurrencyLimitCreate,
    GlobalConcurrencyLimitUpdate,
)
from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound
from prefect.settings import get_current_settings
from prefect_odm.tasks.slot_leases import acquire_slots, release_slots
from pydantic import SecretStr

from prefect_odm.settings import prefect_odm_home

logger = logging.getLogger(__name__)

DEFAULT_LIMIT_NAME = "prefect-odm-memory-gib"
LEASE_DURATION_SECONDS = 60.0


def slots_for(memory_gib: float) -> int:
    """Slots a submodel takes: its estimated peak memory rounded up to whole GiB (at least 1)."""
    return max(1, math.ceil(memory_gib - 1e-9))


_ensured: set[tuple[str, str, int]] = set()  # (API or database, name, GiB) done here
_ensure_lock = threading.Lock()


def ensure_memory_limit(name: str, limit_gib: int) -> None:
    """Create the global concurrency limit ``name`` with ``limit_gib`` slots, or resize it.

    Once per process, API and size: every submodel flow of a run calls it, and concurrent
    subflows each read "not found" and created it, the server logging a duplicate-key error
    for all but one (33 at 100 submodels, issue 33); they now wait on one lock and the first
    one's answer. Another process (or a later size) asks the API again.
    """
    key = (_where(), name, limit_gib)
    with _ensure_lock:
        if key in _ensured:
            return
        _ensure_limit(name, limit_gib)
        _ensured.add(key)


def _where() -> str:
    """The API this process talks to (the temporary server: its database)."""
    settings = get_current_settings()
    url = settings.api.url or settings.server.database.connection_url
    return url.get_secret_value() if isinstance(url, SecretStr) else str(url)


def _ensure_limit(name: str, limit_gib: int) -> None:
    with get_client(sync_client=True) as client:
        try:
            current = client.read_global_concurrency_limit_by_name(name)
        except ObjectNotFound:
            try:
                client.create_global_concurrency_limit(
                    GlobalConcurrencyLimitCreate(name=name, limit=limit_gib, active=True)
                )
                logger.info("created concurrency limit %s with %d GiB slots", name, limit_gib)
                return
            except ObjectAlreadyExists:  # another run created it a moment ago
                current = client.read_global_concurrency_limit_by_name(name)
        if current.limit != limit_gib or not current.active:
            client.update_global_concurrency_limit(
                name, GlobalConcurrencyLimitUpdate(limit=limit_gib, active=True)
            )


def _ledger_dir(name: str) -> Path:
    return prefect_odm_home() / "slots" / name


@dataclass(frozen=True)
class LedgerEntry:
    """One holder of slots on this machine."""

    path: Path
    name: str
    slots: int
    pid: int
    pid_started: float
    what: str
    held: bool
    """False while the holder waits for its slots (the entry is written before it asks)."""

    @property
    def alive(self) -> bool:
        """Whether the holder's process still runs (same pid and start time: a reused pid is not it)."""
        try:
            return abs(psutil.Process(self.pid).create_time() - self.pid_started) < 1.0
        except psutil.Error:
            return False


def ledger(name: str) -> list[LedgerEntry]:
    """The ledger entries of limit ``name`` on this machine."""
    out = []
    for path in sorted(_ledger_dir(name).glob("*.json")):
        try:
            data: dict[str, Any] = json.loads(path.read_text())
            out.append(
                LedgerEntry(
                    path,
                    name,
                    int(data["slots"]),
                    int(data["pid"]),
                    float(data["pid_started"]),
                    str(data["what"]),
                    bool(data.get("held", True)),
                )
            )
        except (OSError, ValueError, KeyError):
            continue
    return out


def on_temporary_server() -> bool:
    """True when no ``PREFECT_API_URL`` is set: the run talks to Prefect's temporary server, whose
    database (under ``PREFECT_HOME``) only processes of this machine use."""
    return not get_current_settings().api.url


EMBEDDED_API_MAX_IN_FLIGHT = 12
"""Submodels in flight that Prefect's temporary API served without a ``503`` on the 2-core
test machine (4 nodes of 2 slots, ``benchmarks/bench_city.py --embedded``); at 60 (20 nodes) it
answered 131-494 retried ``503`` per run (benchmarks/RESULTS.md, issue 33)."""


def embedded_api_advice(in_flight: int) -> str | None:
    """The line to show when a run on Prefect's temporary server holds more than
    :data:`EMBEDDED_API_MAX_IN_FLIGHT` submodels in flight (``None``: below it, or a server)."""
    if in_flight <= EMBEDDED_API_MAX_IN_FLIGHT or not on_temporary_server():
        return None
    return (
        f"{in_flight} submodels in flight on Prefect's temporary API, which answered 503 "
        f"(database locked) beyond {EMBEDDED_API_MAX_IN_FLIGHT} on a 2-core machine: for this "
        "many nodes start a Prefect server on PostgreSQL and set PREFECT_API_URL (README: "
        "Several machines)"
    )


def reclaim_dead_holders(name: str) -> int:
    """Give back slots that no living process holds; returns the slots released.

    Entries of processes that are gone are removed; those that held their slots (``held``) have
    them released. On Prefect's temporary server every holder is a process of this machine with
    a ledger entry (written *before* it asks for slots), so slots counted by the server beyond
    what the living entries name belong to nobody (a holder killed between the server granting
    them and its entry saying so, or a dead entry of a release that did happen): they are released
    too. On a shared server the lease expiry gives those back instead.
    """
    released = 0
    entries = ledger(name)
    dead = [e for e in entries if not e.alive]
    living_slots = sum(e.slots for e in entries if e.alive)
    temporary = on_temporary_server()
    if not dead and not temporary:
        return 0
    with get_client(sync_client=True) as client:
        for entry in dead:
            if entry.held and not temporary:
                # A limit that no longer exists answers with an empty list: nothing to release.
                client.release_concurrency_slots([name], entry.slots, occupancy_seconds=1.0)
                released += entry.slots
                logger.info(
                    "released %d slots of %s left by dead process %d (%s)",
                    entry.slots,
                    name,
                    entry.pid,
                    entry.what,
                )
            entry.path.unlink(missing_ok=True)
        if temporary:
            try:
                active = client.read_global_concurrency_limit_by_name(name).active_slots
            except ObjectNotFound:
                return released
            orphaned = active - living_slots
            if orphaned > 0:
                client.release_concurrency_slots([name], orphaned, occupancy_seconds=1.0)
                released += orphaned
                logger.info(
                    "released %d slots of %s that no process on this machine holds", orphaned, name
                )
    return released


@contextmanager
def memory_slots(
    name: str,
    memory_gib: float,
    *,
    what: str,
    timeout_seconds: float | None = None,
    lease_duration_seconds: float = LEASE_DURATION_SECONDS,
) -> Iterator[int]:
    """Hold ``slots_for(memory_gib)`` slots of limit ``name`` while the block runs.

    The ledger entry is written once the slots are held and removed only after they were
    released: a process that ends in between (the graceful stop's hard exit, a kill) leaves an
    entry whose slots :func:`reclaim_dead_holders` releases at the next run on this machine.
    Dead holders are looked for at a process's first admission on a limit and whenever the
    ledger names a process that is gone (not at every submodel: on the temporary server that
    was one more API call each).

    Raises:
        ConcurrencySlotAcquisitionError: the limit does not exist, or the API refused.
        AcquireConcurrencySlotTimeoutError: ``timeout_seconds`` passed.
    """
    slots = slots_for(memory_gib)
    _reclaim_if_needed(name)
    path = _write_ledger_entry(name, slots, what, held=False)
    try:
        lease = acquire_slots(
            name,
            slots,
            lease_duration_seconds=lease_duration_seconds,
            timeout_seconds=timeout_seconds,
        )
    except BaseException:
        path.unlink(missing_ok=True)  # never granted (a time-out, a missing limit)
        raise
    try:
        _write_ledger_entry(name, slots, what, held=True, path=path)
        yield slots
    except BaseException:
        # The body's own error: the slots go back and the entry with them; a release that
        # fails leaves the entry, so the next run on this machine releases them once this
        # process is gone.
        _release(lease)
        path.unlink(missing_ok=True)
        raise
    # Only once the slots are back: a process ended during the release (the graceful stop's
    # hard exit) keeps its entry, and the next run releases its slots.
    _release(lease)
    path.unlink(missing_ok=True)


def _release(lease: uuid.UUID) -> None:
    """Give a holder's slots back (a seam: the interrupt tests exit the process here)."""
    release_slots(lease)


_reclaimed: set[tuple[str, str]] = set()  # (API or database, limit name) looked at here
_reclaim_lock = threading.Lock()


def _reclaim_if_needed(name: str) -> None:
    """:func:`reclaim_dead_holders` at this process's first admission on ``name`` (on this
    API), and again whenever the ledger names a process that is gone."""
    key = (_where(), name)
    with _reclaim_lock:
        first = key not in _reclaimed
        _reclaimed.add(key)
    if first or any(not e.alive for e in ledger(name)):
        reclaim_dead_holders(name)


def _write_ledger_entry(
    name: str, slots: int, what: str, *, held: bool, path: Path | None = None
) -> Path:
    """Record this process as a holder of ``slots`` of limit ``name`` (atomic rename).

    ``held`` is False while the process still waits for the slots; ``path`` rewrites an entry.
    """
    directory = _ledger_dir(name)
    directory.mkdir(parents=True, exist_ok=True)
    me = psutil.Process()
    if path is None:
        path = directory / f"{os.getpid()}-{uuid.uuid4().hex[:8]}.json"
    tmp = path.with_suffix(".tmp")
    record = {
        "slots": slots,
        "pid": me.pid,
        "pid_started": me.create_time(),
        "what": what,
        "held": held,
    }
    tmp.write_text(json.dumps(record))
    os.replace(tmp, path)
    return path


class SlotHolder(TypedDict):
    """One ledger entry of :func:`slots_status`: a process holding slots on this machine."""

    pid: int
    slots: int
    what: str
    alive: bool
    held: bool
    """False while the process still waits for its slots."""


class SlotsStatus(TypedDict):
    """A memory limit's state (:func:`slots_status`).

    Attributes:
        name: the global concurrency limit's name.
        limit, active_slots: its size and the slots in use, GiB (None: no such limit).
        active: whether the server applies it.
        holders: this machine's ledger.
    """

    name: str
    limit: int | None
    active_slots: int | None
    active: bool
    holders: list[SlotHolder]


def slots_status(name: str) -> SlotsStatus:
    """The limit's size and active slots on the server, and this machine's ledger."""
    with get_client(sync_client=True) as client:
        try:
            limit = client.read_global_concurrency_limit_by_name(name)
        except ObjectNotFound:
            limit = None
    holders = [
        SlotHolder(pid=e.pid, slots=e.slots, what=e.what, alive=e.alive, held=e.held)
        for e in ledger(name)
    ]
    if limit is None:
        return SlotsStatus(name=name, limit=None, active_slots=None, active=False, holders=holders)
    return SlotsStatus(
        name=name,
        limit=limit.limit,
        active_slots=limit.active_slots,
        active=limit.active,
        holders=holders,
    )


def reset_slots(name: str) -> None:
    """Set the limit's active slots to 0 and clear this machine's ledger (nothing may be running)."""
    with get_client(sync_client=True) as client:
        client.update_global_concurrency_limit(name, GlobalConcurrencyLimitUpdate(active_slots=0))
    for entry in ledger(name):
        entry.path.unlink(missing_ok=True)
