"""The ``run_submodel`` task: one ``process_submodel`` subflow of an inline run, retried when
its Prefect bookkeeping fails."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx
from prefect import Task, task
from prefect.cache_policies import NO_CACHE
from prefect.client.schemas.objects import State, TaskRun
from prefect.runtime import task_run as this_task_run
from prefect_odm.flows.process_submodel import process_submodel

from prefect_odm import progress
from prefect_odm.errors import SubmodelFailedError
from prefect_odm.models import SubmodelResult


@dataclass(frozen=True)
class InlineCluster:
    """Where an inline run routed a submodel: the cluster directory block, the cluster's name
    and the submodel's deadline on its node (seconds, ``None``: none)."""

    directory: str
    name: str
    deadline_seconds: float | None = None


BOOKKEEPING_RETRY_DELAYS_SECONDS = [2.0, 5.0, 15.0]
"""Back-off before each new try of a submodel whose Prefect bookkeeping failed (jitter 0.5x)."""


def bookkeeping_failed(task: Task[Any, Any], task_run: TaskRun, state: State[Any]) -> bool:
    """Whether a ``run_submodel`` try failed on the Prefect API rather than on its nodes: an
    answer of 429 or 5xx, or no answer, after the Prefect client's own retries (a SQLite-backed
    server answers 503 while its database is locked, issue 14). Such a try is tried again: the
    submodel's stored result or its task on the node makes that cheap, never a second task."""
    exc = state.data
    if isinstance(exc, httpx.HTTPStatusError):
        code = exc.response.status_code
        return code == 429 or code >= 500
    return isinstance(exc, httpx.TransportError)


@task(
    name="run_submodel",
    cache_policy=NO_CACHE,
    task_run_name="run-{submodel_id}",
    retries=len(BOOKKEEPING_RETRY_DELAYS_SECONDS),
    retry_delay_seconds=BOOKKEEPING_RETRY_DELAYS_SECONDS,
    retry_jitter_factor=0.5,
    retry_condition_fn=bookkeeping_failed,
)
def run_submodel(
    plan_url: str,
    submodel_id: str,
    output: str,
    nodes: list[str],
    force: bool,
    on: InlineCluster | None = None,
) -> SubmodelResult:
    """Run the ``process_submodel`` subflow; a failed submodel comes back as a failed result.

    Args:
        plan_url: the stored ``plan/plan.json``.
        submodel_id: e.g. ``submodel-003``.
        output: the run's output root.
        nodes: node URLs (a cluster shared with :func:`.clusters.sharing_cluster` is used when
            it has the same nodes).
        force: process again even when a stored result exists.
        on: the cluster of a cluster directory the submodel was routed to (the cluster's memory
            limit is used, and the submodel's deadline); ``None``: no directory.
    """
    # Each try of this task is one flow run of the submodel: the live table's ``runs``.
    progress.emit(
        progress.SubmodelRunEvent(submodel_id=submodel_id, runs=max(1, this_task_run.run_count))
    )
    try:
        # Called as a subflow, the flow returns its result's data (also from a Cached state).
        if on is None:
            done = process_submodel(plan_url, submodel_id, output, nodes=nodes, force=force)
        else:
            done = process_submodel(
                plan_url,
                submodel_id,
                output,
                nodes=nodes,
                force=force,
                cluster_directory=on.directory,
                cluster=on.name,
                deadline_seconds=on.deadline_seconds,
            )
        assert isinstance(done, SubmodelResult)
        return done
    except SubmodelFailedError as exc:
        failed = exc.result
        assert isinstance(failed, SubmodelResult)
        return failed
