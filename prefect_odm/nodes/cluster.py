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
import os
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlparse

from prefect_odm import __version__
from prefect_odm.errors import InputError, NodeError, TransientNodeError
from prefect_odm.models import OptionValue
from prefect_odm.nodes.backend import NodeBackend, NodeSettings
from prefect_odm.nodes.client import NodeClient, public_url
from prefect_odm.nodes.membership import NodeClients, NodeMembership
from prefect_odm.nodes.option_check import OptionError, check_options, format_option_errors
from prefect_odm.nodes.pool import NodePool, PoolNode
from prefect_odm.nodes.probes import (
    AnsweredNodes,
    NodeProbe,
    pool_node,
    probe_node,
    probe_nodes,
)
from prefect_odm.nodes.scaleodm import ScaleODMClient, is_scaleodm_url
from prefect_odm.nodes.sources import (
    NodeSource,
    Resolver,
    is_source,
    source_for,
    with_source_memory,
)
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
    "AnsweredNodes",
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

    clients: NodeClients
    pool: NodePool
    engine_identity: str
    node_memory_gib: list[float] = field(default_factory=list)
    """The memory of the nodes that reported a plausible one (or have it in the pool block)."""
    memory_by_node: dict[str, float | None] = field(default_factory=dict)
    """Node URL -> planning memory, GiB; ``None`` where unknown (``--split auto`` refuses it)."""
    cancelled: threading.Event = field(default_factory=threading.Event)
    """Set when the run is cancelled: submodel runners cancel their remote tasks and stop."""
    given: tuple[str, ...] = ()
    """The node URLs and node sources the cluster was connected from, sorted, without tokens."""
    membership: NodeMembership | None = None
    """What keeps the pool in step with the node sources; ``None``: fixed nodes."""
    _checked: list[dict[str, OptionValue]] = field(default_factory=list, init=False, repr=False)

    def serves(self, nodes: Sequence[str]) -> bool:
        """Whether the cluster was connected from these node URLs and sources (tokens aside)."""
        return self.given == tuple(sorted(split_token(u)[0] for u in nodes))

    def check_options(self, options: Mapping[str, OptionValue]) -> None:
        """:func:`check_node_options` on this cluster's nodes that are up, once per set of options
        (the submodel runs of one parent share the cluster and would ask each node again)."""
        if dict(options) not in self._checked:
            down = self.pool.down_keys()
            up = {url: c for url, c in self.clients.items() if url not in down}
            check_node_options(up, options)
            self._checked.append(dict(options))


PROBE_TIMEOUT_SECONDS = 10.0
"""How long the start of a run waits for every node's ``/info``; a node silent that long is set
aside (a hung node used to hold every start for 52 s, issue 14)."""
REPROBE_INTERVAL_SECONDS = 30.0
"""How often a set-aside node is asked for ``/info`` again while the run goes on."""
SOURCE_EMPTY_WAIT_SECONDS = 900.0
"""How long a submodel of a run that reads a node source waits while the source lists no usable
node (a fleet scaling up, its pods replaced) before the attempt fails."""
SOURCE_TASK_SLOTS = 32
"""Submodels a run that reads a node source keeps in flight at least (nodes may still join)."""


