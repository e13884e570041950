"""Helpers shared by the tests in tests/prefect (a unique module name: tests/prefect has no
``__init__.py``, so that ``import prefect`` still finds Prefect)."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path


def engine_tasks(url: str) -> list[dict]:
    """``/task/list`` of an engine, with each task's info."""
    with urllib.request.urlopen(f"{url}/task/list", timeout=10) as res:
        uuids = [t["uuid"] for t in json.loads(res.read())]
    infos = []
    for uuid in uuids:
        with urllib.request.urlopen(f"{url}/task/{uuid}/info", timeout=10) as res:
            infos.append(json.loads(res.read()))
    return infos


def runs_of(deployment_name: str, output: Path) -> list:
    """Runs of the deployment that wrote to ``output`` (other tests share the server)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterName

    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(
            deployment_filter=DeploymentFilter(name=DeploymentFilterName(any_=[deployment_name])),
            limit=200,
        )
    return [r for r in runs if r.parameters.get("output") == str(output)]


def wait_run(run_id, timeout_seconds: float = 240):
    """The flow run once it is final (polls every second)."""
    from prefect_odm.tasks.deployment import wait_for_runs

    return wait_for_runs(
        {"run": str(run_id)}, poll_interval_seconds=1, timeout_seconds=timeout_seconds
    )["run"]


def run_deployment_and_wait(name: str, parameters: dict, timeout_seconds: float = 240):
    """Start a run of deployment ``name`` (not as a subflow) and return it once final."""
    from prefect.deployments import run_deployment

    run = run_deployment(name, parameters=parameters, timeout=0, as_subflow=False)
    return wait_run(run.id, timeout_seconds=timeout_seconds)


def brighton_parameters(images: Path, output: Path, **extra) -> dict:
    """``reconstruct`` parameters for brighton in 2+ submodels, direct pipeline."""
    return {
        "images": str(images),
        "output": str(output),
        "split": 10,
        "split_overlap_m": 20,
        "options": {"pipeline": "direct"},
        **extra,
    }
