"""Node sources: lists of node URLs that may change while a run goes on.

A run's ``--nodes`` may name, beside node URLs, a *source* that is read again during the run
(:class:`~prefect_odm.nodes.membership.NodeMembership` applies what it says to the pool):

``dns+http://name:port`` (or ``dns+https://``)
    every address a DNS name resolves to is one node ``http://address:port``: the pods of a
    Kubernetes headless Service (``clusterIP: None``), whose DNS answer lists the addresses of
    its ready pods. Resolved with :func:`socket.getaddrinfo` (IPv4, as the Service's A records).
    ``?memory_gib=G`` gives every node it lists that memory (a NodeODM pod's ``/info`` reports
    its host's, not its limit).
``file:///path/nodes.txt``
    a text file of node URLs, one a line (``#`` starts a comment), read again when it changes
    (its size, modification time or inode): for a machine whose nodes another program starts
    and stops, as the tests' scaler stand-in does.

Each source is one small object with a ``spec`` and a ``resolve()``; nothing here talks to a node.
"""

from __future__ import annotations

import ipaddress
import math
import os
import socket
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import parse_qs, unquote, urlparse

from prefect_odm.errors import InputError, TransientNodeError
from prefect_odm.nodes.backend import NodeSettings
from prefect_odm.nodes.refs import credential_in

DNS_PREFIXES = ("dns+http://", "dns+https://")
FILE_PREFIX = "file://"

DNS_REFRESH_SECONDS = 5.0
"""Least time between two resolutions of a DNS source: CoreDNS answers a Kubernetes Service's
records with a TTL of 5 s (its ``kubernetes`` plugin's default ``ttl``)."""
FILE_REFRESH_SECONDS = 1.0
"""Least time between two looks at a file source (a ``stat``; read only when it changed)."""

NODE_URL_PREFIXES = ("http://", "https://", "scaleodm+http://", "scaleodm+https://")
"""What a line of a node file may hold."""

_NO_ADDRESS = {
    getattr(socket, name) for name in ("EAI_NONAME", "EAI_NODATA") if hasattr(socket, name)
}
"""``getaddrinfo`` errors that mean the name has no address now (a Service with no ready pod)."""

Resolver = Callable[..., Sequence[tuple[Any, ...]]]
""":func:`socket.getaddrinfo`'s shape: ``(host, port, family, type) -> [(family, type, proto,
canonname, sockaddr), ...]``."""


class NodeSource(Protocol):
    """Where a run finds nodes that may come and go.

    Attributes:
        spec: the source as the user wrote it (safe to log: it carries no token).
        refresh_seconds: the least time between two :meth:`resolve` calls worth making.
    """

    spec: str
    refresh_seconds: float

    @property
    def memory_gib(self) -> float | None:
        """The memory of every node it lists, GiB; None: each node's ``/info`` says."""
        ...

    def resolve(self) -> list[str]:
        """The node URLs the source lists now, sorted, each once.

        Raises:
            InputError: the source cannot be read at all (a missing file, a bad line).
            TransientNodeError: it could not be read this time (a DNS server that does not
                answer); the caller keeps the last list.
        """
        ...


def is_source(spec: str) -> bool:
    """Whether a ``--nodes`` entry is a node source rather than a node URL."""
    return spec.startswith((*DNS_PREFIXES, FILE_PREFIX))


def source_for(spec: str, resolver: Resolver | None = None) -> NodeSource:
    """The source a ``--nodes`` entry names.

    Args:
        spec: ``dns+http(s)://name:port`` or ``file:///path``.
        resolver: the DNS resolver of a ``dns+`` source (:func:`socket.getaddrinfo` by default).

    Raises:
        InputError: not a source, or a malformed one (one line naming it).
    """
    if spec.startswith(DNS_PREFIXES):
        return DnsSource(spec, resolver or socket.getaddrinfo)
    if spec.startswith(FILE_PREFIX):
        return FileSource(spec)
    raise InputError(f"{spec!r} is not a node source (dns+http://name:port or file:///path)")


@dataclass
class DnsSource:
    """``dns+http(s)://name:port``: one node per IPv4 address of ``name``.

    Args:
        spec: the source.
        resolver: :func:`socket.getaddrinfo` or a stand-in of the same shape (tests).
        refresh_seconds: see :data:`DNS_REFRESH_SECONDS`.

    Raises:
        InputError: no host name or no port in ``spec``, or a query other than
            ``?memory_gib=G`` with ``G`` a positive number.
    """

    spec: str
    resolver: Resolver = socket.getaddrinfo
    refresh_seconds: float = DNS_REFRESH_SECONDS
    scheme: str = field(init=False)
    host: str = field(init=False)
    port: int = field(init=False)
    _memory_gib: float | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        """Read the scheme, host, port and memory from ``spec``.

        Raises:
            InputError: ``spec`` is not ``dns+http(s)://name:port[?memory_gib=G]``.
        """
        parts = urlparse(self.spec.removeprefix("dns+"))
        try:
            port = parts.port
        except ValueError:
            port = None
        if not parts.hostname or port is None or parts.path.strip("/"):
            raise InputError(
                f"{self.spec!r}: a DNS node source is dns+http://name:port (a port, no path)"
            )
        self.scheme, self.host, self.port = parts.scheme, parts.hostname, port
        self._memory_gib = _memory_query(self.spec, parts.query)

    @property
    def memory_gib(self) -> float | None:
        """``?memory_gib=``: the memory of every node it lists, GiB (None when not given)."""
        return self._memory_gib

    def resolve(self) -> list[str]:
        """``scheme://address:port`` for each IPv4 address of the name, sorted by address; an
        empty list when the name has no address now.

        Raises:
            TransientNodeError: the resolver failed otherwise (no answer, a server failure).
        """
        try:
            found = self.resolver(self.host, self.port, socket.AF_INET, socket.SOCK_STREAM)
        except socket.gaierror as exc:
            if exc.errno in _NO_ADDRESS:
                return []
            raise TransientNodeError(f"{self.spec}: cannot resolve {self.host}: {exc}") from exc
        addresses = sorted({str(entry[4][0]) for entry in found}, key=ipaddress.ip_address)
        return [f"{self.scheme}://{address}:{self.port}" for address in addresses]


