"""What the submodel runner needs of a processing node (pure core: no HTTP, no pyodm).

:class:`NodeBackend` is the interface between the runner (:mod:`prefect_odm.nodes.runner`) and a
node; :class:`prefect_odm.nodes.client.NodeClient` (NodeODM's HTTP API through pyodm) implements it,
and tests may pass any object with the same methods. Results are typed: :class:`NodeInfo`,
:class:`NodeOption`, :class:`TaskState`. Failures are the node errors of
:mod:`prefect_odm.errors` (:class:`~prefect_odm.errors.TransientNodeError`: worth retrying, maybe
elsewhere; :class:`~prefect_odm.errors.OutOfMemoryError`;
:class:`~prefect_odm.errors.ProcessingFailedError`; any other
:class:`~prefect_odm.errors.NodeError`: the node refused).
"""

from __future__ import annotations

import time
import uuid as uuidlib
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, Required, TypedDict, Unpack

from pydantic import JsonValue

from prefect_odm.errors import NodeError, TransientNodeError

QUEUED, RUNNING, FAILED, COMPLETED, CANCELED = 10, 20, 30, 40, 50
"""NodeODM task status codes."""

STATUS_WORDS = {
    QUEUED: "queued",
    RUNNING: "running",
    FAILED: "failed",
    COMPLETED: "completed",
    CANCELED: "cancelled",
}
"""The status codes in words, for logs and messages (NodeODM ``libs/statusCodes.js``)."""

TASK_UUID_NAMESPACE = uuidlib.UUID("6f1c2a52-3d7e-5b8e-9a41-0d2c6e5f7a10")


def task_uuid(submodel_fingerprint: str, attempt: int) -> str:
    """The NodeODM task UUID of a submodel attempt: UUIDv5 of fingerprint and attempt number.

    The same submodel and attempt always map to the same UUID, so a rerun finds the task a
    killed run created instead of submitting a duplicate.
    """
    return str(uuidlib.uuid5(TASK_UUID_NAMESPACE, f"{submodel_fingerprint}:{attempt}"))


@dataclass(frozen=True)
class TaskState:
    """A task's status as the node reports it (raw JSON kept in ``info``).

    Attributes:
        uuid: the task UUID.
        status: one of the status codes (:data:`QUEUED` ... :data:`CANCELED`).
        progress: percent done, 0 to 100.
        error_message: the node's error message (empty when none).
        images_count: images the task holds.
        processing_time_ms: processing time so far, milliseconds (-1 when unknown).
        info: the node's ``/task/{uuid}/info`` answer.
    """

    uuid: str
    status: int
    progress: float
    error_message: str
    images_count: int
    processing_time_ms: int
    info: dict[str, JsonValue]

    @property
    def finished(self) -> bool:
        """Whether the task ended (failed, completed or cancelled)."""
        return self.status in (FAILED, COMPLETED, CANCELED)

    @property
    def options(self) -> dict[str, JsonValue]:
        """The options the node holds for the task (``info["options"]``, NodeODM's
        ``[{"name", "value"}]``), name -> value as the node wrote it; empty when it reports
        none."""
        raw = self.info.get("options")
        if not isinstance(raw, list):
            return {}
        return {str(o["name"]): o.get("value") for o in raw if isinstance(o, dict) and "name" in o}


def differing_option(
    held: Mapping[str, Any], wanted: Mapping[str, Any]
) -> tuple[str, Any, Any] | None:
    """The first option (by name) whose value a task holds differs from the one wanted:
    ``(name, held value, wanted value)``, or ``None`` when they agree.

    Only the options both name are compared: NodeODM drops the options it does not know (the
    built-in engine's ``pipeline``) and adds some of its own to every task (NodeODM 2.2.4:
    ``pc-ept``, ``cog``, ``gltf``), so an option on one side only says nothing. A node that
    reports no options agrees. ``rerun-from`` is not an option of the result. Values compare as
    the node may have typed them: ``True`` and ``"true"``, ``5`` and ``"5.0"`` are the same value.
    """
    for name in sorted((set(held) & set(wanted)) - {"rerun-from"}):
        if not _same_option_value(held[name], wanted[name]):
            return name, held[name], wanted[name]
    return None


def _same_option_value(a: Any, b: Any) -> bool:
    def text(value: Any) -> str:
        if isinstance(value, bool):
            return "true" if value else "false"
        try:
            return repr(float(value))
        except (TypeError, ValueError):
            return str(value).strip().lower()

    return text(a) == text(b)


