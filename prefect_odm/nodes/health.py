"""Node health: a circuit breaker per node and the health-aware placement tie-break (pure core).

Why: a node that fails every task at once is always the first to be free again, so with ties
going to the lower URL it takes every submodel of a survey (issue 13). Each node therefore has a
small circuit breaker (after Nygard, *Release It!*, "Circuit Breaker"; states renamed for nodes):

``healthy``
    the normal state. A task that fails within ``fast_failure_seconds`` of being started (the node
    did not really try), or ``suspect_after_request_failures`` requests in a row that fail
    (connection refused, timeouts, HTTP 5xx), make the node ``suspected``. Slow task failures
    (real processing that failed, out of memory) say something about the data, not the node.
``suspected``
    the node still takes work, but only when no healthy node can (placement puts it last). After
    ``cooldown_seconds`` it becomes ``probing``.
``probing``
    the node may take ONE trial task (the probe). Success makes it ``healthy``; a failure makes it
    ``suspected`` again with the cool-down multiplied by ``cooldown_backoff`` (up to
    ``max_cooldown_seconds``).

The clock is injected (``clock``, seconds, monotonic), so every transition is deterministic in
tests. Nothing here locks: the caller serialises calls (the placement pool holds its own lock).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from prefect_odm.models import NodeHealthRecord


class Health(StrEnum):
    """A node's state in its circuit breaker."""

    HEALTHY = "healthy"
    SUSPECTED = "suspected"
    PROBING = "probing"


HEALTH_RANK = {Health.HEALTHY: 0, Health.PROBING: 1, Health.SUSPECTED: 2}
"""Placement preference among equally loaded nodes: lower first."""


@dataclass(frozen=True)
class HealthPolicy:
    """When a node is suspected and when it is tried again.

    Attributes:
        fast_failure_seconds: a task failing within this many seconds of its start is a fast
            failure (the node did not process it).
        suspect_after_fast_failures: fast failures in a row that make a node suspected.
        suspect_after_request_failures: failed requests in a row that make a node suspected.
        cooldown_seconds: how long a suspected node waits before a probe.
        cooldown_backoff: factor applied to the cool-down after each failed probe.
        max_cooldown_seconds: the longest cool-down.
    """

    fast_failure_seconds: float = 60.0
    suspect_after_fast_failures: int = 1
    suspect_after_request_failures: int = 3
    cooldown_seconds: float = 120.0
    cooldown_backoff: float = 2.0
    max_cooldown_seconds: float = 1800.0


@dataclass
class NodeRecord:
    """One node's breaker state and its record for the run report.

    Attributes:
        url: the node's public URL (no token).
        health: the stored state (:meth:`HealthBook.health` also turns an expired cool-down into
            ``probing``).
        tasks_completed / tasks_failed / tasks_failed_fast / request_failures: totals.
        consecutive_fast_failures / consecutive_request_failures: the runs that trip the breaker.
        suspected_at: clock time the node was last suspected, or None.
        cooldown_seconds: the current cool-down.
        probe_in_flight: a probe task was handed out and has not reported yet.
        tasks_placed: tasks placement gave the node in this run (the tie-break that spreads a
            survey over equally idle nodes).
        last_error: the last failure's message.
    """

    url: str
    health: Health = Health.HEALTHY
    tasks_completed: int = 0
    tasks_failed: int = 0
    tasks_failed_fast: int = 0
    request_failures: int = 0
    consecutive_fast_failures: int = 0
    consecutive_request_failures: int = 0
    suspected_at: float | None = None
    cooldown_seconds: float = 0.0
    probe_in_flight: bool = False
    tasks_placed: int = 0
    last_error: str = ""

    def summary(self) -> NodeHealthRecord:
        """The record as the manifest and the run report show it."""
        return NodeHealthRecord(
            url=self.url,
            health=self.health.value,
            tasks_completed=self.tasks_completed,
            tasks_failed=self.tasks_failed,
            tasks_failed_fast=self.tasks_failed_fast,
            request_failures=self.request_failures,
            last_error=self.last_error,
        )


