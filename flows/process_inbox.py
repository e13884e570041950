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

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact
from prefect.task_runners import ThreadPoolTaskRunner
from prefect_odm.tasks.inbox import active_reconstruction, fingerprint_folder, start_reconstruction
from pydantic import Field

from prefect_odm import storage
from prefect_odm.errors import PrefectODMError
from prefect_odm.layout import OutputLayout
from prefect_odm.nodes.refs import refuse_credentials
from prefect_odm.survey.inbox import (
    SURVEY_TAG_PREFIX,
    InboxEntry,
    InboxReport,
    ReconstructSettings,
    survey_folders,
    survey_tag,
)

__all__ = [
    "RECONSTRUCT_DEPLOYMENT",
    "SURVEY_TAG_PREFIX",
    "InboxEntry",
    "InboxReport",
    "ReconstructSettings",
    "process_inbox",
    "survey_folders",
]

RECONSTRUCT_DEPLOYMENT = "reconstruct/reconstruct"
"""The ``reconstruct`` deployment of ``prefect.yaml`` (``flow name/deployment name``)."""


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
        InputError: the inbox does not exist; a node URL in ``settings`` carries a credential.
    """
    settings = settings or ReconstructSettings()
    refuse_credentials(settings.nodes, parameter="settings.nodes")
    report = InboxReport(inbox=inbox, output=output)
    todo = [_triage(folder, output, report) for folder in survey_folders(inbox)]
    new = [(entry, fp) for entry, fp in todo if fp is not None]
    get_run_logger().info("%d survey folder(s), %d new", len(report.entries), len(new))
    if new:
        _start_all(new, reconstruct_deployment, output, settings, wait, max_concurrent)
    create_markdown_artifact(
        key="inbox-report", markdown=report.markdown(), description="process_inbox report"
    )
    return report


def _triage(folder: str, output: str, report: InboxReport) -> tuple[InboxEntry, str | None]:
    """The folder's entry in the report, and its survey fingerprint when it is to be started
    (``None``: skipped, or its scan failed)."""
    entry = InboxEntry(folder=folder, action="skipped")
    report.entries.append(entry)
    try:
        fp = fingerprint_folder(folder)
    except PrefectODMError as exc:
        entry.action, entry.reason = "error", str(exc).split("\n")[0]
        return entry, None
    entry.survey_fingerprint = fp
    layout = OutputLayout(output, fp)
    if storage.exists(layout.manifest):
        entry.reason = f"already reconstructed ({layout.survey_dir})"
        return entry, None
    active = active_reconstruction(survey_tag(fp))
    if active is not None:
        entry.reason = f"reconstruction {active} still running"
        return entry, None
    return entry, fp


def _start_all(
    todo: list[tuple[InboxEntry, str]],
    deployment: str,
    output: str,
    settings: ReconstructSettings,
    wait: bool,
    max_concurrent: int,
) -> None:
    """Start the reconstructions, ``max_concurrent`` at a time; each entry records its run or
    why it could not start (the others still run)."""
    with ThreadPoolTaskRunner[tuple[str, str]](max_workers=max_concurrent) as runner:
        futures = [
            runner.submit(
                start_reconstruction,
                parameters={
                    "deployment": deployment,
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
