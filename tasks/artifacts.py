"""Artifacts and states of prefect-odm runs: what the UI shows while and after submodels run.

* progress artifacts (a run's submodels done against planned; one submodel's node progress);
* the live submodel table, one artifact updated in place as submodels start, fail, retry and
  finish (:class:`LiveSubmodelTable`, fed by :class:`prefect_odm.progress.SubmodelBoard`);
* the ``Cached`` state of reused work (a named Completed state, fingerprint in its message);
* pictures embedded in markdown as ``data:`` URIs (Prefect's UI renders them; a relative link
  would be looked up on the UI's own server);
* run names that say which survey and submodel.
"""

from __future__ import annotations

import base64
import contextvars
import json
import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, cast
from uuid import UUID

from prefect import task
from prefect.artifacts import (
    create_progress_artifact,
    create_table_artifact,
    update_progress_artifact,
)
from prefect.cache_policies import NO_CACHE
from prefect.client.schemas.objects import State
from prefect.states import Completed

from prefect_odm import progress, storage
from prefect_odm.errors import StorageError
from prefect_odm.models import SubmodelResult
from prefect_odm.progress import SubmodelBoard

PROGRESS_UPDATE_SECONDS = 2.0
"""A submodel's progress artifact is updated at most this often, its last state always."""

TABLE_UPDATE_SECONDS = 2.0
"""The live submodel table and its progress are sent at most this often, the last change always
(every change of state sent them: about 25 updates per submodel, 2,550 per 10k run, issue 33)."""

CACHED = "Cached"
"""Name of the Completed state of reused work (Prefect shows it as the run's state)."""

PICTURE_MAX_BYTES = 2_000_000
"""Pictures larger than this are linked by their storage URL instead of embedded."""


def new_progress(description: str, key: str | None = None) -> UUID:
    """Create a progress artifact at 0%; returns its id.

    Called from sync flows and tasks, where Prefect runs the sync implementation: the
    ``UUID | Coroutine`` of its type is its sync/async dispatch.
    """
    return cast(UUID, create_progress_artifact(progress=0.0, key=key, description=description))


def set_progress(artifact_id: UUID, percent: float, description: str | None = None) -> None:
    """Set a progress artifact to ``percent`` (0 to 100)."""
    update_progress_artifact(artifact_id, progress=percent, description=description)


def cached_state(what: str, fingerprint: str, data: Any = None) -> State[Any]:
    """The ``Cached`` state of reused work: Completed, named :data:`CACHED`, the fingerprint in
    its message (``"submodel-002: stored result reused, fingerprint 3f2a..."``)."""
    return Completed(
        name=CACHED, message=f"{what}: stored result reused, fingerprint {fingerprint}", data=data
    )


@task(name="reuse_stored", cache_policy=NO_CACHE, task_run_name="reuse-{what}")
def reuse_stored(what: str, fingerprint: str) -> State[Any]:
    """A task run in the ``Cached`` state for stored work that is reused (a submodel's result,
    the merge), so the run's task list shows the reuse and its fingerprint.

    Args:
        what: e.g. ``submodel-002`` or ``merge``.
        fingerprint: the reused work's fingerprint.
    """
    return cached_state(what, fingerprint)


def rename_this_run(name: str) -> None:
    """Rename the current flow run (a no-op outside one)."""
    from prefect.client.orchestration import get_client
    from prefect.context import FlowRunContext

    ctx = FlowRunContext.get()
    if ctx is None or ctx.flow_run is None or ctx.flow_run.name == name:
        return
    with get_client(sync_client=True) as client:
        client.update_flow_run(ctx.flow_run.id, name=name)
    ctx.flow_run.name = name


def embedded_png(url: str, alt: str) -> str:
    """A markdown image of the PNG at ``url`` as a ``data:`` URI (a link when it is larger than
    :data:`PICTURE_MAX_BYTES`; empty when it cannot be read)."""
    try:
        data = storage.read_bytes(url)
    except (OSError, ValueError, StorageError):
        return ""
    if len(data) > PICTURE_MAX_BYTES:
        return f"[{alt}]({url})"
    return f"![{alt}](data:image/png;base64,{base64.b64encode(data).decode()})"


