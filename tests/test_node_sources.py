"""Node sources read again during a run (issue 34): the DNS source with a stand-in resolver (only
127.0.0.1 is a network target here), the file source, and the pool and membership rules with
fakes (one module at a time; the end-to-end runs are in tests/test_node_source_runs.py)."""

from __future__ import annotations

import os
import socket
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from prefect_odm.errors import InputError, TransientNodeError
from prefect_odm.nodes import pool as pool_module
from prefect_odm.nodes.backend import NodeInfo
from prefect_odm.nodes.membership import NodeClients, NodeMembership
from prefect_odm.nodes.pool import NodePool, PoolNode
from prefect_odm.nodes.sources import (
    DnsSource,
    FileSource,
    is_source,
    parse_node_file,
    source_for,
)


@dataclass
class Resolver:
    """A stand-in for :func:`socket.getaddrinfo`: ``answers`` is a list of addresses or an
    exception to raise; ``asked`` records each call's arguments."""

    answers: list[str] | BaseException
    asked: list[tuple[Any, ...]] = field(default_factory=list)

    def __call__(self, host: str, port: int, family: int, kind: int) -> list[tuple[Any, ...]]:
        self.asked.append((host, port, family, kind))
        if isinstance(self.answers, BaseException):
            raise self.answers
        return [(socket.AF_INET, kind, 6, "", (a, port)) for a in self.answers]


def test_dns_source_lists_each_address_once_in_address_order():
    resolver = Resolver(["10.0.0.12", "10.0.0.3", "10.0.0.12", "10.0.1.2"])
    source = source_for("dns+http://nodeodm.odm.svc.cluster.local:3000", resolver)
    assert isinstance(source, DnsSource)
    assert source.resolve() == [
        "http://10.0.0.3:3000",
        "http://10.0.0.12:3000",  # numeric order, not text order
        "http://10.0.1.2:3000",
    ]
    assert resolver.asked == [
        ("nodeodm.odm.svc.cluster.local", 3000, socket.AF_INET, socket.SOCK_STREAM)
    ]
    assert source.refresh_seconds == 5.0


def test_dns_source_without_address_lists_no_node_and_a_failure_is_transient():
    assert DnsSource("dns+https://fleet:443", Resolver([])).resolve() == []
    gone = socket.gaierror(socket.EAI_NONAME, "Name or service not known")
    assert DnsSource("dns+http://fleet:3000", Resolver(gone)).resolve() == []
    again = socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")
    with pytest.raises(TransientNodeError, match="cannot resolve fleet"):
        DnsSource("dns+http://fleet:3000", Resolver(again)).resolve()


@pytest.mark.parametrize(
    "spec", ["dns+http://fleet", "dns+http://fleet:port", "dns+http://fleet:3000/x", "dns+http://"]
)
def test_malformed_dns_sources_are_refused_in_one_line(spec):
    with pytest.raises(InputError, match="dns\\+http://name:port"):
        source_for(spec)


@pytest.mark.parametrize(
    "query", ["memory_gib=0", "memory_gib=-2", "memory_gib=lots", "memory_gib=inf", "token=x",
              "memory_gib=8&memory_gib=9", "memory_gib=8&slots=2"],
)  # fmt: skip
def test_a_dns_source_takes_only_a_positive_memory_in_its_query(query):
    assert source_for("dns+http://fleet:3000?memory_gib=7.5").memory_gib == 7.5
    assert source_for("dns+http://fleet:3000").memory_gib is None
    with pytest.raises(InputError, match="takes one query field, memory_gib=G with G GiB"):
        source_for(f"dns+http://fleet:3000?{query}")


def test_what_is_a_source():
    assert is_source("dns+http://a:1") and is_source("file:///tmp/nodes.txt")
    assert not is_source("http://127.0.0.1:3000") and not is_source("scaleodm+http://s:31100")
    with pytest.raises(InputError, match="is not a node source"):
        source_for("http://127.0.0.1:3000")
    with pytest.raises(InputError, match="file:///absolute/path"):
        source_for("file://relative/nodes.txt")