SHORTEST_POLL_SECONDS = 0.2
"""The shortest wait between two status polls of a task (when it is about to finish)."""

LONGEST_POLL_SECONDS = 30.0
"""The longest wait between two status polls of a long-running task."""

POLL_SHARE_OF_PROCESSING = 0.005
"""A running task is polled at least every this share of its processing time so far (and the
caller's interval): finishing is noticed within 0.5 % of the task's time, and an hour-long task
is polled a few hundred times, not once a second (many submodels on one ClusterODM)."""


def next_poll_seconds(state: TaskState, interval_seconds: float) -> float:
    """How long to wait before polling ``state``'s task again.

    A queued task, or one whose node gives no progress or processing time, waits
    ``interval_seconds``. A running task waits a quarter of its estimated time left
    (``processing_time_ms * (100 - progress) / progress``, from its own progress), at least
    :data:`SHORTEST_POLL_SECONDS` and at most the larger of ``interval_seconds`` and
    :data:`POLL_SHARE_OF_PROCESSING` of its processing time (never above
    :data:`LONGEST_POLL_SECONDS`). So a task about to finish is seen finished within a fraction of
    a second, and a long one is not polled every ``interval_seconds`` for hours.

    Args:
        state: the task's last state.
        interval_seconds: the caller's poll interval, seconds.

    Returns:
        Seconds to wait.
    """
    interval = max(float(interval_seconds), SHORTEST_POLL_SECONDS)
    if state.status != RUNNING or state.progress <= 0 or state.processing_time_ms <= 0:
        return interval
    elapsed_seconds = state.processing_time_ms / 1000.0
    longest = min(max(interval, POLL_SHARE_OF_PROCESSING * elapsed_seconds), LONGEST_POLL_SECONDS)
    left_seconds = elapsed_seconds * max(100.0 - state.progress, 0.0) / state.progress
    return min(longest, max(SHORTEST_POLL_SECONDS, left_seconds / 4.0))


def poll_until_done(
    uuid: str,
    *,
    node_url: str,
    task_state: Callable[[str], TaskState | None],
    classify_failure: Callable[[TaskState], NodeError],
    poll_interval_seconds: float,
    max_wait_seconds: float,
    max_poll_errors: int,
    on_progress: Callable[[TaskState], None] | None = None,
) -> TaskState:
    """Poll a task until it ends; a poll error is transient, never the task's failure.

    The one wait loop of every :class:`NodeBackend` (NodeODM and ScaleODM differ only in how they
    read a task's state and classify its failure). Polls at :func:`next_poll_seconds`; a failed
    poll waits ``poll_interval_seconds`` times the errors in a row (at most 10 s).

    Args:
        uuid: the task's UUID.
        node_url: the node's public URL, for errors.
        task_state: reads the task's state; None when the node no longer knows the task; raises
            :class:`~prefect_odm.errors.TransientNodeError` when the node does not answer.
        classify_failure: the error for a FAILED or CANCELED state.
        poll_interval_seconds: the caller's poll interval, seconds.
        max_wait_seconds: how long the task may run before the wait gives up, seconds.
        max_poll_errors: failed polls in a row before the node counts as gone.
        on_progress: called with every state read.

    Returns:
        The COMPLETED state.

    Raises:
        NodeError: what ``classify_failure`` gives for a failed or cancelled task.
        TransientNodeError: the node stopped answering (``max_poll_errors`` polls in a row),
            forgot the task, or ``max_wait_seconds`` passed.
    """
    deadline = time.monotonic() + max_wait_seconds
    errors = 0
    while True:
        try:
            state = task_state(uuid)
            errors = 0
        except TransientNodeError:
            errors += 1
            if errors >= max_poll_errors:
                raise
            time.sleep(min(10.0, poll_interval_seconds * errors))
            continue
        if state is None:
            raise TransientNodeError(
                "the node no longer knows the task", node_url=node_url, task_uuid=uuid
            )
        if on_progress is not None:
            on_progress(state)
        if state.status == COMPLETED:
            return state
        if state.status in (FAILED, CANCELED):
            raise classify_failure(state)
        if time.monotonic() > deadline:
            raise TransientNodeError(
                f"task still running after {max_wait_seconds:.0f} s",
                node_url=node_url,
                task_uuid=uuid,
            )
        time.sleep(next_poll_seconds(state, poll_interval_seconds))


_NUMBER = (int, float, str)
"""JSON values a figure of ``/info`` may be written as (numbers, or numbers as text)."""


