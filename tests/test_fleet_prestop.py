"""The fleet's scaling rules, as the rendered manifests set them (issue 34): the stand-in's KEDA
and HPA arithmetic (tests/keda_standin.py) from a rendered ScaledObject with a clock given, and
the rendered pre-stop hook itself, run with ``node`` against real nodes on 127.0.0.1 (the
built-in engine and OpenDroneMap's NodeODM 2.2.4 in test mode)."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import yaml
from keda_standin import Autoscaler, ScaledObjectSpec
from node_helpers import create, wait_for

from prefect_odm.engine.launch import free_port
from prefect_odm.k8s.render import RenderSettings, render
from prefect_odm.nodes.client import COMPLETED, QUEUED, RUNNING

pytest_plugins = ("node_backends",)


def rendered(tmp_path: Path, **settings: object) -> dict[str, dict]:
    """The rendered fleet Deployment and ScaledObject (kind -> document)."""
    render(tmp_path, RenderSettings(**settings))  # type: ignore[arg-type]
    docs = [
        d
        for name in ("nodeodm-fleet.yaml", "scaledobject.yaml")
        for d in yaml.safe_load_all((tmp_path / "base" / name).read_text())
        if d
    ]
    return {d["kind"]: d for d in docs}


def test_the_stand_in_reads_the_rendered_scaled_object(tmp_path):
    spec = ScaledObjectSpec.from_manifest(rendered(tmp_path, gib_per_pod=16)["ScaledObject"])
    assert (spec.target_value, spec.min_replicas, spec.max_replicas) == (16.0, 1, 10)
    assert spec.value_location == "wanted_memory_gib" and spec.url.endswith("/clusters/k8s-fleet")
    assert spec.scale_down.window_seconds == 1800
    assert [(p.kind, p.value, p.period_seconds) for p in spec.scale_down.policies] == [
        ("Pods", 1, 600.0)
    ]
    assert spec.scale_up.window_seconds == 0
    assert [(p.kind, p.value, p.period_seconds) for p in spec.scale_up.policies] == [
        ("Pods", 4, 60.0)
    ]


def test_replicas_are_wanted_memory_over_memory_per_pod_within_min_and_max(tmp_path):
    spec = ScaledObjectSpec.from_manifest(rendered(tmp_path, gib_per_pod=16)["ScaledObject"])
    hpa = Autoscaler(spec)
    assert hpa.desired(40.0, 1, now=0.0) == 3  # ceil(40 / 16)
    assert hpa.desired(None, 3, now=15.0) == 3  # the metric failed: no change
    assert hpa.desired(16 * 3 * 1.05, 3, now=30.0) == 3  # within the 10 % tolerance
    # 13 wanted: at most 4 pods added per 60 s, counted from the start of the period
    assert hpa.desired(200.0, 3, now=45.0) == 5  # 2 were added at t=0: 3 - 2 + 4
    assert hpa.desired(200.0, 5, now=120.0) == 9
    assert hpa.desired(200.0, 9, now=185.0) == 10  # maxReplicaCount
    assert hpa.desired(0.0, 10, now=200.0) == 10  # held by the 1800 s stabilization window
    assert hpa.desired(0.0, 10, now=185.0 + 1801) == 9  # then one pod per 600 s
    assert hpa.desired(0.0, 9, now=185.0 + 1900) == 9
    assert hpa.desired(0.0, 9, now=185.0 + 1801 + 601) == 8
    hpa.spec = ScaledObjectSpec.from_manifest(
        rendered(tmp_path / "b", gib_per_pod=16, max_replicas=4)["ScaledObject"]
    )
    assert hpa.desired(0.0, 8, now=2600.0) == 4  # above a lowered maximum: at once


def test_keda_scales_from_and_to_zero_only_with_min_zero(tmp_path):
    doc = rendered(tmp_path, gib_per_pod=8, min_replicas=0)["ScaledObject"]
    hpa = Autoscaler(ScaledObjectSpec.from_manifest(doc))
    assert hpa.desired(0.0, 0, now=0.0) == 0
    assert hpa.desired(20.0, 0, now=10.0) == 1  # activation: 0 -> 1, then the HPA
    assert hpa.desired(20.0, 1, now=20.0) == 3
    assert hpa.desired(0.0, 3, now=30.0) == 3  # inactive, but within cooldownPeriod (1800 s)
    assert hpa.desired(0.0, 3, now=20.0 + 1800) == 0


def _hook(tmp_path: Path, quiet_seconds: int) -> list[str]:
    fleet = rendered(tmp_path, drain_quiet_seconds=quiet_seconds, drain_poll_seconds=1)
    container = fleet["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    command = container["lifecycle"]["preStop"]["exec"]["command"]
    node = shutil.which(command[0])
    assert node is not None, "the pre-stop hook needs node (Debian's nodejs)"
    assert command[1] == "-e" and "taskQueueCount" in command[2]
    return [node, *command[1:]]


def _start_hook(command: list[str], url: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(command, env={**os.environ, "PREFECT_ODM_DRAIN_URL": url})


def test_the_pre_stop_hook_waits_for_the_nodes_tasks_and_a_quiet_time(tmp_path, start_node):
    """The hook starts on an idle node and a task arrives within its quiet time (a run that
    placed it just before the node left the Service): the hook stays while that task runs and
    while another waits for the one slot, and ends once /info has said taskQueueCount 0 for
    the quiet time."""
    node = start_node(parallel=1, task_seconds=3)
    client = node.client()
    hook = _start_hook(_hook(tmp_path, quiet_seconds=5), node.url)
    first = create(client)
    assert hook.poll() is None, "the hook ended before the first task arrived"
    wait_for(client, first, {RUNNING})
    queued = create(client)  # one slot: this one waits
    assert wait_for(client, queued, {QUEUED, RUNNING}).status in (QUEUED, RUNNING)
    wait_for(client, first, {COMPLETED}, 60)
    assert hook.poll() is None
    wait_for(client, queued, {COMPLETED}, 60)
    done_at = time.monotonic()
    assert hook.poll() is None
    assert hook.wait(timeout=60) == 0
    waited = time.monotonic() - done_at
    print(f"{node.backend}: the hook ended {waited:.1f} s after the last task (quiet 5 s)")
    assert waited >= 5 - 1 - 0.5  # the quiet time, less one poll and our own poll's lag


def test_the_pre_stop_hook_ends_at_once_when_the_node_is_gone(tmp_path):
    hook = _start_hook(_hook(tmp_path, quiet_seconds=300), f"http://127.0.0.1:{free_port()}")
    assert hook.wait(timeout=30) == 0
