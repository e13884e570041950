"""The processing nodes a run uses: given NodeODM URLs, or the built-in engine started on demand.

Tokens never travel in flow parameters: a node's token comes from a ``NodeODM`` block (the
glue reads the block and passes its :class:`~prefect_odm.nodes.backend.NodeSettings` in) or from
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
from concurrent.futures import ThreadPoolExecutor, wait
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlparse

import psutil

from prefect_odm import __version__
from prefect_odm.errors import InputError, NodeError, TransientNodeError
from prefect_odm.models import OptionValue
from prefect_odm.nodes.backend import NodeBackend, NodeInfo, NodeSettings
from prefect_odm.nodes.capacity import node_capacity, node_memory_gib, node_task_slots
from prefect_odm.nodes.client import NodeClient, public_url
from prefect_odm.nodes.messages import is_bad_token_error
from prefect_odm.nodes.option_check import check_options, format_option_errors
from prefect_odm.nodes.pool import NodePool, PoolNode
from prefect_odm.nodes.scaleodm import ScaleODMClient, is_scaleodm_url
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
    "check_embedded_options",
    "check_node_options",
    "connect_nodes",
    "node_backend",
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
    _checked: list[dict[str, OptionValue]] = field(default_factory=list, init=False, repr=False)

    def check_options(self, options: Mapping[str, OptionValue]) -> None:
        """:func:`check_node_options` on this cluster's nodes that are up, once per set of options
        (the submodel runs of one parent share the cluster and would ask each node again)."""
        if dict(options) not in self._checked:
            down = {n.key for n in self.pool.nodes if n.down}
            up = {url: c for url, c in self.clients.items() if url not in down}
            check_node_options(up, options)
            self._checked.append(dict(options))


PROBE_TIMEOUT_SECONDS = 10.0
"""How long the start of a run waits for every node's ``/info``; a node silent that long is set
aside (a hung node used to hold every start for 52 s, issue 14)."""
REPROBE_INTERVAL_SECONDS = 30.0
"""How often a set-aside node is asked for ``/info`` again while the run goes on."""


@dataclass(frozen=True)
class _Probe:
    """What one node answered at the start of a run."""

    url: str
    token: str | None
    settings: NodeSettings
    client: NodeBackend | None = None
    info: NodeInfo | None = None
    problem: str | None = None
    """Why the node is set aside (it did not answer, or answered with a transient error)."""


def _probe(
    url: str,
    token: str | None,
    given: NodeSettings,
    client_factory: Callable[[str, str | None], NodeBackend],
) -> _Probe:
    """Ask one node for ``/info``. Raises :class:`InputError` for a configuration problem
    (malformed URL, refused token, not a NodeODM); a transient failure becomes a ``problem``."""
    try:
        client = client_factory(url, token)
    except ValueError as exc:
        raise InputError(_unusable(url, exc)) from None
    try:
        return _Probe(url, token, given, client, client.info())
    except TransientNodeError as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return _Probe(url, token, given, client, problem=first.replace(f"; node {url}", ""))
    except (ValueError, NodeError) as exc:
        raise InputError(_unusable(url, exc)) from None


def _probe_all(
    wanted: Sequence[tuple[str, str | None, NodeSettings]],
    client_factory: Callable[[str, str | None], NodeBackend],
    timeout_seconds: float,
) -> list[_Probe]:
    """:func:`_probe` every node at once; a node that has not answered within
    ``timeout_seconds`` is set aside (its request goes on in the background and is ignored)."""
    executor = ThreadPoolExecutor(max_workers=max(1, len(wanted)), thread_name_prefix="probe")
    try:
        futures = [executor.submit(_probe, *w, client_factory) for w in wanted]
        done, _ = wait(futures, timeout=timeout_seconds)
        probes: list[_Probe] = []
        for (url, token, given), future in zip(wanted, futures, strict=True):
            if future in done:
                probes.append(future.result())
            else:
                silent = f"no answer to /info within {timeout_seconds:g} s"
                probes.append(_Probe(url, token, given, problem=silent))
        return probes
    finally:
        executor.shutdown(wait=False, cancel_futures=True)


def connect_nodes(
    urls: Sequence[str],
    tokens: dict[str, str] | None = None,
    settings: dict[str, NodeSettings] | None = None,
    *,
    client_factory: Callable[[str, str | None], NodeBackend] | None = None,
    probe_timeout_seconds: float = PROBE_TIMEOUT_SECONDS,
    reprobe_interval_seconds: float = REPROBE_INTERVAL_SECONDS,
) -> Cluster:
    """Ask every node for ``/info`` at once and build the pool.

    A node that does not answer within ``probe_timeout_seconds`` (dead, hung, or answering with
    a transient error) is set aside with a warning: it is in the pool but marked down, and asked
    again every ``reprobe_interval_seconds`` in the background; when it answers with an engine
    the run already uses, placement may use it. The run fails only when no node answers.

    Args:
        urls: node URLs (``http://host:port``; a ``?token=`` is taken as that node's token).
        tokens: node public URL -> token, overriding the environment.
        settings: node public URL -> settings from a pool block (token, memory, task slots).
        client_factory: ``(url, token) -> node``; :func:`node_backend` by default (ScaleODM
            for ``scaleodm+http(s)://`` URLs, NodeODM's HTTP API otherwise).
        probe_timeout_seconds: how long to wait for all the ``/info`` answers.
        reprobe_interval_seconds: seconds between probes of a set-aside node.

    Returns:
        The cluster: a node per URL, each with the pool block's memory, else 90% of the memory
        its ``/info`` reports when that is plausible (:func:`~prefect_odm.nodes.capacity.node_capacity`:
        ClusterODM's ``99999999999`` placeholders and zero or negative values are unknown),
        else unknown (no memory limit in placement; ``--split auto`` refuses it). Set-aside
        nodes are not in ``memory_by_node``.

    Raises:
        InputError: a URL is malformed or listed twice, a node refuses the token or is not a
            NodeODM, or no node answers ``/info`` (one line naming each node and its problem).
    """
    client_factory = client_factory or node_backend
    wanted: list[tuple[str, str | None, NodeSettings]] = []
    for raw in urls:
        url, url_token = split_token(raw)
        if any(url == w[0] for w in wanted):
            raise InputError(f"node {url} is listed twice")
        given = (settings or {}).get(url, NodeSettings())
        token = given.token or (tokens or {}).get(url) or url_token or token_for(url)
        wanted.append((url, token, given))
    probes = _probe_all(wanted, client_factory, probe_timeout_seconds)
    if wanted and all(p.info is None for p in probes):
        said = "; ".join(f"{p.url} ({p.problem})" for p in probes)
        raise InputError(f"no node answers: {said}")
    clients: dict[str, NodeBackend] = {}
    nodes: list[PoolNode] = []
    engines: set[str] = set()
    memory: dict[str, float | None] = {}
    aside: list[_Probe] = []
    for probe in probes:
        client = probe.client or client_factory(probe.url, probe.token)
        clients[probe.url] = client
        if probe.info is None:
            logger.warning(
                "node %s set aside: %s; asked again every %g s",
                probe.url,
                probe.problem,
                reprobe_interval_seconds,
            )
            nodes.append(PoolNode(key=probe.url, memory_gib=0.0, max_parallel_tasks=1, down=True))
            aside.append(probe)
            continue
        node, gib = _pool_node(probe.url, probe.info, probe.settings)
        memory[probe.url] = gib
        nodes.append(node)
        engines.add(probe.info.identity)
    known = [gib for gib in memory.values() if gib is not None]
    cluster = Cluster(clients, NodePool(nodes), " | ".join(sorted(engines)), known, memory)
    if aside:
        _start_reprobe(cluster, aside, engines, reprobe_interval_seconds)
    return cluster


def node_backend(url: str, token: str | None = None) -> NodeBackend:
    """The backend of a node URL: :class:`~prefect_odm.nodes.scaleodm.ScaleODMClient` for
    ``scaleodm+http(s)://host:port``, :class:`~prefect_odm.nodes.client.NodeClient` (NodeODM's
    API: NodeODM, ClusterODM, the built-in engine) otherwise.

    Raises:
        ValueError: not a node URL; :class:`InputError` for a ScaleODM without a staging prefix.
    """
    if is_scaleodm_url(url):
        return ScaleODMClient(url, token)
    return NodeClient(url, token)


def _pool_node(url: str, info: NodeInfo, given: NodeSettings) -> tuple[PoolNode, float | None]:
    """The placement record of a node that answered ``/info``, and its planning memory."""
    capacity = node_capacity(info.raw)
    if capacity.unknown:
        logger.info("node %s: /info %s not plausible, taken as unknown", url, capacity.unknown)
    gib = node_memory_gib(capacity, given.memory_gib)
    node = PoolNode(
        key=url,
        memory_gib=math.inf if gib is None else gib,
        max_parallel_tasks=node_task_slots(capacity, given.max_parallel_tasks),
    )
    return node, gib


def _start_reprobe(
    cluster: Cluster, aside: list[_Probe], engines: set[str], interval_seconds: float
) -> None:
    """Ask the set-aside nodes for ``/info`` every ``interval_seconds`` (a daemon thread, ended
    by ``cluster.cancelled`` or when every one has answered) and bring each up that answers with
    an engine already in the run: another engine would change the submodels' fingerprints."""

    def loop() -> None:
        waiting = list(aside)
        while waiting and not cluster.cancelled.wait(interval_seconds):
            for probe in list(waiting):
                try:
                    info = cluster.clients[probe.url].info()
                except (ValueError, NodeError):
                    continue
                waiting.remove(probe)
                if info.identity not in engines:
                    logger.warning(
                        "node %s answers again but runs %s, not %s: left aside",
                        probe.url,
                        info.identity,
                        " | ".join(sorted(engines)),
                    )
                    continue
                node, _ = _pool_node(probe.url, info, probe.settings)
                cluster.pool.bring_up(probe.url, node.memory_gib, node.max_parallel_tasks)
                logger.warning("node %s answers again: taking work", probe.url)

    threading.Thread(target=loop, name="node-reprobe", daemon=True).start()


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


def check_node_options(
    clients: Mapping[str, NodeBackend], options: Mapping[str, OptionValue]
) -> None:
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


def check_embedded_options(options: Mapping[str, Any]) -> None:
    """Check the run's node options against the built-in engine's option table, without
    starting it (the engine answers ``/options`` from the same table), so a bad option on the
    embedded engine is refused before the plan is written, as it is with ``--nodes``.

    Raises:
        InputError: some option is unknown to the engine or its value does not fit.
    """
    from prefect_odm.engine.options import option_specs
    from prefect_odm.engine.pipeline_options import OPTIONS

    listed = [spec.to_dict() for spec in option_specs(OPTIONS)]
    errors = check_options(dict(options), listed)
    if errors:
        raise InputError(format_option_errors(errors, "the built-in engine"))


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
        engine = stack.enter_context(
            start_engine(
                data_dir, max_parallel_tasks=EMBEDDED_MAX_PARALLEL_TASKS, method=method or None
            )
        )
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
