"""A survey completes while the fleet scales under it (issue 34, acceptance).

brighton (direct pipeline at 20 cm, split 5: four submodels) runs as deployment runs on a
process worker of a real ``prefect server``; ``prefect-odm capacity serve`` reports the fleet
cluster's wanted memory; the KEDA/HPA/Deployment stand-in (tests/keda_standin.py, reading the
rendered ScaledObject and pre-stop hook) starts and stops built-in engines listed in the node
file that every run reads at each placement (tests/fleet_run.py). Midway an operator lowers
``maxReplicaCount`` from 3 to 2 and the stand-in removes the busiest engine (the worst case for
its pre-stop wait); at the end the fleet shrinks to its minimum. Every task is counted on the
engine that ran it: none lost, none done twice.
"""

from __future__ import annotations

import pytest
from fleet_run import (
    POOL,
    SUBMODELS,
    busiest_first,
    figures,
    lower_max_when_all_placed,
    prepare_deployment,
    run_on_fleet,
)
from odm_server import stop_group

pytestmark = pytest.mark.integration

COMPLETED = 40


def test_a_survey_completes_while_the_fleet_scales(
    prefect_server, brighton_images, tmp_path, odm_home
):
    prepare_deployment()
    worker = prefect_server.start_worker(tmp_path / "worker.log", pool=POOL)
    try:
        run = run_on_fleet(
            brighton_images,
            tmp_path,
            prefect_server.env,
            operator=lower_max_when_all_placed,
            rank=busiest_first,
        )
    finally:
        stop_group(worker)
        prefect_server.workers.remove(worker)
    print(f"\n{figures(run)}")
    results, fleet = run.manifest.submodels, run.fleet
    assert len(results) == SUBMODELS
    assert all(r.status == "completed" and r.attempts == 1 for r in results), [
        (r.submodel_id, r.status, r.attempts, r.error) for r in results
    ]
    by_url = {p.url: p for p in fleet.pods}
    tasks = [t for p in fleet.pods for t in p.tasks.values()]
    assert len(tasks) == len(results)  # none lost and done again, none twice
    assert all(t["status"]["code"] == COMPLETED for t in tasks)
    for r in results:  # each submodel's products came from the task its engine completed
        assert r.node_url in by_url and r.task_uuid in by_url[r.node_url].tasks
    scales = [detail for _, what, detail in fleet.events if what == "scale"]
    assert scales[0][1] > scales[0][0] and max(to for _, to in scales) == 3  # on wanted memory
    assert (3, 2) in scales and scales[-1][1] == 1  # the lowered maximum, then the minimum
    deleted = [p for p in fleet.pods if p.deleted_at is not None]
    assert len(deleted) == 2 and all(p.hook_exit == 0 for p in deleted)
    forced = min(deleted, key=lambda p: p.deleted_at or 0.0)
    assert forced.queue_when_deleted and forced.queue_when_deleted >= 1  # it had work: waited
    assert forced.tasks and all(t["status"]["code"] == COMPLETED for t in forced.tasks.values())
