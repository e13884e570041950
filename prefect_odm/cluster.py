"""The processing nodes a run uses: given NodeODM URLs, or the built-in engine started on demand.

Tokens never travel in flow parameters: a node's token comes from a ``NodeODM`` block (the
glue reads the block and passes its :class:`~prefect_odm.backend.NodeSettings` in) or from
the environment (``PREFECT_ODM_NODE_TOKEN`` for every node, or ``PREFECT_ODM_NODE_TOKENS``, a JSON
object mapping node URL to token). A ``?token=`` written into a URL on the command line is moved
out of the URL before anything is logged.
"""

from __future__ import annotations

import fcntl
import json
import logging
import math
import os
import re
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlparse

import psutil

from prefect_odm import __version__
from prefect_odm.backend import NodeBackend, NodeSettings
from prefect_odm.errors import InputError, NodeError, TransientNodeError
from prefect_odm.node_capacity import node_capacity, node_memory_gib, node_task_slots
from prefect_odm.node_messages import is_bad_token_error
from prefect_odm.nodeodm import NodeClient, public_url
from prefect_odm.option_check import check_options, format_option_errors
from prefect_odm.pool import NodePool, PoolNode
from prefect_odm.settings import get_settings, prefect_odm_home

logger = logging.getLogger(__name__)

EMBEDDED_ENGINE_IDENTITY = f"prefect-odm-engine {__version__}"
EMBEDDED_MAX_PARALLEL_TASKS = 2
ENGINE_ONLY_OPTIONS = frozenset({"pipeline"})
"""Options of the built-in engine that a NodeODM may leave out of its ``/options``."""


def split_token(url: str) -> tuple[str, str | None]:
    """``(url without query, token)`` for a node URL that may carry ``?token=``."""
    token = parse_qs(urlparse(url).query).get("token", [None])[0]
    return public_url(url), token


def token_for(url: str) -> str | None:
    """The token for the node at ``url`` from the environment, if any."""
    settings = get_settings()
    tokens = settings.node_tokens
    if tokens:
        try:
            mapping = json.loads(tokens)
        except json.JSONDecodeError as exc:
            raise InputError(
                "PREFECT_ODM_NODE_TOKENS is not a JSON object of URL -> token"
            ) from exc
        if public_url(url) in mapping:
            return str(mapping[public_url(url)])
    return settings.node_token.get_secret_value() if settings.node_token else None


__all__ = [
    "EMBEDDED_ENGINE_IDENTITY",
    "Cluster",
    "NodeSettings",
    "check_node_options",
    "connect_nodes",
    "embedded_engine",
    "embedded_memory_gib",
    "split_token",
    "token_for",
]


@dataclass
class Cluster:
    """Node clients plus the placement pool over them."""

    clients: dict[str, NodeBackend]
    pool: NodePool
    engine_identity: str
    node_memory_gib: list[float] = field(default_factory=list)
    """The memory of the nodes that reported a plausible one (or have it in the pool block)."""
    memory_by_node: dict[str, float | None] = field(default_factory=dict)
    """Node URL -> planning memory, GiB; ``None`` where unknown (``--split auto`` refuses it)."""
    cancelled: threading.Event = field(default_factory=threading.Event)
    """Set when the run is cancelled: submodel runners cancel their remote tasks and stop."""
    _checked: list[dict[str, Any]] = field(default_factory=list, init=False, repr=False)

    def check_options(self, options: Mapping[str, Any]) -> None:
        """:func:`check_node_options` on this cluster's nodes, once per set of options (the
        submodel runs of one parent share the cluster and would ask each node again)."""
        if dict(options) not in self._checked:
            check_node_options(self.clients, options)
            self._checked.append(dict(options))


