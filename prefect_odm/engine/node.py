"""The built-in engine's state and operations (NodeODM's task life cycle), without HTTP.

:class:`Engine` owns the task table (:mod:`.store`), the task processes (:mod:`.supervisor`) and
the uploaded files (:mod:`.uploads`); :mod:`.routes` only translates HTTP requests into its
calls. What it does better than NodeODM: the task table is written atomically on every change;
each task is its own process group; unknown options are listed in the task output; a failed task
always carries an ``errorMessage`` with the last output lines; upload names that try to leave the
task folder are refused.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import logging
import os
import re
import shutil
import threading
import time
import uuid as uuid_module
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import psutil
from pydantic import JsonValue

import prefect_odm
from prefect_odm.engine import supervisor, task_files
from prefect_odm.engine.api_records import (
    ActionAnswer,
    InfoAnswer,
    OptionEntry,
    TaskInfo,
    TaskStatus,
    UuidAnswer,
)
from prefect_odm.engine.faults import Faults
from prefect_odm.engine.machine_memory import usable_memory_bytes
from prefect_odm.engine.options import (
    OptionSpec,
    load_pipeline,
    option_specs,
    parse_options_text,
    validate_options,
)
from prefect_odm.engine.store import (
    CANCELED,
    COMPLETED,
    DEFAULT_CLEANUP_HOURS,
    FAILED,
    PENDING,
    QUEUED,
    RUNNING,
    OptionFields,
    TaskRecord,
    TaskStore,
    option_fields,
)
from prefect_odm.engine.task_fields import parse_task_fields
from prefect_odm.engine.uploads import (
    count_images,
    fetch_zip_into,
    route_upload,
    safe_extract_zip,
    sanitize_upload_name,
    save_upload,
    unique_path,
)
from prefect_odm.errors import EngineError, InputError, StorageError

logger = logging.getLogger(__name__)

NODEODM_API_VERSION = "2.2.1"
"""The NodeODM version whose API this engine speaks (pyodm needs >= 1.4.0 for chunked uploads)."""

ENGINE_NAME = "prefect-odm"

UUID_PATTERN = re.compile(
    r"^[0-9a-f]{8}-[0-9a-f]{4}-[1-8][0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$", re.IGNORECASE
)


@dataclass(frozen=True)
class EngineConfig:
    """Settings of one engine process (each attribute is described below it)."""

    data_dir: Path
    """Where the task table and task folders live."""
    host: str = "127.0.0.1"
    """Address to bind (loopback by default)."""
    port: int = 3000
    """TCP port."""
    token: str | None = None
    """When set, every request needs ``?token=`` with this value."""
    max_parallel_tasks: int = 1
    """Task processes running at once."""
    method: str | None = None
    """Default of the ``pipeline`` option (``"sfm"`` or ``"direct"``); None keeps the pipeline's."""
    max_images: int | None = None
    """Most images one task may have (None: unlimited)."""
    max_upload_mb: float | None = None
    """Largest single uploaded file in MiB (None: unlimited)."""
    memory_gib: float | None = None
    """The memory ``/info`` reports, GiB (None: the machine's, or its cgroup's limit when
    smaller: :func:`~prefect_odm.engine.machine_memory.usable_memory_bytes`)."""
    cleanup_hours: float = DEFAULT_CLEANUP_HOURS
    """Uncommitted uploads and finished tasks are deleted after this many hours (0 or less:
    never)."""
    faults: Faults = field(default_factory=Faults)
    """Fault injection (none by default)."""


def _lock_data_dir(data_dir: Path) -> IO[str]:
    """Hold an exclusive lock on ``data_dir/engine.lock`` for the life of this process.

    The kernel drops the lock when the process ends, however it ends (SIGKILL included).

    Raises:
        StorageError: another engine process uses this data folder.
    """
    import fcntl

    handle = open(data_dir / "engine.lock", "a+")  # noqa: SIM115 - held until the process ends
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        handle.close()
        raise StorageError(f"{data_dir} is in use by another engine process") from exc
    handle.seek(0)
    handle.truncate()
    handle.write(f"{os.getpid()}\n")
    handle.flush()
    return handle


