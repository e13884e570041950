"""The task process of the built-in engine: ``python -m prefect_odm.engine run-task TASK_DIR``.

Each task run is its own process, started by the :class:`~.supervisor.Supervisor` in a new
session (its own process group) so that cancelling kills it and every child it spawned with one
``killpg``. Its stdout and stderr are appended to ``TASK_DIR/task_output.txt``, so the console
output survives an engine restart. The task process:

- reads ``TASK_DIR/run.json`` (options, stage to resume from, faults, run number);
- runs ``pipeline.run`` on ``TASK_DIR`` (images in ``TASK_DIR/images``);
- writes its progress to ``TASK_DIR/progress.txt`` and, on success, ``TASK_DIR/all.zip``
  (temporary name, then renamed);
- writes ``TASK_DIR/result.json`` and exits 0 (success), 1 (failure) or 137 (out of memory);
- kills its own process group when the engine that started it dies, so no orphan keeps working
  after an engine crash (the restarted engine re-queues the task).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from prefect_odm.engine.faults import Faults
from prefect_odm.engine.task_files import (
    OOM_EXIT_CODE,
    PROGRESS_FILE,
    RESULT_FILE,
    RUN_FILE,
    STAGE_FILE,
    TaskResult,
    build_zip,
    write_atomic,
)

TASK_NICENESS = 10
"""How much lower a task process's CPU priority is than the engine's (``nice``): the API answers
and the flow's uploads, downloads and checks go first when processing fills the cores."""


class _ProgressLog:
    """Console output of the task process that also turns stage names into progress (0-100)."""

    def __init__(self, task_dir: Path, stages: tuple[str, ...], start_stage: str | None) -> None:
        self.task_dir = task_dir
        self.stages = stages
        self.index = stages.index(start_stage) if start_stage in stages else -1
        self.patterns = [re.compile(rf"(?<![\w-]){re.escape(s)}(?![\w-])") for s in stages]
        self.write_progress(0.0 if self.index < 0 else 100.0 * self.index / len(stages))
        if self.index >= 0:
            write_atomic(task_dir / STAGE_FILE, stages[self.index] + "\n")

    def write_progress(self, progress: float) -> None:
        """Write ``progress`` (0-100) to the progress file the supervisor polls."""
        write_atomic(self.task_dir / PROGRESS_FILE, f"{progress:.1f}\n")

    def __call__(self, line: str) -> None:
        text = str(line)
        sys.stdout.write(text.rstrip("\n") + "\n")
        sys.stdout.flush()
        for index in range(self.index + 1, len(self.stages)):
            if self.patterns[index].search(text):
                self.index = index
                self.write_progress(100.0 * index / len(self.stages))
                write_atomic(self.task_dir / STAGE_FILE, self.stages[index] + "\n")
                break


def _watch_parent(engine_pid: int) -> None:
    """Kill this task's process group when the engine process that started it is gone."""

    def loop() -> None:
        while True:
            if os.getppid() != engine_pid:
                with contextlib.suppress(OSError):
                    os.killpg(os.getpgrp(), signal.SIGKILL)
                os._exit(1)
            time.sleep(0.5)

    threading.Thread(target=loop, name="watch-engine", daemon=True).start()


def run_task(task_dir: Path) -> int:
    """Entry point of a task process; returns the process exit code.

    Args:
        task_dir: the task folder with ``run.json`` and ``images/``.

    Returns:
        0 on success, :data:`OOM_EXIT_CODE` on :class:`MemoryError`, 1 on any other failure
        (the reason is in ``result.json`` and the console output).
    """
    from prefect_odm.engine.options import load_pipeline

    task_dir = Path(task_dir).resolve()
    # Below the engine's API and the flow on the same cores: an upload, a download or a status
    # answer never waits behind processing (issue 14: on 2 cores shared by 4 busy nodes, uploads
    # took 2.4x as long as on a quiet machine).
    os.nice(TASK_NICENESS)
    spec = json.loads((task_dir / RUN_FILE).read_text(encoding="utf-8"))
    engine_pid = spec.get("engine_pid")
    if engine_pid:
        _watch_parent(int(engine_pid))
    faults = Faults.from_dict(spec.get("faults") or {})
    result_path = task_dir / RESULT_FILE
    rerun_from = spec.get("rerun_from")
    log: Callable[[str], None] = print
    try:
        pipeline = load_pipeline(stand_in=faults.stand_in_pipeline)
        log = _ProgressLog(task_dir, tuple(pipeline.STAGES), rerun_from)
        faults.before_processing(
            name=spec.get("name", ""), run_ordinal=int(spec.get("run_ordinal", 1)), log=log
        )
        pipeline.run(task_dir, dict(spec["options"]), rerun_from=rerun_from, log=log)
        log("Building all.zip")
        build_zip(task_dir, spec.get("outputs"))
    except MemoryError as exc:
        _report_failure(log, exc)
        _write_result(result_path, {"ok": False, "memory": True, "error": str(exc)})
        return OOM_EXIT_CODE
    except BaseException as exc:  # the process ends here; the reason goes to result.json
        _report_failure(log, exc)
        message = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        _write_result(result_path, {"ok": False, "memory": False, "error": message})
        return 1
    write_atomic(task_dir / PROGRESS_FILE, "100.0\n")
    _write_result(result_path, {"ok": True})
    log("Task completed")
    return 0


def _write_result(path: Path, result: TaskResult) -> None:
    """Write the task's :data:`RESULT_FILE` (atomically: the engine reads it when we exit)."""
    write_atomic(path, json.dumps(result))


def _report_failure(log: Callable[[str], None], exc: BaseException) -> None:
    for line in traceback.format_exception(exc):
        for part in line.rstrip("\n").splitlines():
            log(part)
