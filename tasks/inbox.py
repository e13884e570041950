"""Prefect tasks of ``process_inbox``: a survey folder's fingerprint, the check for a
reconstruction still running, and the start of a ``reconstruct`` deployment run."""

from __future__ import annotations

from typing import cast

from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect.client.schemas.objects import FlowRun
from prefect.context import get_run_context
from prefect.deployments import run_deployment

from prefect_odm.errors import DeploymentRunError
from prefect_odm.survey.inbox import ReconstructSettings, survey_tag

_ACTIVE_STATES = ["SCHEDULED", "PENDING", "RUNNING", "PAUSED", "CANCELLING"]


def active_reconstruction(tag: str) -> str | None:
    """The id of a not-yet-finished flow run carrying ``tag``, if any."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        FlowRunFilter,
        FlowRunFilterState,
        FlowRunFilterStateType,
        FlowRunFilterTags,
    )
    from prefect.client.schemas.objects import StateType

    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(
            flow_run_filter=FlowRunFilter(
                tags=FlowRunFilterTags(all_=[tag]),
                state=FlowRunFilterState(
                    type=FlowRunFilterStateType(any_=[StateType(s) for s in _ACTIVE_STATES])
                ),
            ),
            limit=1,
        )
    return str(runs[0].id) if runs else None


@task(name="fingerprint_folder", cache_policy=NO_CACHE, task_run_name="fingerprint-{folder}")
def fingerprint_folder(folder: str) -> str:
    """The survey fingerprint of the images in ``folder`` (see :mod:`prefect_odm.survey.scan`)."""
    from prefect_odm.survey.scan import scan_images

    return scan_images(folder).fingerprint


@task(
    name="start_reconstruction", cache_policy=NO_CACHE, task_run_name="reconstruct-{fingerprint16}"
)
def start_reconstruction(
    deployment: str,
    folder: str,
    output: str,
    fingerprint16: str,
    settings: ReconstructSettings,
    wait: bool,
) -> tuple[str, str]:
    """Start the ``reconstruct`` deployment run for one survey; optionally wait for it.

    The idempotency key ``{inbox run id}-{fingerprint16}`` makes a retried inbox run find the
    reconstruction it started instead of starting another.

    Returns:
        ``(flow run id, state name)``.
    """
    task_run = getattr(get_run_context(), "task_run", None)
    if task_run is None:
        raise DeploymentRunError("start_reconstruction must run as a task inside a flow run")
    parent = task_run.flow_run_id
    parameters: dict[str, object] = {
        "images": folder,
        "output": output,
        **settings.model_dump(mode="json"),
    }
    # Called from a sync task, run_deployment runs its sync implementation; the union in its
    # type is Prefect's sync/async dispatch.
    run = cast(
        FlowRun,
        run_deployment(
            deployment,
            parameters=parameters,
            idempotency_key=f"{parent}-{fingerprint16}",
            tags=[survey_tag(fingerprint16)],
            flow_run_name=f"reconstruct-{folder.rstrip('/').rsplit('/', 1)[-1]}",
            timeout=None if wait else 0,
            poll_interval=2,
        ),
    )
    return str(run.id), run.state.name if run.state and run.state.name else "?"
