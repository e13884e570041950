"""A survey run as deployment runs on a fleet that the KEDA/HPA stand-in scales (issue 34):
shared by tests/test_fleet_scaling.py and benchmarks/bench_fleet_scaling.py.

The parts, all on 127.0.0.1: a ``prefect server`` (the caller's) with a process work pool
``fleet-pool`` whose queue ``fleet`` is the fleet cluster's; a ``process_submodel`` deployment on
it and a process worker; ``prefect-odm capacity serve`` over a cluster directory naming that
queue; the fleet manifests rendered by ``prefect_odm.k8s.render`` at test scale; the stand-in
(tests/keda_standin.py) reading the rendered ScaledObject and running the rendered pre-stop
hook; and the parent ``reconstruct`` run in this process, its nodes the stand-in's node file.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml
from keda_standin import FleetStandIn, Pod, ScaledObjectSpec, engine_tasks, newest_ready_first
from odm_server import free_port, stop_group

from prefect_odm.k8s.render import RenderSettings, render
from prefect_odm.models import Manifest, ProcessingOptions

POOL = "fleet-pool"
CLUSTER = "fleet"
DEPLOYMENT = "process_submodel/fleet"
FAST = ProcessingOptions(pipeline="direct", orthophoto_resolution_cm=20)
"""The direct pipeline at 20 cm: a third of the time of 5 cm per submodel, same protocol."""
SUBMODELS = 4
"""brighton at ``--split 5 --split-overlap-m 15``."""


def serve_capacity(env: dict[str, str], directory: str, log: Path) -> tuple[subprocess.Popen, str]:
    """``prefect-odm capacity serve`` on a free port, refreshing every second."""
    port = free_port()
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "prefect_odm.cli", "capacity", "serve", "--directory",
             directory, "--port", str(port), "--refresh-seconds", "1"],
            env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()
        try:
            if httpx.get(f"{url}/clusters/{CLUSTER}", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    stop_group(proc)
    raise AssertionError(f"capacity serve did not answer: {log.read_text()}")


def fleet_manifests(out: Path, capacity_url: str, replicas: tuple[int, int]) -> dict[str, Any]:
    """The fleet Deployment and ScaledObject rendered at test scale (kind -> document): 1 GiB
    per pod, ``replicas`` = (min, max), an 8 s scale-down window, one pod per 4 s, a 3 s
    pre-stop quiet time."""
    settings = RenderSettings(
        capacity_url=capacity_url,
        fleet_cluster=CLUSTER,
        gib_per_pod=1,
        min_replicas=replicas[0],
        max_replicas=replicas[1],
        scale_down_window_seconds=8,
        scale_down_period_seconds=4,
        drain_quiet_seconds=3,
        drain_poll_seconds=1,
    )
    render(out, settings)
    docs = [
        d
        for name in ("nodeodm-fleet.yaml", "scaledobject.yaml")
        for d in yaml.safe_load_all((out / "base" / name).read_text())
        if d
    ]
    return {d["kind"]: d for d in docs}


def queue_count(pod: Pod) -> int:
    return int(httpx.get(f"{pod.url}/info", timeout=5).json()["taskQueueCount"])


def busiest_first(pods: list[Pod]) -> list[Pod]:
    """Remove the pod with the most queued and running tasks first (the worst case for its
    pre-stop wait; the ReplicaSet itself does not look at tasks)."""
    return sorted(pods, key=lambda p: -queue_count(p))


def lower_max_when_all_placed(fleet: FleetStandIn, stop: threading.Event) -> None:
    """The operator: once every submodel's task is on some engine of three and one still works,
    lower ``maxReplicaCount`` to 2 (``kubectl edit scaledobject``)."""
    while not stop.wait(0.5):
        ready = [p for p in fleet.active() if p.ready_at is not None]
        if len(ready) < 3:
            continue
        placed = sum(len(engine_tasks(p.url)) for p in ready)
        if placed >= SUBMODELS and any(queue_count(p) > 0 for p in ready):
            fleet.events.append((time.monotonic(), "max", 2))
            fleet.set_max_replicas(2)
            return


def prepare_deployment() -> None:
    """The work pool, the ``process_submodel`` deployment on the fleet's queue, and the cluster
    directory block ``fleet-test`` naming that queue (in the current Prefect API)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect_odm.blocks import ClusterDirectoryBlock

    from prefect_odm.clusters.directory import ClusterSpec

    with get_client(sync_client=True) as client:
        client.create_work_pool(WorkPoolCreate(name=POOL, type="process"), overwrite=True)
        client.create_deployment(
            client.create_flow_from_name("process_submodel"),
            "fleet",
            work_pool_name=POOL,
            work_queue_name=CLUSTER,
            entrypoint="prefect_odm.flows.process_submodel:process_submodel",
            enforce_parameter_schema=False,
        )
    ClusterDirectoryBlock(clusters=[ClusterSpec(name=CLUSTER, work_pool=POOL)]).save(
        "fleet-test", overwrite=True
    )


