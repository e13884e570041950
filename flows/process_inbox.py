"""The ``process_inbox`` flow: start a ``reconstruct`` deployment run for every new survey folder.

An inbox is a local folder or an ``s3://`` prefix whose direct sub-folders are surveys. A survey is
*new* when no reconstruction of the same images exists under the output root (same survey
fingerprint, ``{output}/{fingerprint[:16]}/manifest.json``, whatever the folder is called) and no
``reconstruct`` run for it is still scheduled, pending or running (runs carry the tag
``prefect-odm-survey:{fingerprint[:16]}``). Reconstructions start as deployment runs from Prefect
tasks (linked to this run), at most ``max_concurrent`` at a time, and what happened is reported
as a markdown artifact and returned.
"""

from __future__ import annotations

import logging
from typing import Any, Literal

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.context import get_run_context
from prefect.deployments import run_deployment
from prefect.task_runners import ThreadPoolTaskRunner
from pydantic import BaseModel, Field

from prefect_odm import storage
from prefect_odm.errors import PrefectODMError
from prefect_odm.layout import OutputLayout, join
from prefect_odm.models import ProcessingOptions
from prefect_odm.settings import DEFAULT_SPLIT, DEFAULT_SPLIT_OVERLAP_M

logger = logging.getLogger(__name__)

RECONSTRUCT_DEPLOYMENT = "reconstruct/reconstruct"
"""The ``reconstruct`` deployment of ``prefect.yaml`` (``flow name/deployment name``)."""

SURVEY_TAG_PREFIX = "prefect-odm-survey:"
"""Tag on every reconstruction started from an inbox, followed by the survey fingerprint[:16]."""

_ACTIVE_STATES = ["SCHEDULED", "PENDING", "RUNNING", "PAUSED", "CANCELLING"]


class ReconstructSettings(BaseModel):
    """Parameters given to every reconstruction the inbox starts (see the ``reconstruct`` flow)."""

    split: int | Literal["auto"] = Field(
        DEFAULT_SPLIT, description="Target images per submodel, or 'auto'."
    )
    split_overlap_m: float = Field(
        DEFAULT_SPLIT_OVERLAP_M, ge=0, description="Overlap between submodels, metres."
    )
    options: ProcessingOptions = Field(
        default_factory=ProcessingOptions, description="Processing options for every node."
    )
    nodes: list[str] | None = Field(
        None, description="NodeODM node URLs; none: the built-in engine."
    )
    allow_partial: bool = Field(False, description="Merge what finished when submodels fail.")
    priority: Literal["normal", "urgent"] = Field(
        "normal", description="Queue priority of submodels."
    )


class InboxEntry(BaseModel):
    """What ``process_inbox`` did with one survey folder."""

    folder: str = Field(description="The survey folder (path or URL).")
    survey_fingerprint: str | None = Field(None, description="Survey fingerprint, when scanned.")
    action: Literal["started", "skipped", "error"]
    reason: str = Field("", description="Why it was skipped, or the error.")
    flow_run_id: str | None = Field(None, description="The reconstruct run, when one was started.")
    state: str | None = Field(None, description="Final state of that run (when waited for).")


class InboxReport(BaseModel):
    """Everything ``process_inbox`` looked at, in folder order."""

    inbox: str
    output: str
    entries: list[InboxEntry] = Field(default_factory=list)

    @property
    def started(self) -> list[InboxEntry]:
        return [e for e in self.entries if e.action == "started"]

    def markdown(self) -> str:
        """The report as a markdown table."""
        lines = [
            f"# Inbox `{self.inbox}`",
            "",
            f"Output root: `{self.output}`. Started {len(self.started)} reconstruction(s).",
            "",
            "| folder | survey | action | reason | run | state |",
            "|---|---|---|---|---|---|",
        ]
        for e in self.entries:
            fp = (e.survey_fingerprint or "")[:16]
            run, state = e.flow_run_id or "", e.state or ""
            lines.append(f"| {e.folder} | {fp} | {e.action} | {e.reason} | {run} | {state} |")
        return "\n".join(lines) + "\n"


def survey_folders(inbox: str) -> list[str]:
    """The direct sub-folders of ``inbox`` (local folder, symlinks followed, or fsspec prefix),
    sorted by name, as paths or URLs.

    Raises:
        InputError: the inbox does not exist.
    """
    from prefect_odm.errors import InputError

    if storage.is_local(inbox):
        root = storage.local_path(inbox)
        if not root.is_dir():
            raise InputError(f"inbox {inbox}: not a folder")
        return [str(p) for p in sorted(root.iterdir()) if p.is_dir() and not p.name.startswith(".")]
    fs, path = storage.filesystem(inbox)
    if not fs.exists(path):
        raise InputError(f"inbox {inbox}: does not exist")
    protocol = inbox.split("://", 1)[0]
    found = []
    for info in fs.ls(path, detail=True):
        name = info["name"].rstrip("/")
        if info.get("type") == "directory" and not name.rsplit("/", 1)[-1].startswith("."):
            found.append(f"{protocol}://{name}")
    return sorted(found)


