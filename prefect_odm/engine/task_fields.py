"""The text fields of ``/task/new/init`` (and ``/task/new``) other than ``options``, as NodeODM
reads them: ``name``, ``outputs``, ``webhook``, ``dateCreated``, ``skipPostProcessing``."""

from __future__ import annotations

import contextlib
import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime

from prefect_odm.engine import task_files
from prefect_odm.errors import EngineError


@dataclass(frozen=True)
class TaskFields:
    """The parsed fields (each as :class:`.store.TaskRecord` keeps it)."""

    name: str
    date_created_ms: int
    webhook: str | None
    outputs: list[str] | None
    skip_post_processing: bool


def parse_task_fields(fields: dict[str, str]) -> TaskFields:
    """Parse the init fields; a missing name becomes ``Task of <ISO time>`` as on NodeODM.

    Raises:
        EngineError: ``outputs`` is not a JSON list of paths, or ``webhook`` is not http(s).
    """
    outputs: list[str] | None = None
    if fields.get("outputs"):
        try:
            outputs = json.loads(fields["outputs"])
        except json.JSONDecodeError as exc:
            raise EngineError(f"Invalid outputs parameter: {exc}") from exc
        if not isinstance(outputs, list) or not all(isinstance(o, str) for o in outputs):
            raise EngineError("Invalid outputs parameter: expected a JSON list of paths")
    webhook = (fields.get("webhook") or "").strip() or None
    if webhook is not None and not re.match(r"^https?://", webhook):
        raise EngineError(f"Invalid webhook URL: {webhook}")
    date_created = task_files.now_ms()
    if fields.get("dateCreated"):
        with contextlib.suppress(ValueError):
            date_created = int(float(fields["dateCreated"]))
    name = (fields.get("name") or "").strip()
    if not name:
        name = "Task of " + datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
    skip = str(fields.get("skipPostProcessing", "")).strip().lower() in ("true", "1")
    return TaskFields(name, date_created, webhook, outputs, skip)