def test_node_file_lines_comments_and_refusals(tmp_path):
    text = "# the fleet\nhttp://127.0.0.1:3001\n\n  http://127.0.0.1:3000/  # first\nhttp://127.0.0.1:3001\n"
    assert parse_node_file(text) == ["http://127.0.0.1:3000", "http://127.0.0.1:3001"]
    with pytest.raises(InputError, match=r"^nodes.txt:2: 'ftp://x' is not a node URL"):
        parse_node_file("http://127.0.0.1:3000\nftp://x\n", "nodes.txt")
    with pytest.raises(InputError, match=r"nodes.txt:1: http://a:1 carries a credential") as err:
        parse_node_file("http://a:1?token=s3cret\n", "nodes.txt")
    assert "s3cret" not in str(err.value)


def test_file_source_is_read_again_only_when_it_changes(tmp_path, monkeypatch):
    path = tmp_path / "nodes.txt"
    path.write_text("http://127.0.0.1:3000\n")
    source = source_for(f"file://{path}")
    assert isinstance(source, FileSource)
    reads: list[Path] = []
    real = Path.read_text

    def counting(self: Path, *args: Any, **kwargs: Any) -> str:
        reads.append(self)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", counting)
    assert source.resolve() == ["http://127.0.0.1:3000"]
    assert source.resolve() == ["http://127.0.0.1:3000"]
    assert reads == [path]  # the second look was a stat
    replacement = tmp_path / "nodes.txt.tmp"
    replacement.write_text("http://127.0.0.1:3000\nhttp://127.0.0.1:3002\n")
    os.replace(replacement, path)  # how a writer replaces it whole
    assert source.resolve() == ["http://127.0.0.1:3000", "http://127.0.0.1:3002"]
    assert len(reads) == 2
    path.unlink()
    with pytest.raises(InputError, match="cannot read the node file"):
        source.resolve()


class FakeSource:
    """A source whose list the test sets; ``fail`` makes the next readings raise."""

    def __init__(self, urls: list[str]) -> None:
        self.spec = "file:///fake/nodes.txt"
        self.refresh_seconds = 1.0
        self.urls = urls
        self.fail: BaseException | None = None

    def resolve(self) -> list[str]:
        if self.fail is not None:
            raise self.fail
        return sorted(self.urls)


class FakeNode:
    """A node client answering ``/info`` with ``queued`` tasks; ``alive`` False: no answer."""

    def __init__(self, url: str, engine: str = "prefect-odm", queued: int = 0) -> None:
        self.url, self.engine, self.queued, self.alive = url, engine, queued, True

    def info(self) -> NodeInfo:
        if not self.alive:
            raise TransientNodeError("connection refused", node_url=self.url)
        raw = {"engine": self.engine, "engineVersion": "1", "taskQueueCount": self.queued}
        return NodeInfo.from_json(raw)


class Fleet:
    """A membership over fake nodes: ``probe`` answers as the nodes do, counting the asks."""

    def __init__(self, urls: list[str], fixed: frozenset[str] = frozenset()) -> None:
        self.nodes = {u: FakeNode(u) for u in ["http://a:1", "http://b:1", "http://c:1"]}
        self.source = FakeSource(urls)
        self.asked: list[str] = []
        self.now = 0.0
        self.pool = NodePool([])
        self.clients = NodeClients()
        self.membership = NodeMembership(
            [self.source], self.pool, self.clients, self.probe, fixed, clock=lambda: self.now
        )

    def probe(self, url: str) -> Any:
        self.asked.append(url)
        node = self.nodes[url]
        if not node.alive:
            return None
        if node.engine != "prefect-odm":
            raise InputError(f"it runs {node.engine} 1, not prefect-odm 1")
        return node, PoolNode(url, memory_gib=8.0, max_parallel_tasks=1)

    def refresh(self) -> None:
        self.now += 10.0
        self.membership.refresh()

    def usable(self) -> list[str]:
        return sorted(n.key for n in self.pool.nodes if n.usable)


