"""``prefect deploy --all`` from a clean copy of the repository, then a ``reconstruct`` deployment
run on brighton (direct pipeline, built-in engine started by each submodel run) on a worker."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from odm_prefect_helpers import brighton_parameters, run_deployment_and_wait, runs_of

pytestmark = pytest.mark.integration

EXPECTED = {
    "reconstruct": "prefect_odm.flows.reconstruct:reconstruct",
    "process-submodel": "prefect_odm.flows.process_submodel:process_submodel",
    "process-inbox": "prefect_odm.flows.process_inbox:process_inbox",
}


def test_deploy_all_from_a_clean_copy_creates_every_deployment(prefect_server, deployed: Path):
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        deployments = {d.name: d for d in client.read_deployments()}
        queues = {q.name: q.priority for q in client.read_work_queues(work_pool_name="odm")}
    expected = dict(EXPECTED)
    if (deployed / "flows" / "merge_existing.py").exists():
        expected["merge-existing"] = "prefect_odm.flows.merge_existing:merge_existing"
    assert {name: d.entrypoint for name, d in deployments.items()} == expected
    for d in deployments.values():
        assert d.work_pool_name == "odm"
        # module entrypoints: workers import the installed package (from the folder `prefect
        # deploy` ran in)
        assert d.pull_steps == [
            {"prefect.deployments.steps.set_working_directory": {"directory": str(deployed)}}
        ]
    assert (
        deployments["reconstruct"].parameters["submodel_deployment"]
        == "process_submodel/process-submodel"
    )
    inbox_schedules = deployments["process-inbox"].schedules
    assert [s.schedule.cron for s in inbox_schedules] == ["*/30 * * * *"]
    # parameters are documented in the UI: the reconstruct schema has descriptions
    props = deployments["reconstruct"].parameter_openapi_schema["properties"]
    assert "description" in props["priority"] and "description" in props["images"]
    assert queues["urgent"] < queues["default"]  # lower number = taken first


@pytest.mark.slow
def test_reconstruct_deployment_run_on_brighton_completes_on_a_worker(
    prefect_server, worker, brighton_images, tmp_path
):
    output = tmp_path / "out"
    run = run_deployment_and_wait(
        "reconstruct/reconstruct",
        brighton_parameters(brighton_images, output),
        timeout_seconds=300,
    )
    assert run.state.type.value == "COMPLETED", run.state.message
    children = runs_of("process-submodel", output)
    assert len(children) >= 2
    assert all(c.state.type.value == "COMPLETED" for c in children)
    # children are named after the survey and the submodel: brighton_beach_1600-<fp8>-submodel-00N
    assert all(
        re.fullmatch(rf"brighton_beach_1600-[0-9a-f]{{8}}-{c.parameters['submodel_id']}", c.name)
        for c in children
    ), [c.name for c in children]
    assert re.fullmatch(r"brighton_beach_1600-[0-9a-f]{8}", run.name), run.name
    manifest = json.loads(next(output.glob("*/manifest.json")).read_text())
    assert all(r["status"] == "completed" for r in manifest["submodels"])
    for product in ("orthophoto", "dsm", "point_cloud"):
        assert Path(manifest["products"][product]).stat().st_size > 0
