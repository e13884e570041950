"""The built-in engine's HTTP server: NodeODM's API over FastAPI.

Every route and answer shape follows ``NODEODM_API.md`` (NodeODM 2.2.x as pyodm, WebODM and
ClusterODM see it): errors are HTTP 200 ``{"error": ...}``, an injected upload failure is a bare
HTTP 500, unknown routes are 404. When a token is configured every route needs ``?token=``.

What it does better than NodeODM: the task table is written atomically on every change (see
:mod:`.store`); each task is its own process group (see :mod:`.runner`); unknown options are listed
in the task output; a failed task always carries an ``errorMessage`` with the last output lines;
upload names that try to leave the task folder are refused; it binds 127.0.0.1 unless told
otherwise.

Task folder layout (``{data_dir}/tasks/{uuid}/``): ``images/`` (the images), extra files at the
top (``gcp_list.txt`` for any GCP ``*.txt``, ``geo.txt``, ``image_groups.txt``, ``align.*``),
``seed.zip`` unpacked there at commit, ``task_output.txt``, the ODM products and ``all.zip``.
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
import zipfile
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import IO, Any

import psutil
from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

import prefect_odm
from prefect_odm.engine import runner
from prefect_odm.engine.faults import Faults
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
    FAILED,
    PENDING,
    QUEUED,
    RUNNING,
    TaskRecord,
    TaskStore,
)
from prefect_odm.errors import InputError, StorageError

logger = logging.getLogger(__name__)

NODEODM_API_VERSION = "2.2.1"
"""The NodeODM version whose API this engine speaks (pyodm needs >= 1.4.0 for chunked uploads)."""

ENGINE_NAME = "prefect-odm"

IMAGE_SUFFIXES = frozenset({".jpg", ".jpeg", ".tif", ".tiff", ".png", ".dng", ".raw"})
UUID_PATTERN = re.compile(
    r"^[0-9a-f]{8}-[0-9a-f]{4}-[1-8][0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$", re.IGNORECASE
)
COPY_CHUNK_BYTES = 1 << 20


@dataclass(frozen=True)
class EngineConfig:
    """Settings of one engine process.

    Attributes:
        data_dir: where the task table and task folders live.
        host: address to bind (loopback by default).
        port: TCP port.
        token: when set, every request needs ``?token=`` with this value.
        max_parallel_tasks: task processes running at once.
        method: default of the ``pipeline`` option (``"sfm"`` or ``"direct"``); None keeps the
            pipeline's own default.
        max_images: most images one task may have (None: unlimited).
        max_upload_mb: largest single uploaded file in MiB (None: unlimited).
        cleanup_hours: uncommitted uploads and finished tasks are deleted after this many hours
            (0 or less: never).
        faults: fault injection (none by default).
    """

    data_dir: Path
    host: str = "127.0.0.1"
    port: int = 3000
    token: str | None = None
    max_parallel_tasks: int = 1
    method: str | None = None
    max_images: int | None = None
    max_upload_mb: float | None = None
    cleanup_hours: float = 48.0
    faults: Faults = field(default_factory=Faults)


class EngineError(InputError):
    """A request the engine refuses; the message is sent as ``{"error": message}``."""

    def __init__(self, message: str, *, no_retry: bool = False) -> None:
        super().__init__(message)
        self.no_retry = no_retry


def _error(message: str, **extra: Any) -> dict[str, Any]:
    return {"error": message, **extra}


def sanitize_upload_name(filename: str | None) -> str:
    """The base name an uploaded file is stored under.

    Folders in the name are dropped (``a/b.jpg`` -> ``b.jpg``); names that try to leave the task
    folder (``..`` parts, absolute paths, drive letters) or are empty are refused.

    Raises:
        EngineError: the name is refused (``noRetry``: sending it again cannot help).
    """
    raw = filename or ""
    text = raw.replace("\\", "/")
    parts = [p for p in text.split("/") if p not in ("", ".")]
    if (
        not parts
        or "\x00" in text
        or text.startswith("/")
        or re.match(r"^[A-Za-z]:", text)
        or any(p == ".." for p in parts)
    ):
        raise EngineError(f"Invalid file name: {raw!r}", no_retry=True)
    name = parts[-1]
    if name.startswith("."):
        raise EngineError(f"Invalid file name: {raw!r}", no_retry=True)
    return name


def route_upload(name: str) -> tuple[str, str]:
    """Where an uploaded file goes: ``(folder relative to the task folder, file name)``.

    Images go to ``images/``; ``seed.zip``, ``geo.txt``, ``image_groups.txt`` and ``align.*``
    keep their names at the top of the task folder; any other ``*.txt`` is the GCP file,
    stored as ``gcp_list.txt`` (ODM's name); anything else goes to the top folder unchanged.
    """
    lower = name.lower()
    suffix = PurePosixPath(lower).suffix
    if suffix in IMAGE_SUFFIXES and not lower.startswith("align."):
        return "images", name
    if lower in ("seed.zip", "geo.txt", "image_groups.txt"):
        return ".", lower
    if lower.startswith("align.") and suffix in (".las", ".laz", ".tif", ".tiff"):
        return ".", lower
    if suffix == ".txt":
        return ".", "gcp_list.txt"
    return ".", name


def _unique_path(folder: Path, name: str) -> Path:
    """``folder/name``, or ``folder/stem_N.ext`` with the first free N when it exists."""
    candidate = folder / name
    stem, suffix = os.path.splitext(name)
    n = 1
    while candidate.exists():
        candidate = folder / f"{stem}_{n}{suffix}"
        n += 1
    return candidate


def safe_extract_zip(archive: Path, destination: Path) -> int:
    """Unpack a zip into ``destination``, refusing members that would leave it.

    Returns:
        Number of files written.

    Raises:
        EngineError: the archive is not a zip or holds an unsafe member name.
    """
    root = destination.resolve()
    count = 0
    try:
        with zipfile.ZipFile(archive) as zf:
            for member in zf.infolist():
                target = (root / member.filename).resolve()
                if not (target == root or root in target.parents):
                    raise EngineError(f"Unsafe path in {archive.name}: {member.filename!r}")
                if member.is_dir():
                    target.mkdir(parents=True, exist_ok=True)
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                with zf.open(member) as src, open(target, "wb") as dst:
                    shutil.copyfileobj(src, dst, COPY_CHUNK_BYTES)
                count += 1
    except zipfile.BadZipFile as exc:
        raise EngineError(f"{archive.name} is not a valid zip file") from exc
    return count


def _count_images(task_dir: Path) -> int:
    folder = task_dir / "images"
    if not folder.is_dir():
        return 0
    return sum(1 for p in folder.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)


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
        self.config = config
        self.data_dir = Path(config.data_dir)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._lock_file = _lock_data_dir(self.data_dir)
        self.store = TaskStore(self.data_dir)
        pipeline = load_pipeline(stand_in=config.faults.stand_in_pipeline)
        self.stages: tuple[str, ...] = tuple(pipeline.STAGES)
        self.specs: list[OptionSpec] = option_specs(pipeline.OPTIONS, method=config.method)
        self.supervisor = runner.Supervisor(
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

    def task_info(self, record: TaskRecord, with_output: int | None = None) -> dict[str, Any]:
        """A task's ``/task/{uuid}/info`` answer."""
        if record.status == RUNNING and record.started_ms:
            processing_time = runner.now_ms() - record.started_ms
        else:
            processing_time = record.processing_time_ms
        status: dict[str, Any] = {"code": record.status}
        if record.status == FAILED:
            status["errorMessage"] = record.error_message or "Task failed"
        info: dict[str, Any] = {
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
            lines = runner.read_output_lines(self.store.task_dir(record.uuid))
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
    def info(self) -> dict[str, Any]:
        """The ``/info`` answer (memory in bytes)."""
        memory = psutil.virtual_memory()
        queued = sum(1 for t in self.store.all() if t.status in (QUEUED, RUNNING))
        return {
            "version": NODEODM_API_VERSION,
            "taskQueueCount": queued,
            "totalMemory": int(memory.total),
            "availableMemory": int(memory.available),
            "cpuCores": psutil.cpu_count(logical=True) or 1,
            "maxImages": self.config.max_images,
            "maxParallelTasks": self.supervisor.max_parallel_tasks,
            "engine": ENGINE_NAME,
            "engineVersion": prefect_odm.__version__,
        }

    def options(self) -> list[dict[str, Any]]:
        """The ``/options`` answer."""
        return [spec.to_dict() for spec in self.specs]

    def init_task(self, fields: dict[str, str], set_uuid: str | None) -> dict[str, Any]:
        """``/task/new/init``: validate the fields and create a task waiting for uploads."""
        if set_uuid is not None:
            uuid = set_uuid.strip()
            if not UUID_PATTERN.match(uuid) or uuid in self.store:
                raise EngineError(f"Invalid set-uuid: {set_uuid}")
        else:
            uuid = str(uuid_module.uuid4())
        try:
            given = parse_options_text(fields.get("options"))
        except InputError as exc:
            raise EngineError(str(exc)) from exc
        validated = validate_options(given, self.specs)
        if validated.errors:
            raise EngineError(json.dumps(validated.errors))
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
        date_created = runner.now_ms()
        if fields.get("dateCreated"):
            with contextlib.suppress(ValueError):
                date_created = int(float(fields["dateCreated"]))
        name = (fields.get("name") or "").strip()
        if not name:
            name = "Task of " + datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
        skip = str(fields.get("skipPostProcessing", "")).strip().lower() in ("true", "1")
        record = TaskRecord(
            uuid=uuid,
            name=name,
            date_created_ms=date_created,
            status=PENDING,
            options=validated.given,
            typed_options=validated.typed,
            ignored_options=validated.ignored,
            webhook=webhook,
            outputs=outputs,
            skip_post_processing=skip,
            rerun_from=validated.typed.get("rerun-from") or None,
        )
        task_dir = self.store.task_dir(uuid)
        if task_dir.exists():  # a leftover folder without a table row: start clean
            shutil.rmtree(task_dir, ignore_errors=True)
        (task_dir / "images").mkdir(parents=True)
        try:
            self.store.add(record)
        except KeyError as exc:
            raise EngineError(f"Invalid set-uuid: {set_uuid}") from exc
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
            size = 0
            try:
                with open(tmp, "wb") as out:
                    while chunk := stream.read(COPY_CHUNK_BYTES):
                        size += len(chunk)
                        if limit is not None and size > limit * 1024 * 1024:
                            raise EngineError(
                                f"File too large: {name} is over {limit} MB", no_retry=True
                            )
                        out.write(chunk)
                    out.flush()
                    os.fsync(out.fileno())
                with self._upload_lock:
                    final = _unique_path(folder, target_name)
                    os.rename(tmp, final)
            finally:
                tmp.unlink(missing_ok=True)
            stored.append(final.relative_to(task_dir.resolve()).as_posix())
        return stored

    def commit(self, uuid: str) -> dict[str, Any]:
        """``/task/new/commit/{uuid}``: unpack ``seed.zip``, count images and queue the task."""
        record = self.store.get(uuid)
        if record is None or record.status != PENDING:
            raise EngineError("Invalid uuid (not found)")
        task_dir = self.store.task_dir(uuid)
        for leftover in task_dir.rglob(".upload-*.part"):  # from uploads cut by a crash
            leftover.unlink(missing_ok=True)
        count = _count_images(task_dir)
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
            runner.append_output(task_dir, f"[engine] unpacked seed.zip ({files} files)")
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
        import requests

        if not re.match(r"^https?://", url):
            raise EngineError(f"Invalid zipurl: {url}")
        task_dir = self.store.task_dir(uuid)
        archive = task_dir / ".zipurl.zip"
        try:
            with requests.get(url, stream=True, timeout=60) as res:
                res.raise_for_status()
                with open(archive, "wb") as out:
                    for chunk in res.iter_content(COPY_CHUNK_BYTES):
                        out.write(chunk)
        except requests.RequestException as exc:
            raise EngineError(f"Cannot download zipurl: {exc}") from exc
        staging = task_dir / ".zipurl"
        try:
            safe_extract_zip(archive, staging)
            files = [p for p in staging.rglob("*") if p.is_file()]
            for path in files:
                folder_name, target_name = route_upload(path.name)
                folder = task_dir / folder_name
                folder.mkdir(parents=True, exist_ok=True)
                os.replace(path, _unique_path(folder, target_name))
        finally:
            archive.unlink(missing_ok=True)
            shutil.rmtree(staging, ignore_errors=True)
        return len(files)

    def list_tasks(self) -> list[dict[str, str]]:
        """The ``/task/list`` answer (committed tasks, by creation date)."""
        return [{"uuid": t.uuid} for t in self.store.all() if t.status != PENDING]

    def info_of(self, uuid: str, with_output: int | None) -> dict[str, Any]:
        """``/task/{uuid}/info``."""
        return self.task_info(self._visible(uuid), with_output)

    def output_of(self, uuid: str, line: int) -> list[str]:
        """``/task/{uuid}/output?line=N`` (N < 0: the last -N lines)."""
        record = self._visible(uuid)
        return runner.read_output_lines(self.store.task_dir(record.uuid))[line:]

    def zip_of(self, uuid: str, asset: str) -> Path:
        """Path of a finished task's all.zip.

        Raises:
            EngineError: unknown task, another asset name, or the zip is not ready.
        """
        record = self._visible(uuid)
        if asset != runner.ZIP_FILE:
            raise EngineError("Invalid asset")
        path = self.store.task_dir(record.uuid) / runner.ZIP_FILE
        if record.status != COMPLETED or not path.exists():
            raise EngineError("Asset not ready")
        return path

    def cancel(self, uuid: str) -> dict[str, Any]:
        """``/task/cancel``."""
        record = self._visible(uuid)
        if self.supervisor.cancel(record.uuid):
            return {"success": True}
        if record.status == CANCELED:
            return {"success": False, "error": "Task already canceled"}
        return {"success": False, "error": "Task already finished"}

    def remove(self, uuid: str) -> dict[str, Any]:
        """``/task/remove``: cancel when active, delete the folder and the table row."""
        record = self._visible(uuid)
        self.supervisor.cancel(record.uuid)
        self.store.remove(record.uuid)
        shutil.rmtree(self.store.task_dir(record.uuid), ignore_errors=True)
        return {"success": True}

    def restart(self, uuid: str, options_text: str | None) -> dict[str, Any]:
        """``/task/restart``: run a finished task again in the same folder.

        ``options`` (when given) replace all options; ``rerun-from`` among them resumes from
        that stage so the earlier stages' files are reused.
        """
        record = self._visible(uuid)
        if record.status in (QUEUED, RUNNING) or self.supervisor.is_running(record.uuid):
            return {"success": False, "error": "Task cannot be restarted"}
        changes: dict[str, Any] = {}
        if options_text is not None and options_text.strip():
            try:
                given = parse_options_text(options_text)
            except InputError as exc:
                return {"success": False, "error": str(exc)}
            validated = validate_options(given, self.specs)
            if validated.errors:
                return {"success": False, "error": json.dumps(validated.errors)}
            changes.update(
                options=validated.given,
                typed_options=validated.typed,
                ignored_options=validated.ignored,
                rerun_from=validated.typed.get("rerun-from") or None,
            )
        task_dir = self.store.task_dir(record.uuid)
        (task_dir / runner.ZIP_FILE).unlink(missing_ok=True)
        (task_dir / runner.OUTPUT_FILE).write_text("", encoding="utf-8")
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


# -- HTTP ----------------------------------------------------------------------------------------


class _AuthError(Exception):
    pass


def _json(payload: Any) -> JSONResponse:
    return JSONResponse(payload, status_code=200)


def _int_param(value: str | None, default: int | None) -> int | None:
    if value is None or value == "":
        return default
    try:
        return int(float(value))
    except ValueError:
        return default


def create_app(engine: Engine, *, manage_lifecycle: bool = True) -> FastAPI:
    """The FastAPI application serving NodeODM's API for ``engine``.

    Args:
        engine: the engine.
        manage_lifecycle: start the engine on application start-up and stop it on shutdown.
    """

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        if manage_lifecycle:
            engine.start()
        try:
            yield
        finally:
            if manage_lifecycle:
                engine.stop()

    async def check_token(request: Request) -> None:
        if not engine.check_token(request.query_params.get("token")):
            raise _AuthError()

    from fastapi import Depends

    app = FastAPI(
        title="prefect-odm built-in engine",
        version=prefect_odm.__version__,
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    auth = [Depends(check_token)]
    request_log = engine.data_dir / "requests.log"

    @app.middleware("http")
    async def log_request(request: Request, call_next: Any) -> Any:
        # One JSON line per request: method, path and the *names* of the query parameters
        # (never their values, so a token is never written down).
        line = json.dumps(
            {
                "method": request.method,
                "path": request.url.path,
                "query": sorted(request.query_params),
            }
        )
        with open(request_log, "a", encoding="utf-8") as fh:
            fh.write(line + "\n")
        return await call_next(request)

    @app.exception_handler(_AuthError)
    async def _auth_failed(_: Request, __: _AuthError) -> JSONResponse:
        return _json(_error("Invalid authentication token: token does not match."))

    @app.exception_handler(EngineError)
    async def _refused(_: Request, exc: EngineError) -> JSONResponse:
        extra = {"noRetry": True} if exc.no_retry else {}
        return _json(_error(str(exc), **extra))

    async def read_form(request: Request) -> tuple[dict[str, str], list[tuple[str | None, Any]]]:
        form = await request.form(max_files=1_000_000, max_fields=10_000)
        fields: dict[str, str] = {}
        files: list[tuple[str | None, Any]] = []
        for key, value in form.multi_items():
            if isinstance(value, str):
                fields[key] = value
            elif key == "images":
                files.append((value.filename, value.file))
        return fields, files

    @app.get("/info", dependencies=auth)
    def info() -> JSONResponse:
        return _json(engine.info())

    @app.get("/options", dependencies=auth)
    def options() -> JSONResponse:
        return _json(engine.options())

    @app.post("/task/new/init", dependencies=auth)
    async def task_new_init(request: Request) -> JSONResponse:
        fields, _ = await read_form(request)
        result = await run_in_threadpool(engine.init_task, fields, request.headers.get("set-uuid"))
        return _json(result)

    @app.post("/task/new/upload/{uuid}", dependencies=auth)
    async def task_new_upload(uuid: str, request: Request) -> Response:
        ordinal = engine.next_upload_ordinal()
        if engine.config.faults.upload_should_fail(ordinal):
            return PlainTextResponse("Internal Server Error (injected fault)", status_code=500)
        try:
            _, files = await read_form(request)
        except Exception as exc:  # a broken multipart body: the chunk failed, the client retries
            logger.warning("upload to %s failed: %s", uuid, exc)
            return PlainTextResponse(f"Upload failed: {exc}", status_code=500)
        await run_in_threadpool(engine.store_files, uuid, files)
        engine.config.faults.die_if_upload_limit(ordinal)
        return _json({"success": True})

    @app.post("/task/new/commit/{uuid}", dependencies=auth)
    async def task_new_commit(uuid: str) -> JSONResponse:
        return _json(await run_in_threadpool(engine.commit, uuid))

    @app.post("/task/new", dependencies=auth)
    async def task_new(request: Request) -> JSONResponse:
        fields, files = await read_form(request)
        created = await run_in_threadpool(engine.init_task, fields, request.headers.get("set-uuid"))
        uuid = created["uuid"]
        try:
            if files:
                await run_in_threadpool(engine.store_files, uuid, files)
            if fields.get("zipurl"):
                await run_in_threadpool(engine.fetch_zipurl, uuid, fields["zipurl"])
            if not files and not fields.get("zipurl"):
                raise EngineError("Need at least 1 file.", no_retry=True)
            return _json(await run_in_threadpool(engine.commit, uuid))
        except EngineError:
            await run_in_threadpool(engine.discard, uuid)
            raise

    @app.get("/task/list", dependencies=auth)
    def task_list() -> JSONResponse:
        return _json(engine.list_tasks())

    @app.get("/task/{uuid}/info", dependencies=auth)
    def task_info(uuid: str, request: Request) -> JSONResponse:
        with_output = _int_param(request.query_params.get("with_output"), None)
        return _json(engine.info_of(uuid, with_output))

    @app.get("/task/{uuid}/output", dependencies=auth)
    def task_output(uuid: str, request: Request) -> JSONResponse:
        line = _int_param(request.query_params.get("line"), 0) or 0
        return _json(engine.output_of(uuid, line))

    @app.get("/task/{uuid}/download/{asset}", dependencies=auth)
    def task_download(uuid: str, asset: str) -> Response:
        path = engine.zip_of(uuid, asset)
        handle = open(path, "rb")  # noqa: SIM115 - closed by the generator
        size = os.fstat(handle.fileno()).st_size

        def chunks() -> Iterator[bytes]:
            with handle:
                while chunk := handle.read(COPY_CHUNK_BYTES):
                    yield chunk

        return StreamingResponse(
            chunks(),
            media_type="application/zip",
            headers={
                "Content-Length": str(size),
                "Content-Disposition": f'attachment; filename="{asset}"',
            },
        )

    async def uuid_field(request: Request) -> str:
        fields, _ = await read_form(request)
        uuid = fields.get("uuid")
        if not uuid:
            raise EngineError("uuid param missing.")
        return uuid

    @app.post("/task/cancel", dependencies=auth)
    async def task_cancel(request: Request) -> JSONResponse:
        uuid = await uuid_field(request)
        return _json(await run_in_threadpool(engine.cancel, uuid))

    @app.post("/task/remove", dependencies=auth)
    async def task_remove(request: Request) -> JSONResponse:
        uuid = await uuid_field(request)
        return _json(await run_in_threadpool(engine.remove, uuid))

    @app.post("/task/restart", dependencies=auth)
    async def task_restart(request: Request) -> JSONResponse:
        fields, _ = await read_form(request)
        uuid = fields.get("uuid")
        if not uuid:
            raise EngineError("uuid param missing.")
        return _json(await run_in_threadpool(engine.restart, uuid, fields.get("options")))

    return app


def serve(config: EngineConfig) -> None:
    """Run the engine's HTTP server until SIGTERM or SIGINT (blocking).

    Raises:
        ImportError: the pipeline cannot be imported.
        OSError: the address cannot be bound.
    """
    import uvicorn

    engine = Engine(config)
    app = create_app(engine)
    uvicorn_config = uvicorn.Config(
        app,
        host=config.host,
        port=config.port,
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=5,
    )
    uvicorn.Server(uvicorn_config).run()