def test_a_listed_node_is_probed_before_it_takes_work_and_a_silent_one_is_asked_again():
    fleet = Fleet(["http://a:1", "http://b:1"])
    fleet.nodes["http://b:1"].alive = False
    fleet.refresh()
    assert fleet.usable() == ["http://a:1"] and sorted(fleet.clients) == ["http://a:1"]
    fleet.nodes["http://b:1"].alive = True
    fleet.refresh()
    assert fleet.usable() == ["http://a:1", "http://b:1"]
    assert fleet.asked == ["http://a:1", "http://b:1", "http://b:1"]


def test_refreshes_are_rate_limited_by_the_clock():
    fleet = Fleet(["http://a:1"])
    fleet.refresh()
    fleet.source.urls = ["http://a:1", "http://b:1"]
    fleet.now += 0.5  # under the source's refresh_seconds
    fleet.membership.refresh()
    assert fleet.usable() == ["http://a:1"]
    fleet.now += 0.6
    fleet.membership.refresh()
    assert fleet.usable() == ["http://a:1", "http://b:1"]


def test_a_node_that_leaves_keeps_its_running_task_and_gets_no_new_one():
    fleet = Fleet(["http://a:1", "http://b:1"])
    fleet.refresh()
    with fleet.pool.lease(1.0, what="submodel-000", exclude=["http://b:1"]) as held:
        assert held.key == "http://a:1"
        fleet.source.urls = ["http://b:1"]
        fleet.refresh()
        assert held.gone and held.running == 1  # still held: the task goes on
        assert fleet.pool.down_keys() == frozenset({"http://a:1"})
        with fleet.pool.lease(1.0, what="submodel-001") as other:
            assert other.key == "http://b:1"
    assert held.running == 0 and held.used_memory_gib == 0.0
    assert "http://a:1" in fleet.clients  # its client stays: results can still be fetched
    fleet.source.urls = ["http://a:1", "http://b:1"]
    fleet.refresh()  # back: asked again, then placed on
    assert fleet.asked.count("http://a:1") == 2 and fleet.usable() == ["http://a:1", "http://b:1"]


def test_another_engine_is_refused_once_and_a_fixed_node_never_leaves():
    fleet = Fleet(["http://a:1", "http://c:1"], fixed=frozenset({"http://b:1"}))
    fleet.nodes["http://c:1"].engine = "odm"
    fleet.refresh()
    fleet.refresh()
    assert fleet.asked.count("http://c:1") == 1 and "http://c:1" not in fleet.clients
    fleet.source.urls = []
    fleet.refresh()
    assert fleet.usable() == ["http://b:1"]  # a plain --nodes URL stays whatever the source says


def test_a_source_that_cannot_be_read_keeps_its_last_list():
    fleet = Fleet(["http://a:1", "http://b:1"])
    fleet.refresh()
    fleet.source.fail = TransientNodeError("DNS server does not answer")
    fleet.refresh()
    assert fleet.usable() == ["http://a:1", "http://b:1"]
    fleet.source.fail = InputError("nodes.txt:3: 'x' is not a node URL")
    fleet.refresh()
    assert fleet.usable() == ["http://a:1", "http://b:1"]


def test_each_refresh_records_the_tasks_shared_nodes_report():
    """A node whose reported tasks fill its slots gets no more: the submodel waits for a slot."""
    fleet = Fleet(["http://a:1", "http://b:1"])
    fleet.refresh()
    fleet.nodes["http://a:1"].queued = 1  # another run's task
    fleet.nodes["http://b:1"].alive = False  # no answer: its count is left as it was
    fleet.refresh()
    loads = {n.key: n.reported_tasks for n in fleet.pool.nodes}
    assert loads == {"http://a:1": 1, "http://b:1": 0}
    fleet.nodes["http://b:1"].alive = True
    with fleet.pool.lease(1.0, what="submodel-000") as node:
        assert node.key == "http://b:1"  # a's one slot holds the other run's task
    fleet.nodes["http://b:1"].queued = 1
    fleet.refresh()
    with pytest.raises(TransientNodeError, match="no node had room"):  # wait, do not queue
        with fleet.pool.lease(1.0, what="submodel-001", timeout_seconds=0.2):
            pass


