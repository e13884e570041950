"""The rerun story against a real ``prefect server start`` and a process worker.

A ``reconstruct`` deployment run on brighton (direct pipeline, 2+ submodels) runs each submodel as
a ``process-submodel`` deployment run on an engine node that fails submodel-001's task. The
failed child is retried as the UI's Retry button does, then the parent is retried: afterwards
every submodel has exactly one completed run, the parent completed, and no finished submodel was
processed twice.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from odm_prefect_helpers import (
    brighton_parameters,
    engine_tasks,
    run_deployment_and_wait,
    runs_of,
    wait_run,
)

from prefect_odm.engine.launch import start_engine
from prefect_odm.settings import FAULTS_ENV

pytestmark = [pytest.mark.integration, pytest.mark.slow]

FAILING = "submodel-001"


def _failing_engine(engine_dir: Path):
    """The built-in engine on ``engine_dir``, failing every task of :data:`FAILING`."""
    faults = json.dumps({"fail_task_name": f"^{FAILING}-"})
    return start_engine(
        engine_dir, method="direct", max_parallel_tasks=2, extra_env={FAULTS_ENV: faults}
    )


def test_failed_submodel_retried_from_ui_then_parent_reuses_everything(
    prefect_server, worker, brighton_images, tmp_path
):
    from prefect.client.orchestration import get_client
    from prefect_odm.tasks.deployment import retry_flow_run

    engine_dir = tmp_path / "engine"
    output = tmp_path / "out"
    engine = _failing_engine(engine_dir)
    try:
        t0 = time.monotonic()
        parent = run_deployment_and_wait(
            "reconstruct/reconstruct",
            brighton_parameters(brighton_images, output, nodes=[engine.url]),
        )
        first_round_seconds = time.monotonic() - t0
        assert parent.state.type.value == "FAILED", parent.state
        assert FAILING in (parent.state.message or "")

        children = runs_of("process-submodel", output)
        by_submodel = {c.parameters["submodel_id"]: c for c in children}
        assert len(by_submodel) == len(children) >= 2
        assert by_submodel[FAILING].state.type.value == "FAILED"
        finished = {sid: c for sid, c in by_submodel.items() if sid != FAILING}
        assert all(c.state.type.value == "COMPLETED" for c in finished.values())
        # every child is linked to the parent run (started from a task of the parent)
        with get_client(sync_client=True) as client:
            for child in children:
                assert child.parent_task_run_id is not None
                assert client.read_task_run(child.parent_task_run_id).flow_run_id == parent.id
        results = {sid: next((output).glob(f"*/submodels/{sid}-*/result.json")) for sid in finished}
        mtimes = {sid: p.stat().st_mtime_ns for sid, p in results.items()}

        # The operator mends the node: the same node (port, data folder) without the fault. It
        # still holds the failed task; the retried child restarts that task in place.
        engine.stop()
        engine = start_engine(engine_dir, port=engine.port, method="direct", max_parallel_tasks=2)
        failed_tasks = [t for t in engine_tasks(engine.url) if t["status"]["code"] == 30]
        assert [t["name"].startswith(FAILING) for t in failed_tasks] == [True]
        completed_before = {
            t["uuid"]: t["dateCreated"]
            for t in engine_tasks(engine.url)
            if t["status"]["code"] == 40
        }

        # Retry the failed child as the UI's Retry button does, then the parent.
        t1 = time.monotonic()
        retry_flow_run(by_submodel[FAILING].id)
        child = wait_run(by_submodel[FAILING].id)
        assert child.state.type.value == "COMPLETED", child.state
        retry_flow_run(parent.id)
        parent = wait_run(parent.id)
        rerun_seconds = time.monotonic() - t1
        assert parent.state.type.value == "COMPLETED", parent.state

        # Exactly one run per submodel, all completed; no new child was started.
        children = runs_of("process-submodel", output)
        counts: dict[str, int] = {}
        for c in children:
            counts[c.parameters["submodel_id"]] = counts.get(c.parameters["submodel_id"], 0) + 1
        assert counts == {sid: 1 for sid in by_submodel}
        assert all(c.state.type.value == "COMPLETED" for c in children)
        assert len(runs_of("reconstruct", output)) == 1

        # No finished submodel was processed twice: one engine task per submodel, all completed,
        # and the stored results of the first round were not rewritten.
        tasks = engine_tasks(engine.url)
        names = sorted(t["name"].rsplit("-", 1)[0] for t in tasks)
        assert names == sorted(by_submodel), names
        assert all(t["status"]["code"] == 40 for t in tasks)
        assert {t["uuid"]: t["dateCreated"] for t in tasks if t["uuid"] in completed_before} == (
            completed_before
        )
        assert {sid: p.stat().st_mtime_ns for sid, p in results.items()} == mtimes
        manifest = json.loads(next(output.glob("*/manifest.json")).read_text())
        assert sorted(r["submodel_id"] for r in manifest["submodels"]) == sorted(by_submodel)
        assert all(r["status"] in ("completed", "reused") for r in manifest["submodels"])
        assert Path(manifest["products"]["orthophoto"]).is_file()
        print(
            f"\nrerun story: first round {first_round_seconds:.1f} s, "
            f"child+parent retry {rerun_seconds:.1f} s"
        )
    finally:
        engine.stop()


def test_parent_retried_alone_retries_its_failed_child(
    prefect_server, worker, brighton_images, tmp_path
):
    """The operator retries only the parent: the idempotency key hands back the failed child,
    which the parent retries (no second run for any submodel)."""
    from prefect_odm.tasks.deployment import retry_flow_run

    engine_dir = tmp_path / "engine"
    output = tmp_path / "out"
    engine = _failing_engine(engine_dir)
    try:
        parent = run_deployment_and_wait(
            "reconstruct/reconstruct",
            brighton_parameters(brighton_images, output, nodes=[engine.url]),
        )
        assert parent.state.type.value == "FAILED"
        failed_child = next(
            c for c in runs_of("process-submodel", output) if c.parameters["submodel_id"] == FAILING
        )
        assert failed_child.state.type.value == "FAILED"
        engine.stop()
        engine = start_engine(engine_dir, port=engine.port, method="direct", max_parallel_tasks=2)

        retry_flow_run(parent.id)
        parent = wait_run(parent.id)
        assert parent.state.type.value == "COMPLETED", parent.state
        children = runs_of("process-submodel", output)
        ids = sorted(c.parameters["submodel_id"] for c in children)
        assert ids == sorted(set(ids))  # one run per submodel
        assert all(c.state.type.value == "COMPLETED" for c in children)
        assert failed_child.id in {c.id for c in children}  # the same run, retried
        assert next(output.glob("*/manifest.json")).is_file()
    finally:
        engine.stop()
