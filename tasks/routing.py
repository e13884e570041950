"""A ``reconstruct`` run that routes its submodels among the clusters of a cluster directory:
the clusters read at its start, the submodel runs it starts on the chosen queues, and the
dead-letter queue.

:func:`open_clusters` loads the directory block and probes every cluster (Prefect's API and each
node's ``/info``, :mod:`prefect_odm.clusters.capacity`); the run plans for the engine of the
most preferred cluster and sizes ``--split auto`` by the largest node of the clusters that run
it. :func:`start_routed_run` creates one submodel's deployment run on its queue, from a Prefect
task (so the run is linked to its parent), with the idempotency key
``{parent}-{submodel}`` for its first route and ``{parent}-{submodel}-route{n}`` after failovers:
a retried parent finds its runs again. :func:`dead_letter` puts a submodel that exhausted its
failovers in the paused dead-letter queue with its last error.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast
from uuid import UUID

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.client.schemas.objects import FlowRun
from prefect.context import get_run_context
from prefect_odm.blocks.clusters import load_cluster_directory

from prefect_odm.clusters.capacity import ClusterProbe, directory_probes
from prefect_odm.clusters.deadlines import DeadlineRule
from prefect_odm.clusters.directory import ClusterDirectory
from prefect_odm.clusters.records import DeadLetterRecord, RoutingOptions, RoutingSummary
from prefect_odm.clusters.router import ClusterState
from prefect_odm.clusters.routing import cluster_states, plan_engine, survey_states
from prefect_odm.errors import DeploymentRunError
from prefect_odm.models import SplitPlan

DEAD_LETTER_TAG = "dead-letter"
DEAD_LETTER_STATE = "DeadLetter"
"""The name of a dead-letter run's ``Scheduled`` state: Prefect's late-runs service marks only
runs named ``Scheduled`` ``Late`` (which would drop the error from the state message)."""
PARENT_TAG_PREFIX = "prefect-odm-parent:"
"""Tag of a dead-letter run naming the ``reconstruct`` run it belongs to."""


@dataclass
class ClusterSession:
    """The clusters of a run: the directory, their states and probes when last read, those
    the survey may use (in the router's order) and the engine the plan is made for."""

    options: RoutingOptions
    directory: ClusterDirectory
    probes: list[ClusterProbe]
    states: list[ClusterState]
    usable: list[ClusterState]
    engine_identity: str
    workers: bool = True
    """Submodels run on the clusters' workers (deployment runs); off: inline, where a cluster
    is down only when no node answers."""
    summary: RoutingSummary = field(init=False)

    def __post_init__(self) -> None:
        """Start the run's routing summary empty, named after the directory block it reads."""
        self.summary = RoutingSummary(directory=self.options.directory)

    def refresh(self) -> None:
        """Read every cluster's state again (Prefect's API, the nodes' ``/info``)."""
        self.probes = directory_probes(self.directory)
        self.states = cluster_states(self.directory, self.probes, workers=self.workers)

    def down_reasons(self) -> dict[str, str]:
        """Cluster -> why it is down, for the clusters down at the last read."""
        return {p.figures.cluster: p.down_reason for p in self.probes if p.down_reason}

    def deadline_seconds(
        self, plan: SplitPlan, submodel_id: str, megapixels: float
    ) -> float | None:
        """The submodel's deadline on its node, seconds (``None`` with deadlines off);
        ``megapixels``: the survey's mean image size."""
        if not self.options.deadlines:
            return None
        rule = DeadlineRule.for_engine(plan.engine_identity)
        return rule.deadline_seconds(
            len(plan.submodel(submodel_id).image_names),
            megapixels,
            self.options.submodel_timeout_seconds,
        )


def open_clusters(options: RoutingOptions, workers: bool = True) -> ClusterSession:
    """Load the directory block and read every cluster's state (``workers``: see
    :class:`ClusterSession`).

    Raises:
        InputError: no such block, or a pool block it names is missing.
        RoutingError: no cluster may take the survey (each one's reason named).
    """
    directory = load_cluster_directory(options.directory)
    probes = directory_probes(directory)
    states = cluster_states(directory, probes, workers=workers)
    usable = survey_states(states, options)
    engine = plan_engine(usable)
    return ClusterSession(options, directory, probes, states, usable, engine, workers)


def route_key(parent_id: UUID, submodel_id: str, route: int) -> str:
    """The idempotency key of a submodel's ``route``-th run (1: the first)."""
    base = f"{parent_id}-{submodel_id}"
    return base if route == 1 else f"{base}-route{route}"


@task(name="start_routed_run", cache_policy=NO_CACHE, task_run_name="route-{submodel_id}")
def start_routed_run(
    deployment: str,
    submodel_id: str,
    parameters: dict[str, Any],
    work_queue_name: str,
    route: int,
    run_name: str,
) -> tuple[str, str]:
    """Create (or find, by its idempotency key) a submodel's run on ``work_queue_name``.

    Returns:
        (flow run id, its state type, e.g. ``SCHEDULED`` or ``FAILED`` for a run found again).

    Raises:
        DeploymentRunError: not called from inside a flow run.
    """
    from prefect.deployments import run_deployment

    ctx = get_run_context()
    task_run = getattr(ctx, "task_run", None)
    if task_run is None:
        raise DeploymentRunError("start_routed_run must run as a task inside a flow run")
    child = cast(
        FlowRun,
        run_deployment(
            deployment,
            parameters=parameters,
            idempotency_key=route_key(task_run.flow_run_id, submodel_id, route),
            work_queue_name=work_queue_name,
            flow_run_name=run_name,
            timeout=0,
        ),
    )
    state = child.state.type.value if child.state is not None else "SCHEDULED"
    get_run_logger().info(
        "%s: route %d, run %s on queue %s (%s)",
        submodel_id,
        route,
        child.id,
        work_queue_name,
        state,
    )
    return str(child.id), state


def dead_letter(
    deployment: str,
    directory: ClusterDirectory,
    parameters: dict[str, Any],
    error: str,
    tried: list[str],
    parent_id: str,
) -> DeadLetterRecord:
    """Put a submodel in the paused dead-letter queue (created paused when missing; paused
    again when someone resumed it): a run of the submodel deployment, of type ``SCHEDULED``
    named ``DeadLetter`` (never marked ``Late``) with its last error as the state message, tagged ``dead-letter`` and with its parent's id.

    Raises:
        DeploymentRunError: the submodel deployment does not exist.
    """
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound
    from prefect.states import Scheduled

    queue = directory.dead_letter_queue
    sid = str(parameters["submodel_id"])
    with get_client(sync_client=True) as client:
        try:
            found = client.read_deployment_by_name(deployment)
        except ObjectNotFound:
            raise DeploymentRunError(
                f"no deployment {deployment!r} for the dead-letter queue"
            ) from None
        pool = found.work_pool_name
        try:
            client.create_work_queue(name=queue, work_pool_name=pool, is_paused=True)
        except ObjectAlreadyExists:
            existing = client.read_work_queue_by_name(queue, work_pool_name=pool)
            if not existing.is_paused:
                client.update_work_queue(existing.id, is_paused=True)
        run = client.create_flow_run_from_deployment(
            found.id,
            parameters={**parameters, "cluster": None},
            state=Scheduled(message=error[:2000], name=DEAD_LETTER_STATE),
            name=f"{sid}-dead-letter",
            tags=[DEAD_LETTER_TAG, f"{PARENT_TAG_PREFIX}{parent_id}"],
            idempotency_key=f"{parent_id}-{sid}-dead-letter",
            work_queue_name=queue,
        )
    get_run_logger().warning("%s: in the dead-letter queue as run %s: %s", sid, run.id, error)
    return DeadLetterRecord(
        submodel_id=sid, flow_run_id=str(run.id), work_queue=queue, error=error, tried=tried
    )
