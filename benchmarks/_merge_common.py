"""Shared helpers of the merge benchmarks (imported as ``_merge_common``).

``run_in_child`` measures one merge in a fresh process; the raster writers are the merge tests'
own (``tests/merge/conftest.py``), so tests and benchmarks write their inputs the same way.
"""

from __future__ import annotations

import multiprocessing as mp
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "merge"))

from conftest import rgba_profile  # noqa: E402

__all__ = ["bench_folder", "rgba_profile", "run_in_child"]


@contextmanager
def bench_folder(keep: Path | None, prefix: str) -> Iterator[Path]:
    """The benchmark's working folder: ``keep`` (made, kept afterwards) or a temporary one
    (removed afterwards)."""
    root = keep or Path(tempfile.mkdtemp(prefix=prefix))
    root.mkdir(parents=True, exist_ok=True)
    try:
        yield root
    finally:
        if keep is None:
            shutil.rmtree(root, ignore_errors=True)


def run_in_child(target: Callable[..., None], *args: Any) -> tuple[Any, ...]:
    """Run ``target(*args, queue)`` in a spawned process; returns what it put on the queue.

    Raises:
        SystemExit: the child exited with a non-zero code.
    """
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=target, args=(*args, queue))
    proc.start()
    result = queue.get()
    proc.join()
    if proc.exitcode != 0:
        raise SystemExit(f"benchmark child failed with exit code {proc.exitcode}")
    return result  # type: ignore[no-any-return]