@dataclass(frozen=True)
class NodeInfo:
    """A node's ``/info``.

    Attributes:
        engine: the processing engine's name (``odm``, ``prefect-odm``).
        engine_version: its version (``?`` when the node does not say).
        total_memory_bytes: the node's memory, bytes, as the node writes it (``None`` when it
            does not say).
        max_parallel_tasks: tasks the node runs at once (``None`` when the node does not say).
        raw: the whole answer.
    """

    engine: str
    engine_version: str
    total_memory_bytes: float | None
    max_parallel_tasks: int | None
    raw: dict[str, JsonValue] = field(default_factory=dict)

    @classmethod
    def from_json(cls, raw: Mapping[str, JsonValue]) -> NodeInfo:
        """From NodeODM's ``/info`` JSON (``engine``, ``engineVersion``, ``totalMemory``,
        ``maxParallelTasks``; a figure that is not a number is taken as not said).

        Raises:
            ValueError: ``totalMemory`` or ``maxParallelTasks`` is text that is not a number.
        """
        memory = raw.get("totalMemory")
        tasks = raw.get("maxParallelTasks")
        return cls(
            engine=str(raw.get("engine", "odm")),
            engine_version=str(raw.get("engineVersion", "?")),
            total_memory_bytes=float(memory) if isinstance(memory, _NUMBER) and memory else None,
            max_parallel_tasks=int(tasks) if isinstance(tasks, _NUMBER) and tasks else None,
            raw=dict(raw),
        )

    @property
    def identity(self) -> str:
        """``"{engine} {engine_version}"``, the engine part of a submodel fingerprint."""
        return f"{self.engine} {self.engine_version}"


@dataclass(frozen=True)
class NodeOption:
    """One option the node accepts (``/options``).

    Attributes:
        name: the ODM option name (``rerun-from``, ``orthophoto-resolution``).
        domain: the allowed values when the node lists them (``rerun-from``: the stage order).
        raw: the node's description of the option.
    """

    name: str
    domain: tuple[str, ...] | None
    raw: dict[str, JsonValue] = field(default_factory=dict)

    @classmethod
    def from_json(cls, raw: Mapping[str, JsonValue]) -> NodeOption:
        """From one entry of NodeODM's ``/options`` JSON."""
        domain = raw.get("domain")
        return cls(
            name=str(raw.get("name", "")),
            domain=tuple(str(d) for d in domain) if isinstance(domain, list) else None,
            raw=dict(raw),
        )


@dataclass(frozen=True)
class NodeSettings:
    """What a pool block says of one node; ``None`` fields come from the node's ``/info``.

    Attributes:
        token: the node's token (sent only to that node).
        memory_gib: memory this library may use on the node, GiB.
        max_parallel_tasks: tasks run at once on the node.
    """

    token: str | None = None
    memory_gib: float | None = None
    max_parallel_tasks: int | None = None


class NewTask(TypedDict, total=False):
    """The keywords of :meth:`NodeBackend.create_task` besides the UUID, files and options.

    Attributes:
        name: the task name the node shows (required).
        outputs: limit the task's all.zip to these folders (NodeODM ``outputs``).
        deadline_seconds: the whole upload must finish within this time, seconds.
        progress: called with (files uploaded, total files).
    """

    name: Required[str]
    outputs: Sequence[str]
    deadline_seconds: float
    progress: Callable[[int, int], None] | None


