"""Survey inboxes (no Prefect): the folders of an inbox, what a reconstruction started from an
inbox is given, and the report of what the inbox run did with each folder.

An inbox is a local folder or an fsspec prefix (``s3://bucket/inbox``) whose direct sub-folders
are surveys. Reconstructions started from an inbox carry the tag :func:`survey_tag` of their
survey fingerprint, so a survey still being reconstructed is not started twice.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from prefect_odm import storage
from prefect_odm.errors import InputError
from prefect_odm.models import ProcessingOptions
from prefect_odm.settings import DEFAULT_SPLIT, DEFAULT_SPLIT_OVERLAP_M

SURVEY_TAG_PREFIX = "prefect-odm-survey:"
"""Tag on every reconstruction started from an inbox, followed by the survey fingerprint[:16]."""


def survey_tag(survey_fingerprint: str) -> str:
    """The tag of the reconstructions of a survey: :data:`SURVEY_TAG_PREFIX` + fingerprint[:16]."""
    return f"{SURVEY_TAG_PREFIX}{survey_fingerprint[:16]}"


class ReconstructSettings(BaseModel):
    """Parameters given to every reconstruction the inbox starts (see the ``reconstruct`` flow)."""

    split: int | Literal["auto"] = Field(
        DEFAULT_SPLIT, description="Target images per submodel, or 'auto'."
    )
    split_overlap_m: float | None = Field(
        None,
        ge=0,
        description=(
            f"Overlap between submodels, metres; unset: {DEFAULT_SPLIT_OVERLAP_M:g}, widened by "
            "the plan until every pair of neighbours can be aligned."
        ),
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
        """The entries whose reconstruction was started."""
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
