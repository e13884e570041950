"""Files of one engine task folder: console output, run spec, result, progress, all.zip.

The engine (:mod:`.supervisor`) and the task process (:mod:`.runner`) talk through these files,
so a task's state and console output survive an engine restart.
"""

from __future__ import annotations

import os
import time
import zipfile
from pathlib import Path, PurePosixPath
from typing import NotRequired, TypedDict

from prefect_odm.registry import PRODUCTS, REPORT_FOLDER

OUTPUT_FILE = "task_output.txt"
RUN_FILE = "run.json"
RESULT_FILE = "result.json"
PROGRESS_FILE = "progress.txt"
STAGE_FILE = "stage.txt"
ZIP_FILE = "all.zip"
OOM_EXIT_CODE = 137
LAST_LINES_IN_ERROR = 10

DEFAULT_ZIP_CONTENTS: tuple[str, ...] = (
    *dict.fromkeys(PurePosixPath(p.odm_path).parts[0] for p in PRODUCTS.values()),
    "odm_texturing",
    REPORT_FOLDER,
    "entwine_pointcloud",
    "3d_tiles",
    "images.json",
    "cameras.json",
    "log.json",
    OUTPUT_FILE,
)
"""What all.zip holds when the client gave no ``outputs`` (NodeODM's default set)."""


class TaskResult(TypedDict):
    """What a task process writes to :data:`RESULT_FILE` when it ends."""

    ok: bool
    """The pipeline ran to its end and all.zip was built."""
    memory: NotRequired[bool]
    """The process ran out of memory (a :class:`MemoryError`)."""
    error: NotRequired[str]
    """Why it failed, one line."""


def now_ms() -> int:
    """Current time in epoch milliseconds."""
    return int(time.time() * 1000)


def read_output_lines(task_dir: Path) -> list[str]:
    """The task's console output, one string per line (empty when there is none yet)."""
    path = Path(task_dir) / OUTPUT_FILE
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    return data.decode("utf-8", errors="replace").splitlines()


def append_output(task_dir: Path, *lines: str) -> None:
    """Append lines to the task's console output."""
    with open(Path(task_dir) / OUTPUT_FILE, "a", encoding="utf-8") as fh:
        for line in lines:
            fh.write(line.rstrip("\n") + "\n")


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same folder (atomic)."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def safe_relative(task_dir: Path, relative: str) -> Path | None:
    """Resolve ``relative`` inside ``task_dir``; None when it would leave the folder."""
    root = Path(task_dir).resolve()
    candidate = (root / relative).resolve()
    if candidate == root or root in candidate.parents:
        return candidate
    return None


STORED_SUFFIXES = frozenset({".tif", ".tiff", ".laz", ".jpg", ".jpeg", ".png"})
"""Files put in all.zip as they are: the products are compressed already (DEFLATE gained 0.06 %
on a 41 MB orthophoto and made a LAZ larger), so deflating cost the engine and then the client
CPU for nothing."""


def build_zip(task_dir: Path, outputs: list[str] | None) -> Path:
    """Write ``task_dir/all.zip`` with the products (or only ``outputs``), atomically; already
    compressed files (:data:`STORED_SUFFIXES`) stored, the rest deflated.

    Args:
        task_dir: the task folder.
        outputs: paths relative to the task folder (files or folders) to include; None for
            :data:`DEFAULT_ZIP_CONTENTS`. Missing paths and paths leaving the folder are skipped.

    Returns:
        The path of all.zip.
    """
    task_dir = Path(task_dir)
    root = task_dir.resolve()
    wanted = list(outputs) if outputs else list(DEFAULT_ZIP_CONTENTS)
    tmp = task_dir / f".{ZIP_FILE}.tmp"
    seen: set[str] = set()
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=1) as zf:
        for relative in wanted:
            path = safe_relative(task_dir, relative)
            if path is None or not path.exists():
                continue
            files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
            for file in files:
                arcname = file.resolve().relative_to(root).as_posix()
                if arcname in seen or arcname in (ZIP_FILE, f".{ZIP_FILE}.tmp"):
                    continue
                seen.add(arcname)
                stored = file.suffix.lower() in STORED_SUFFIXES
                zf.write(file, arcname, compress_type=zipfile.ZIP_STORED if stored else None)
    final = task_dir / ZIP_FILE
    os.replace(tmp, final)
    return final
