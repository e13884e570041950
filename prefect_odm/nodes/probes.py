"""Asking nodes for ``/info``: at the start of a run, and when a node source lists a new node.

A node that answers gives its placement record (:func:`pool_node`); one that does not answer, or
answers with a transient error, has a ``problem``; a configuration problem (malformed URL,
refused token, not a NodeODM) raises :class:`InputError` in one line (:func:`unusable`).
"""

from __future__ import annotations

import logging
import math
import re
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, wait
from dataclasses import dataclass

from prefect_odm.errors import InputError, NodeError, TransientNodeError
from prefect_odm.nodes.backend import NodeBackend, NodeInfo, NodeSettings
from prefect_odm.nodes.capacity import node_capacity, node_memory_gib, node_task_slots
from prefect_odm.nodes.messages import is_bad_token_error
from prefect_odm.nodes.pool import PoolNode

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class NodeProbe:
    """What one node answered to ``/info``."""

    url: str
    token: str | None
    settings: NodeSettings
    client: NodeBackend | None = None
    info: NodeInfo | None = None
    problem: str | None = None
    """Why the node is set aside (it did not answer, or answered with a transient error)."""


def probe_node(
    url: str,
    token: str | None,
    given: NodeSettings,
    client_factory: Callable[[str, str | None], NodeBackend],
) -> NodeProbe:
    """Ask one node for ``/info``. Raises :class:`InputError` for a configuration problem
    (malformed URL, refused token, not a NodeODM); a transient failure becomes a ``problem``."""
    try:
        client = client_factory(url, token)
    except ValueError as exc:
        raise InputError(unusable(url, exc)) from None
    try:
        return NodeProbe(url, token, given, client, client.info())
    except TransientNodeError as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return NodeProbe(url, token, given, client, problem=first.replace(f"; node {url}", ""))
    except (ValueError, NodeError) as exc:
        raise InputError(unusable(url, exc)) from None


def probe_nodes(
    wanted: Sequence[tuple[str, str | None, NodeSettings]],
    client_factory: Callable[[str, str | None], NodeBackend],
    timeout_seconds: float,
) -> list[NodeProbe]:
    """:func:`probe_node` every node at once; a node that has not answered within
    ``timeout_seconds`` is set aside (its request goes on in the background and is ignored).

    Each probe runs on a daemon thread: a ``ThreadPoolExecutor``'s workers are joined when the
    interpreter exits, so a command refusing a hung node waited for that node's HTTP time-out
    (32 s for a 10 s probe) before it could exit.
    """
    futures: list[Future[NodeProbe]] = []
    for w in wanted:
        future: Future[NodeProbe] = Future()
        futures.append(future)
        threading.Thread(
            target=_settle, args=(future, w, client_factory), name="probe", daemon=True
        ).start()
    done, _ = wait(futures, timeout=timeout_seconds)
    probes: list[NodeProbe] = []
    for (url, token, given), future in zip(wanted, futures, strict=True):
        if future in done:
            probes.append(future.result())
        else:
            silent = f"no answer to /info within {timeout_seconds:g} s"
            probes.append(NodeProbe(url, token, given, problem=silent))
    return probes


def _settle(
    future: Future[NodeProbe],
    wanted: tuple[str, str | None, NodeSettings],
    client_factory: Callable[[str, str | None], NodeBackend],
) -> None:
    """Run one :func:`probe_node` into ``future`` (its result or its error)."""
    try:
        future.set_result(probe_node(*wanted, client_factory))
    except BaseException as exc:  # handed to the caller through the future
        future.set_exception(exc)


def pool_node(url: str, info: NodeInfo, given: NodeSettings) -> tuple[PoolNode, float | None]:
    """The placement record of a node that answered ``/info``, and its planning memory."""
    capacity = node_capacity(info.raw)
    if capacity.unknown:
        logger.info("node %s: /info %s not plausible, taken as unknown", url, capacity.unknown)
    gib = node_memory_gib(capacity, given.memory_gib)
    node = PoolNode(
        key=url,
        memory_gib=math.inf if gib is None else gib,
        max_parallel_tasks=node_task_slots(capacity, given.max_parallel_tasks),
        queue_depth=1,  # the next task uploads while its slot's task runs (issue 33)
    )
    return node, gib


def unusable(url: str, exc: Exception) -> str:
    """One line on why the node at ``url`` cannot be used (the node named once)."""
    first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    first = first.replace(f"; node {url}", "")
    # The node's own words are quoted ("GET /info: node answered '...'") or follow a colon.
    said = [*re.findall(r"'([^']*)'", first), *first.split(": ")]
    if any(is_bad_token_error(part) for part in said):
        return (
            f"node {url} refused the token (wrong or missing): set the node's token in the "
            "pool block, or PREFECT_ODM_NODE_TOKEN / PREFECT_ODM_NODE_TOKENS"
        )
    return f"node {url} is not usable: {first}"


@dataclass(frozen=True)
class AnsweredNodes:
    """What the nodes that answered ``/info`` say, as :func:`~prefect_odm.nodes.cluster.connect_nodes` reads it.

    Attributes:
        engine_identity: their engines, ``" | "``-joined in sorted order (the plan's identity).
        memory_by_node: node public URL -> planning memory, GiB (None: unknown).
    """

    engine_identity: str
    memory_by_node: dict[str, float | None]

    @classmethod
    def of(cls, probes: Sequence[NodeProbe]) -> AnsweredNodes:
        """What the probes that got an ``/info`` answer say (:func:`pool_node`'s memory)."""
        answered = [(p, p.info) for p in probes if p.info is not None]
        return cls(
            " | ".join(sorted({info.identity for _, info in answered})),
            {p.url: pool_node(p.url, info, p.settings)[1] for p, info in answered},
        )

    @property
    def node_memory_gib(self) -> list[float]:
        """The known memories, GiB (what a plan is checked against)."""
        return [gib for gib in self.memory_by_node.values() if gib is not None]
