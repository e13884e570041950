"""Slots of a Prefect global concurrency limit taken by each thread itself, renewed by one.

Prefect's ``concurrency()`` sends every acquisition of a process through one queue per set of
limit names (``ConcurrencySlotAcquisitionWithLeaseService``): one API call at a time, and a call
caught in the client's ``503`` back-off (2, 4, ... s) or a ``423`` wait (``Retry-After``, up to
30 s) holds every other submodel of the process behind it (issue 33: 23 % of 40 node slots busy
on the embedded API, never more than 25 leases while 40 slots were free). Here each caller asks
the API from its own thread (``increment-with-lease``), so one slow answer delays only its own
submodel; a caller told ``423`` (the limit full) waits at most the server's ``Retry-After`` and
is woken at once when a holder of this process gives slots back. One thread renews every lease
of the process (``concurrency()`` starts one per holder), at three quarters of its duration.
"""

from __future__ import annotations

import contextvars
import logging
import threading
import time
from uuid import UUID

import httpx
from prefect.client.orchestration import get_client
from prefect.concurrency.asyncio import (
    AcquireConcurrencySlotTimeoutError,
    ConcurrencySlotAcquisitionError,
)

logger = logging.getLogger(__name__)

RENEWAL_FRACTION = 0.75
"""A lease is renewed once this share of its duration has passed (Prefect's own fraction)."""

_released = threading.Condition()
"""Notified whenever this process gives slots back: a caller waiting on a full limit tries again."""
_generation = 0
"""Counts this process's releases, so that a release between a ``423`` and the wait is seen."""


class _Renewer:
    """Renews every lease this process holds, from one daemon thread started at the first.

    Each lease is renewed in a copy of its holder's context: Prefect's settings (the API's URL)
    may be set there rather than in the environment (``temporary_settings``, the test harness).
    """

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._due: dict[UUID, tuple[float, float]] = {}  # lease -> (next renewal, duration s)
        self._context: dict[UUID, contextvars.Context] = {}
        self._thread: threading.Thread | None = None

    def add(self, lease_id: UUID, duration_seconds: float) -> None:
        with self._lock:
            next_at = time.monotonic() + RENEWAL_FRACTION * duration_seconds
            self._due[lease_id] = (next_at, duration_seconds)
            self._context[lease_id] = contextvars.copy_context()
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="prefect-odm-lease-renewal", daemon=True
                )
                self._thread.start()
            self._lock.notify_all()

    def remove(self, lease_id: UUID) -> None:
        with self._lock:
            self._due.pop(lease_id, None)
            self._context.pop(lease_id, None)

    def held(self) -> int:
        """Leases being renewed now."""
        with self._lock:
            return len(self._due)

    def _run(self) -> None:
        while True:
            with self._lock:
                now = time.monotonic()
                due = [lease for lease, (at, _) in self._due.items() if at <= now]
                if not due:
                    soonest = min((at for at, _ in self._due.values()), default=now + 60.0)
                    self._lock.wait(timeout=max(0.05, soonest - now))
                    continue
                work = [(lease, self._due[lease][1], self._context[lease]) for lease in due]
            for lease, duration, context in work:
                context.run(self._renew, lease, duration)

    def _renew(self, lease_id: UUID, duration_seconds: float) -> None:
        try:
            with get_client(sync_client=True) as client:
                client.renew_concurrency_lease(lease_id=lease_id, lease_duration=duration_seconds)
        except Exception as exc:  # the next round tries again; the lease may lapse meanwhile
            logger.warning("could not renew concurrency lease %s: %s", lease_id, exc)
            retry_at = time.monotonic() + min(10.0, 0.1 * duration_seconds)
        else:
            retry_at = time.monotonic() + RENEWAL_FRACTION * duration_seconds
        with self._lock:
            if lease_id in self._due:  # not released meanwhile
                self._due[lease_id] = (retry_at, duration_seconds)


renewer = _Renewer()


def acquire_slots(
    name: str,
    slots: int,
    *,
    lease_duration_seconds: float,
    timeout_seconds: float | None = None,
) -> UUID:
    """Take ``slots`` of limit ``name`` under a lease renewed until :func:`release_slots`.

    Asks the API from the calling thread (no queue shared with other callers); a full limit
    (``423``) is asked again after its ``Retry-After`` or as soon as this process releases slots.

    Returns:
        The lease's id.

    Raises:
        ConcurrencySlotAcquisitionError: the limit does not exist (``strict``, as
            ``concurrency(..., strict=True)``), or the API answered another error.
        AcquireConcurrencySlotTimeoutError: ``timeout_seconds`` passed.
    """
    deadline = None if timeout_seconds is None else time.monotonic() + timeout_seconds
    with get_client(sync_client=True) as client:
        while True:
            with _released:
                generation = _generation
            try:
                response = client.increment_concurrency_slots_with_lease(
                    names=[name],
                    slots=slots,
                    mode="concurrency",
                    lease_duration=lease_duration_seconds,
                )
            except httpx.HTTPStatusError as exc:
                if exc.response.status_code != 423:
                    raise ConcurrencySlotAcquisitionError(
                        f"Unable to acquire concurrency slots on {[name]!r}: "
                        f"{exc.response.status_code} {exc.response.reason_phrase}"
                    ) from exc
                wait = float(exc.response.headers.get("Retry-After", 1.0))
                if deadline is not None:
                    if time.monotonic() >= deadline:
                        raise AcquireConcurrencySlotTimeoutError(
                            f"Attempt to acquire concurrency slots timed out after "
                            f"{timeout_seconds} second(s)"
                        ) from exc
                    wait = min(wait, max(0.0, deadline - time.monotonic()))
                _wait_for_release(generation, wait)
                continue
            data = response.json()
            if not data.get("limits"):
                raise ConcurrencySlotAcquisitionError(
                    f"Concurrency limits {[name]!r} must be created before acquiring slots"
                )
            lease_id = UUID(str(data["lease_id"]))
            renewer.add(lease_id, lease_duration_seconds)
            return lease_id


def release_slots(lease_id: UUID) -> None:
    """Give the lease's slots back and wake this process's callers waiting on a full limit.

    Raises:
        httpx.HTTPError: the API did not take the release (after the client's retries).
    """
    renewer.remove(lease_id)
    with get_client(sync_client=True) as client:
        client.release_concurrency_slots_with_lease(lease_id=lease_id)
    global _generation
    with _released:
        _generation += 1
        _released.notify_all()


def _wait_for_release(generation: int, seconds: float) -> None:
    """Wait up to ``seconds``, less when this process released slots since ``generation``."""
    end = time.monotonic() + seconds
    with _released:
        while _generation == generation:
            left = end - time.monotonic()
            if left <= 0:
                return
            _released.wait(timeout=left)
