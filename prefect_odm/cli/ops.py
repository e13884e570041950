"""Operations on a Prefect server: ``prefect-odm setup``, ``prefect-odm automations create``.

* the crash automation: a self-hosted server does not mark a run whose process died as crashed on
  its own; Prefect's documented remedy ("detect zombie flows") is an automation that expects a
  ``prefect.flow-run.heartbeat`` (or a final state) within a window after each heartbeat and
  otherwise changes the run to ``Crashed``. Runs emit heartbeats only when
  ``PREFECT_FLOWS_HEARTBEAT_FREQUENCY`` is set (seconds, at least 30) in the workers' environment;
  the window should be about three heartbeats.
  Source: https://docs.prefect.io/v3/advanced/detect-zombie-flows
* the work queues of the work pool: ``urgent`` (priority 1, taken first) and ``default``
  (priority 10), so an urgent run's submodels are taken before a large normal survey's backlog.

Both are idempotent: running them again updates what exists.
"""

from __future__ import annotations

import argparse
import logging
from datetime import timedelta
from typing import Any, cast

from prefect_odm.settings import get_settings

logger = logging.getLogger(__name__)

CRASH_AUTOMATION_NAME = "prefect-odm: crash runs without heartbeats"
"""Name of the automation created by :func:`create_crash_automation`."""

DEFAULT_HEARTBEAT_WINDOW_SECONDS = 540
"""Default window without heartbeat before a run is marked crashed (3 x the 180 s heartbeat)."""


def create_crash_automation(
    within_seconds: float = DEFAULT_HEARTBEAT_WINDOW_SECONDS, name: str = CRASH_AUTOMATION_NAME
) -> str:
    """Create (or replace) the automation that marks runs without heartbeats ``Crashed``.

    Args:
        within_seconds: how long after a heartbeat the next heartbeat or a final state must
            arrive, seconds (about 3 x ``PREFECT_FLOWS_HEARTBEAT_FREQUENCY``).
        name: automation name; an existing automation of that name is replaced.

    Returns:
        The automation id.
    """
    from prefect.automations import Automation
    from prefect.client.schemas.objects import StateType
    from prefect.events.actions import ChangeFlowRunState
    from prefect.events.schemas.automations import EventTrigger, Posture
    from prefect.events.schemas.events import ResourceSpecification

    _delete_automations(name)
    # Called outside an event loop, create() runs its sync implementation; the union in its
    # type is Prefect's sync/async dispatch.
    automation = cast(
        Automation,
        Automation(
            name=name,
            description="Marks a flow run Crashed when its heartbeats stop (its process died).",
            trigger=EventTrigger(
                after={"prefect.flow-run.heartbeat"},
                expect={
                    "prefect.flow-run.heartbeat",
                    "prefect.flow-run.Completed",
                    "prefect.flow-run.Failed",
                    "prefect.flow-run.Cancelled",
                    "prefect.flow-run.Crashed",
                },
                match=ResourceSpecification({"prefect.resource.id": ["prefect.flow-run.*"]}),
                for_each={"prefect.resource.id"},
                posture=Posture.Proactive,
                threshold=1,
                within=timedelta(seconds=within_seconds),
            ),
            actions=[
                ChangeFlowRunState(
                    state=StateType.CRASHED,
                    message=f"Flow run marked crashed: no heartbeat for {within_seconds:.0f} s.",
                )
            ],
        ).create(),
    )
    return str(automation.id)


def _delete_automations(name: str) -> int:
    from prefect.client.orchestration import get_client

    removed = 0
    with get_client(sync_client=True) as client:
        for existing in client.read_automations_by_name(name):
            client.delete_automation(existing.id)
            removed += 1
    return removed


def create_work_queues(pool: str, urgent: str | None = None) -> dict[str, int]:
    """Create or update the pool's ``default`` (priority 10) and urgent (priority 1) queues.

    Args:
        pool: work pool name (must exist: ``prefect work-pool create POOL --type process``).
        urgent: urgent queue name (default :data:`prefect_odm.settings.URGENT_WORK_QUEUE`
            or ``PREFECT_ODM_URGENT_WORK_QUEUE``).

    Returns:
        queue name -> priority.
    """

    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectAlreadyExists

    urgent = urgent or get_settings().urgent_work_queue
    wanted = {"default": 10, urgent: 1}  # default first: the pool created it with priority 1
    with get_client(sync_client=True) as client:
        for queue, priority in wanted.items():
            try:
                client.create_work_queue(name=queue, work_pool_name=pool, priority=priority)
            except ObjectAlreadyExists:
                existing = client.read_work_queue_by_name(queue, work_pool_name=pool)
                client.update_work_queue(existing.id, priority=priority)
    return wanted


def add_parsers(sub: Any) -> list[argparse.ArgumentParser]:
    """Add ``setup`` and ``automations`` to the ``prefect-odm`` sub-command parsers.

    Returns:
        The parsers of ``setup`` and ``automations create`` (the caller adds ``-v`` to them).
    """
    setup = sub.add_parser("setup", help="create the urgent work queue and the crash automation")
    setup.add_argument(
        "--pool",
        default="odm",
        help="work pool (default odm; names starting with prefect are reserved)",
    )
    setup.add_argument(
        "--heartbeat-window-seconds",
        type=float,
        default=DEFAULT_HEARTBEAT_WINDOW_SECONDS,
        help="mark runs crashed after this long without heartbeat (default 540)",
    )
    setup.add_argument(
        "--directory",
        metavar="BLOCK_NAME",
        help="also each cluster's queue, the global and dead-letter queues of this cluster "
        "directory, and the automations pausing a cluster's queue while its pool is not ready",
    )
    auto = sub.add_parser("automations", help="Prefect automations of prefect-odm")
    auto_sub = auto.add_subparsers(dest="automations_command", required=True)
    create = auto_sub.add_parser("create", help="create the crash-detection automation")
    create.add_argument(
        "--heartbeat-window-seconds",
        type=float,
        default=DEFAULT_HEARTBEAT_WINDOW_SECONDS,
        help="mark runs crashed after this long without heartbeat (default 540)",
    )
    return [setup, create]


def _setup_clusters(block: str) -> None:
    """The queues and automations of the cluster directory ``block`` (printed)."""
    from prefect_odm.blocks.clusters import load_cluster_directory
    from prefect_odm.cli.cluster_setup import create_cluster_automations, create_cluster_queues

    directory = load_cluster_directory(block)
    for (pool, queue), what in create_cluster_queues(directory).items():
        print(f"work queue {queue} of {pool}: {what}")
    for name, automation_id in create_cluster_automations(directory).items():
        print(f"automation '{name}': {automation_id}")


def run(args: argparse.Namespace) -> int:
    """Run ``setup`` or ``automations create``; prints what was made."""
    if args.command == "setup":
        queues = create_work_queues(args.pool)
        print(
            f"work queues of {args.pool}: "
            + ", ".join(f"{q} (priority {p})" for q, p in queues.items())
        )
        if getattr(args, "directory", None):
            _setup_clusters(args.directory)
    automation_id = create_crash_automation(args.heartbeat_window_seconds)
    print(f"automation '{CRASH_AUTOMATION_NAME}': {automation_id}")
    print("workers need PREFECT_FLOWS_HEARTBEAT_FREQUENCY (seconds, >= 30) for heartbeats")
    return 0
