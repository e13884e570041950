"""``prefect-odm requeue``: replay the submodels waiting in the dead-letter queue, then merge
their surveys again.

Each dead-letter run (``Scheduled`` in the paused dead-letter queue, tagged ``dead-letter`` and
``prefect-odm-parent:<reconstruct run id>``, its last error as its state message) is routed
again among every cluster of the directory (the fault is taken to be fixed) and run as a new
``process_submodel`` run on the chosen queue. Once it completed, the dead-letter run is marked
``Cancelled`` ("requeued: completed as run ..."); one that fails again stays, with its new
error. When every dead-letter run of a ``reconstruct`` run completed, that run's merge runs
again: a deployment run is retried (as the UI's Retry button), any other is run again here with
its stored parameters; both reuse every stored submodel and merge them all.
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast
from uuid import UUID

from prefect_odm.clusters.directory import ClusterDirectory

if TYPE_CHECKING:
    from prefect.client.schemas.objects import FlowRun


@dataclass(frozen=True)
class DeadRun:
    """A run of the dead-letter queue: its id, submodel, parameters, error and parent run."""

    flow_run_id: str
    submodel_id: str
    parameters: dict[str, Any]
    error: str
    parent_id: str | None


def dead_runs(directory: ClusterDirectory) -> list[DeadRun]:
    """The runs waiting in the directory's dead-letter queue(s), oldest first."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        FlowRunFilter,
        FlowRunFilterState,
        FlowRunFilterStateType,
        WorkPoolFilter,
        WorkPoolFilterName,
        WorkQueueFilter,
        WorkQueueFilterName,
    )
    from prefect.client.schemas.objects import StateType
    from prefect.client.schemas.sorting import FlowRunSort

    from prefect_odm.tasks.routing import PARENT_TAG_PREFIX

    pools = sorted({c.work_pool for c in directory.clusters})
    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(
            flow_run_filter=FlowRunFilter(
                state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.SCHEDULED]))
            ),
            work_pool_filter=WorkPoolFilter(name=WorkPoolFilterName(any_=pools)),
            work_queue_filter=WorkQueueFilter(
                name=WorkQueueFilterName(any_=[directory.dead_letter_queue])
            ),
            sort=FlowRunSort.EXPECTED_START_TIME_ASC,
            limit=200,
        )
    out = []
    for run in runs:
        parents = [
            t.removeprefix(PARENT_TAG_PREFIX) for t in run.tags if t.startswith(PARENT_TAG_PREFIX)
        ]
        out.append(
            DeadRun(
                flow_run_id=str(run.id),
                submodel_id=str(run.parameters.get("submodel_id")),
                parameters=dict(run.parameters),
                error=(run.state.message if run.state else "") or "",
                parent_id=parents[0] if parents else None,
            )
        )
    return out


def _routing_of(parent_id: str | None, directory: str) -> Any:
    """The routing options of the parent run (its groups and regions), else the defaults."""
    from prefect.client.orchestration import get_client

    from prefect_odm.clusters.records import RoutingOptions

    if parent_id is not None:
        with get_client(sync_client=True) as client:
            given = client.read_flow_run(UUID(parent_id)).parameters.get("routing")
        if isinstance(given, dict):
            return RoutingOptions.model_validate({**given, "directory": directory})
    return RoutingOptions(directory=directory)


def replay(dead: DeadRun, block: str, deployment: str) -> str:
    """Route ``dead``'s submodel among every cluster again and start its run; its id.

    Raises:
        RoutingError: no cluster can take it; InputError: its plan cannot be read.
    """
    from prefect.deployments import run_deployment

    from prefect_odm.clusters.router import route
    from prefect_odm.clusters.routing import demand_for
    from prefect_odm.plan.cache import load_plan_and_survey
    from prefect_odm.tasks.routing import open_clusters

    options = _routing_of(dead.parent_id, block)
    session = open_clusters(options)
    plan, _ = load_plan_and_survey(str(dead.parameters["plan_url"]))
    decision = route(
        demand_for(plan.submodel(dead.submodel_id), options, plan.engine_identity),
        session.states,
        global_queue=session.directory.global_queue,
        overflow_fraction=session.directory.overflow_fraction,
    )
    parameters = {**dead.parameters, "cluster": decision.cluster, "cluster_directory": block}
    # Called outside an event loop, run_deployment runs its sync implementation.
    run = cast(
        "FlowRun",
        run_deployment(
            deployment,
            parameters=parameters,
            work_queue_name=decision.work_queue,
            flow_run_name=f"{dead.submodel_id}-requeued",
            timeout=0,
            as_subflow=False,
        ),
    )
    print(
        f"{dead.submodel_id}: requeued as run {run.id} on {decision.work_queue}: {decision.reason}"
    )
    return str(run.id)


