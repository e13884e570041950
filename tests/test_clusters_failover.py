"""Two clusters of built-in engines, each with its own real process worker reading
``[own, global]``, on one PostgreSQL-backed Prefect server (issue 32's acceptance):

* cluster A held at 80 % of its memory: new submodels go to B's queue and, once B is full
  too, to the global queue, and B's worker takes them; the manifest says why;
* A's worker and engine killed (kill -9) in the middle of a survey: every submodel completes
  on B, each processed once (tasks counted on the nodes), the products byte-identical to the
  run without the fault;
* a submodel failing on every cluster waits in the paused dead-letter queue with its error
  while the others merge; with the fault cleared, ``prefect-odm requeue`` completes it and the
  merge runs again with it;
* ``prefect-odm setup --directory`` pauses a cluster's queue while its pool is not ready.

brighton, split 6 (3 submodels), the ``direct`` pipeline at 10 cm. Durations are printed.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cluster_stack import (
    DEPLOYMENT,
    POOL,
    Cluster,
    Stack,
    engine_tasks,
    finished,
    kill_tree,
    live_tasks,
    prefect_on_postgres,
    reconstruct,
    restart_engine,
    start_cluster,
    start_worker,
    stop_cluster,
    wait_until,
)
from prefect_odm.blocks import ClusterDirectoryBlock

from prefect_odm.cli.cluster_setup import create_cluster_queues
from prefect_odm.clusters.directory import ClusterSpec
from prefect_odm.models import Manifest

pytestmark = pytest.mark.integration

COMPLETED = 40
CANCELED = 50
PRODUCTS = ("orthophoto", "dsm", "point_cloud")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    t0 = time.monotonic()
    with prefect_on_postgres(tmp_path_factory.mktemp("clusters")) as s:
        print(f"\nPostgreSQL + prefect server + deployments: {time.monotonic() - t0:.1f} s")
        yield s


def _directory(name: str, a: Cluster, b: Cluster, memory_gib: tuple[float, float]) -> None:
    """Save the directory of clusters a (1 per node-hour) and b (2 per node-hour, dearer)
    with their memory caps and create its queues."""
    block = ClusterDirectoryBlock(
        clusters=[
            ClusterSpec(name="a", work_pool=POOL, nodes=[a.engine.url], memory_gib=memory_gib[0],
                        cost_per_node_hour=1.0),
            ClusterSpec(name="b", work_pool=POOL, nodes=[b.engine.url], memory_gib=memory_gib[1],
                        cost_per_node_hour=2.0),
        ]
    )  # fmt: skip
    block.save(name, overwrite=True)
    create_cluster_queues(block.directory())


def _ready(*queues: str) -> None:
    """Wait until a worker polls each queue (READY)."""
    from prefect.client.orchestration import get_client

    def all_ready() -> bool:
        with get_client(sync_client=True) as client:
            return all(
                client.read_work_queue_by_name(q, work_pool_name=POOL).status.value == "READY"
                for q in queues
            )

    wait_until(f"queues {queues} READY", all_ready, timeout_seconds=90)


def _manifest(out: Path) -> Manifest:
    return Manifest.model_validate_json(next(out.glob("*/manifest.json")).read_text())


def _digests(manifest: Manifest) -> dict[str, str]:
    return {
        p: hashlib.sha256(Path(manifest.products[p]).read_bytes()).hexdigest() for p in PRODUCTS
    }


def _completed_by_name(tasks: list[dict[str, Any]]) -> dict[str, int]:
    """Submodel id -> runs of its completed tasks on a node, from the engine's task table (a
    task's name is ``{id}-{fp[:12]}``; a task restarted on the node counts each run)."""
    out: dict[str, int] = {}
    for t in tasks:
        if t["status"] == COMPLETED:
            sid = str(t["name"]).rsplit("-", 1)[0]
            out[sid] = out.get(sid, 0) + int(t["run_count"])
    return out