def connect_nodes(
    urls: Sequence[str],
    tokens: dict[str, str] | None = None,
    settings: dict[str, NodeSettings] | None = None,
    *,
    client_factory: Callable[[str, str | None], NodeBackend] | None = None,
    probe_timeout_seconds: float = PROBE_TIMEOUT_SECONDS,
    reprobe_interval_seconds: float = REPROBE_INTERVAL_SECONDS,
    resolver: Resolver | None = None,
) -> Cluster:
    """Ask every node for ``/info`` at once and build the pool.

    A node that does not answer within ``probe_timeout_seconds`` (dead, hung, or answering with
    a transient error) is set aside with a warning: it is in the pool but marked down, and asked
    again every ``reprobe_interval_seconds`` in the background; when it answers with an engine
    the run already uses, placement may use it. The run fails only when no node answers.

    An entry may be a node source (``dns+http://name:port``, ``file:///path``:
    :mod:`prefect_odm.nodes.sources`): the nodes it lists now are asked like the others (one that
    does not answer is left to the next reading), and the pool reads it again at each placement
    (:class:`~prefect_odm.nodes.membership.NodeMembership`): nodes join and leave during the run.

    Args:
        urls: node URLs (``http://host:port``; a ``?token=`` is taken as that node's token) and
            node sources.
        tokens: node public URL -> token, overriding the environment.
        settings: node public URL -> settings from a pool block (token, memory, task slots).
        client_factory: ``(url, token) -> node``; :func:`node_backend` by default (ScaleODM
            for ``scaleodm+http(s)://`` URLs, NodeODM's HTTP API otherwise).
        probe_timeout_seconds: how long to wait for all the ``/info`` answers.
        reprobe_interval_seconds: seconds between probes of a set-aside node.
        resolver: the DNS resolver of ``dns+`` sources (:func:`socket.getaddrinfo`).

    Returns:
        The cluster: a node per URL, each with the pool block's memory, else 90% of the memory
        its ``/info`` reports when that is plausible (:func:`~prefect_odm.nodes.capacity.node_capacity`:
        ClusterODM's ``99999999999`` placeholders and zero or negative values are unknown),
        else unknown (no memory limit in placement; ``--split auto`` refuses it). Set-aside
        nodes are not in ``memory_by_node``.

    Raises:
        InputError: a URL is malformed or listed twice, a node refuses the token or is not a
            NodeODM, a source cannot be read, or no node answers ``/info`` (one line naming
            each node and its problem).
    """
    client_factory = client_factory or node_backend
    sources = [source_for(u, resolver) for u in urls if is_source(u)]
    plain = [u for u in urls if not is_source(u)]
    listed = _listed_now(sources)
    wanted = _wanted(plain, tokens, settings)
    fixed = {w[0] for w in wanted}
    from_sources = sorted({u for found in listed.values() for u in found} - fixed)
    wanted += _wanted(from_sources, tokens, with_source_memory(sources, listed, settings))
    probes = probe_nodes(wanted, client_factory, probe_timeout_seconds)
    if all(p.info is None for p in probes):
        said = [f"{p.url} ({p.problem})" for p in probes]
        said += [f"{s.spec} (lists no node)" for s in sources if not listed.get(s.spec)]
        raise InputError(f"no node answers: {'; '.join(said)}")
    # A silent node a source lists is asked again at the next reading, not set aside.
    probes = [p for p in probes if p.info is not None or p.url in fixed]
    cluster, engines, aside = _assemble(probes, client_factory, reprobe_interval_seconds)
    cluster.given = tuple(sorted(split_token(u)[0] for u in urls))
    if aside:
        _start_reprobe(cluster, aside, engines, reprobe_interval_seconds)
    if sources:
        _follow(cluster, sources, listed, fixed, engines, tokens, settings, client_factory)
    return cluster


def check_nodes_answer(
    urls: Sequence[str],
    timeout_seconds: float = PROBE_TIMEOUT_SECONDS,
    options: Mapping[str, OptionValue] | None = None,
    resolver: Resolver | None = None,
) -> AnsweredNodes:
    """Refuse, before anything starts, a list of node URLs of which none answers ``/info``.

    The command line calls it before Prefect starts, so a mistyped or dead ``--nodes`` URL, or a
    missing or malformed ``--nodes-file``, costs a second instead of the temporary server's
    start-up; :func:`connect_nodes` asks again in the flow, and refuses what this refuses: node
    sources (``dns+``, ``file://``) are read once here, and the nodes they list now are asked
    with the others.

    With ``options``, each node that answers is asked for its ``/options`` and the run's
    options checked against them, as the flow does (:func:`check_node_options`). ``resolver``
    resolves ``dns+`` sources (:func:`socket.getaddrinfo` by default).

    Returns:
        The answering nodes' engines and memory, as the flow's cluster will have them (so the
        command line plans as the flow will: :func:`prefect_odm.cli.reconstruct.plan_local_images`).

    Raises:
        InputError: a source cannot be read, or no node answers (one line naming each node
            and its problem, and each source that lists no node); a node refuses an option
            (one line per bad option).
    """
    sources = [source_for(u, resolver) for u in urls if is_source(u)]
    plain = [u for u in urls if not is_source(u)]
    listed = _listed_now(sources)  # a missing or malformed node file: its one line
    wanted = _wanted(plain, None, None)
    fixed = {w[0] for w in wanted}
    from_sources = sorted({u for found in listed.values() for u in found} - fixed)
    wanted += _wanted(from_sources, None, with_source_memory(sources, listed, None))
    probes = probe_nodes(wanted, node_backend, timeout_seconds)
    if all(p.info is None for p in probes):
        said = [f"{p.url} ({p.problem})" for p in probes]
        said += [f"{s.spec} (lists no node)" for s in sources if not listed.get(s.spec)]
        raise InputError(f"no node answers: {'; '.join(said)}")
    if options is not None:
        check_node_options({p.url: p.client for p in probes if p.client and p.info}, options)
    return AnsweredNodes.of(probes)


def _listed_now(sources: Sequence[NodeSource]) -> dict[str, list[str]]:
    """Each source's node URLs now (source spec -> URLs).

    Raises:
        InputError: a source cannot be read.
    """
    listed: dict[str, list[str]] = {}
    for source in sources:
        try:
            listed[source.spec] = source.resolve()
        except TransientNodeError as exc:
            raise InputError(str(exc)) from None
    return listed


