"""Waiting for a task and telling why it failed: what every polled node backend shares.

:class:`NodeClient <prefect_odm.nodes.client.NodeClient>` (NodeODM, ClusterODM, the built-in
engine) and :class:`ScaleODMClient <prefect_odm.nodes.scaleodm.ScaleODMClient>` read a task's
state and console lines each their own way; the wait loop (:func:`.backend.poll_until_done`) and
the reading of a failure (cancelled, out of memory, or failed) are the same, and live here once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from prefect_odm.errors import NodeError, OutOfMemoryError, ProcessingFailedError
from prefect_odm.nodes.backend import CANCELED, TaskState, poll_until_done

E = TypeVar("E", bound=NodeError)

LAST_LINES_READ = 20
"""Console lines read from a failed task (kept in the error)."""

LAST_LINES_SEARCHED = 5
"""Of those, the last lines searched for an out-of-memory text (with the error message)."""


class PolledBackend:
    """A node backend whose task ends are seen by polling its state.

    Subclasses give :meth:`task_state` and :meth:`output`, and set :attr:`url`,
    :attr:`oom_markers` and :attr:`no_message`.
    """

    url: str
    """The node's public URL (no token), for errors."""
    oom_markers: tuple[str, ...] = ()
    """Lower-case texts that mean the task ran out of memory."""
    no_message: str = "task failed (the node gave no error message)"
    """The error of a failed task whose node gave no message."""

    def error(self, kind: type[E], message: str, uuid: str | None = None) -> E:
        """A node error of ``kind`` naming this node and the task ``uuid`` (when there is one)."""
        return kind(message, node_url=self.url, task_uuid=uuid)

    def task_state(self, uuid: str, *, with_output: int | None = None) -> TaskState | None:
        """The task's state, or ``None`` when the node does not know the task."""
        raise NotImplementedError

    def output(self, uuid: str, line: int = -30) -> list[str]:
        """Console lines of the task (negative ``line``: the last lines)."""
        raise NotImplementedError

    def wait(
        self,
        uuid: str,
        *,
        poll_interval_seconds: float = 2.0,
        max_wait_seconds: float = 24 * 3600.0,
        max_poll_errors: int = 5,
        on_progress: Callable[[TaskState], None] | None = None,
    ) -> TaskState:
        """Poll until the task ends; a poll error is transient, never the task's failure.

        Polls every ``poll_interval_seconds``, more often as the task nears its end and less
        often once it has run long (:func:`~prefect_odm.nodes.backend.next_poll_seconds`).

        Returns:
            The COMPLETED state.

        Raises:
            OutOfMemoryError: the task failed for lack of memory.
            ProcessingFailedError: the task failed or was cancelled.
            TransientNodeError: the node stopped answering (``max_poll_errors`` polls in a row),
                forgot the task, or ``max_wait_seconds`` passed.
        """
        return poll_until_done(
            uuid,
            node_url=self.url,
            task_state=self.task_state,
            classify_failure=self.classify_failure,
            poll_interval_seconds=poll_interval_seconds,
            max_wait_seconds=max_wait_seconds,
            max_poll_errors=max_poll_errors,
            on_progress=on_progress,
        )

    def classify_failure(self, state: TaskState) -> NodeError:
        """The error of a FAILED or CANCELED task, with its last console lines: cancelled; out
        of memory when :attr:`oom_markers` appear in its message or last lines; else failed."""
        try:
            last = self.output(state.uuid, -LAST_LINES_READ)
        except NodeError:
            last = []
        if state.status == CANCELED:
            return ProcessingFailedError(
                "task was cancelled", node_url=self.url, task_uuid=state.uuid, last_output=last
            )
        message = state.error_message or self.no_message
        text = " ".join([message, *last[-LAST_LINES_SEARCHED:]]).lower()
        kind = (
            OutOfMemoryError if any(m in text for m in self.oom_markers) else ProcessingFailedError
        )
        return kind(message, node_url=self.url, task_uuid=state.uuid, last_output=last)