@dataclass
class FleetRun:
    """A finished run on the fleet: its manifest, the stand-in with its pods and events, and
    the clock's zero (monotonic and wall seconds at the start)."""

    manifest: Manifest
    fleet: FleetStandIn
    t0: float
    t0_wall: float
    run_seconds: float


def run_on_fleet(
    images: Path,
    work: Path,
    env: dict[str, str],
    replicas: tuple[int, int] = (1, 3),
    operator: Callable[[FleetStandIn, threading.Event], None] | None = None,
    rank: Callable[[list[Pod]], list[Pod]] = newest_ready_first,
) -> FleetRun:
    """Run brighton on a stand-in fleet of ``replicas`` = (min, max) engines, with ``operator``
    acting on the fleet meanwhile and pods removed in ``rank``'s order (the ReplicaSet's by
    default); wait until the fleet is back at its minimum.

    ``env`` is the environment of ``capacity serve`` (its ``PREFECT_API_URL``); a process worker
    on :data:`POOL` must be running and :func:`prepare_deployment` done.
    """
    from prefect_odm.flows import reconstruct

    capacity, capacity_url = serve_capacity(env, "fleet-test", work / "capacity.log")
    docs = fleet_manifests(work / "k8s", capacity_url, replicas)
    container = docs["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    nodes_file = work / "nodes.txt"
    fleet = FleetStandIn(
        ScaledObjectSpec.from_manifest(docs["ScaledObject"]),
        container["lifecycle"]["preStop"]["exec"]["command"],
        nodes_file,
        work / "pods",
        rank=rank,
        engine_options={"method": "direct", "max_parallel_tasks": 1},
    )
    stop = threading.Event()
    t0, t0_wall = time.monotonic(), time.time()
    try:
        fleet.start()
        if operator is not None:
            threading.Thread(target=operator, args=(fleet, stop), daemon=True).start()
        manifest = reconstruct(
            images=str(images),
            output=str(work / "out"),
            split=5,
            split_overlap_m=15,
            options=FAST,
            nodes=[f"file://{nodes_file}"],
            submodel_deployment=DEPLOYMENT,
        )
        run_seconds = time.monotonic() - t0
        deadline = time.monotonic() + 120
        while len(fleet.active()) > replicas[0] or any(
            p.stopped_at is None for p in fleet.pods if p.deleted_at is not None
        ):
            assert time.monotonic() < deadline, "the fleet did not shrink back to its minimum"
            time.sleep(0.5)
    finally:
        stop.set()
        fleet.close()
        stop_group(capacity)
    return FleetRun(manifest, fleet, t0, t0_wall, run_seconds)


def figures(run: FleetRun) -> dict[str, Any]:
    """Scaling reaction times (s from the run's start), engine-seconds held, tasks per engine."""
    fleet, t0 = run.fleet, run.t0
    target = fleet.spec.target_value

    def first(what: str, pick: Callable[[Any], bool]) -> float | None:
        times = [t - t0 for t, w, d in fleet.events if w == what and pick(d)]
        return min(times) if times else None

    needed = first("metric", lambda m: m is not None and m > target * fleet.spec.min_replicas)
    up = first("scale", lambda d: d[1] > d[0])
    new_pods = fleet.pods[max(1, fleet.spec.min_replicas) :]  # the ones scaling added
    ready = sorted((p.ready_at or 0.0) - t0 for p in new_pods)
    first_task = [
        min(t["dateCreated"] for t in p.tasks.values()) / 1000 - run.t0_wall
        for p in new_pods
        if p.tasks
    ]
    run_end = t0 + run.run_seconds

    def held(p: Pod) -> float:  # until it stopped if it was removed, else until the run ended
        until = (p.stopped_at or run_end) if p.deleted_at is not None else run_end
        return max(0.0, until - (p.ready_at or until))

    drains = [
        {
            "pod": p.name,
            "tasks_when_deleted": p.queue_when_deleted,
            "deleted_s": round((p.deleted_at or 0.0) - t0, 1),
            "stopped_after_s": round((p.stopped_at or 0.0) - (p.deleted_at or 0.0), 1),
        }
        for p in fleet.pods
        if p.deleted_at is not None
    ]
    return {
        "run_s": round(run.run_seconds, 1),
        "wanted_above_min_s": None if needed is None else round(needed, 1),
        "scale_up_decided_s": None if up is None else round(up, 1),
        "new_pods_ready_s": [round(t, 1) for t in ready],
        "first_task_on_new_pod_s": round(min(first_task), 1) if first_task else None,
        "drains": drains,
        "engine_seconds": round(sum(held(p) for p in fleet.pods), 1),
        "tasks_per_engine": {p.name: len(p.tasks) for p in fleet.pods},
    }
