"""Placement of submodels on a pool of NodeODM nodes, inside one process.

Each node has a memory budget (GiB) and a number of parallel task slots. :meth:`NodePool.lease`
blocks until some node has both a free slot and the memory a submodel needs (memory is never
overcommitted), then picks among those the least loaded (running tasks / task slots), healthy
nodes before suspected ones (:func:`~prefect_odm.nodes.health.placement_key`): a node that fails
every task at once is free first, and without the health tie-break it would take every
submodel (issue 13). A submodel larger than every node is refused at once (:class:`PlanningError`). Nodes
that stop answering are marked down and get no more work.

A pool fed by a node source (:mod:`prefect_odm.nodes.membership`) calls its ``refresh`` hook at
each placement, outside its lock: nodes join (:meth:`NodePool.add_node`) and leave
(:meth:`NodePool.set_gone`: no new work, running tasks go on) during the run. Such nodes may be
shared with other runs, so a node whose reported tasks fill its slots gets no more (the submodel
waits for a free slot anywhere rather than queue behind another run's task), and ties are broken
by a hash of the submodel and the node (rendezvous hashing), which spreads runs that start at the
same moment without talking to each other.

This is the in-process admission that works in every mode; across processes and machines the
Prefect global concurrency limit of memory slots is taken first (see DESIGN.md).
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TypeVar

from prefect_odm.errors import PlanningError, TransientNodeError
from prefect_odm.nodes.health import HealthBook, placement_key


@dataclass
class PoolNode:
    """A node's capacity and current load. ``key`` identifies it (its public URL)."""

    key: str
    memory_gib: float
    max_parallel_tasks: int
    labels: tuple[str, ...] = ()
    used_memory_gib: float = 0.0
    running: int = 0
    down: bool = False
    gone: bool = False
    """The node left its node source: no new work; tasks running there go on."""
    reported_tasks: int = 0
    """Queued and running tasks of every run the node reported at its last ``/info`` (a node
    shared with other runs); 0 when not asked."""
    queue_depth: int = 0
    """Tasks placed beyond its task slots, to wait in the node's own queue (NodeODM starts them
    as a slot frees), their memory reserved as if running: the next submodel's bookkeeping and
    upload overlap the running tasks instead of leaving the slot idle (issue 33)."""

    @property
    def usable(self) -> bool:
        """Placement may give the node work (it is neither down nor gone)."""
        return not self.down and not self.gone

    @property
    def load(self) -> float:
        """Busy task slots as a fraction: this run's tasks, or the node's own count when higher."""
        return max(self.running, self.reported_tasks) / max(1, self.max_parallel_tasks)

    def fits(self, memory_gib: float) -> bool:
        """Usable, a task slot (or a place in its queue) free, of this run's and of what the node
        reported from every run, and the memory this run has not taken."""
        return (
            self.usable
            and max(self.running, self.reported_tasks) < self.max_parallel_tasks + self.queue_depth
            and self.used_memory_gib + memory_gib <= self.memory_gib + 1e-9
        )


@dataclass
class _Waiter:
    ticket: int
    memory_gib: float
    exclude: tuple[str, ...]
    what: str
    priority: float = 0.0
    passes: int = 0

    @property
    def order(self) -> tuple[float, int]:
        """Its place among the waiters: priority, then arrival."""
        return (self.priority, self.ticket)


T = TypeVar("T")

WAIT_SECONDS = 5.0
"""Longest wait between two looks at the nodes while a submodel waits for one."""

MAX_PASSES = 3
"""How often later, smaller submodels may start before an earlier waiting one; after that the
pool holds new placements back until the earlier one fits (no starvation)."""