@dataclass
class HealthBook:
    """The breakers of every node of a pool, keyed by public URL.

    Args:
        urls: the nodes (more are added on first use).
        policy: thresholds and cool-downs.
        clock: seconds, monotonic (default :func:`time.monotonic`).
    """

    urls: Iterable[str] = ()
    policy: HealthPolicy = field(default_factory=HealthPolicy)
    clock: Callable[[], float] = time.monotonic
    records: dict[str, NodeRecord] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        """Start every node of ``urls`` healthy."""
        for url in self.urls:
            self.record(url)

    def record(self, url: str) -> NodeRecord:
        """The node's record (created healthy on first use)."""
        if url not in self.records:
            self.records[url] = NodeRecord(url)
        return self.records[url]

    def health(self, url: str) -> Health:
        """The node's state now: a suspected node whose cool-down passed is ``probing``."""
        rec = self.record(url)
        if rec.health is Health.SUSPECTED and rec.suspected_at is not None:
            if self.clock() - rec.suspected_at >= rec.cooldown_seconds:
                rec.health = Health.PROBING
        return rec.health

    def may_take_task(self, url: str) -> bool:
        """False only while a probing node's one trial task is out; healthy and suspected nodes
        may take work (placement puts suspected ones after every healthy node with room,
        :func:`placement_key`)."""
        state = self.health(url)
        return not (state is Health.PROBING and self.record(url).probe_in_flight)

    def task_started(self, url: str) -> None:
        """A task was placed on the node (a probing node's first one is its probe)."""
        self.record(url).tasks_placed += 1
        if self.health(url) is Health.PROBING:
            self.record(url).probe_in_flight = True

    def task_completed(self, url: str) -> None:
        """A task on the node finished: the node is healthy."""
        rec = self.record(url)
        rec.tasks_completed += 1
        rec.consecutive_fast_failures = 0
        rec.consecutive_request_failures = 0
        self._heal(rec)

    def task_failed(self, url: str, elapsed_seconds: float, message: str = "") -> Health:
        """A task on the node failed ``elapsed_seconds`` after it was started.

        Returns:
            The node's state after the failure.
        """
        rec = self.record(url)
        rec.tasks_failed += 1
        rec.last_error = message
        if elapsed_seconds >= self.policy.fast_failure_seconds:
            if rec.health is Health.PROBING and rec.probe_in_flight:
                self._heal(rec)  # it really processed: the node works, the data did not
            return self.health(url)
        rec.tasks_failed_fast += 1
        rec.consecutive_fast_failures += 1
        if rec.consecutive_fast_failures >= self.policy.suspect_after_fast_failures:
            self._suspect(rec)
        return self.health(url)

    def request_failed(self, url: str, message: str = "") -> Health:
        """A request to the node failed (connection, timeout, HTTP 5xx)."""
        rec = self.record(url)
        rec.request_failures += 1
        rec.consecutive_request_failures += 1
        rec.last_error = message
        if rec.consecutive_request_failures >= self.policy.suspect_after_request_failures:
            self._suspect(rec)
        return self.health(url)

    def request_succeeded(self, url: str) -> None:
        """A request to the node answered: the run of request failures ends."""
        self.record(url).consecutive_request_failures = 0

    def retry_elsewhere(self, url: str, retries_done: int) -> bool:
        """Whether a submodel that failed on ``url`` gets one more try on a healthy node.

        True when ``url`` is now suspected or probing, no such retry was made yet, and some
        other node is healthy.
        """
        if retries_done > 0 or self.health(url) is Health.HEALTHY:
            return False
        return any(self.health(other) is Health.HEALTHY for other in self.records if other != url)

    def report(self) -> list[NodeHealthRecord]:
        """Every node's record, sorted by URL, for the run report."""
        for url in self.records:
            self.health(url)
        return [self.records[url].summary() for url in sorted(self.records)]

    def _suspect(self, rec: NodeRecord) -> None:
        if rec.health is Health.PROBING or rec.suspected_at is not None:
            grown = max(rec.cooldown_seconds, 1e-9) * self.policy.cooldown_backoff
            rec.cooldown_seconds = min(self.policy.max_cooldown_seconds, grown)
        else:
            rec.cooldown_seconds = self.policy.cooldown_seconds
        rec.health = Health.SUSPECTED
        rec.suspected_at = self.clock()
        rec.probe_in_flight = False

    def _heal(self, rec: NodeRecord) -> None:
        rec.health = Health.HEALTHY
        rec.suspected_at = None
        rec.cooldown_seconds = 0.0
        rec.probe_in_flight = False


def placement_key(
    load: float, health: Health, url: str, placed: int = 0
) -> tuple[int, float, int, str]:
    """Sort key among nodes that can take a submodel: healthy before probing before suspected,
    then least load, then fewest tasks placed so far, then URL (so the order is total and
    repeatable).

    Health comes first so that a node whose tasks fail at once (and is therefore idle first) gets
    no more work while a healthy node has room; it still takes work when only it has room. The
    count of tasks placed spreads a survey whose submodels start one at a time over all idle
    nodes: with the URL alone as the tie-break the first node took 37 submodels and the fourth 4
    (issue 14).

    Args:
        load: the node's load as a fraction, e.g. running tasks / task slots (0 = idle).
        health: the node's state.
        url: the node's public URL.
        placed: tasks placed on the node so far in this run.
    """
    return (HEALTH_RANK[health], load, placed, url)


def order_nodes(loads: Mapping[str, float], book: HealthBook) -> list[str]:
    """The URLs of ``loads`` (url -> load fraction) in placement order (see :func:`placement_key`),
    leaving out a probing node whose probe is still out."""
    usable = [url for url in loads if book.may_take_task(url)]
    return sorted(
        usable,
        key=lambda url: placement_key(
            loads[url], book.health(url), url, book.record(url).tasks_placed
        ),
    )