@pytest.fixture(scope="module")
def routed(
    stack: Stack, brighton_images: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    """Scenario (a): A (cheaper, 5 GiB) holds 4 GiB in a run on its worker (limit 1), B
    (dearer, 2 GiB) is empty; the survey is routed and run."""
    from prefect.client.orchestration import get_client
    from prefect.states import Cancelled

    a = start_cluster(stack, "a", "routing", limit=1)
    b = start_cluster(stack, "b", "routing")
    _directory("routing", a, b, (5, 2))
    out = tmp_path_factory.mktemp("routed") / "out"
    try:
        with get_client(sync_client=True) as client:
            hold = client.create_flow_run_from_deployment(
                client.read_deployment_by_name("hold/hold").id,
                parameters={"memory_gib": 4.0},
                work_queue_name="a",
            )
            wait_until(
                "the hold run on A",
                lambda: client.read_flow_run(hold.id).state_type.value == "RUNNING",
            )
        _ready("a", "b")
        t0 = time.monotonic()
        finished(reconstruct(stack, brighton_images, out, "routing"), out.parent / "out.log")
        seconds = time.monotonic() - t0
        with get_client(sync_client=True) as client:
            tags = {r.submodel_id: client.read_flow_run(r.flow_run_id).tags
                    for r in _manifest(out).routing.decisions}  # fmt: skip
            held = client.read_flow_run(hold.id).state_type.value
            client.set_flow_run_state(hold.id, Cancelled(), force=True)
        return {"out": out, "seconds": seconds, "tags": tags, "hold": held,
                "a": engine_tasks(a.data_dir), "b": engine_tasks(b.data_dir)}  # fmt: skip
    finally:
        stop_cluster(a)
        stop_cluster(b)


def test_a_full_cluster_sends_new_submodels_to_global_and_b_takes_them(
    routed: dict[str, Any],
) -> None:
    manifest = _manifest(routed["out"])
    print(f"\nrouted run (A held at 80 %): {routed['seconds']:.1f} s")
    assert manifest.routing is not None
    decisions = manifest.routing.decisions
    for d in decisions:
        print(f"  {d.submodel_id}: {d.work_queue} -> ran on {d.ran_on}: {d.reason}")
    assert sorted(d.submodel_id for d in decisions) == [s.submodel_id for s in manifest.submodels]
    assert all(d.cluster != "a" and d.ran_on == "b" and d.outcome == "completed" for d in decisions)
    overflow = [d for d in decisions if d.work_queue == "global"]
    direct = [d for d in decisions if d.work_queue == "b"]
    assert overflow and direct  # B had room for some, then both were full
    for d in overflow:
        assert d.reason.startswith("overflow: every eligible cluster at or over 80%"), d.reason
        assert "a 80%" in d.reason
        assert "cluster:b" in routed["tags"][d.submodel_id]  # taken from global, recorded
    assert all(d.reason.startswith("cheapest with room") for d in direct)
    assert all(r.status == "completed" and r.cluster == "b" for r in manifest.submodels)
    assert routed["hold"] == "RUNNING"  # A's worker stayed busy with its own run
    assert routed["a"] == []  # nothing ran on A's node
    assert _completed_by_name(routed["b"]) == {r.submodel_id: 1 for r in manifest.submodels}


def test_killing_cluster_a_mid_survey_completes_every_submodel_on_b_once(
    stack: Stack, routed: dict[str, Any], brighton_images: Path, tmp_path: Path
) -> None:
    a = start_cluster(stack, "a", "failover", faults={"slow_seconds": 600})  # tasks wait on A
    b = start_cluster(stack, "b", "failover")
    _directory("failover", a, b, (10, 10))
    out = tmp_path / "out"
    try:
        _ready("a", "b")
        t0 = time.monotonic()
        parent = reconstruct(stack, brighton_images, out, "failover")
        wait_until("two tasks on A's node", lambda: len(live_tasks(a.engine.url)) >= 2, 180)
        killed_at = time.time()
        a.kill()
        print(f"\nkilled A's worker and engine {time.monotonic() - t0:.1f} s into the run")
        finished(parent, tmp_path / "out.log")
        seconds = time.monotonic() - t0
        manifest = _manifest(out)
        b_tasks = engine_tasks(b.data_dir)
    finally:
        stop_cluster(a)
        stop_cluster(b)
    assert manifest.routing is not None
    decisions = manifest.routing.decisions
    first = [d for d in decisions if d.route == 1]
    second = [d for d in decisions if d.route == 2]
    assert {d.cluster for d in first} == {"a"}
    assert all(d.outcome == "failed over" and d.error.startswith("cluster a down") for d in first)
    assert all(d.ran_on == "b" and d.excluded == ["a"] and d.outcome == "completed" for d in second)
    assert sorted(d.submodel_id for d in second) == [s.submodel_id for s in manifest.submodels]
    assert all(r.status == "completed" and r.cluster == "b" for r in manifest.submodels)
    # each processed once: one completed run per submodel on B's node, none on A's
    assert _completed_by_name(b_tasks) == {r.submodel_id: 1 for r in manifest.submodels}
    assert _completed_by_name(engine_tasks(a.data_dir)) == {}
    assert _digests(manifest) == _digests(_manifest(routed["out"]))  # as without the fault
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        rerouted = [client.read_flow_run(d.flow_run_id).created.timestamp() for d in second]
    print(f"failover run: {seconds:.1f} s in all; kill -> last submodel routed to B: "
          f"{max(rerouted) - killed_at:.1f} s")  # fmt: skip


def test_a_submodel_failing_everywhere_waits_in_dead_letter_then_requeue_merges_it(
    stack: Stack, routed: dict[str, Any], brighton_images: Path, tmp_path: Path
) -> None:
    from prefect.client.orchestration import get_client

    fault = {"fail_task_name": "^submodel-001-", "fail_message": "Injected failure of 001"}
    a = start_cluster(stack, "a", "dead-letter", faults=fault)
    b = start_cluster(stack, "b", "dead-letter", faults=fault)
    _directory("dead-letter", a, b, (10, 10))
    out = tmp_path / "out"
    try:
        _ready("a", "b")
        t0 = time.monotonic()
        finished(reconstruct(stack, brighton_images, out, "dead-letter"), tmp_path / "out.log")
        partial = _manifest(out)
        first_seconds = time.monotonic() - t0
        assert partial.routing is not None
        (dead,) = partial.routing.dead_letter
        assert dead.submodel_id == "submodel-001" and dead.tried == ["a", "b"]
        assert "Injected failure of 001" in dead.error
        assert set(partial.failed_submodels) == {"submodel-001"}
        assert "dead-letter queue" in partial.failed_submodels["submodel-001"]
        assert sorted(r.submodel_id for r in partial.submodels if r.status == "completed") == [
            "submodel-000", "submodel-002"
        ]  # fmt: skip
        assert all(Path(partial.products[p]).stat().st_size > 0 for p in PRODUCTS)
        with get_client(sync_client=True) as client:
            waiting = client.read_flow_run(dead.flow_run_id)
            queue = client.read_work_queue_by_name("dead-letter", work_pool_name=POOL)
        assert (waiting.state_type.value, waiting.work_queue_name) == ("SCHEDULED", "dead-letter")
        assert waiting.state_name == "DeadLetter"  # not marked Late, which drops the message
        assert "Injected failure of 001" in (waiting.state.message or "") and queue.is_paused
        restart_engine(a)  # the fault is cleared
        restart_engine(b)
        t1 = time.monotonic()
        res = subprocess.run(
            [sys.executable, "-m", "prefect_odm.cli", "requeue", "--directory", "dead-letter",
             "--deployment", DEPLOYMENT],
            env=stack.child_env("requeue"), capture_output=True, text=True, timeout=400,
        )  # fmt: skip
        requeue_seconds = time.monotonic() - t1
    finally:
        stop_cluster(a)
        stop_cluster(b)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "submodel-001: requeued as run" in res.stdout and "merging the survey" in res.stdout
    full = _manifest(out)
    assert not full.failed_submodels and full.merge_fingerprint != partial.merge_fingerprint
    assert {r.submodel_id: r.status for r in full.submodels} == {
        "submodel-000": "reused", "submodel-001": "reused", "submodel-002": "reused"
    }  # fmt: skip
    assert _digests(full) == _digests(_manifest(routed["out"]))  # the full merge, as in (a)
    with get_client(sync_client=True) as client:
        replayed = client.read_flow_run(dead.flow_run_id)
    assert replayed.state_type.value == "CANCELLED"
    assert (replayed.state.message or "").startswith("requeued: completed as run")
    print(f"\ndead-letter run: {first_seconds:.1f} s; requeue (replay + merge again): "
          f"{requeue_seconds:.1f} s")  # fmt: skip


def test_inline_from_the_command_line_routes_and_fails_over_without_workers(
    stack: Stack, routed: dict[str, Any], brighton_images: Path, tmp_path: Path
) -> None:
    """No worker and no queue: the command line runs every submodel on the routed cluster's
    nodes itself; each fails on A (its node fails every task) and is routed again to B."""
    a = start_cluster(stack, "a", "inline", faults={"fail_task_name": "."}, worker=False)
    b = start_cluster(stack, "b", "inline", worker=False)
    _directory("inline", a, b, (10, 10))
    out = tmp_path / "out"
    try:
        t0 = time.monotonic()
        finished(
            reconstruct(stack, brighton_images, out, "inline", deployment=False),
            tmp_path / "out.log",
        )
        seconds = time.monotonic() - t0
    finally:
        stop_cluster(a)
        stop_cluster(b)
    manifest = _manifest(out)
    assert manifest.routing is not None
    by_route = {(d.submodel_id, d.route): d for d in manifest.routing.decisions}
    for r in manifest.submodels:
        first, second = by_route[(r.submodel_id, 1)], by_route[(r.submodel_id, 2)]
        assert (first.cluster, first.outcome) == (
            "a",
            "failed",
        ) and "Injected failure" in first.error
        assert (second.cluster, second.excluded, second.outcome) == ("b", ["a"], "completed")
        assert r.status == "completed" and r.cluster == "b"
    assert _digests(manifest) == _digests(_manifest(routed["out"]))
    print(f"\ninline run with failover (no workers): {seconds:.1f} s")


def test_a_submodel_past_its_deadline_is_cancelled_on_its_node_and_says_timed_out(
    stack: Stack, brighton_images: Path, tmp_path: Path
) -> None:
    """One cluster whose node holds every task (a slow node); the deadline passes 3 s after
    the submodel got the node: its node task is cancelled and the run fails saying why."""
    a = start_cluster(stack, "a", "deadline", faults={"slow_seconds": 600}, worker=False)
    ClusterDirectoryBlock(
        clusters=[ClusterSpec(name="a", work_pool=POOL, nodes=[a.engine.url], memory_gib=10)]
    ).save("deadline", overwrite=True)
    out = tmp_path / "out"
    try:
        t0 = time.monotonic()
        proc = reconstruct(stack, brighton_images, out, "deadline", "--split", "18",
                           "--submodel-timeout", "3", deployment=False)  # fmt: skip
        proc.wait(timeout=300)
        seconds = time.monotonic() - t0
        tasks = engine_tasks(a.data_dir)
    finally:
        stop_cluster(a)
    log = (tmp_path / "out.log").read_text()
    assert proc.returncode == 1, log
    assert "submodel-000: timed out after 3 s on its node; its node task was cancelled" in log
    assert [t["status"] for t in tasks] == [CANCELED]  # the node task, cancelled on the node
    print(f"\ntimed-out run (3 s deadline on a node that holds its task): {seconds:.1f} s")


def test_setup_pauses_a_clusters_queue_while_its_pool_is_not_ready(stack: Stack) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate

    with get_client(sync_client=True) as client:
        client.create_work_pool(WorkPoolCreate(name="solo", type="process"), overwrite=True)
    ClusterDirectoryBlock(
        clusters=[ClusterSpec(name="solo", work_pool="solo", nodes=["http://127.0.0.1:9"])]
    ).save("solo", overwrite=True)
    res = subprocess.run(
        [sys.executable, "-m", "prefect_odm.cli", "setup", "--pool", "solo", "--directory", "solo"],
        env=stack.child_env("setup"), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    assert "automation 'prefect-odm: pause cluster solo while its pool is not ready'" in res.stdout

    def paused() -> bool:
        with get_client(sync_client=True) as client:
            return bool(client.read_work_queue_by_name("solo", work_pool_name="solo").is_paused)

    def pool_status() -> str:
        with get_client(sync_client=True) as client:
            return str(client.read_work_pool("solo").status.value)

    worker = _solo_worker(stack)
    try:
        wait_until("pool solo READY", lambda: pool_status() == "READY", 60)
        assert not paused()
        kill_tree(worker.pid)
        t0 = time.monotonic()
        wait_until("queue solo paused", paused, 90)
        pause_seconds = time.monotonic() - t0
        worker = _solo_worker(stack)
        t1 = time.monotonic()
        wait_until("queue solo resumed", lambda: not paused(), 90)
        resume_seconds = time.monotonic() - t1
    finally:
        kill_tree(worker.pid)
    print(f"\nworker killed -> queue paused: {pause_seconds:.1f} s (2 s heartbeats); "
          f"worker back -> resumed: {resume_seconds:.1f} s")  # fmt: skip


def _solo_worker(stack: Stack) -> subprocess.Popen[bytes]:
    return start_worker(stack, "solo", "solo", pool="solo")
