"""The engine's durable task table.

One JSON file, ``{data_dir}/tasks.json``, rewritten on every change: written to a temporary file
in the same folder, flushed and fsync'ed, then moved over the old one with :func:`os.replace`
(atomic on POSIX), and the folder fsync'ed. A crash at any instant leaves either the old or the
new table, and never loses a change that was answered to a client. (NodeODM saves its table only
at shutdown and hourly, so a crash forgets recent tasks.)

The table before the last change stays as ``tasks.json.bak`` (a hard link to the old file, so
no copy is written). A table torn anyway (a file system that does not order data before the
rename, a copy cut short, a full disk) never stops the engine: at start-up every complete record
of the torn table is kept, the backup fills in the tasks whose record was cut off (when their
folder is still there), and a task folder left without any record is moved to
``{data_dir}/lost/{uuid}/`` and listed with its reason in ``{data_dir}/lost.json``; the
recovered table is written back at once.

Task folders live in ``{data_dir}/tasks/{uuid}/``.
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypedDict

from pydantic import JsonValue, TypeAdapter, ValidationError

from prefect_odm.engine.api_records import GivenOption, TypedOptions
from prefect_odm.engine.options import ValidatedOptions
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
BACKUP_NAME = "tasks.json.bak"
LOST_DIR = "lost"
LOST_FILE = "lost.json"
TABLE_VERSION = 1

_DECODER = json.JSONDecoder()


Row = dict[str, JsonValue]
"""A task row as read from the table's JSON, not yet checked (:meth:`TaskRecord.from_dict`)."""


class LostTask(TypedDict):
    """One entry of ``lost.json``: a task folder set aside because its record was lost."""

    uuid: str
    reason: str
    folder: str


def salvage_rows(text: str) -> tuple[list[Row], bool]:
    """The task rows of a table's text, and whether the text was whole.

    A whole table is parsed as JSON; of a torn one (cut at any byte), every task object that is
    complete before the cut is returned, in order.
    """
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        pass
    else:
        listed = data.get("tasks", []) if isinstance(data, dict) else []
        return [r for r in listed if isinstance(r, dict) and "uuid" in r], True
    start = text.find('"tasks"')
    start = text.find("[", start) if start >= 0 else -1
    rows: list[Row] = []
    pos = start + 1 if start >= 0 else len(text)
    while pos < len(text):
        while pos < len(text) and text[pos] in " \t\r\n,":
            pos += 1
        if pos >= len(text) or text[pos] != "{":
            break
        try:
            row, pos = _DECODER.raw_decode(text, pos)
        except json.JSONDecodeError:
            break
        if isinstance(row, dict) and "uuid" in row:
            rows.append(row)
    return rows, False


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
    options: list[GivenOption] = field(default_factory=list)
    typed_options: TypedOptions = field(default_factory=dict)
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

    def to_dict(self) -> Row:
        """A JSON-ready copy."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Row) -> TaskRecord:
        """Build from :meth:`to_dict` output, ignoring unknown keys (forward compatible).

        Raises:
            pydantic.ValidationError: a field is missing or its value is not of the field's type.
        """
        return _RECORD.validate_python(data)


_RECORD = TypeAdapter(TaskRecord)
"""Checks a table row against :class:`TaskRecord`'s fields (unknown keys are ignored)."""


class OptionFields(TypedDict, total=False):
    """The :class:`TaskRecord` fields that a task's options set, at init and at restart
    (:func:`option_fields` sets all four; empty: a restart keeps the task's options)."""

    options: list[GivenOption]
    typed_options: TypedOptions
    ignored_options: list[str]
    rerun_from: str | None


def option_fields(validated: ValidatedOptions) -> OptionFields:
    """The record fields of validated options (``rerun_from``: the ``rerun-from`` option, None
    when empty)."""
    rerun_from = validated.typed.get("rerun-from")
    return {
        "options": validated.given,
        "typed_options": validated.typed,
        "ignored_options": validated.ignored,
        "rerun_from": str(rerun_from) if rerun_from else None,
    }


