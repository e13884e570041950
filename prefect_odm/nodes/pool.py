"""Placement of submodels on a pool of NodeODM nodes, inside one process.

Each node has a memory budget (GiB) and a number of parallel task slots. :meth:`NodePool.lease`
blocks until some node has both a free slot and the memory a submodel needs (memory is never
overcommitted), then picks among those the least loaded (running tasks / task slots), healthy
nodes before suspected ones (:func:`~prefect_odm.nodes.health.placement_key`): a node that fails
every task at once is free first, and without the health tie-break it would take every
submodel (issue 13). A submodel larger than every node is refused at once (:class:`PlanningError`). Nodes
that stop answering are marked down and get no more work.

This is the in-process admission that works in every mode; across processes and machines the
Prefect global concurrency limit of memory slots is taken first (see DESIGN.md).
"""

from __future__ import annotations

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

    def fits(self, memory_gib: float) -> bool:
        return (
            not self.down
            and self.running < self.max_parallel_tasks
            and self.used_memory_gib + memory_gib <= self.memory_gib + 1e-9
        )


@dataclass
class _Waiter:
    ticket: int
    memory_gib: float
    exclude: tuple[str, ...]
    passes: int = 0


T = TypeVar("T")

MAX_PASSES = 3
"""How often later, smaller submodels may start before an earlier waiting one; after that the
pool holds new placements back until the earlier one fits (no starvation)."""


@dataclass
class NodePool:
    """Thread-safe load- and health-aware placement over ``nodes``, first come first served with bounded
    overtaking: a later submodel may start before an earlier waiting one only while the earlier
    one could not start anyway, and at most :data:`MAX_PASSES` times."""

    nodes: Sequence[PoolNode]
    health: HealthBook = field(default_factory=HealthBook)
    """Each node's circuit breaker; the runner records task and request outcomes in it."""
    _cond: threading.Condition = field(default_factory=threading.Condition, init=False, repr=False)
    _waiting: list[_Waiter] = field(default_factory=list, init=False, repr=False)
    _tickets: int = field(default=0, init=False, repr=False)

    def __post_init__(self) -> None:
        for n in self.nodes:
            self.health.record(n.key)

    def _best(self, memory_gib: float, exclude: Sequence[str]) -> PoolNode | None:
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
                n.running / max(1, n.max_parallel_tasks),
                self.health.health(n.key),
                n.key,
                self.health.record(n.key).tasks_placed,
            ),
        )

    @property
    def task_slots(self) -> int:
        """How many submodels the pool can hold at once: the task slots of the nodes that are
        up, plus as many as the largest of them for each node set aside (it may come back);
        at least 1."""
        up = [n.max_parallel_tasks for n in self.nodes if not n.down]
        aside = sum(1 for n in self.nodes if n.down)
        return max(1, sum(up) + aside * max(up, default=1))

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
    ) -> Iterator[PoolNode]:
        """Hold a task slot and ``memory_gib`` on the node placement picks while the block runs.

        Raises:
            PlanningError: no node could ever hold the submodel.
            TransientNodeError: every usable node is down, or ``timeout_seconds`` passed.
        """
        self.check_fits(memory_gib, what)
        deadline = None if timeout_seconds is None else time.monotonic() + timeout_seconds
        with self._cond:
            self._tickets += 1
            me = _Waiter(self._tickets, memory_gib, tuple(exclude))
            self._waiting.append(me)
            try:
                while True:
                    if not any(not n.down and n.key not in exclude for n in self.nodes):
                        raise TransientNodeError(
                            f"no node available for {what}: all are down or excluded"
                        )
                    node = self._best(memory_gib, exclude)
                    earlier = [w for w in self._waiting if w.ticket < me.ticket]
                    may_pass = all(
                        w.passes < MAX_PASSES and self._best(w.memory_gib, w.exclude) is None
                        for w in earlier
                    )
                    if node is not None and may_pass:
                        for w in earlier:
                            w.passes += 1
                        node.used_memory_gib += memory_gib
                        node.running += 1
                        self.health.task_started(node.key)
                        break
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if remaining is not None and remaining <= 0:
                        raise TransientNodeError(
                            f"no node had room for {what} within {timeout_seconds} s"
                        )
                    self._cond.wait(timeout=5.0 if remaining is None else min(5.0, remaining))
            finally:
                self._waiting.remove(me)
                self._cond.notify_all()
        try:
            yield node
        finally:
            with self._cond:
                node.used_memory_gib -= memory_gib
                node.running -= 1
                self._cond.notify_all()

    def down_keys(self) -> frozenset[str]:
        """The keys of the nodes set aside now (down, or not answering at the start)."""
        with self._cond:
            return frozenset(n.key for n in self.nodes if n.down)

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
