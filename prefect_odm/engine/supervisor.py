"""The engine side of task processes: a queue, at most N processes, their end as a status.

The :class:`Supervisor` keeps at most ``max_parallel_tasks`` task processes (each
``python -m prefect_odm.engine run-task TASK_DIR``, see :mod:`.runner`), starts queued tasks in
FIFO order, turns a process's end into the task's final status, re-queues the tasks an engine
crash interrupted and deletes old tasks.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import psutil

from prefect_odm.engine.faults import DIE_EXIT_CODE, Faults
from prefect_odm.engine.store import (
    CANCELED,
    COMPLETED,
    DEFAULT_CLEANUP_HOURS,
    FAILED,
    FINISHED,
    PENDING,
    QUEUED,
    RUNNING,
    TaskRecord,
    TaskStore,
)
from prefect_odm.engine.task_files import (
    LAST_LINES_IN_ERROR,
    OOM_EXIT_CODE,
    OUTPUT_FILE,
    PROGRESS_FILE,
    RESULT_FILE,
    RUN_FILE,
    STAGE_FILE,
    ZIP_FILE,
    TaskResult,
    append_output,
    now_ms,
    read_output_lines,
    write_atomic,
)

logger = logging.getLogger(__name__)


@dataclass
class _Run:
    uuid: str
    process: subprocess.Popen[bytes]
    output: IO[bytes]
    canceled: bool = False


def _same_process(pid: int | None, create_time: float | None) -> psutil.Process | None:
    """The live process ``pid`` if it is the one started at ``create_time`` (guards pid reuse)."""
    if not pid:
        return None
    try:
        proc = psutil.Process(pid)
        if create_time is not None and abs(proc.create_time() - create_time) > 0.01:
            return None
        if proc.status() == psutil.STATUS_ZOMBIE:
            return None
        return proc
    except psutil.Error:
        return None


def _interrupted_stage(
    task_dir: Path, stages: tuple[str, ...], rerun_from: str | None
) -> str | None:
    """The stage a crashed run was in, when resuming there skips work; else None."""
    try:
        stage = (task_dir / STAGE_FILE).read_text(encoding="utf-8").strip()
    except OSError:
        return None
    if stage not in stages:
        return None
    floor = stages.index(rerun_from) if rerun_from in stages else 0
    return stage if stages.index(stage) > floor else None


def kill_process_group(pid: int) -> None:
    """SIGKILL the process group led by ``pid`` (a task process started in its own session)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def describe_failure(returncode: int, result: TaskResult | None, last_lines: list[str]) -> str:
    """The ``errorMessage`` of a failed task: the cause, the exit code and the last output lines.

    A process killed by SIGKILL (returncode -9, the out-of-memory killer's signal) or ending with
    exit code 137 or a :class:`MemoryError` is reported as "Not enough memory".
    """
    result = result or {"ok": False}
    if result.get("memory") or returncode in (-signal.SIGKILL, OOM_EXIT_CODE):
        if returncode == -signal.SIGKILL:
            how = "killed by signal 9 (SIGKILL), exit code 137"
        else:
            how = "exit code 137"
        message = f"Not enough memory: the task process ran out of memory ({how})"
        if result.get("error"):
            message += f"; {result['error']}"
    elif result.get("error"):
        message = f"{result['error']} (exit code {returncode})"
    elif returncode < 0:
        message = f"Task process killed by signal {-returncode} (exit code {128 - returncode})"
    else:
        message = f"Task process exited with code {returncode}"
    tail = [line for line in last_lines if line.strip()][-LAST_LINES_IN_ERROR:]
    if tail:
        message += "\nLast output lines:\n" + "\n".join(tail)
    return message


