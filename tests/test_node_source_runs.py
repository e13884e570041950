"""Node sources with real built-in engines on 127.0.0.1 (issue 34): a DNS source through
``connect_nodes`` with a stand-in resolver, and a run whose node file changes while its
submodels are processed (the direct pipeline on brighton)."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from test_node_sources import Resolver

from prefect_odm.engine.launch import EngineProcess, start_engine
from prefect_odm.errors import TransientNodeError
from prefect_odm.layout import OutputLayout
from prefect_odm.models import ProcessingOptions
from prefect_odm.nodes.client import RUNNING, NodeClient
from prefect_odm.nodes.cluster import connect_nodes
from prefect_odm.nodes.runner import SubmodelRunner
from prefect_odm.plan.planning import plan_split
from prefect_odm.survey.scan import scan_images

pytestmark = pytest.mark.integration


@pytest.fixture
def two_engines(tmp_path: Path) -> Iterator[list[EngineProcess]]:
    with (
        start_engine(tmp_path / "a", method="direct", max_parallel_tasks=1) as a,
        # B's tasks are held 8 s on the node, so the one it runs is still running when B leaves
        # (a 20 cm direct task can end between the two checks on a busy machine)
        start_engine(
            tmp_path / "b",
            method="direct",
            max_parallel_tasks=1,
            extra_env={"PREFECT_ODM_ENGINE_FAULTS": json.dumps({"slow_seconds": 8})},
        ) as b,
    ):
        yield [a, b]


def write_nodes(path: Path, urls: list[str]) -> None:
    """Replace the node file whole, as a writer must."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(f"{u}\n" for u in urls))
    os.replace(tmp, path)


def test_a_dns_source_resolved_again_sets_its_node_aside_and_takes_it_back(tmp_path):
    with start_engine(tmp_path / "node") as engine:
        resolver = Resolver(["127.0.0.1"])
        spec = f"dns+http://nodeodm.odm.svc:{engine.port}"
        cluster = connect_nodes([spec], resolver=resolver)
        assert cluster.given == (spec,) and cluster.serves([spec])
        (node,) = cluster.pool.nodes
        assert node.key == engine.url and node.usable
        assert cluster.membership is not None
        resolver.answers = []  # the Service has no ready pod
        cluster.membership.refresh(force=True)
        assert node.gone and cluster.pool.down_keys() == {engine.url}
        cluster.pool.empty_wait_seconds = 0.5
        with pytest.raises(TransientNodeError, match="no node available"):
            with cluster.pool.lease(1.0, what="submodel-000"):
                pass
        resolver.answers = ["127.0.0.1"]
        cluster.membership.refresh(force=True)
        assert node.usable
        with cluster.pool.lease(1.0, what="submodel-000") as leased:
            assert leased.key == engine.url
        assert all(asked[0] == "nodeodm.odm.svc" for asked in resolver.asked)


def test_a_dns_source_gives_its_nodes_the_memory_it_names(tmp_path):
    """NodeODM in a pod reports its host's memory: ``?memory_gib=`` on the source stands for
    the pod's limit, for the nodes it lists at the start and for one that joins later; the
    edge's check reads it the same way."""
    from prefect_odm.nodes.cluster import check_nodes_answer

    with start_engine(tmp_path / "a") as a, start_engine(tmp_path / "b") as b:
        resolver = Resolver(["127.0.0.1"])
        spec = f"dns+http://nodeodm.odm.svc:{a.port}?memory_gib=6"
        cluster = connect_nodes([spec], resolver=resolver)
        assert cluster.memory_by_node == {a.url: 6.0}
        assert [n.memory_gib for n in cluster.pool.nodes] == [6.0]
        # without the query the engine's own /info figure (90 % of this machine's) is used
        plain = connect_nodes([f"dns+http://nodeodm.odm.svc:{a.port}"], resolver=resolver)
        assert plain.memory_by_node[a.url] not in (None, 6.0)
        # a node that joins through the source later gets the same memory
        later = Resolver([])
        joined = connect_nodes([f"dns+http://nodeodm.odm.svc:{b.port}?memory_gib=6", a.url],
                               resolver=later)  # fmt: skip
        assert joined.membership is not None
        later.answers = ["127.0.0.1"]
        joined.membership.refresh(force=True)
        by_key = {n.key: n.memory_gib for n in joined.pool.nodes}
        assert by_key[b.url] == 6.0 and by_key[a.url] != 6.0
        answered = check_nodes_answer([spec], resolver=resolver)
        assert answered.memory_by_node == {a.url: 6.0}