def _active_reconstruction(tag: str) -> str | None:
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


@task(name="survey_fingerprint", cache_policy=NO_CACHE, task_run_name="fingerprint-{folder}")
def survey_fingerprint(folder: str) -> str:
    """The survey fingerprint of the images in ``folder`` (see :mod:`prefect_odm.scan`)."""
    from prefect_odm.scan import scan_survey

    return scan_survey(folder).fingerprint


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
    ctx = get_run_context()
    parent = ctx.task_run.flow_run_id  # type: ignore[union-attr]
    parameters: dict[str, Any] = {
        "images": folder,
        "output": output,
        **settings.model_dump(mode="json"),
    }
    run = run_deployment(
        deployment,
        parameters=parameters,
        idempotency_key=f"{parent}-{fingerprint16}",
        tags=[f"{SURVEY_TAG_PREFIX}{fingerprint16}"],
        flow_run_name=f"reconstruct-{folder.rstrip('/').rsplit('/', 1)[-1]}",
        timeout=None if wait else 0,
        poll_interval=2,
    )
    return str(run.id), run.state.name if run.state else "?"


@flow(name="process_inbox", flow_run_name="inbox-{inbox}", validate_parameters=True)
def process_inbox(
    inbox: str,
    output: str,
    max_concurrent: int = Field(2, ge=1, description="Reconstructions running at once."),
    settings: ReconstructSettings | None = None,
    reconstruct_deployment: str = RECONSTRUCT_DEPLOYMENT,
    wait: bool = True,
) -> InboxReport:
    """Start a reconstruction for every survey folder of ``inbox`` not reconstructed yet.

    Args:
        inbox: local folder or fsspec prefix (``s3://bucket/inbox``) whose sub-folders are surveys.
        output: output root of the reconstructions (the ``reconstruct`` flow's ``output``).
        max_concurrent: at most this many reconstructions run at once (with ``wait``).
        settings: parameters for every reconstruction (split, options, nodes, priority).
        reconstruct_deployment: ``"flow/deployment"`` of the reconstruct deployment.
        wait: wait for each reconstruction to finish (bounded by ``max_concurrent``); off:
            start them all and return.

    Returns:
        The report (also published as the markdown artifact ``inbox-report``).

    Raises:
        InputError: the inbox does not exist.
    """
    from prefect.artifacts import create_markdown_artifact

    log = get_run_logger()
    settings = settings or ReconstructSettings()
    report = InboxReport(inbox=inbox, output=output)
    todo: list[tuple[InboxEntry, str]] = []
    for folder in survey_folders(inbox):
        entry = InboxEntry(folder=folder, action="skipped")
        report.entries.append(entry)
        try:
            fp = survey_fingerprint(folder)
        except PrefectODMError as exc:
            entry.action, entry.reason = "error", str(exc).split("\n")[0]
            continue
        entry.survey_fingerprint = fp
        manifest = OutputLayout(output, fp).manifest
        if storage.exists(manifest):
            entry.reason = f"already reconstructed ({join(output, fp[:16])})"
            continue
        active = _active_reconstruction(f"{SURVEY_TAG_PREFIX}{fp[:16]}")
        if active is not None:
            entry.reason = f"reconstruction {active} still running"
            continue
        todo.append((entry, fp))
    log.info("%d survey folder(s), %d new", len(report.entries), len(todo))
    if todo:
        with ThreadPoolTaskRunner(max_workers=max_concurrent) as runner:
            futures = [
                runner.submit(
                    start_reconstruction,
                    parameters={
                        "deployment": reconstruct_deployment,
                        "folder": entry.folder,
                        "output": output,
                        "fingerprint16": fp[:16],
                        "settings": settings,
                        "wait": wait,
                    },
                )
                for entry, fp in todo
            ]
            for (entry, _), future in zip(todo, futures, strict=True):
                try:
                    run_id, state = future.result()
                except Exception as exc:  # reported per survey; the others still run
                    entry.action, entry.reason = "error", f"could not start: {exc}".split("\n")[0]
                    continue
                entry.action, entry.flow_run_id, entry.state = "started", run_id, state
    create_markdown_artifact(
        key="inbox-report", markdown=report.markdown(), description="process_inbox report"
    )
    return report