def connect_nodes(
    urls: Sequence[str],
    tokens: dict[str, str] | None = None,
    settings: dict[str, NodeSettings] | None = None,
    *,
    client_factory: Callable[[str, str | None], NodeBackend] = NodeClient,
) -> Cluster:
    """Check every node with ``/info`` and build the pool.

    Args:
        urls: node URLs (``http://host:port``; a ``?token=`` is taken as that node's token).
        tokens: node public URL -> token, overriding the environment.
        settings: node public URL -> settings from a pool block (token, memory, task slots).
        client_factory: ``(url, token) -> node``; the NodeODM HTTP client by default.

    Returns:
        The cluster: a node per URL, each with the pool block's memory, else 90% of the memory
        its ``/info`` reports when that is plausible (:func:`~prefect_odm.node_capacity.node_capacity`:
        ClusterODM's ``99999999999`` placeholders and zero or negative values are unknown),
        else unknown (no memory limit in placement; ``--split auto`` refuses it).

    Raises:
        InputError: a URL is malformed, a node does not answer ``/info``, or refuses the token.
    """
    clients: dict[str, NodeBackend] = {}
    nodes: list[PoolNode] = []
    engines: set[str] = set()
    memory: dict[str, float | None] = {}
    for raw in urls:
        url, url_token = split_token(raw)
        given = (settings or {}).get(url, NodeSettings())
        token = given.token or (tokens or {}).get(url) or url_token or token_for(url)
        try:
            client = client_factory(url, token)
            info = client.info()
        except (ValueError, NodeError) as exc:
            raise InputError(_unusable(url, exc)) from None
        if url in clients:
            raise InputError(f"node {url} is listed twice")
        clients[url] = client
        capacity = node_capacity(info.raw)
        if capacity.unknown:
            logger.info("node %s: /info %s not plausible, taken as unknown", url, capacity.unknown)
        gib = memory[url] = node_memory_gib(capacity, given.memory_gib)
        nodes.append(
            PoolNode(
                key=url,
                memory_gib=math.inf if gib is None else gib,
                max_parallel_tasks=node_task_slots(capacity, given.max_parallel_tasks),
            )
        )
        engines.add(info.identity)
    known = [gib for gib in memory.values() if gib is not None]
    return Cluster(clients, NodePool(nodes), " | ".join(sorted(engines)), known, memory)


def _unusable(url: str, exc: Exception) -> str:
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


def check_node_options(clients: Mapping[str, NodeBackend], options: Mapping[str, Any]) -> None:
    """Check the run's node options against each node's ``/options``, before anything is sent.

    A node that does not answer ``/options`` is left to the runner (which takes a dead node out
    of the pool); every node that answers is checked.

    Raises:
        InputError: some option is unknown to a node or its value does not fit (one line per
            bad option, naming the node whose list was used).
    """
    for url, client in sorted(clients.items()):
        try:
            listed = [option.raw for option in client.options()]
        except TransientNodeError as exc:
            logger.warning("options not checked on %s: %s", url, str(exc).splitlines()[0])
            continue
        names = {str(entry.get("name")) for entry in listed}
        # ``pipeline`` picks the built-in engine's method; a NodeODM that does not list it
        # ignores it, and the fingerprint keeps it so that the two engines never share results.
        asked = {k: v for k, v in options.items() if k in names or k not in ENGINE_ONLY_OPTIONS}
        errors = check_options(asked, listed)
        if errors:
            raise InputError(format_option_errors(errors, url))


def embedded_memory_gib() -> float:
    """Memory the embedded engine may use: 80% of this machine's RAM."""
    return round(psutil.virtual_memory().total / 2**30 * 0.8, 2)


_embedded_lock = threading.Lock()


@contextmanager
def embedded_engine(method: str | None = None) -> Iterator[Cluster]:
    """Start the built-in engine on a free loopback port for the duration of the block.

    Its data folder is ``prefect_odm_home()/engine`` (so a rerun after a crash finds the tasks the
    killed run left); when another process holds that folder, a private folder is used.
    """
    from prefect_odm.engine.launch import start_engine

    with _embedded_lock, ExitStack() as stack:
        base = prefect_odm_home() / "engine"
        base.mkdir(parents=True, exist_ok=True)
        lock_file = stack.enter_context(open(base / ".lock", "w"))
        try:
            fcntl.flock(lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
            data_dir = base / "data"
        except BlockingIOError:
            data_dir = base / f"data-{os.getpid()}"
            logger.info("embedded engine data folder is in use; using %s", data_dir)
        kwargs: dict[str, Any] = {"max_parallel_tasks": EMBEDDED_MAX_PARALLEL_TASKS}
        if method:
            kwargs["method"] = method
        engine = stack.enter_context(start_engine(data_dir, **kwargs))
        client = NodeClient(engine.url)
        node = PoolNode(
            key=client.url,
            memory_gib=embedded_memory_gib(),
            max_parallel_tasks=EMBEDDED_MAX_PARALLEL_TASKS,
        )
        yield Cluster(
            {client.url: client},
            NodePool([node]),
            EMBEDDED_ENGINE_IDENTITY,
            [node.memory_gib],
            {client.url: node.memory_gib},
        )