class LiveSubmodelTable:
    """One table artifact of the run's submodels, updated in place (not a new version per
    change) whenever the board changes; a progress artifact beside it counts done against
    planned.

    Args:
        board: the submodels' states.
        key: artifact key of the table (``submodels-{survey fingerprint[:12]}``); the progress
            artifact's is ``submodels-done-{survey fingerprint[:12]}``.
    """

    def __init__(self, board: SubmodelBoard, key: str) -> None:
        """Create the table and progress artifacts from the board's current rows (Prefect API
        calls)."""
        self.board = board
        self._lock = threading.Lock()
        self._sending = threading.Lock()  # one send at a time, never under ``_lock``
        self._timer: threading.Timer | None = None
        self._sent_at = time.monotonic()
        self.sent = 0
        """Updates sent (each: the table and the progress artifact)."""
        rows = board.table()
        self._last = json.dumps(rows)
        self.table_id = cast(
            UUID,
            create_table_artifact(
                table=[dict(r) for r in rows], key=key, description=self._description()
            ),
        )
        self.progress_id = cast(
            UUID,
            create_progress_artifact(
                progress=board.counts().percent_done,
                key=key.replace("submodels-", "submodels-done-", 1),
                description=self._description(),
            ),
        )

    def _description(self) -> str:
        return f"Submodels: {self.board.counts().summary()}"

    def publish(self, now: bool = False) -> None:
        """Send the board to the UI when it changed since the last send: at the end of
        :data:`TABLE_UPDATE_SECONDS` after the last send (at once when that has passed), from a
        timer thread, so a burst of changes is one update; ``now``: in this thread, at once.

        The caller never waits for the API, nor for a send in flight: every submodel's state
        change comes here, and with the send in the caller under the board's lock the
        submodels' runs queued one behind the other on it (0.12 of the task runner workers'
        samples at 1.8k on a loaded machine, issue 33).
        """
        with self._lock:
            wait = self._sent_at + TABLE_UPDATE_SECONDS - time.monotonic()
            if not now:
                if self._timer is None:
                    run = contextvars.copy_context().run  # the flow's Prefect settings
                    self._timer = threading.Timer(max(0.0, wait), run, (self._send_pending,))
                    self._timer.daemon = True  # a pending refresh never holds the process
                    self._timer.start()
                return
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
        with self._sending:
            self._send()

    def _send_pending(self) -> None:
        """The timer's send. A run that ended meanwhile (interrupted: its Prefect client closed)
        has no table left to refresh: that one update is dropped, with a debug line."""
        with self._lock:
            self._timer = None
        with self._sending:
            try:
                self._send()
            except RuntimeError as exc:  # "The client cannot be started again after closing"
                logging.getLogger(__name__).debug("live table update dropped: %s", exc)

    def _send(self) -> None:
        from prefect.client.orchestration import get_client
        from prefect.client.schemas.actions import ArtifactUpdate

        rows = self.board.table()
        data = json.dumps(rows)
        if data == self._last:
            return
        self._last, self._sent_at = data, time.monotonic()
        description = self._description()
        with get_client(sync_client=True) as client:
            client.update_artifact(
                self.table_id, ArtifactUpdate(data=data, description=description)
            )
        set_progress(self.progress_id, self.board.counts().percent_done, description)
        self.sent += 1

    def show_result(self, result: SubmodelResult, builtin: bool) -> None:
        """Put a submodel's result on the board (``reused`` shows as ``cached``) and publish.

        Args:
            result: the submodel's result.
            builtin: it ran on the built-in engine (shown as such, not as its loopback port).
        """
        state = {"reused": "cached"}.get(result.status, result.status)
        node = "built-in engine" if builtin and result.node_url else (result.node_url or "")
        self.board.update(
            result.submodel_id,
            state=state,
            node=node,
            attempts=result.attempts,
            seconds=result.duration_seconds,
            error=result.error or "",
            fraction=0.0 if state == "failed" else 1.0,
        )
        self.publish()


@contextmanager
def submodel_progress(submodel_id: str) -> Iterator[None]:
    """A progress artifact for one submodel run, fed by the runner's progress events: at most
    one update every :data:`PROGRESS_UPDATE_SECONDS` (a change of state too: several came
    within a second), the last event always (sent when the run ends)."""
    artifact_id = new_progress(f"{submodel_id}: starting")
    last_time, sent, pending = 0.0, ("", -1.0), ("", -1.0)

    def send(state: str, percent: float) -> None:
        nonlocal last_time, sent
        last_time, sent = time.monotonic(), (state, percent)
        set_progress(artifact_id, percent, f"{submodel_id}: {state}")

    def listen(event: progress.ProgressEvent) -> None:
        nonlocal pending
        if not isinstance(event, progress.SubmodelEvent) or event.submodel_id != submodel_id:
            return
        pending = (event.state, round(100.0 * event.fraction, 1))
        if time.monotonic() - last_time >= PROGRESS_UPDATE_SECONDS:
            send(*pending)

    unsubscribe = progress.subscribe(listen)
    try:
        yield
    finally:
        unsubscribe()
        if pending != sent and pending[0]:
            send(*pending)