class Supervisor:
    """Runs queued tasks as processes, FIFO, at most ``max_parallel_tasks`` at a time.

    Args:
        store: the task table.
        max_parallel_tasks: how many task processes may run at once (at least 1).
        faults: fault injection (passed to task processes; the engine-death timer runs here).
        cleanup_hours: finished tasks and uncommitted uploads older than this are deleted
            (0 or less: never).
        on_finished: called with a task UUID (in a worker thread) after the task COMPLETED or
            FAILED; used for webhooks.
        poll_interval_seconds: how often processes are polled.
    """

    def __init__(
        self,
        store: TaskStore,
        *,
        max_parallel_tasks: int = 1,
        faults: Faults | None = None,
        cleanup_hours: float = DEFAULT_CLEANUP_HOURS,
        on_finished: Callable[[str], None] | None = None,
        poll_interval_seconds: float = 0.1,
    ) -> None:
        """Set up the queue; no process starts before :meth:`start`."""
        self.store = store
        self.max_parallel_tasks = max(1, int(max_parallel_tasks))
        self.faults = faults or Faults()
        self.cleanup_hours = cleanup_hours
        self.on_finished = on_finished
        self.poll_interval_seconds = poll_interval_seconds
        self._runs: dict[str, _Run] = {}
        self._lock = store.lock
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._run_ordinal = 0
        self._last_cleanup = 0.0

    # -- life cycle -----------------------------------------------------------------------
    def recover(self, stages: tuple[str, ...] = ()) -> list[str]:
        """Re-queue the tasks that were running or queued when the engine last stopped.

        A task process left over from a crashed engine is killed first (it normally kills
        itself when it notices its engine is gone). Re-queued tasks keep their FIFO order. A
        task that was running resumes from the stage it was in (``TASK_DIR/stage.txt``, when
        that stage is one of ``stages`` and later than its ``rerun-from``), so the stages it
        had finished are not computed again; NodeODM starts such tasks from the beginning.

        Returns:
            The UUIDs re-queued.
        """
        requeued = []
        with self._lock:
            for record in self.store.all():
                if record.status not in (QUEUED, RUNNING):
                    continue
                leftover = _same_process(record.pid, record.pid_create_time)
                if leftover is not None:
                    kill_process_group(leftover.pid)
                resume_stage = record.resume_stage
                if record.status == RUNNING:
                    task_dir = self.store.task_dir(record.uuid)
                    resume_stage = _interrupted_stage(task_dir, stages, record.rerun_from)
                    append_output(
                        task_dir,
                        "[engine] the engine restarted while this task ran; task re-queued",
                    )
                self.store.update(
                    record.uuid,
                    status=QUEUED,
                    pid=None,
                    pid_create_time=None,
                    started_ms=None,
                    processing_time_ms=-1,
                    progress=0.0,
                    resume_stage=resume_stage,
                )
                requeued.append(record.uuid)
        self._wake.set()
        return requeued

    def start(self) -> None:
        """Start the supervising thread."""
        self._thread = threading.Thread(target=self._loop, name="engine-supervisor", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop supervising and kill the running task processes.

        Their tasks stay RUNNING in the table, so the next engine start re-queues them.
        """
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        with self._lock:
            for run in list(self._runs.values()):
                kill_process_group(run.process.pid)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    run.process.wait(timeout=2)
                run.output.close()
            self._runs.clear()

    def wake(self) -> None:
        """Ask the supervising thread to look at the queue now."""
        self._wake.set()

    # -- operations -----------------------------------------------------------------------
    def enqueue(self, uuid: str) -> TaskRecord:
        """Put a task at the end of the queue."""
        record = self.store.update(uuid, status=QUEUED, queue_seq=self.store.next_queue_seq())
        self._wake.set()
        return record

    def cancel(self, uuid: str) -> bool:
        """Cancel a queued or running task; its process group is killed and reaped.

        Returns:
            True when the task was queued or running (now CANCELED), False otherwise.
        """
        with self._lock:
            record = self.store.get(uuid)
            if record is None or record.status not in (QUEUED, RUNNING):
                return False
            run = self._runs.get(uuid)
            if run is not None:
                run.canceled = True
                kill_process_group(run.process.pid)
            else:
                leftover = _same_process(record.pid, record.pid_create_time)
                if leftover is not None:
                    kill_process_group(leftover.pid)
            elapsed = now_ms() - record.started_ms if record.started_ms else -1
            self.store.update(
                uuid,
                status=CANCELED,
                processing_time_ms=elapsed,
                finished_ms=now_ms(),
                pid=None,
                pid_create_time=None,
            )
        if run is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                run.process.wait(timeout=5)
            append_output(self.store.task_dir(uuid), "[engine] task canceled")
        self._wake.set()
        return True

    def is_running(self, uuid: str) -> bool:
        """True while a process of this task is alive."""
        with self._lock:
            return uuid in self._runs

    # -- the loop -------------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._tick()
            except Exception:  # the loop must survive; the error is logged with its traceback
                logger.exception("engine supervisor tick failed")
            self._wake.wait(self.poll_interval_seconds)
            self._wake.clear()

    def _tick(self) -> None:
        finished: list[str] = []
        with self._lock:
            for uuid, run in list(self._runs.items()):
                code = run.process.poll()
                if code is None:
                    self._refresh_progress(uuid)
                    continue
                run.output.close()
                del self._runs[uuid]
                if run.canceled:
                    continue
                if self._finish(uuid, code):
                    finished.append(uuid)
            queued = sorted(
                (r for r in self.store.all() if r.status == QUEUED), key=lambda r: r.queue_seq
            )
            for record in queued:
                if len(self._runs) >= self.max_parallel_tasks or self._stop.is_set():
                    break
                self._start(record)
        for uuid in finished:
            if self.on_finished is not None:
                threading.Thread(target=self.on_finished, args=(uuid,), daemon=True).start()
        if time.monotonic() - self._last_cleanup > 60:
            self._last_cleanup = time.monotonic()
            self.cleanup()

    def _refresh_progress(self, uuid: str) -> None:
        try:
            text = (self.store.task_dir(uuid) / PROGRESS_FILE).read_text(encoding="utf-8")
            progress = float(text.strip())
        except (OSError, ValueError):
            return
        record = self.store.get(uuid)
        if record is not None and abs(record.progress - progress) > 1e-6:
            self.store.update(uuid, progress=progress)

    def _start(self, record: TaskRecord) -> None:
        task_dir = self.store.task_dir(record.uuid)
        task_dir.mkdir(parents=True, exist_ok=True)
        for name in (RESULT_FILE, PROGRESS_FILE, STAGE_FILE, ZIP_FILE):
            (task_dir / name).unlink(missing_ok=True)
        self._run_ordinal += 1
        start_stage = record.resume_stage or record.rerun_from
        spec = {
            "uuid": record.uuid,
            "name": record.name,
            "options": record.typed_options,
            "rerun_from": start_stage,
            "outputs": record.outputs,
            "skip_post_processing": record.skip_post_processing,
            "faults": self.faults.to_dict(),
            "run_ordinal": self._run_ordinal,
            "engine_pid": os.getpid(),
        }
        write_atomic(task_dir / RUN_FILE, json.dumps(spec, indent=1))
        header = [f"[engine] run {record.run_count + 1} of task {record.uuid} ({record.name})"]
        if record.ignored_options:
            header.append("[engine] ignored unknown options: " + ", ".join(record.ignored_options))
        if start_stage:
            header.append(f"[engine] resuming from stage {start_stage}")
        append_output(task_dir, *header)
        output = open(task_dir / OUTPUT_FILE, "ab")  # noqa: SIM115 - closed when the run ends
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        process = subprocess.Popen(
            [sys.executable, "-m", "prefect_odm.engine", "run-task", str(task_dir)],
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            cwd=task_dir,
            env=env,
            start_new_session=True,
        )
        try:
            create_time: float | None = psutil.Process(process.pid).create_time()
        except psutil.Error:
            create_time = None
        self._runs[record.uuid] = _Run(record.uuid, process, output)
        self.store.update(
            record.uuid,
            status=RUNNING,
            started_ms=now_ms(),
            processing_time_ms=0,
            progress=0.0,
            error_message=None,
            pid=process.pid,
            pid_create_time=create_time,
            run_count=record.run_count + 1,
            resume_stage=None,
            finished_ms=None,
            webhook_sent=False,
        )
        if self.faults.die_after_task_seconds > 0:
            timer = threading.Timer(
                self.faults.die_after_task_seconds, os._exit, args=(DIE_EXIT_CODE,)
            )
            timer.daemon = True
            timer.start()

    def _finish(self, uuid: str, returncode: int) -> bool:
        """Record the end of a task process; True when the task COMPLETED or FAILED."""
        record = self.store.get(uuid)
        if record is None or record.status != RUNNING:
            return False
        task_dir = self.store.task_dir(uuid)
        result: TaskResult | None
        try:
            result = json.loads((task_dir / RESULT_FILE).read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            result = None
        elapsed = now_ms() - record.started_ms if record.started_ms else 0
        ok = (
            returncode == 0 and bool(result and result.get("ok")) and (task_dir / ZIP_FILE).exists()
        )
        if ok:
            self.store.update(
                uuid,
                status=COMPLETED,
                progress=100.0,
                processing_time_ms=elapsed,
                finished_ms=now_ms(),
                pid=None,
                pid_create_time=None,
            )
        else:
            message = describe_failure(returncode, result, read_output_lines(task_dir))
            append_output(task_dir, "[engine] task failed: " + message.splitlines()[0])
            self.store.update(
                uuid,
                status=FAILED,
                error_message=message,
                processing_time_ms=elapsed,
                finished_ms=now_ms(),
                pid=None,
                pid_create_time=None,
            )
        return True

    # -- clean-up -------------------------------------------------------------------------
    def cleanup(self) -> list[str]:
        """Delete uncommitted uploads and finished tasks older than ``cleanup_hours``.

        Returns:
            The UUIDs deleted.
        """
        if self.cleanup_hours <= 0:
            return []
        limit_ms = now_ms() - int(self.cleanup_hours * 3600 * 1000)
        removed = []
        for record in self.store.all():
            if record.status == PENDING:
                old = record.date_created_ms < limit_ms
            elif record.status in FINISHED:
                old = (record.finished_ms or record.date_created_ms) < limit_ms
            else:
                old = False
            if old:
                self.store.remove(record.uuid)
                shutil.rmtree(self.store.task_dir(record.uuid), ignore_errors=True)
                removed.append(record.uuid)
        return removed