def merge_again(parent_id: str) -> str:
    """Run the merge of ``parent_id``'s survey again (see the module); the final state's name.

    Raises:
        PrefectODMError: the run failed again.
    """
    from prefect.client.orchestration import get_client

    from prefect_odm.flows import reconstruct
    from prefect_odm.tasks.deployment import retry_flow_run, wait_for_runs

    with get_client(sync_client=True) as client:
        parent = client.read_flow_run(UUID(parent_id))
    if parent.deployment_id is not None:
        retry_flow_run(parent.id, message="Retried by prefect-odm requeue")
        done = wait_for_runs({"parent": parent_id})["parent"]
        assert done.state is not None
        return str(done.state.name)
    manifest = reconstruct(**dict(parent.parameters))
    print(
        f"merged again: {len(manifest.submodels)} submodels, products {sorted(manifest.products)}"
    )
    for name, url in sorted(manifest.products.items()):
        print(f"{name}: {url}")
    return "Completed"


def run(args: argparse.Namespace) -> int:
    """``prefect-odm requeue``: list (``--list``) or replay the dead-letter runs (all, or those
    named), then merge each survey whose dead-letter runs all completed. Exit 1 when a replay
    failed again."""
    from prefect.client.orchestration import get_client
    from prefect.states import Cancelled

    from prefect_odm.blocks.clusters import load_cluster_directory
    from prefect_odm.tasks.deployment import SUBMODEL_DEPLOYMENT, state_text, wait_for_runs

    directory = load_cluster_directory(args.directory)
    waiting = [d for d in dead_runs(directory) if not args.runs or d.flow_run_id in args.runs]
    if not waiting:
        print(f"nothing waits in the dead-letter queue {directory.dead_letter_queue!r}")
        return 0
    for dead in waiting:
        print(f"{dead.submodel_id}: run {dead.flow_run_id} (parent {dead.parent_id}): {dead.error}")
    if args.list:
        return 0
    deployment = args.deployment or SUBMODEL_DEPLOYMENT
    started = {d.flow_run_id: replay(d, args.directory, deployment) for d in waiting}
    done = wait_for_runs(started)
    failed: set[str] = set()
    by_parent: dict[str | None, list[DeadRun]] = defaultdict(list)
    with get_client(sync_client=True) as client:
        for dead in waiting:
            new = done[dead.flow_run_id]
            assert new.state is not None
            if new.state.is_completed():
                client.set_flow_run_state(
                    UUID(dead.flow_run_id),
                    Cancelled(message=f"requeued: completed as run {new.id}"),
                    force=True,
                )
                by_parent[dead.parent_id].append(dead)
            else:
                failed.add(dead.parent_id or "")
                print(f"{dead.submodel_id}: failed again: {state_text(new.state)}")
    left = {d.parent_id for d in dead_runs(directory)}
    for parent in sorted(p for p in by_parent if p and p not in failed and p not in left):
        print(f"merging the survey of run {parent} again: {merge_again(parent)}")
    return 1 if failed else 0


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Add ``requeue`` to the sub-command parsers; returns its parser."""
    requeue: argparse.ArgumentParser = sub.add_parser(
        "requeue", help="replay the submodels of the dead-letter queue, then merge again"
    )
    requeue.add_argument(
        "--directory", required=True, metavar="BLOCK_NAME", help="saved cluster directory block"
    )
    requeue.add_argument("runs", nargs="*", metavar="RUN_ID", help="only these dead-letter runs")
    requeue.add_argument("--list", action="store_true", help="list the dead-letter runs only")
    requeue.add_argument(
        "--deployment",
        help="the process_submodel deployment (default process_submodel/process-submodel)",
    )
    return requeue
