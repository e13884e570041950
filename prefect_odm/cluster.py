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
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlparse

import psutil

from prefect_odm import __version__
from prefect_odm.backend import NodeBackend, NodeSettings
from prefect_odm.errors import InputError, NodeError
from prefect_odm.nodeodm import NodeClient, public_url
from prefect_odm.pool import NodePool, PoolNode
from prefect_odm.settings import get_settings, prefect_odm_home

logger = logging.getLogger(__name__)

EMBEDDED_ENGINE_IDENTITY = f"prefect-odm-engine {__version__}"
EMBEDDED_MAX_PARALLEL_TASKS = 2


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
    cancelled: threading.Event = field(default_factory=threading.Event)
    """Set when the run is cancelled: submodel runners cancel their remote tasks and stop."""


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
        The cluster: a node per URL, each with 90% of its ``/info`` memory (or this machine's
        when the node does not say) unless ``settings`` gives it.

    Raises:
        InputError: a URL is malformed or a node does not answer ``/info``.
    """
    clients: dict[str, NodeBackend] = {}
    nodes: list[PoolNode] = []
    engines: set[str] = set()
    for raw in urls:
        url, url_token = split_token(raw)
        given = (settings or {}).get(url, NodeSettings())
        token = given.token or (tokens or {}).get(url) or url_token or token_for(url)
        try:
            client = client_factory(url, token)
            info = client.info()
        except (ValueError, NodeError) as exc:
            raise InputError(f"node {url} is not usable: {str(exc).splitlines()[0]}") from None
        if url in clients:
            raise InputError(f"node {url} is listed twice")
        clients[url] = client
        total = float(info.total_memory_bytes or psutil.virtual_memory().total) / 2**30
        nodes.append(
            PoolNode(
                key=url,
                memory_gib=given.memory_gib or round(total * 0.9, 2),
                max_parallel_tasks=given.max_parallel_tasks or info.max_parallel_tasks or 1,
            )
        )
        engines.add(info.identity)
    return Cluster(
        clients, NodePool(nodes), " | ".join(sorted(engines)), [n.memory_gib for n in nodes]
    )


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
            {client.url: client}, NodePool([node]), EMBEDDED_ENGINE_IDENTITY, [node.memory_gib]
        )
