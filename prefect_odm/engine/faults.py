"""Fault injection for the built-in engine (tests and drills only; OFF by default).

Faults are switched on only by the environment variable ``PREFECT_ODM_ENGINE_FAULTS`` or the
``serve --faults`` argument, both holding one JSON object. Every key is optional:

``fail_task_name`` (str, regex)
    a task whose name matches (``re.search``) fails before processing with ``fail_message``.
``fail_first_n_tasks`` (int)
    the first N task runs started by this engine process fail with ``fail_message``.
``fail_message`` (str, default ``"Injected failure"``)
    the message of the failures above (it appears in the task output and ``errorMessage``).
``oom_task_name`` (str, regex) / ``oom_first_n_tasks`` (int)
    simulate the out-of-memory killer: the task process prints a line and kills itself with
    SIGKILL (the engine sees exit code 137 / signal 9).
``oom_mode`` (``"sigkill"`` | ``"memoryerror"``, default ``"sigkill"``)
    ``"memoryerror"`` raises :class:`MemoryError` inside the task process instead.
``upload_error_every`` (int k)
    every k-th request to ``/task/new/upload/{uuid}`` (counted per engine process, 1-based)
    answers a bare HTTP 500 without storing anything. Deterministic.
``die_after_uploads`` (int N)
    the engine process dies (``os._exit(70)``) while handling the N-th upload request, after the
    files were stored and before it answers.
``die_after_task_seconds`` (float S)
    the engine process dies (``os._exit(70)``) S seconds after a task process was started.
``slow_seconds`` (float N)
    each task process waits N seconds (printing a line per second) before processing.
``slow_download_seconds`` (float N)
    each ``/task/{uuid}/download/{asset}`` request waits N seconds before it answers.
``stand_in_pipeline`` (bool)
    use :data:`STAND_IN_PIPELINE` (:class:`StandInPipeline`), a tiny fake photogrammetry
    pipeline that writes small placeholder files in ODM's layout, instead of
    :mod:`prefect_odm.engine.pipeline`.

Example::

    PREFECT_ODM_ENGINE_FAULTS='{"upload_error_every": 3, "slow_seconds": 2}'
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from prefect_odm.engine.api_records import OptionEntry
from prefect_odm.engine.pipeline_options import (
    STAGES,
    bool_option,
    enum_option,
    option,
    stage_option,
)
from prefect_odm.errors import InputError
from prefect_odm.models import OptionValue
from prefect_odm.registry import PRODUCTS, REPORT_FOLDER
from prefect_odm.settings import get_settings

DIE_EXIT_CODE = 70
"""Exit code of an engine process that dies on purpose."""


FaultSetting = str | int | float | bool | None
"""The value of one :class:`Faults` field (a name pattern, a count, seconds, a switch)."""


class InjectedFailure(RuntimeError):
    """A task failure injected by :class:`Faults` (never raised unless asked for)."""


@dataclass(frozen=True)
class Faults:
    """Parsed fault configuration; the default instance injects nothing."""

    fail_task_name: str | None = None
    fail_first_n_tasks: int = 0
    fail_message: str = "Injected failure"
    oom_task_name: str | None = None
    oom_first_n_tasks: int = 0
    oom_mode: str = "sigkill"
    upload_error_every: int = 0
    die_after_uploads: int = 0
    die_after_task_seconds: float = 0.0
    slow_seconds: float = 0.0
    slow_download_seconds: float = 0.0
    stand_in_pipeline: bool = False

    @classmethod
    def from_json(cls, text: str | None) -> Faults:
        """Parse a JSON object (``None`` or empty text gives no faults).

        Raises:
            InputError: the text is not a JSON object or holds an unknown key or bad value.
        """
        if not text or not text.strip():
            return cls()
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InputError(f"fault configuration is not valid JSON: {exc}") from exc
        if not isinstance(data, dict):
            raise InputError("fault configuration must be a JSON object")
        return cls.from_dict(data)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Faults:
        """Build from a mapping of the documented keys.

        Raises:
            InputError: an unknown key or a value of the wrong type.
        """
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(set(data) - set(known))
        if unknown:
            raise InputError(f"unknown fault keys: {', '.join(unknown)}")
        if data.get("oom_mode", "sigkill") not in ("sigkill", "memoryerror"):
            raise InputError("oom_mode must be 'sigkill' or 'memoryerror'")
        try:
            return cls(**dict(data))
        except TypeError as exc:
            raise InputError(f"bad fault configuration: {exc}") from exc

    @classmethod
    def from_env(cls) -> Faults:
        """Read ``PREFECT_ODM_ENGINE_FAULTS`` (no variable: no faults)."""
        return cls.from_json(get_settings().engine_faults)

    def to_dict(self) -> dict[str, FaultSetting]:
        """The configuration as a JSON-ready mapping (only keys that differ from the default)."""
        default = Faults()
        return {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if getattr(self, f.name) != getattr(default, f.name)
        }

    @property
    def active(self) -> bool:
        """True when any fault is configured."""
        return bool(self.to_dict())

    # -- engine (server) side -------------------------------------------------------------
    def upload_should_fail(self, upload_ordinal: int) -> bool:
        """True when the ``upload_ordinal``-th upload request (1-based) must answer HTTP 500."""
        k = self.upload_error_every
        return k > 0 and upload_ordinal % k == 0

    def die_if_upload_limit(self, upload_ordinal: int) -> None:
        """End the engine process at once on the ``die_after_uploads``-th upload request."""
        if self.die_after_uploads and upload_ordinal >= self.die_after_uploads:
            os._exit(DIE_EXIT_CODE)

    # -- task process side ----------------------------------------------------------------
    def before_processing(self, *, name: str, run_ordinal: int, log: Callable[[str], None]) -> None:
        """Apply the task-side faults before the pipeline runs.

        Args:
            name: the task's name.
            run_ordinal: 1-based number of this task run among the runs started by the engine.
            log: the task's console output.

        Raises:
            InjectedFailure: the task was asked to fail.
            MemoryError: ``oom_mode`` is ``"memoryerror"`` and the task was asked to run out.
        """
        if self.slow_seconds > 0:
            deadline = time.monotonic() + self.slow_seconds
            while (left := deadline - time.monotonic()) > 0:
                log(f"[fault] slow processing: {left:.0f} s left")
                time.sleep(min(1.0, left))
        oom = (self.oom_task_name is not None and re.search(self.oom_task_name, name)) or (
            run_ordinal <= self.oom_first_n_tasks
        )
        if oom:
            log("[fault] simulating out of memory")
            if self.oom_mode == "memoryerror":
                raise MemoryError("injected out of memory")
            os.kill(os.getpid(), signal.SIGKILL)
        fail = (self.fail_task_name is not None and re.search(self.fail_task_name, name)) or (
            run_ordinal <= self.fail_first_n_tasks
        )
        if fail:
            raise InjectedFailure(self.fail_message)


# -- the stand-in pipeline ----------------------------------------------------------------------

_STAND_IN_STAGES: tuple[str, ...] = STAGES

_STAND_IN_OPTIONS: list[OptionEntry] = [
    option(
        "orthophoto-resolution",
        "float",
        "5",
        "float > 0.0",
        "Orthophoto resolution in cm/pixel.",
    ),
    bool_option("dsm", "Build a DSM."),
    bool_option("dtm", "Build a DTM."),
    enum_option("pipeline", "sfm", ["sfm", "direct"], "Reconstruction method."),
    option(
        "resize-to",
        "int",
        "2048",
        "integer",
        "Resize images to this many pixels on the long side (-1: no resizing).",
    ),
    stage_option("end-with", "odm_report", "End processing at this stage."),
    stage_option("rerun-from", "", "Rerun processing from this stage."),
    option("max-concurrency", "int", "2", "integer > 0", "Maximum number of threads."),
]


_STAND_IN_FILES: dict[str, tuple[str, bytes | None]] = {
    "odm_dem": (PRODUCTS["dsm"].odm_path, b"stand-in dsm\n"),
    "odm_orthophoto": (PRODUCTS["orthophoto"].odm_path, b"stand-in\n"),
    "odm_georeferencing": (PRODUCTS["point_cloud"].odm_path, b"stand-in laz\n"),
    "odm_report": (f"{REPORT_FOLDER}/images.txt", None),
}
"""Stage -> (placeholder file it writes, its bytes; None: the image names, one a line)."""


class StandInPipeline:
    """A tiny fake photogrammetry pipeline with the pipeline contract.

    It has :mod:`.pipeline`'s ``STAGES``, a few of its ``OPTIONS`` and a ``run`` that writes
    small placeholder files in ODM's layout, one marker file per stage: tests of the server and
    the task processes run in a fraction of a second with it.
    """

    STAGES: tuple[str, ...] = _STAND_IN_STAGES
    OPTIONS: list[OptionEntry] = _STAND_IN_OPTIONS

    def run(
        self,
        task_dir: Path,
        options: Mapping[str, OptionValue | None],
        *,
        rerun_from: str | None = None,
        log: Callable[[str], None] = print,
    ) -> None:
        """Write placeholder products in ODM's layout, one marker file per stage.

        Stages before ``rerun_from`` whose marker exists are skipped, as ODM's ``rerun-from``
        does.

        Raises:
            InputError: no image in ``task_dir/images``.
        """
        task_dir = Path(task_dir)
        images = sorted(p.name for p in (task_dir / "images").iterdir() if p.is_file())
        if not images:
            raise InputError("no images")
        markers = task_dir / "stand_in"
        markers.mkdir(exist_ok=True)
        start = self.STAGES.index(rerun_from) if rerun_from in self.STAGES else 0
        end_with = options.get("end-with") or self.STAGES[-1]
        for index, stage in enumerate(self.STAGES):
            marker = markers / f"{stage}.done"
            if index < start and marker.exists():
                log(f"Skipping {stage} stage (rerun-from {rerun_from})")
                continue
            log(f"Running {stage} stage")
            placeholder = _STAND_IN_FILES.get(stage)
            if placeholder is not None:
                path = task_dir / placeholder[0]
                path.parent.mkdir(exist_ok=True)
                path.write_bytes(placeholder[1] or ("\n".join(images) + "\n").encode())
            marker.write_text(json.dumps({"options": options, "rerun_from": rerun_from}))
            if stage == end_with:
                break
        log("Stand-in pipeline finished")


STAND_IN_PIPELINE = StandInPipeline()
"""The stand-in pipeline (see :class:`StandInPipeline`)."""