def _running_on(client: NodeClient) -> int:
    return sum(1 for u in client.task_list() if (s := client.task_state(u)) and s.status == RUNNING)


def _wait(what: str, done: threading.Event, check, timeout_seconds: float = 300) -> None:
    deadline = time.monotonic() + timeout_seconds
    while not check():
        assert not done.is_set(), f"the run ended before {what}"
        assert time.monotonic() < deadline, f"no {what} within {timeout_seconds} s"
        time.sleep(0.2)


def test_nodes_join_and_leave_a_run_through_its_node_file(
    brighton_images, tmp_path, two_engines, odm_home
):
    """Six submodels on a node file that first lists A; B is added once A runs a task and
    removed once B runs one: B takes work, its running task ends and is downloaded, it gets no
    task after it left, and no submodel is processed twice."""
    a, b = (NodeClient(e.url) for e in two_engines)
    survey = scan_images(str(brighton_images))
    options = ProcessingOptions(pipeline="direct", orthophoto_resolution_cm=20)  # fast
    plan = plan_split(survey, split=3, split_overlap_m=10, options=options)
    # six: each node takes a task into its queue beside the running one (issue 33), so four were
    # all placed once B joined, and with no placement after the file changed B was never read
    # as gone; with six, two still wait and their placement reads the file again
    assert len(plan.submodels) >= 6
    plan = plan.model_copy(update={"submodels": plan.submodels[:6]})
    nodes_file = tmp_path / "nodes.txt"
    write_nodes(nodes_file, [a.url])
    cluster = connect_nodes([f"file://{nodes_file}"])
    assert [n.key for n in cluster.pool.nodes] == [a.url]
    runner = SubmodelRunner(
        plan,
        survey,
        OutputLayout(str(tmp_path / "out"), survey.fingerprint),
        cluster.pool,
        cluster.clients,
        poll_interval_seconds=0.3,
    )
    done = threading.Event()
    with ThreadPoolExecutor(max_workers=len(plan.submodels)) as ex:
        futures = [ex.submit(runner.run, s.id) for s in plan.submodels]
        ex.submit(lambda: (wait_all(futures), done.set()))
        _wait("task running on A", done, lambda: _running_on(a) > 0)
        write_nodes(nodes_file, [a.url, b.url])
        _wait("task running on B", done, lambda: _running_on(b) > 0)
        write_nodes(nodes_file, [a.url])
        on_b = next(n for n in cluster.pool.nodes if n.key == b.url)
        _wait("B set aside", done, lambda: on_b.gone)
        left_at_ms = time.time() * 1000
        # its task slot (and the place in its queue) were held when it left
        assert 1 <= on_b.running <= on_b.max_parallel_tasks + on_b.queue_depth
        running_when_left = [
            u for u in b.task_list() if (s := b.task_state(u)) and s.status == RUNNING
        ]
        results = [f.result() for f in futures]
    assert all(r.status == "completed" and r.attempts == 1 for r in results), [
        (r.submodel_id, r.error) for r in results
    ]
    tasks = {c.url: [c.task_state(u) for u in c.task_list()] for c in (a, b)}
    print({url: len(states) for url, states in tasks.items()})
    assert sum(len(states) for states in tasks.values()) == len(plan.submodels)  # none redone
    on_b_results = [r for r in results if r.node_url == b.url]
    assert on_b_results and len(on_b_results) == len(tasks[b.url])
    assert all(s is not None and s.info["dateCreated"] < left_at_ms for s in tasks[b.url])
    # the task B ran when it left went on to the end, and its products were stored
    assert len(running_when_left) == 1
    (kept,) = [r for r in on_b_results if r.task_uuid == running_when_left[0]]
    assert all(Path(p).stat().st_size > 0 for p in kept.products.values())


def wait_all(futures: list) -> None:
    for f in futures:
        f.exception()