class TaskStore:
    """Thread-safe task table persisted atomically on every change.

    Args:
        data_dir: the engine's data folder (created when missing).

    A torn table is recovered (see the module's description); it never stops the engine.

    Raises:
        StorageError: the table exists but the file cannot be read (permissions, I/O).
    """

    def __init__(self, data_dir: Path) -> None:
        """Create the task folder when missing and load the table (a torn one is recovered)."""
        self.data_dir = Path(data_dir)
        self.tasks_dir = self.data_dir / "tasks"
        self.tasks_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.data_dir / TABLE_NAME
        self._lock = threading.RLock()
        self._tasks: dict[str, TaskRecord] = {}
        self._load()

    # -- persistence ----------------------------------------------------------------------
    def _load(self) -> None:
        for leftover in self.data_dir.glob(f".{TABLE_NAME}.*.tmp"):
            leftover.unlink(missing_ok=True)
        backup = self.data_dir / BACKUP_NAME
        if not self.path.exists() and not backup.exists():
            return
        rows, whole = self._read_rows(self.path)
        if whole:
            for row in rows:
                self._keep(row)
            return
        for row in rows:
            self._keep(row)
        from_backup = 0
        for row in self._read_rows(backup)[0]:
            uuid = str(row["uuid"])
            if uuid not in self._tasks and self.task_dir(uuid).is_dir():
                from_backup += self._keep(row)
        lost = self._set_aside_orphans()
        logger.warning(
            "the task table %s was torn: %d task(s) recovered from it, %d from %s, %d lost "
            "(moved to %s, listed in %s)",
            self.path,
            len(rows),
            from_backup,
            BACKUP_NAME,
            len(lost),
            self.data_dir / LOST_DIR,
            self.data_dir / LOST_FILE,
        )
        self._save()

    def _read_rows(self, path: Path) -> tuple[list[Row], bool]:
        """Rows of one table file and whether it was whole (a missing file is torn, empty)."""
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return [], False
        except OSError as exc:
            raise StorageError(f"cannot read the task table {path}: {exc}") from exc
        return salvage_rows(text)

    def _keep(self, row: Row) -> int:
        """Add a recovered row (1), or skip one that does not make a record (0)."""
        try:
            record = TaskRecord.from_dict(row)
        except ValidationError:
            return 0
        self._tasks[record.uuid] = record
        return 1

    def _set_aside_orphans(self) -> list[str]:
        """Move task folders without a record to ``lost/`` and list them in ``lost.json``."""
        lost_dir = self.data_dir / LOST_DIR
        lost_file = self.data_dir / LOST_FILE
        listed: list[LostTask] = []
        with contextlib.suppress(OSError, ValueError):
            listed = list(json.loads(lost_file.read_text(encoding="utf-8")))
        moved = []
        for folder in sorted(p for p in self.tasks_dir.iterdir() if p.is_dir()):
            if folder.name in self._tasks:
                continue
            lost_dir.mkdir(exist_ok=True)
            target = lost_dir / folder.name
            if target.exists():
                shutil.rmtree(target, ignore_errors=True)
            shutil.move(str(folder), str(target))
            moved.append(folder.name)
            listed.append(
                {
                    "uuid": folder.name,
                    "reason": "its record was lost when the task table was torn",
                    "folder": str(target),
                }
            )
        if moved:
            lost_file.write_text(json.dumps(listed, indent=1), encoding="utf-8")
        return moved

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
            self._keep_backup()
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

    def _keep_backup(self) -> None:
        """Make ``tasks.json.bak`` the current table (a hard link; a copy where links fail)."""
        if not self.path.exists():
            return
        link = self.data_dir / f".{BACKUP_NAME}.link"
        link.unlink(missing_ok=True)
        try:
            os.link(self.path, link)
        except OSError:
            shutil.copyfile(self.path, link)
        os.replace(link, self.data_dir / BACKUP_NAME)

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
        """Whether the table holds a task with this UUID (pending uploads included)."""
        with self._lock:
            return uuid in self._tasks

    def __iter__(self) -> Iterator[TaskRecord]:
        """Copies of all records, in creation order (:meth:`all`)."""
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
