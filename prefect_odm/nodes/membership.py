"""A pool's nodes kept in step with its node sources while a run goes on.

At each placement (and every few seconds while a submodel waits for a node) the pool calls
:meth:`NodeMembership.refresh`, which asks the sources (:mod:`prefect_odm.nodes.sources`), at
most every ``refresh_seconds``, and applies the difference:

* a node a source lists that the pool does not use is asked for ``/info`` first, as a node set
  aside at the start of a run is when it answers again; it takes work only when it answers with
  the run's engine (another engine would change the submodels' fingerprints);
* a node no source lists any more is *gone*: it gets no new work, but nothing is cancelled and
  its client stays, so a task running there is followed to its end and its products downloaded
  (on Kubernetes the pod's pre-stop hook keeps the node up until its tasks are done);
* a gone node listed again is asked for ``/info`` again, then takes work.

Nodes given as plain URLs are never gone. A source that cannot be read this time keeps its last
list. The pool's nodes may be shared with other runs (the pods of a fleet), so each refresh also
records every usable node's ``taskQueueCount`` for placement.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any, TypeVar

from prefect_odm.errors import InputError, NodeError
from prefect_odm.nodes.backend import NodeBackend
from prefect_odm.nodes.pool import NodePool, PoolNode
from prefect_odm.nodes.sources import NodeSource

logger = logging.getLogger(__name__)

Probe = Callable[[str], "tuple[NodeBackend, PoolNode] | None"]
"""Ask a node URL for ``/info``: its client and placement record when it answers with the run's
engine, ``None`` when it does not answer (asked again at the next refresh); raises
:class:`InputError` when it answers but cannot be used (another engine, a refused token)."""


class NodeClients(Mapping[str, NodeBackend]):
    """Node key (public URL) -> node, safe to read while a node source adds nodes.

    Iterating gives a snapshot of the keys, so a runner looping over the nodes never sees the
    mapping change under it; entries are added, never removed (a gone node keeps its client).
    """

    def __init__(self, clients: Mapping[str, NodeBackend] | None = None) -> None:
        """Start with ``clients`` (none: empty)."""
        self._clients: dict[str, NodeBackend] = dict(clients or {})
        self._lock = threading.Lock()

    def __getitem__(self, key: str) -> NodeBackend:
        """The client of the node ``key`` (``KeyError`` for an unknown one)."""
        return self._clients[key]

    def __iter__(self) -> Iterator[str]:
        """A snapshot of the node keys, taken under the lock."""
        with self._lock:
            return iter(list(self._clients))

    def __len__(self) -> int:
        """How many nodes have a client (gone ones included)."""
        return len(self._clients)

    def add(self, key: str, client: NodeBackend) -> None:
        """Add (or replace) the client of the node ``key``."""
        with self._lock:
            self._clients[key] = client


@dataclass
class NodeMembership:
    """Applies node sources to a pool and its clients (see the module docstring).

    Args:
        sources: the run's node sources.
        pool: the placement pool (nodes are added to it and set aside in it).
        clients: the run's node clients (new nodes' clients are added).
        probe: asks one new node for ``/info`` (:data:`Probe`).
        fixed: node keys given as plain URLs (never gone).
        clock: seconds, monotonic.
        probe_timeout_seconds: how long one refresh waits for ``/info`` answers.
    """

    sources: Sequence[NodeSource]
    pool: NodePool
    clients: NodeClients
    probe: Probe
    fixed: frozenset[str] = frozenset()
    clock: Callable[[], float] = time.monotonic
    probe_timeout_seconds: float = 5.0
    """How long a refresh waits for the nodes' ``/info``; a node slower than that is asked
    again at the next refresh."""
    listed: dict[str, list[str]] = field(default_factory=dict)
    """Source spec -> the node URLs it listed at its last good reading."""
    refused: set[str] = field(default_factory=set)
    """Nodes that answered but cannot be used; asked again only once they left and came back."""
    _last: float | None = field(default=None, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    @property
    def refresh_seconds(self) -> float:
        """The least time between two refreshes: the shortest of the sources'."""
        return min((s.refresh_seconds for s in self.sources), default=5.0)

    def refresh(self, *, force: bool = False) -> None:
        """Read the sources (at most every :attr:`refresh_seconds`, unless ``force``) and apply
        what they list. Another thread's refresh in progress makes this one return at once."""
        if not self._lock.acquire(blocking=False):
            return
        try:
            now = self.clock()
            if not force and self._last is not None and now - self._last < self.refresh_seconds:
                return
            self._last = now
            wanted = set(self.fixed)
            for source in self.sources:
                wanted |= set(self._read(source))
            self._apply(wanted)
        finally:
            self._lock.release()

    def _read(self, source: NodeSource) -> list[str]:
        try:
            urls = source.resolve()
        except (InputError, NodeError) as exc:
            kept = self.listed.get(source.spec, [])
            logger.warning("%s not read (%s); keeping its %d node(s)", source.spec, exc, len(kept))
            return kept
        self.listed[source.spec] = urls
        return urls

    def _apply(self, wanted: set[str]) -> None:
        """Set aside the nodes no source lists, probe the new and returning ones, and record
        the load of the rest."""
        in_pool = {n.key: n for n in self.pool.nodes}
        for key, node in in_pool.items():
            if key not in wanted and not node.gone:
                self.pool.set_gone(key)
                logger.warning("node %s left its source: no new work, its running tasks go on", key)
        self.refused &= wanted
        # new nodes, returning ones, and listed ones set aside as dead (a pod restarted there)
        asked = sorted(
            key
            for key in wanted - self.refused
            if key not in in_pool
            or in_pool[key].gone
            or (in_pool[key].down and key not in self.fixed)
        )
        loads = [n.key for n in self.pool.nodes if not n.gone and not n.down]
        if not asked and not loads:
            return
        ex = ThreadPoolExecutor(max_workers=len(asked) + len(loads), thread_name_prefix="member")
        try:
            probes = [ex.submit(self._probe_one, key) for key in asked]
            counts = [ex.submit(self._queue_count, key) for key in loads]
            asked_all: list[Future[Any]] = [*probes, *counts]
            wait(asked_all, timeout=self.probe_timeout_seconds)
        finally:
            ex.shutdown(wait=False, cancel_futures=True)  # a silent node is asked next time
        joined = [_answer(key, f) for key, f in zip(asked, probes, strict=True)]
        reported = [_answer(key, f) for key, f in zip(loads, counts, strict=True)]
        for key, client_node in zip(asked, joined, strict=True):
            if client_node is None:
                continue
            client, node = client_node
            self.clients.add(key, client)
            came_back = key in in_pool
            self.pool.add_node(node)
            logger.warning("node %s %s: taking work", key, "is back" if came_back else "joined")
        for key, count in zip(loads, reported, strict=True):
            if count is not None:
                self.pool.report_tasks(key, count)

    def _probe_one(self, key: str) -> tuple[NodeBackend, PoolNode] | None:
        try:
            return self.probe(key)
        except InputError as exc:
            self.refused.add(key)
            logger.warning("node %s listed but not used: %s", key, exc)
            return None

    def _queue_count(self, key: str) -> int | None:
        """The node's ``taskQueueCount`` (queued and running tasks of every run), or ``None``."""
        try:
            raw = self.clients[key].info().raw
        except (NodeError, KeyError):
            return None
        count = raw.get("taskQueueCount")
        return count if isinstance(count, int) and not isinstance(count, bool) else None


T = TypeVar("T")


def _answer(key: str, future: Future[T]) -> T | None:
    """A node's answer, or ``None`` when it gave none in time or its request failed in a way
    the node's client does not classify (logged: one node must not stop every placement)."""
    if not future.done():
        return None
    error = future.exception()
    if error is not None:
        logger.warning("node %s: /info failed: %s", key, error)
        return None
    return future.result()