def test_a_placement_waits_for_a_node_to_join(monkeypatch):
    monkeypatch.setattr(pool_module, "WAIT_SECONDS", 0.05)
    joined = PoolNode("http://a:1", memory_gib=8.0, max_parallel_tasks=1)
    calls: list[int] = []
    pool = NodePool([PoolNode("http://z:1", memory_gib=8.0, max_parallel_tasks=1, gone=True)])

    def refresh() -> None:
        calls.append(1)
        if len(calls) == 3:
            threading.Thread(target=pool.add_node, args=(joined,)).start()

    pool.refresh, pool.empty_wait_seconds = refresh, 30.0
    with pool.lease(1.0, what="submodel-000") as node:
        assert node.key == "http://a:1"
    pool.empty_wait_seconds = 0.2
    pool.set_gone("http://a:1")
    with pytest.raises(TransientNodeError, match="no node available for submodel-001"):
        with pool.lease(1.0, what="submodel-001"):
            pass


def _one_each(spread: bool, names: list[str], urls: list[str]) -> dict[str, str]:
    """Where each submodel goes when each runs in its own process (a fresh pool over the same
    idle nodes, as deployment runs of one parent have)."""
    placed: dict[str, str] = {}
    for name in names:
        pool = NodePool([PoolNode(u, memory_gib=8.0, max_parallel_tasks=1) for u in urls])
        pool.spread = spread
        with pool.lease(1.0, what=name) as node:
            placed[name] = node.key
    return placed


def test_runs_in_other_processes_spread_their_submodels_over_shared_nodes():
    """Each process sees the same idle nodes and nothing of the others' placements: with the URL
    tie-break every one sends its submodel to the first node; with rendezvous hashing the same
    submodel always goes to the same node and different submodels spread."""
    names = [f"submodel-{i:03d}" for i in range(12)]
    urls = ["http://a:1", "http://b:1", "http://c:1"]
    assert set(_one_each(False, names, urls).values()) == {"http://a:1"}
    first = _one_each(True, names, urls)
    assert first == _one_each(True, names, urls)
    per_node = {u: sum(1 for v in first.values() if v == u) for u in urls}
    assert min(per_node.values()) >= 2, per_node


def test_node_clients_iterate_a_snapshot():
    clients = NodeClients({"http://a:1": FakeNode("http://a:1")})  # type: ignore[dict-item]
    seen = []
    for key in clients:
        clients.add("http://b:1", FakeNode("http://b:1"))  # type: ignore[arg-type]
        seen.append(key)
    assert seen == ["http://a:1"] and sorted(clients) == ["http://a:1", "http://b:1"]


def test_the_command_line_takes_sources_and_scaleodm_urls(tmp_path, monkeypatch, capsys):
    from prefect_odm.cli.args import build_parser

    monkeypatch.chdir(tmp_path)
    args = build_parser().parse_args(
        ["reconstruct", "imgs", "-o", "out", "--nodes", "scaleodm+http://scaleodm:31100",
         "dns+http://nodeodm.odm.svc:3000", "--nodes-file", "fleet/nodes.txt"]
    )  # fmt: skip
    assert args.nodes == ["scaleodm+http://scaleodm:31100", "dns+http://nodeodm.odm.svc:3000"]
    assert args.nodes_file == f"file://{tmp_path / 'fleet' / 'nodes.txt'}"
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["reconstruct", "i", "-o", "o", "--nodes", "dns+http://fleet"])
    assert exit_.value.code == 2
    (line,) = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert "argument --nodes: 'dns+http://fleet': a DNS node source is dns+http://name:port" in line


def test_a_listed_node_marked_dead_is_asked_again_a_fixed_one_is_not():
    fleet = Fleet(["http://a:1"], fixed=frozenset({"http://b:1"}))
    fleet.refresh()
    fleet.pool.mark_down("http://a:1")  # the runner found it dead (a pod restarting)
    fleet.pool.mark_down("http://b:1")
    fleet.refresh()
    assert fleet.usable() == ["http://a:1"]  # answered again: back in placement
    assert fleet.asked.count("http://a:1") == 2 and fleet.asked.count("http://b:1") == 1
