"""Progress artifacts of prefect-odm runs (what the UI shows while submodels run)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import cast
from uuid import UUID

from prefect.artifacts import create_progress_artifact, update_progress_artifact

from prefect_odm import progress

PROGRESS_UPDATE_SECONDS = 2.0
"""A submodel's progress artifact is updated at most this often (and on every change of state)."""


def new_progress(description: str, key: str | None = None) -> UUID:
    """Create a progress artifact at 0%; returns its id.

    Called from sync flows and tasks, where Prefect runs the sync implementation: the
    ``UUID | Coroutine`` of its type is its sync/async dispatch.
    """
    return cast(UUID, create_progress_artifact(progress=0.0, key=key, description=description))


def set_progress(artifact_id: UUID, percent: float, description: str | None = None) -> None:
    """Set a progress artifact to ``percent`` (0 to 100)."""
    update_progress_artifact(artifact_id, progress=percent, description=description)


@contextmanager
def submodel_progress(submodel_id: str) -> Iterator[None]:
    """A progress artifact for one submodel run, fed by the runner's progress events (at most
    one update every :data:`PROGRESS_UPDATE_SECONDS`, and on every change of state)."""
    artifact_id = new_progress(f"{submodel_id}: starting")
    last_time, last_state = 0.0, ""

    def listen(event: dict[str, object]) -> None:
        nonlocal last_time, last_state
        if event.get("kind") != "submodel" or event.get("id") != submodel_id:
            return
        now = time.monotonic()
        state = str(event.get("state", ""))
        if state == last_state and now - last_time < PROGRESS_UPDATE_SECONDS:
            return
        last_time, last_state = now, state
        # Submodel events carry their fraction (0 to 1) as a float (prefect_odm.progress).
        fraction = float(cast(float, event.get("fraction", 0.0)))
        set_progress(artifact_id, round(100.0 * fraction, 1), f"{submodel_id}: {state}")

    unsubscribe = progress.subscribe(listen)
    try:
        yield
    finally:
        unsubscribe()