@dataclass
class NodePool:
    """Thread-safe load- and health-aware placement over ``nodes``, by priority then first come
    first served, with bounded overtaking: a later submodel may start before an earlier waiting
    one only while the earlier one could not start anyway, and at most :data:`MAX_PASSES` times."""

    nodes: Sequence[PoolNode]
    health: HealthBook = field(default_factory=HealthBook)
    """Each node's circuit breaker; the runner records task and request outcomes in it."""
    refresh: Callable[[], None] | None = None
    """Called outside the lock at each placement and while one waits: a node source's
    :meth:`~prefect_odm.nodes.membership.NodeMembership.refresh`; ``None``: fixed nodes."""
    spread: bool = False
    """Break placement ties by a hash of the submodel and node rather than the node's URL
    (nodes shared with runs in other processes, whose placements this pool does not see)."""
    empty_wait_seconds: float = 0.0
    """How long a placement waits while no node is usable before it fails; 0: at once. A
    pool fed by a source waits for nodes to join (a fleet scaling up from its minimum)."""
    source_task_slots: int = 0
    """The least :attr:`task_slots` of a pool fed by a source (nodes that may still join)."""
    _cond: threading.Condition = field(default_factory=threading.Condition, init=False, repr=False)
    _waiting: list[_Waiter] = field(default_factory=list, init=False, repr=False)
    _tickets: int = field(default=0, init=False, repr=False)

    def __post_init__(self) -> None:
        """Copy the node list and give every node a health record (closed breaker)."""
        self.nodes = list(self.nodes)
        for n in self.nodes:
            self.health.record(n.key)

    def _best(self, memory_gib: float, exclude: Sequence[str], what: str) -> PoolNode | None:
        fitting = [
            n
            for n in self.nodes
            if n.key not in exclude and n.fits(memory_gib) and self.health.may_take_task(n.key)
        ]
        if not fitting:
            return None
        return min(
            fitting,
            key=lambda n: placement_key(
                n.load,
                self.health.health(n.key),
                _rendezvous(what, n.key) if self.spread else n.key,
                self.health.record(n.key).tasks_placed,
            ),
        )

    @property
    def task_slots(self) -> int:
        """How many submodels the pool can hold at once: the task slots of the nodes that are
        up, plus as many as the largest of them for each node set aside (it may come back);
        at least 1."""
        up = [n.max_parallel_tasks for n in self.nodes if n.usable]
        aside = sum(1 for n in self.nodes if not n.usable)
        return max(1, sum(up) + aside * max(up, default=1), self.source_task_slots)

    def check_fits(self, memory_gib: float, what: str) -> None:
        """Raise :class:`PlanningError` if no node could ever run ``memory_gib``."""
        largest = max((n.memory_gib for n in self.nodes), default=0.0)
        if memory_gib > largest:
            raise PlanningError(
                f"{what} needs an estimated {memory_gib:.1f} GiB but the largest node has "
                f"{largest:.1f} GiB: use a smaller --split"
            )

    @contextmanager
    def lease(
        self,
        memory_gib: float,
        *,
        what: str,
        exclude: Sequence[str] = (),
        timeout_seconds: float | None = None,
        priority: float = 0.0,
    ) -> Iterator[PoolNode]:
        """Hold a task slot and ``memory_gib`` on the node placement picks while the block runs.

        Waiters are served by ``priority`` (lower first), then in arrival order: the runner gives
        larger submodels a lower one, so the largest waiting goes first even when the Prefect
        API delayed its arrival (issue 33: the largest reached a node 3 minutes in).

        Raises:
            PlanningError: no node could ever hold the submodel.
            TransientNodeError: every usable node is down or gone (for longer than
                :attr:`empty_wait_seconds`), or ``timeout_seconds`` passed.
        """
        self.check_fits(memory_gib, what)
        deadline = None if timeout_seconds is None else time.monotonic() + timeout_seconds
        self._refresh()
        with self._cond:
            self._tickets += 1
            me = _Waiter(self._tickets, memory_gib, tuple(exclude), what, priority)
            self._waiting.append(me)
        try:
            node = self._wait_for_node(me, deadline, timeout_seconds)
        finally:
            with self._cond:
                self._waiting.remove(me)
                self._cond.notify_all()
        try:
            yield node
        finally:
            with self._cond:
                node.used_memory_gib -= memory_gib
                node.running -= 1
                self._cond.notify_all()

    def _wait_for_node(
        self, me: _Waiter, deadline: float | None, timeout_seconds: float | None
    ) -> PoolNode:
        """Place ``me`` (taking its slot and memory), waiting as long as it must; the node
        source, if any, is read again between the waits."""
        empty_since: float | None = None
        while True:
            with self._cond:
                if any(n.usable and n.key not in me.exclude for n in self.nodes):
                    empty_since = None
                else:
                    empty_since = empty_since or time.monotonic()
                    if time.monotonic() - empty_since >= self.empty_wait_seconds:
                        raise TransientNodeError(
                            f"no node available for {me.what}: all are down or excluded"
                        )
                node = self._place(me)
                if node is not None:
                    return node
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise TransientNodeError(
                        f"no node had room for {me.what} within {timeout_seconds} s"
                    )
                self._cond.wait(
                    timeout=WAIT_SECONDS if remaining is None else min(WAIT_SECONDS, remaining)
                )
            self._refresh()

    def _place(self, me: _Waiter) -> PoolNode | None:
        """The node ``me`` gets now, its slot and memory taken (under the lock), or ``None``
        when none fits or an earlier waiter must go first."""
        node = self._best(me.memory_gib, me.exclude, me.what)
        earlier = [w for w in self._waiting if w.order < me.order]
        may_pass = all(
            w.passes < MAX_PASSES and self._best(w.memory_gib, w.exclude, w.what) is None
            for w in earlier
        )
        if node is None or not may_pass:
            return None
        for w in earlier:
            w.passes += 1
        node.used_memory_gib += me.memory_gib
        node.running += 1
        self.health.task_started(node.key)
        return node

    def _refresh(self) -> None:
        """Read the node source (outside the lock: it may ask nodes for ``/info``)."""
        if self.refresh is not None:
            self.refresh()

    def add_node(self, node: PoolNode) -> None:
        """Let placement use ``node``: a node that joined the source, or one that left and came
        back (its capacity replaced, no longer down or gone; its running count kept)."""
        with self._cond:
            known = next((n for n in self.nodes if n.key == node.key), None)
            if known is None:
                self.nodes = [*self.nodes, node]  # a new list: readers iterate the old one
                self.health.record(node.key)
            else:
                known.memory_gib, known.max_parallel_tasks = (
                    node.memory_gib,
                    node.max_parallel_tasks,
                )
                known.down = known.gone = False
            self._cond.notify_all()

    def set_gone(self, key: str) -> None:
        """The node ``key`` left its source: no new work; its leases run to their end."""
        with self._cond:
            for n in self.nodes:
                if n.key == key:
                    n.gone = True
            self._cond.notify_all()

    def report_tasks(self, key: str, tasks: int) -> None:
        """Record the queued and running tasks (of every run) the node ``key`` reported."""
        with self._cond:
            for n in self.nodes:
                if n.key == key:
                    n.reported_tasks = max(0, tasks)
            self._cond.notify_all()

    def down_keys(self) -> frozenset[str]:
        """The keys of the nodes set aside now (down, not answering at the start, or gone from
        their source)."""
        with self._cond:
            return frozenset(n.key for n in self.nodes if not n.usable)

    def mark_down(self, key: str) -> None:
        """Stop placing work on the node ``key``."""
        with self._cond:
            for n in self.nodes:
                if n.key == key:
                    n.down = True
            self._cond.notify_all()

    def bring_up(self, key: str, memory_gib: float, max_parallel_tasks: int) -> None:
        """Let placement use the node ``key`` again, with the capacity it now reports (a node
        set aside at the start of a run that answers later)."""
        with self._cond:
            for n in self.nodes:
                if n.key == key:
                    n.memory_gib, n.max_parallel_tasks, n.down = (
                        memory_gib,
                        max_parallel_tasks,
                        False,
                    )
            self._cond.notify_all()

    def record(self, call: Callable[[HealthBook], T]) -> T:
        """Apply ``call`` to the health book under the pool's lock, then wake the waiters (a
        node's state may have changed who fits); ``call``'s result."""
        with self._cond:
            result = call(self.health)
            self._cond.notify_all()
            return result


def _rendezvous(what: str, key: str) -> str:
    """Highest-random-weight (rendezvous) hashing's weight of node ``key`` for submodel
    ``what`` (Thaler and Ravishankar, 1998): every run ranks the nodes the same way for the
    same submodel, and different submodels spread evenly over equally loaded nodes."""
    return hashlib.sha256(f"{what}\0{key}".encode()).hexdigest()