def _wanted(
    urls: Sequence[str],
    tokens: dict[str, str] | None,
    settings: Mapping[str, NodeSettings] | None,
) -> list[tuple[str, str | None, NodeSettings]]:
    """``(public URL, token, settings)`` of each node URL.

    Raises:
        InputError: a URL is listed twice.
    """
    wanted: list[tuple[str, str | None, NodeSettings]] = []
    for raw in urls:
        url, url_token = split_token(raw)
        if any(url == w[0] for w in wanted):
            raise InputError(f"node {url} is listed twice")
        given = (settings or {}).get(url, NodeSettings())
        token = given.token or (tokens or {}).get(url) or url_token or token_for(url)
        wanted.append((url, token, given))
    return wanted


def _assemble(
    probes: Sequence[NodeProbe],
    client_factory: Callable[[str, str | None], NodeBackend],
    reprobe_interval_seconds: float,
) -> tuple[Cluster, set[str], list[NodeProbe]]:
    """The cluster of the probed nodes, the engines that answered, and the set-aside probes."""
    clients = NodeClients()
    nodes: list[PoolNode] = []
    engines: set[str] = set()
    memory: dict[str, float | None] = {}
    aside: list[NodeProbe] = []
    for probe in probes:
        client = probe.client or client_factory(probe.url, probe.token)
        clients.add(probe.url, client)
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
        node, gib = pool_node(probe.url, probe.info, probe.settings)
        memory[probe.url] = gib
        nodes.append(node)
        engines.add(probe.info.identity)
    known = [gib for gib in memory.values() if gib is not None]
    cluster = Cluster(clients, NodePool(nodes), " | ".join(sorted(engines)), known, memory)
    return cluster, engines, aside


def _follow(
    cluster: Cluster,
    sources: Sequence[NodeSource],
    listed: dict[str, list[str]],
    fixed: set[str],
    engines: set[str],
    tokens: dict[str, str] | None,
    settings: dict[str, NodeSettings] | None,
    client_factory: Callable[[str, str | None], NodeBackend],
) -> None:
    """Let the cluster's pool read ``sources`` again at each placement: a node joins once it
    answers ``/info`` with an engine the run already uses."""

    def probe(url: str) -> tuple[NodeBackend, PoolNode] | None:
        # membership.listed is this reading's (refresh updates it before it probes)
        known = with_source_memory(sources, membership.listed, settings)
        ((_, token, given),) = _wanted([url], tokens, known)
        answer = probe_node(url, token, given, client_factory)
        if answer.info is None or answer.client is None:
            return None
        if answer.info.identity not in engines:
            raise InputError(f"it runs {answer.info.identity}, not {' | '.join(sorted(engines))}")
        return answer.client, pool_node(url, answer.info, given)[0]

    membership = NodeMembership(sources, cluster.pool, cluster.clients, probe, frozenset(fixed))
    membership.listed.update(listed)
    membership.refresh(force=True)  # the clock starts; nodes that left since are set aside
    cluster.membership = membership
    pool = cluster.pool
    pool.refresh, pool.spread = membership.refresh, True
    pool.empty_wait_seconds, pool.source_task_slots = SOURCE_EMPTY_WAIT_SECONDS, SOURCE_TASK_SLOTS


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


def _start_reprobe(
    cluster: Cluster, aside: list[NodeProbe], engines: set[str], interval_seconds: float
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
                node, _ = pool_node(probe.url, info, probe.settings)
                cluster.pool.bring_up(probe.url, node.memory_gib, node.max_parallel_tasks)
                logger.warning("node %s answers again: taking work", probe.url)

    threading.Thread(target=loop, name="node-reprobe", daemon=True).start()


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
    errors = embedded_option_errors(options)
    if errors:
        raise InputError(format_option_errors(errors, "the built-in engine"))


def embedded_option_errors(options: Mapping[str, Any]) -> list[OptionError]:
    """The options the built-in engine's option table refuses (one error each; empty: all fit),
    without starting it (see :func:`check_embedded_options`)."""
    from prefect_odm.engine.options import option_specs
    from prefect_odm.engine.pipeline_options import OPTIONS

    listed = [spec.to_dict() for spec in option_specs(OPTIONS)]
    return check_options(dict(options), listed)


def embedded_memory_gib() -> float:
    """Memory the embedded engine may use: 80% of this machine's RAM, or of its cgroup's
    limit when smaller (:func:`~prefect_odm.engine.machine_memory.usable_memory_bytes`)."""
    from prefect_odm.engine.machine_memory import usable_memory_bytes

    return round(usable_memory_bytes() / 2**30 * 0.8, 2)


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
            NodeClients({client.url: client}),
            NodePool([node]),
            EMBEDDED_ENGINE_IDENTITY,
            [node.memory_gib],
            {client.url: node.memory_gib},
            given=(client.url,),
        )