class NodeBackend(Protocol):
    """A processing node as the submodel runner uses it (NodeODM's task model).

    Every method raises :class:`~prefect_odm.errors.TransientNodeError` when the node cannot be
    reached (connection, timeout, HTTP 5xx) and :class:`~prefect_odm.errors.NodeError` when it
    answers with a refusal.
    """

    url: str
    """The node's URL without token or query: safe to log."""

    def info(self) -> NodeInfo:
        """The node's ``/info``."""
        ...

    def options(self) -> list[NodeOption]:
        """The options the node accepts."""
        ...

    def task_list(self) -> list[str]:
        """UUIDs of the tasks the node knows."""
        ...

    def task_state(self, uuid: str, *, with_output: int | None = None) -> TaskState | None:
        """The task's state, or ``None`` when the node does not know the UUID."""
        ...

    def output(self, uuid: str, line: int = -30) -> list[str]:
        """Console lines of the task (negative ``line``: the last lines)."""
        ...

    def create_task(
        self, uuid: str, files: Sequence[str], options: Mapping[str, Any], **new: Unpack[NewTask]
    ) -> str:
        """Create the task ``uuid`` (init, upload every file, commit); returns the UUID."""
        ...

    def wait(
        self,
        uuid: str,
        *,
        poll_interval_seconds: float = 2.0,
        on_progress: Callable[[TaskState], None] | None = None,
    ) -> TaskState:
        """Poll until the task completes; raises the classified error when it fails."""
        ...

    def classify_failure(self, state: TaskState) -> NodeError:
        """The error for a failed or cancelled task, with the node's last output lines."""
        ...

    def download(self, uuid: str, dest: Path) -> Path:
        """Download the task's outputs (all.zip), verified, extracted into ``dest``."""
        ...

    def cancel(self, uuid: str) -> bool:
        """Cancel the task; whether the node accepted."""
        ...

    def remove(self, uuid: str) -> bool:
        """Remove the task and its files; whether the node accepted."""
        ...

    def restart(self, uuid: str, options: Mapping[str, Any] | None = None) -> bool:
        """Restart a finished task, optionally with new options; whether the node accepted."""
        ...


def find_tasks(
    clients: Mapping[str, NodeBackend], uuids: Sequence[str]
) -> dict[tuple[str, str], TaskState]:
    """Which nodes know which of ``uuids``: one ``/task/list`` per node, the nodes asked at once.

    Only the UUIDs a node lists are asked for their state; a node whose list fails is asked
    for each UUID (``/task/{uuid}/info``, as ClusterODM may need), and a node that does not
    answer is passed over. Asking every node for every UUID cost a run of 18 submodels on 4
    nodes 32 requests per submodel, between one task ending on a node and the next starting
    (issue 14).

    Args:
        clients: node key -> node.
        uuids: the task UUIDs looked for.

    Returns:
        (node key, UUID) -> the task's state, for every UUID a node knows.
    """

    def on(key: str, client: NodeBackend) -> dict[tuple[str, str], TaskState]:
        try:
            listed = set(client.task_list())
            asked = [u for u in uuids if u in listed]
        except NodeError:
            asked = list(uuids)
        found: dict[tuple[str, str], TaskState] = {}
        for uuid in asked:
            try:
                state = client.task_state(uuid)
            except NodeError:
                continue
            if state is not None:
                found[(key, uuid)] = state
        return found

    if not clients or not uuids:
        return {}
    with ThreadPoolExecutor(max_workers=len(clients), thread_name_prefix="find-tasks") as ex:
        answers = list(ex.map(lambda item: on(*item), sorted(clients.items())))
    return {k: v for answer in answers for k, v in answer.items()}


def live_attempt(
    clients: Mapping[str, NodeBackend], submodel_fingerprint: str, attempts: int
) -> int:
    """The attempt whose task a killed run left on some node, so a rerun continues it.

    Each attempt has its own UUID (:func:`task_uuid`); a run killed after it moved to a later
    attempt (a failure, a half-made task) leaves that attempt's task behind, and starting again
    from attempt 0 would submit a second task for the submodel. A completed task is preferred,
    then a queued or running one, then a failed or cancelled one (restarted by the runner where
    its images are: a run ended by a signal cancels its tasks); nodes that do not answer are
    passed over. The nodes are asked with :func:`find_tasks`.

    Args:
        clients: node key -> node.
        submodel_fingerprint: the submodel's fingerprint.
        attempts: how many attempt UUIDs to look at (0 .. attempts - 1).

    Returns:
        The attempt number to start from (0 when no node has any of them).
    """
    attempt_of = {task_uuid(submodel_fingerprint, a): a for a in range(attempts)}
    return preferred_attempt(find_tasks(clients, list(attempt_of)), attempt_of)


def preferred_attempt(
    found: Mapping[tuple[str, str], TaskState], attempt_of: Mapping[str, int]
) -> int:
    """The attempt :func:`live_attempt` continues, from what :func:`find_tasks` ``found`` of the
    UUIDs ``attempt_of`` (UUID -> attempt number): completed first, then queued or running,
    then failed or cancelled; 0 when none was found."""
    rank = {COMPLETED: 0, RUNNING: 1, QUEUED: 1, FAILED: 2, CANCELED: 2}
    ranked = [
        (rank[state.status], attempt_of[uuid])
        for (_key, uuid), state in found.items()
        if state.status in rank and uuid in attempt_of
    ]
    return min(ranked)[1] if ranked else 0