def _memory_query(spec: str, query: str) -> float | None:
    """The ``memory_gib`` of a DNS source's query; None without a query.

    Raises:
        InputError: another field, or a value that is not a positive finite number.
    """
    if not query:
        return None
    fields = parse_qs(query, keep_blank_values=True)
    values = fields.pop("memory_gib", [])
    try:
        gib = float(values[0]) if len(values) == 1 and not fields else math.nan
    except ValueError:
        gib = math.nan
    if not (gib > 0 and math.isfinite(gib)):
        raise InputError(
            f"{spec!r}: a DNS node source takes one query field, memory_gib=G with G GiB "
            "(a positive number: the memory of each node it lists)"
        )
    return gib


@dataclass
class FileSource:
    """``file:///path``: the node URLs listed in a text file, one a line.

    Blank lines and everything after ``#`` are ignored; each line is an ``http(s)://`` or
    ``scaleodm+http(s)://`` node URL without a credential (tokens come from
    ``PREFECT_ODM_NODE_TOKEN(S)`` or a pool block, as for ``--nodes``). The file is read again only when its size, modification
    time or inode changed; a writer replaces it whole (write a temporary file, then rename).

    Raises:
        InputError: ``spec`` is not a ``file://`` URL of an absolute path.
    """

    spec: str
    refresh_seconds: float = FILE_REFRESH_SECONDS
    path: Path = field(init=False)
    _seen: tuple[int, int, int] | None = field(default=None, init=False, repr=False)
    _urls: list[str] = field(default_factory=list, init=False, repr=False)

    def __post_init__(self) -> None:
        """Read the file's path from ``spec``.

        Raises:
            InputError: ``spec`` is not ``file:///absolute/path``.
        """
        parts = urlparse(self.spec)
        if parts.netloc not in ("", "localhost") or not parts.path.startswith("/"):
            raise InputError(f"{self.spec!r}: a node file is file:///absolute/path")
        self.path = Path(unquote(parts.path))

    @property
    def memory_gib(self) -> None:
        """None: each listed node's ``/info`` (or a pool block) gives its memory."""
        return None

    def resolve(self) -> list[str]:
        """The URLs the file lists now, sorted, each once.

        Raises:
            InputError: the file is missing or unreadable, or a line is not a node URL (the
                message names the file and the line).
        """
        try:
            stat = os.stat(self.path)
        except OSError as exc:
            raise InputError(f"{self.path}: cannot read the node file ({exc.strerror})") from exc
        seen = (stat.st_size, stat.st_mtime_ns, stat.st_ino)
        if seen == self._seen:
            return list(self._urls)
        try:
            text = self.path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise InputError(f"{self.path}: cannot read the node file ({exc})") from exc
        self._urls, self._seen = parse_node_file(text, self.path), seen
        return list(self._urls)


def parse_node_file(text: str, path: Path | str = "node file") -> list[str]:
    """The node URLs of a node file's ``text``, sorted, each once (see :class:`FileSource`).

    Raises:
        InputError: a line is not a node URL, or carries a credential (``{path}:{line}: ...``).
    """
    urls: set[str] = set()
    for number, line in enumerate(text.splitlines(), start=1):
        entry = line.split("#", 1)[0].strip()
        if not entry:
            continue
        shown = entry.split("?", 1)[0].rsplit("@", 1)[-1]  # never echo a token
        try:
            host = urlparse(entry).hostname
        except ValueError:
            host = None
        if not entry.startswith(NODE_URL_PREFIXES) or not host:
            raise InputError(f"{path}:{number}: {shown!r} is not a node URL (http://host:port)")
        credential = credential_in(entry)
        if credential is not None:
            raise InputError(
                f"{path}:{number}: {shown} carries a credential ({credential}); give tokens in "
                "PREFECT_ODM_NODE_TOKENS or a NodeODMPool block"
            )
        urls.add(entry.rstrip("/"))
    return sorted(urls)


def with_source_memory(
    sources: Sequence[NodeSource],
    listed: Mapping[str, Sequence[str]],
    settings: Mapping[str, NodeSettings] | None,
) -> dict[str, NodeSettings]:
    """``settings`` with each source's ``memory_gib`` (``dns+http://name:port?memory_gib=G``)
    for the nodes it lists; a node's own settings (a pool block's) win."""
    merged = dict(settings or {})
    for source in sources:
        if source.memory_gib is not None:
            for url in listed.get(source.spec, ()):
                merged.setdefault(url, NodeSettings(memory_gib=source.memory_gib))
    return merged