class Engine:
    """The engine's state and operations; the HTTP layer (:func:`create_app`) only translates.

    Args:
        config: the engine settings.

    Raises:
        ImportError: the photogrammetry pipeline cannot be imported.
        StorageError: the task table cannot be read, or another engine uses ``data_dir``.
    """

    def __init__(self, config: EngineConfig) -> None:
        """Lock the data folder, read the task table and load the pipeline (nothing runs until
        :meth:`start`)."""
        self.config = config
        self.data_dir = Path(config.data_dir)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._lock_file = _lock_data_dir(self.data_dir)
        self.store = TaskStore(self.data_dir)
        pipeline = load_pipeline(stand_in=config.faults.stand_in_pipeline)
        self.stages: tuple[str, ...] = tuple(pipeline.STAGES)
        self.specs: list[OptionSpec] = option_specs(pipeline.OPTIONS, method=config.method)
        self.supervisor = supervisor.Supervisor(
            self.store,
            max_parallel_tasks=config.max_parallel_tasks,
            faults=config.faults,
            cleanup_hours=config.cleanup_hours,
            on_finished=self._send_webhook,
        )
        self._upload_lock = threading.Lock()
        self._upload_count = 0

    # -- life cycle -----------------------------------------------------------------------
    def start(self) -> None:
        """Re-queue interrupted tasks, clean up and start running tasks."""
        requeued = self.supervisor.recover(self.stages)
        if requeued:
            logger.info("re-queued %d interrupted task(s)", len(requeued))
        self.supervisor.cleanup()
        for record in self.store.all():  # webhooks an engine crash kept from being sent
            if record.webhook and not record.webhook_sent and record.status in (COMPLETED, FAILED):
                threading.Thread(
                    target=self._send_webhook, args=(record.uuid,), daemon=True
                ).start()
        self.supervisor.start()

    def stop(self) -> None:
        """Stop running tasks (they are re-queued at the next start)."""
        self.supervisor.stop()

    # -- helpers --------------------------------------------------------------------------
    def check_token(self, given: str | None) -> bool:
        """True when no token is configured or ``given`` matches it."""
        if not self.config.token:
            return True
        return given is not None and hmac.compare_digest(
            given.encode("utf-8"), self.config.token.encode("utf-8")
        )

    def _visible(self, uuid: str) -> TaskRecord:
        record = self.store.get(uuid) if isinstance(uuid, str) else None
        if record is None or record.status == PENDING:
            raise EngineError(f"{uuid} not found")
        return record

    def task_info(self, record: TaskRecord, with_output: int | None = None) -> TaskInfo:
        """A task's ``/task/{uuid}/info`` answer."""
        if record.status == RUNNING and record.started_ms:
            processing_time = task_files.now_ms() - record.started_ms
        else:
            processing_time = record.processing_time_ms
        status: TaskStatus = {"code": record.status}
        if record.status == FAILED:
            status["errorMessage"] = record.error_message or "Task failed"
        info: TaskInfo = {
            "uuid": record.uuid,
            "name": record.name,
            "dateCreated": record.date_created_ms,
            "processingTime": processing_time,
            "status": status,
            "options": record.options,
            "imagesCount": record.images_count,
            "progress": round(record.progress, 1),
        }
        if with_output is not None:
            lines = task_files.read_output_lines(self.store.task_dir(record.uuid))
            info["output"] = lines[with_output:]
        return info

    def _send_webhook(self, uuid: str) -> None:
        record = self.store.get(uuid)
        if record is None or not record.webhook or record.webhook_sent:
            return
        if record.status not in (COMPLETED, FAILED):
            return
        import requests

        body = self.task_info(record)
        for attempt in range(3):
            try:
                requests.post(record.webhook, json=body, timeout=10)
                break
            except requests.RequestException as exc:
                logger.warning(
                    "webhook %s failed (attempt %d): %s", record.webhook, attempt + 1, exc
                )
                time.sleep(1 + attempt)
        with contextlib.suppress(KeyError):
            self.store.update(uuid, webhook_sent=True)

    # -- routes ---------------------------------------------------------------------------
    def info(self) -> InfoAnswer:
        """The ``/info`` answer (memory in bytes: what this node may use, see
        :attr:`EngineConfig.memory_gib`)."""
        total = (
            usable_memory_bytes()
            if self.config.memory_gib is None
            else int(self.config.memory_gib * 2**30)
        )
        queued = sum(1 for t in self.store.all() if t.status in (QUEUED, RUNNING))
        return {
            "version": NODEODM_API_VERSION,
            "taskQueueCount": queued,
            "totalMemory": total,
            "availableMemory": min(total, int(psutil.virtual_memory().available)),
            "cpuCores": psutil.cpu_count(logical=True) or 1,
            "maxImages": self.config.max_images,
            "maxParallelTasks": self.supervisor.max_parallel_tasks,
            "engine": ENGINE_NAME,
            "engineVersion": prefect_odm.__version__,
        }

    def options(self) -> list[OptionEntry]:
        """The ``/options`` answer."""
        return [spec.to_dict() for spec in self.specs]

    def init_task(self, fields: dict[str, str], set_uuid: str | None) -> UuidAnswer:
        """``/task/new/init``: validate the fields and create a task waiting for uploads.

        As on NodeODM, a ``set-uuid`` whose task is still waiting for uploads (not committed)
        is initialised again: its name and options are replaced and the files uploaded so far
        are kept. That is what lets a client that died during an upload (kill -9) resume it
        under the same UUID (issue 15, item 1). A committed UUID is refused.
        """
        uuid = str(uuid_module.uuid4()) if set_uuid is None else set_uuid.strip()
        if set_uuid is not None and not UUID_PATTERN.match(uuid):
            raise EngineError(f"Invalid set-uuid: {set_uuid}")
        try:
            given = parse_options_text(fields.get("options"))
        except InputError as exc:
            raise EngineError(str(exc)) from exc
        validated = validate_options(given, self.specs)
        if validated.errors:
            raise EngineError(json.dumps(validated.errors))
        parsed = parse_task_fields(fields)
        record = TaskRecord(
            uuid=uuid,
            name=parsed.name,
            date_created_ms=parsed.date_created_ms,
            status=PENDING,
            webhook=parsed.webhook,
            outputs=parsed.outputs,
            skip_post_processing=parsed.skip_post_processing,
            **option_fields(validated),
        )
        with self.store.lock:
            existing = self.store.get(uuid)
            if existing is not None and existing.status != PENDING:
                raise EngineError(f"Invalid set-uuid: {set_uuid}")
            task_dir = self.store.task_dir(uuid)
            if existing is None and task_dir.exists():  # a folder without a table row
                shutil.rmtree(task_dir, ignore_errors=True)
            (task_dir / "images").mkdir(parents=True, exist_ok=True)
            self.store.remove(uuid)
            self.store.add(record)
        return {"uuid": uuid}

    def next_upload_ordinal(self) -> int:
        """Count an upload request (for fault injection); 1-based."""
        with self._upload_lock:
            self._upload_count += 1
            return self._upload_count

    def store_files(self, uuid: str, files: list[tuple[str | None, IO[bytes]]]) -> list[str]:
        """Store uploaded files in a task waiting for uploads.

        Args:
            uuid: the task.
            files: ``(client file name, readable binary file)`` pairs.

        Returns:
            The stored paths relative to the task folder (duplicates renamed ``stem_N.ext``).

        Raises:
            EngineError: unknown task, no file, a refused name or a file too large.
        """
        record = self.store.get(uuid)
        if record is None or record.status != PENDING:
            raise EngineError("Invalid uuid (not found)")
        if not files:
            raise EngineError("Need at least 1 file.", no_retry=True)
        names = [sanitize_upload_name(name) for name, _ in files]
        limit = self.config.max_upload_mb
        task_dir = self.store.task_dir(uuid)
        stored = []
        for name, (_, stream) in zip(names, files, strict=True):
            folder_name, target_name = route_upload(name)
            folder = (task_dir / folder_name).resolve()
            folder.mkdir(parents=True, exist_ok=True)
            tmp = folder / f".upload-{uuid_module.uuid4().hex}.part"
            try:
                save_upload(stream, tmp, name=name, limit_mb=limit)
                with self._upload_lock:
                    final = unique_path(folder, target_name)
                    os.rename(tmp, final)
            finally:
                tmp.unlink(missing_ok=True)
            stored.append(final.relative_to(task_dir.resolve()).as_posix())
        return stored

    def commit(self, uuid: str) -> UuidAnswer:
        """``/task/new/commit/{uuid}``: unpack ``seed.zip``, count images and queue the task."""
        record = self.store.get(uuid)
        if record is None or record.status != PENDING:
            raise EngineError("Invalid uuid (not found)")
        task_dir = self.store.task_dir(uuid)
        for leftover in task_dir.rglob(".upload-*.part"):  # from uploads cut by a crash
            leftover.unlink(missing_ok=True)
        count = count_images(task_dir)
        if count == 0:
            raise EngineError("Not enough images (no image was uploaded)")
        if self.config.max_images is not None and count > self.config.max_images:
            raise EngineError(
                f"Too many images: {count} (this node takes at most {self.config.max_images})"
            )
        seed = task_dir / "seed.zip"
        if seed.exists():
            files = safe_extract_zip(seed, task_dir)
            seed.unlink()
            task_files.append_output(task_dir, f"[engine] unpacked seed.zip ({files} files)")
        self.store.update(uuid, images_count=count)
        self.supervisor.enqueue(uuid)
        return {"uuid": uuid}

    def discard(self, uuid: str) -> None:
        """Forget a task that never got committed (a failed single-shot ``/task/new``)."""
        record = self.store.get(uuid)
        if record is not None and record.status == PENDING:
            self.store.remove(uuid)
            shutil.rmtree(self.store.task_dir(uuid), ignore_errors=True)

    def fetch_zipurl(self, uuid: str, url: str) -> int:
        """Download a zip of images from ``url`` into a pending task and unpack it.

        Raises:
            EngineError: the URL is not http(s), the download failed or the zip is unsafe.
        """
        return fetch_zip_into(url, self.store.task_dir(uuid))

    def list_tasks(self) -> list[dict[str, str]]:
        """The ``/task/list`` answer (committed tasks, by creation date)."""
        return [{"uuid": t.uuid} for t in self.store.all() if t.status != PENDING]

    def info_of(self, uuid: str, with_output: int | None) -> TaskInfo:
        """``/task/{uuid}/info``."""
        return self.task_info(self._visible(uuid), with_output)

    def output_of(self, uuid: str, line: int) -> list[str]:
        """``/task/{uuid}/output?line=N`` (N < 0: the last -N lines)."""
        record = self._visible(uuid)
        return task_files.read_output_lines(self.store.task_dir(record.uuid))[line:]

    def zip_of(self, uuid: str, asset: str) -> Path:
        """Path of a finished task's all.zip.

        Raises:
            EngineError: unknown task, another asset name, or the zip is not ready.
        """
        record = self._visible(uuid)
        if asset != task_files.ZIP_FILE:
            raise EngineError("Invalid asset")
        path = self.store.task_dir(record.uuid) / task_files.ZIP_FILE
        if record.status != COMPLETED or not path.exists():
            raise EngineError("Asset not ready")
        return path

    def _action_target(self, uuid: str) -> TaskRecord | ActionAnswer:
        """The task a cancel/remove/restart acts on, or NodeODM's answer for an unknown one."""
        try:
            return self._visible(uuid)
        except EngineError as exc:
            return {"success": False, "error": str(exc)}

    def cancel(self, uuid: str) -> ActionAnswer:
        """``/task/cancel``; cancelling a cancelled task succeeds, as on NodeODM.

        Unlike NodeODM, a COMPLETED (or FAILED) task is not turned into a cancelled one: its
        products stay, and the answer is ``success: false``.
        """
        record = self._action_target(uuid)
        if isinstance(record, dict):
            return record
        if self.supervisor.cancel(record.uuid) or record.status == CANCELED:
            return {"success": True}
        return {"success": False, "error": "Task already finished"}

    def remove(self, uuid: str) -> ActionAnswer:
        """``/task/remove``: cancel when active, delete the folder and the table row."""
        record = self._action_target(uuid)
        if isinstance(record, dict):
            return record
        self.supervisor.cancel(record.uuid)
        self.store.remove(record.uuid)
        shutil.rmtree(self.store.task_dir(record.uuid), ignore_errors=True)
        return {"success": True}

    def restart(
        self, uuid: str, options: str | list[JsonValue] | dict[str, JsonValue] | None
    ) -> ActionAnswer:
        """``/task/restart``: run a finished task again in the same folder.

        ``options`` (JSON text or, from a JSON body, a list; when given) replace all options;
        ``rerun-from`` among them resumes from that stage so the earlier stages' files are reused.
        """
        record = self._action_target(uuid)
        if isinstance(record, dict):
            return record
        if record.status in (QUEUED, RUNNING) or self.supervisor.is_running(record.uuid):
            return {"success": False, "error": "Task cannot be restarted"}
        changes: OptionFields = {}
        if options is not None and (not isinstance(options, str) or options.strip()):
            try:
                given = parse_options_text(options)
            except InputError as exc:
                return {"success": False, "error": str(exc)}
            validated = validate_options(given, self.specs)
            if validated.errors:
                return {"success": False, "error": json.dumps(validated.errors)}
            changes = option_fields(validated)
        task_dir = self.store.task_dir(record.uuid)
        (task_dir / task_files.ZIP_FILE).unlink(missing_ok=True)
        (task_dir / task_files.OUTPUT_FILE).write_text("", encoding="utf-8")
        self.store.update(
            record.uuid,
            progress=0.0,
            processing_time_ms=-1,
            started_ms=None,
            finished_ms=None,
            error_message=None,
            webhook_sent=False,
            resume_stage=None,
            **changes,
        )
        self.supervisor.enqueue(record.uuid)
        return {"success": True}
