"""``prefect-odm setup --directory BLOCK``: the work queues and automations of a cluster
directory on a Prefect server (idempotent: running it again updates what exists).

* each cluster's own queue (priority 1) in its work pool, the global overflow queue (priority
  100, taken after the own queues) in every pool of a cluster reading it, and the dead-letter
  queue (paused: no worker takes its runs until ``prefect-odm requeue`` replays them);
* per cluster, two automations: its queue is paused when its work pool turns NOT_READY (Prefect's
  ``prefect.work-pool.not-ready`` event, sent by the server's foreman about three heartbeats after
  the pool's last worker stopped) and resumed on ``prefect.work-pool.ready`` (a worker is back).
  With one pool for every cluster the pool turns NOT_READY only when no worker of any cluster
  is left; one cluster's death shows in its own queue's status, which the router reads.
"""

from __future__ import annotations

from typing import cast

from prefect_odm.clusters.directory import ClusterDirectory

OWN_QUEUE_PRIORITY = 1
GLOBAL_QUEUE_PRIORITY = 100


def automation_names(cluster: str) -> tuple[str, str]:
    """The names of the pause and resume automations of ``cluster``."""
    return (
        f"prefect-odm: pause cluster {cluster} while its pool is not ready",
        f"prefect-odm: resume cluster {cluster} when its pool is ready",
    )


def create_cluster_queues(directory: ClusterDirectory) -> dict[tuple[str, str], str]:
    """Create or update every queue the directory names (its pools must exist).

    Returns:
        (pool, queue) -> what it is, e.g. ``"priority 1"`` or ``"paused"``.
    """
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectAlreadyExists

    wanted: dict[tuple[str, str], tuple[int, bool]] = {}
    for c in directory.clusters:
        wanted[(c.work_pool, c.queue)] = (OWN_QUEUE_PRIORITY, False)
        if c.reads_global:
            wanted[(c.work_pool, directory.global_queue)] = (GLOBAL_QUEUE_PRIORITY, False)
        wanted.setdefault((c.work_pool, directory.dead_letter_queue), (GLOBAL_QUEUE_PRIORITY, True))
    made: dict[tuple[str, str], str] = {}
    with get_client(sync_client=True) as client:
        for (pool, queue), (priority, paused) in wanted.items():
            try:
                client.create_work_queue(
                    name=queue, work_pool_name=pool, priority=priority, is_paused=paused
                )
            except ObjectAlreadyExists:
                existing = client.read_work_queue_by_name(queue, work_pool_name=pool)
                client.update_work_queue(existing.id, priority=priority, is_paused=paused)
            made[(pool, queue)] = "paused" if paused else f"priority {priority}"
    return made


def create_cluster_automations(directory: ClusterDirectory) -> dict[str, str]:
    """Create (or replace) each cluster's pause and resume automations.

    Returns:
        automation name -> id.
    """
    from prefect.automations import Automation
    from prefect.client.orchestration import get_client
    from prefect.events.actions import PauseWorkQueue, ResumeWorkQueue
    from prefect.events.schemas.automations import EventTrigger, Posture
    from prefect.events.schemas.events import ResourceSpecification

    made: dict[str, str] = {}
    with get_client(sync_client=True) as client:
        for c in directory.clusters:
            pool = client.read_work_pool(c.work_pool)
            queue = client.read_work_queue_by_name(c.queue, work_pool_name=c.work_pool)
            match = ResourceSpecification({"prefect.resource.id": f"prefect.work-pool.{pool.id}"})
            pause = PauseWorkQueue(source="selected", work_queue_id=queue.id)
            resume = ResumeWorkQueue(source="selected", work_queue_id=queue.id)
            for name, event, action in (
                (automation_names(c.name)[0], "prefect.work-pool.not-ready", pause),
                (automation_names(c.name)[1], "prefect.work-pool.ready", resume),
            ):
                for existing in client.read_automations_by_name(name):
                    client.delete_automation(existing.id)
                trigger = EventTrigger(
                    expect={event}, match=match, posture=Posture.Reactive, threshold=1
                )
                # Called outside an event loop, create() runs its sync implementation.
                automation = cast(
                    Automation,
                    Automation(
                        name=name,
                        description=f"Cluster {c.name}: queue {c.queue} of pool {c.work_pool}.",
                        trigger=trigger,
                        actions=[action],
                    ).create(),
                )
                made[name] = str(automation.id)
    return made
