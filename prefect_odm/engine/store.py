"""The engine's durable task table.

One JSON file, ``{data_dir}/tasks.json``, rewritten on every change: written to a temporary file
in the same folder, flushed and fsync'ed, then moved over the old one with :func:`os.replace`
(atomic on POSIX), and the folder fsync'ed. A crash at any instant leaves either the old or the
new table, never a torn one, and never loses a change that was answered to a client. (NodeODM
saves its table only at shutdown and hourly, so a crash forgets recent tasks.)

Task folders live in ``{data_dir}/tasks/{uuid}/``.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from prefect_odm.errors import StorageError

logger = logging.getLogger(__name__)

PENDING = 0
"""Internal status of a task whose chunked upload is not committed yet (not visible in the API)."""
QUEUED = 10
RUNNING = 20
FAILED = 30
COMPLETED = 40
CANCELED = 50
FINISHED = frozenset({FAILED, COMPLETED, CANCELED})

DEFAULT_CLEANUP_HOURS = 48.0
"""Finished tasks and uncommitted uploads older than this are deleted (the engine's default)."""

TABLE_NAME = "tasks.json"
TABLE_VERSION = 1


@dataclass
class TaskRecord:
    """One row of the task table (times are epoch milliseconds).

    Attributes:
        uuid: NodeODM task UUID.
        name: task name given by the client.
        date_created_ms: creation time.
        status: one of PENDING, QUEUED, RUNNING, FAILED, COMPLETED, CANCELED.
        options: the task's effective options as given, ``[{"name", "value"}]``.
        typed_options: every known option name -> typed value (defaults filled in).
        ignored_options: unknown option names that were dropped.
        images_count: number of images uploaded.
        progress: 0-100.
        started_ms: when the current run started (None until it starts).
        processing_time_ms: -1 until processing starts; final duration once finished.
        error_message: why the task failed.
        webhook: URL to POST the task info to when it completes or fails.
        outputs: paths that all.zip is limited to (None: the default set).
        skip_post_processing: NodeODM's ``skipPostProcessing``.
        rerun_from: the task's ``rerun-from`` option (None: from the start).
        resume_stage: for the next run only, the stage an engine crash interrupted; that run
            starts there, reusing the earlier stages' files (cleared when the run starts).
        queue_seq: FIFO position among queued tasks.
        pid: the task process id while it runs; ``pid_create_time`` guards against pid reuse.
        finished_ms: when the task reached a final status.
        run_count: how many runs were started.
        webhook_sent: the webhook of the current run was delivered (or given up).
    """

    uuid: str
    name: str
    date_created_ms: int
    status: int = PENDING
    options: list[dict[str, Any]] = field(default_factory=list)
    typed_options: dict[str, Any] = field(default_factory=dict)
    ignored_options: list[str] = field(default_factory=list)
    images_count: int = 0
    progress: float = 0.0
    started_ms: int | None = None
    processing_time_ms: int = -1
    error_message: str | None = None
    webhook: str | None = None
    outputs: list[str] | None = None
    skip_post_processing: bool = False
    rerun_from: str | None = None
    resume_stage: str | None = None
    queue_seq: int = 0
    pid: int | None = None
    pid_create_time: float | None = None
    finished_ms: int | None = None
    run_count: int = 0
    webhook_sent: bool = False

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready copy."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TaskRecord:
        """Build from :meth:`to_dict` output, ignoring unknown keys (forward compatible)."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


class TaskStore:
    """Thread-safe task table persisted atomically on every change.

    Args:
        data_dir: the engine's data folder (created when missing).

    Raises:
        StorageError: the table exists but cannot be read.
    """

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = Path(data_dir)
        self.tasks_dir = self.data_dir / "tasks"
        self.tasks_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.data_dir / TABLE_NAME
        self._lock = threading.RLock()
        self._tasks: dict[str, TaskRecord] = {}
        self._load()

    # -- persistence ----------------------------------------------------------------------
    def _load(self) -> None:
        if not self.path.exists():
            return
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise StorageError(f"cannot read the task table {self.path}: {exc}") from exc
        for row in data.get("tasks", []):
            record = TaskRecord.from_dict(row)
            self._tasks[record.uuid] = record
        for leftover in self.data_dir.glob(f".{TABLE_NAME}.*.tmp"):
            leftover.unlink(missing_ok=True)

    def _save(self) -> None:
        payload = {
            "version": TABLE_VERSION,
            "tasks": [t.to_dict() for t in self._tasks.values()],
        }
        text = json.dumps(payload, indent=1, sort_keys=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{TABLE_NAME}.", suffix=".tmp", dir=self.data_dir)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(text)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.path)
        except OSError as exc:
            Path(tmp).unlink(missing_ok=True)
            raise StorageError(f"cannot write the task table {self.path}: {exc}") from exc
        try:
            dir_fd = os.open(self.data_dir, os.O_RDONLY)
        except OSError:
            return
        try:
            os.fsync(dir_fd)
        except OSError:
            pass  # some file systems refuse fsync on folders; the replace itself is atomic
        finally:
            os.close(dir_fd)

    # -- access ---------------------------------------------------------------------------
    @property
    def lock(self) -> threading.RLock:
        """The store's lock; hold it to make a read-then-update atomic."""
        return self._lock

    def task_dir(self, uuid: str) -> Path:
        """The folder of a task."""
        return self.tasks_dir / uuid

    def get(self, uuid: str) -> TaskRecord | None:
        """A copy of the record, or None."""
        with self._lock:
            record = self._tasks.get(uuid)
            return copy.deepcopy(record) if record is not None else None

    def all(self) -> list[TaskRecord]:
        """Copies of all records, in creation order."""
        with self._lock:
            records = [copy.deepcopy(r) for r in self._tasks.values()]
        return sorted(records, key=lambda r: (r.date_created_ms, r.uuid))

    def __contains__(self, uuid: object) -> bool:
        with self._lock:
            return uuid in self._tasks

    def __iter__(self) -> Iterator[TaskRecord]:
        return iter(self.all())

    def add(self, record: TaskRecord) -> None:
        """Insert a new record and persist.

        Raises:
            KeyError: the UUID exists already.
        """
        with self._lock:
            if record.uuid in self._tasks:
                raise KeyError(record.uuid)
            self._tasks[record.uuid] = copy.deepcopy(record)
            self._save()

    def update(self, uuid: str, **changes: Any) -> TaskRecord:
        """Change fields of a record and persist; returns a copy of the new record.

        Raises:
            KeyError: unknown UUID.
        """
        with self._lock:
            record = self._tasks[uuid]
            for key, value in changes.items():
                if not hasattr(record, key):
                    raise AttributeError(key)
                setattr(record, key, value)
            self._save()
            return copy.deepcopy(record)

    def mutate(self, uuid: str, fn: Callable[[TaskRecord], None]) -> TaskRecord:
        """Apply ``fn`` to the live record under the lock and persist; returns a copy."""
        with self._lock:
            record = self._tasks[uuid]
            fn(record)
            self._save()
            return copy.deepcopy(record)

    def remove(self, uuid: str) -> TaskRecord | None:
        """Delete a record and persist; returns the removed record or None."""
        with self._lock:
            record = self._tasks.pop(uuid, None)
            if record is not None:
                self._save()
            return record

    def next_queue_seq(self) -> int:
        """A FIFO sequence number larger than every one in the table."""
        with self._lock:
            return 1 + max((t.queue_seq for t in self._tasks.values()), default=0)
