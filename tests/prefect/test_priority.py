"""Urgent runs: submitted while a normal survey's submodel runs are queued, their submodel runs
are taken first; priority is in no fingerprint.

Submodel runs go to a separate pool (``odm-prio``, concurrency limit 1, queues ``urgent`` priority
1 and ``default`` priority 10) whose worker starts only once both surveys' submodels are queued.
"""

from __future__ import annotations

import json
import time

import pytest
from odm_prefect_helpers import runs_of, wait_run

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PRIO_POOL = "odm-prio"


def _wait_for_children(output, count_at_least: int, timeout_seconds: float = 180) -> list:
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        runs = runs_of("prio", output)
        if len(runs) >= count_at_least:
            return runs
        time.sleep(1)
    parents = runs_of("reconstruct", output)
    raise AssertionError(
        f"submodel runs for {output} were not created in {timeout_seconds} s; parent runs: "
        + "; ".join(f"{r.state.name} {r.parameters}" for r in parents)
    )


def test_urgent_submodels_are_taken_before_a_normal_backlog(
    prefect_server, worker, deployed, brighton_images, tmp_path
):
    from prefect.deployments import run_deployment

    from prefect_odm.cli.ops import create_work_queues

    prefect_server.cli("work-pool", "create", PRIO_POOL, "--type", "process")
    prefect_server.cli("work-pool", "set-concurrency-limit", PRIO_POOL, "1")
    create_work_queues(PRIO_POOL)
    prefect_server.cli(
        "--no-prompt",
        "deploy",
        "flows/process_submodel.py:process_submodel",
        "-n",
        "prio",
        "-p",
        PRIO_POOL,
        cwd=deployed,
    )

    def submit(images, output, priority, split):
        return run_deployment(
            "reconstruct/reconstruct",
            parameters={
                "images": str(images),
                "output": str(output),
                "split": split,
                "split_overlap_m": 10,
                "options": {"pipeline": "direct"},
                "submodel_deployment": "process_submodel/prio",
                "priority": priority,
            },
            timeout=0,
            as_subflow=False,
        )

    normal_out, urgent_out = tmp_path / "normal", tmp_path / "urgent"
    normal = submit(brighton_images, normal_out, "normal", 9)
    _wait_for_children(normal_out, 2)
    # the same survey resubmitted as urgent (to another output root, so nothing is reused)
    urgent = submit(brighton_images, urgent_out, "urgent", 9)
    _wait_for_children(urgent_out, 2)
    time.sleep(2)
    normal_children, urgent_children = runs_of("prio", normal_out), runs_of("prio", urgent_out)
    assert {c.work_queue_name for c in normal_children} == {"default"}
    assert {c.work_queue_name for c in urgent_children} == {"urgent"}
    assert all(c.state.type.value == "SCHEDULED" for c in normal_children + urgent_children)

    prefect_server.start_worker(prefect_server.home / "worker-prio.log", pool=PRIO_POOL)
    assert wait_run(urgent.id, timeout_seconds=300).state.type.value == "COMPLETED"
    assert wait_run(normal.id, timeout_seconds=300).state.type.value == "COMPLETED"

    starts_urgent = [c.start_time for c in runs_of("prio", urgent_out)]
    starts_normal = [c.start_time for c in runs_of("prio", normal_out)]
    # the pool runs one submodel at a time: every urgent one ran before every normal one
    assert max(starts_urgent) < min(starts_normal), (starts_urgent, starts_normal)

    # priority is in no fingerprint: the urgent run planned exactly what the normal run planned
    normal_plan = json.loads(next(normal_out.glob("*/plan/plan.json")).read_text())
    urgent_plan = json.loads(next(urgent_out.glob("*/plan/plan.json")).read_text())
    assert urgent_plan["fingerprint"] == normal_plan["fingerprint"]
    assert [s["fingerprint"] for s in urgent_plan["submodels"]] == [
        s["fingerprint"] for s in normal_plan["submodels"]
    ]
    normal_manifest = json.loads(next(normal_out.glob("*/manifest.json")).read_text())
    urgent_manifest = json.loads(next(urgent_out.glob("*/manifest.json")).read_text())
    assert urgent_manifest["merge_fingerprint"] == normal_manifest["merge_fingerprint"]
