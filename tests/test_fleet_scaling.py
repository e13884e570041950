"""A survey completes while the fleet scales under it (issue 34, acceptance): brighton (direct
pipeline at 20 cm, split 5: four submodels) runs as deployment runs on a process worker of a real
``prefect server``; ``prefect-odm capacity serve`` reports the fleet cluster's wanted memory; the
KEDA/HPA/Deployment stand-in (tests/keda_standin.py, reading the rendered ScaledObject and
pre-stop hook) starts and stops built-in engines listed in the node file every run reads at
each placement. Midway an operator lowers ``maxReplicaCount`` and the stand-in removes the
busiest engine (the worst case for its pre-stop wait); at the end the fleet shrinks to its
minimum. Every task is counted on the engine that ran it: none lost, none done twice."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from keda_standin import FleetStandIn, Pod, ScaledObjectSpec, engine_tasks
from odm_server import free_port, stop_group

from prefect_odm.k8s.render import RenderSettings, render
from prefect_odm.models import ProcessingOptions

pytestmark = pytest.mark.integration

POOL = "fleet-pool"
CLUSTER = "fleet"
COMPLETED = 40
FAST = ProcessingOptions(pipeline="direct", orthophoto_resolution_cm=20)
"""The direct pipeline at 20 cm: a third of the time of 5 cm per submodel, same protocol."""


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


def fleet_manifests(out: Path, capacity_url: str) -> dict[str, dict[str, Any]]:
    """The fleet Deployment and ScaledObject rendered at test scale: 1 GiB per pod, 1 to 3
    pods, an 8 s scale-down window, one pod per 4 s, a 3 s pre-stop quiet time."""
    settings = RenderSettings(
        capacity_url=capacity_url,
        fleet_cluster=CLUSTER,
        gib_per_pod=1,
        min_replicas=1,
        max_replicas=3,
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
    """Remove the pod with the most queued and running tasks first."""
    return sorted(pods, key=lambda p: -queue_count(p))


def lower_max_when_all_placed(fleet: FleetStandIn, submodels: int, stop: threading.Event) -> None:
    """The operator: once every submodel's task is on some engine and one still works, lower
    ``maxReplicaCount`` from 3 to 2."""
    while not stop.wait(0.5):
        ready = [p for p in fleet.active() if p.ready_at is not None]
        if len(ready) < 3:
            continue
        placed = sum(len(engine_tasks(p.url)) for p in ready)
        if placed >= submodels and any(queue_count(p) > 0 for p in ready):
            fleet.events.append((time.monotonic(), "max", 2))
            fleet.set_max_replicas(2)
            return


def test_a_survey_completes_while_the_fleet_scales(
    prefect_server, brighton_images, tmp_path, odm_home
):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect_odm.blocks import ClusterDirectoryBlock
    from prefect_odm.flows import reconstruct

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
    worker = prefect_server.start_worker(tmp_path / "worker.log", pool=POOL)
    capacity, capacity_url = serve_capacity(prefect_server.env, "fleet-test", tmp_path / "cap.log")
    docs = fleet_manifests(tmp_path / "k8s", capacity_url)
    container = docs["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    nodes_file = tmp_path / "nodes.txt"
    fleet = FleetStandIn(
        ScaledObjectSpec.from_manifest(docs["ScaledObject"]),
        container["lifecycle"]["preStop"]["exec"]["command"],
        nodes_file,
        tmp_path / "pods",
        sync_seconds=1.0,
        rank=busiest_first,
        engine_options={"method": "direct", "max_parallel_tasks": 1},
    )
    stop = threading.Event()
    t0 = time.monotonic()
    try:
        fleet.start()
        operator = threading.Thread(target=lower_max_when_all_placed, args=(fleet, 4, stop))
        operator.start()
        manifest = reconstruct(
            images=str(brighton_images),
            output=str(tmp_path / "out"),
            split=5,
            split_overlap_m=15,
            options=FAST,
            nodes=[f"file://{nodes_file}"],
            submodel_deployment="process_submodel/fleet",
        )
        run_seconds = time.monotonic() - t0
        deadline = time.monotonic() + 120
        while len(fleet.active()) > 1 or any(
            p.stopped_at is None for p in fleet.pods if p.deleted_at
        ):
            assert time.monotonic() < deadline, "the fleet did not shrink back to its minimum"
            time.sleep(0.5)
    finally:
        stop.set()
        fleet.close()
        stop_group(capacity)
        stop_group(worker)
        prefect_server.workers.remove(worker)
    report(fleet, manifest, t0, run_seconds)
    results = manifest.submodels
    assert len(results) == 4
    assert all(r.status == "completed" and r.attempts == 1 for r in results), [
        (r.submodel_id, r.status, r.attempts, r.error) for r in results
    ]
    by_url = {p.url: p for p in fleet.pods}
    tasks = [(p.name, u, t) for p in fleet.pods for u, t in p.tasks.items()]
    assert len(tasks) == len(results)  # no task lost and done again, none twice
    assert all(t["status"]["code"] == COMPLETED for _, _, t in tasks)
    for r in results:  # each submodel's products came from the task its engine completed
        assert r.node_url in by_url and r.task_uuid in by_url[r.node_url].tasks
    scales = [detail for _, what, detail in fleet.events if what == "scale"]
    assert scales[0][1] > scales[0][0] and max(to for _, to in scales) == 3  # up on wanted memory
    assert (3, 2) in scales and scales[-1][1] == 1  # the lowered maximum, then the minimum
    deleted = [p for p in fleet.pods if p.deleted_at is not None]
    assert len(deleted) == 2 and all(p.hook_exit == 0 for p in deleted)
    forced = min(deleted, key=lambda p: p.deleted_at or 0.0)
    assert forced.queue_when_deleted and forced.queue_when_deleted >= 1  # it had work: waited
    assert forced.tasks and all(t["status"]["code"] == COMPLETED for t in forced.tasks.values())


def report(fleet: FleetStandIn, manifest: Any, t0: float, run_seconds: float) -> None:
    """Print the figures: scaling reaction times and tasks per engine."""

    def at(what: str, pick: Any = None) -> list[float]:
        return [t - t0 for t, w, d in fleet.events if w == what and (pick is None or pick(d))]

    wanted = at("metric", lambda m: m is not None and m > 1.0)
    up = at("scale", lambda d: d[1] > d[0])
    ready = at("ready")
    print(f"\nrun {run_seconds:.1f} s; wanted memory first above one pod at {wanted[0]:.1f} s, "
          f"scale-up decided at {up[0]:.1f} s, pods ready at "
          f"{', '.join(f'{t:.1f}' for t in ready)} s")  # fmt: skip
    for pod in fleet.pods:
        drain = (
            f"deleted at {pod.deleted_at - t0:.1f} s with {pod.queue_when_deleted} task(s), "
            f"stopped {pod.stopped_at - pod.deleted_at:.1f} s later"
            if pod.deleted_at is not None and pod.stopped_at is not None
            else "kept"
        )
        print(f"{pod.name}: {len(pod.tasks)} task(s); {drain}")
