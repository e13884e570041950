"""Records kept by key in memory up to a budget, then appended to one file per key on disk.

The COPC writer spills the points of each octree cell here while the merge streams, and reads
each cell back whole to build it (Untwine's approach: points binned into files by voxel, each
file then built alone), so memory stays bounded by the budget plus one cell whatever the cloud.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

SpillKey = tuple[int, ...]
"""A spill key: ``(depth, cell)`` for a spill cell, ``(level, x, y, z)`` for an octree node."""

SPILL_BUDGET_BYTES = 128 * 2**20
"""Bytes of records held in memory across all keys before they are written to their files."""


class SpillStore:
    """Append-only record arrays by key, in memory or in files under a temporary folder.

    Args:
        dtype: the structured dtype of every record (raw LAS point records, for the writer).
        parent: folder to make the temporary spill folder in (None: the system's).
        budget_bytes: records held in memory before every buffer is flushed to its file
            (None: :data:`SPILL_BUDGET_BYTES`).
    """

    def __init__(
        self,
        dtype: np.dtype,
        parent: Path | None = None,
        budget_bytes: int | None = None,
    ) -> None:
        """Make the spill folder at once (nothing is written in it until the budget is passed)."""
        self.dtype = dtype
        self._folder = Path(tempfile.mkdtemp(prefix="prefect-odm-spill-", dir=parent))
        self._budget = SPILL_BUDGET_BYTES if budget_bytes is None else budget_bytes
        self._buffers: dict[SpillKey, list[NDArray[Any]]] = {}
        self._counts: dict[SpillKey, int] = {}
        self._files: dict[SpillKey, Path] = {}
        self._held = 0
        self._made = 0

    def append(self, key: SpillKey, records: NDArray[Any], *, copy: bool = False) -> None:
        """Add ``records`` after those already under ``key``.

        Args:
            key: the spill key.
            records: the records; without ``copy`` the store keeps this array itself until it
                is flushed (the caller must not change it, and a slice keeps its whole base
                array alive: pass slices that together cover their base, or copy).
            copy: keep a copy (for a small slice of a large array).
        """
        if records.size == 0:
            return
        self._buffers.setdefault(key, []).append(records.copy() if copy else records)
        self._counts[key] = self._counts.get(key, 0) + int(records.size)
        self._held += int(records.nbytes)
        if self._held > self._budget:
            self.flush()

    def flush(self) -> None:
        """Write every buffer to the end of its key's file and free the memory."""
        for key, parts in self._buffers.items():
            if key not in self._files:
                self._made += 1
                self._files[key] = self._folder / f"{self._made}.bin"
            path = self._files[key]
            with path.open("ab") as fh:
                for part in parts:
                    part.tofile(fh)
        self._buffers.clear()
        self._held = 0

    def keys(self) -> list[SpillKey]:
        """Every key that holds records, in the order they were first appended."""
        return list(self._counts)

    def count(self, key: SpillKey) -> int:
        """Records under ``key`` (0 if none)."""
        return self._counts.get(key, 0)

    def take(self, key: SpillKey) -> NDArray[Any]:
        """All records of ``key`` in append order, removed from the store."""
        path = self._files.pop(key, None)
        buffered = self._buffers.pop(key, [])
        self._held -= sum(int(p.nbytes) for p in buffered)
        out = np.empty(self._counts.pop(key, 0), dtype=self.dtype)
        at = 0
        if path is not None:  # read straight into the result: no second copy
            with path.open("rb") as fh:
                at = fh.readinto(out.data.cast("B")) // self.dtype.itemsize
            path.unlink()
        for part in buffered:
            out[at : at + part.size] = part
            at += part.size
        if at != out.size:
            raise RuntimeError(f"spill key {key}: {at} records read, {out.size} appended")
        return out

    def take_chunks(self, key: SpillKey, chunk: int) -> Iterator[NDArray[Any]]:
        """The records of ``key`` in append order, ``chunk`` at a time (the last one shorter),
        removed from the store: the buffers are flushed first and the file is read piece by
        piece, so memory is one chunk and two stores appended alike give the same pieces."""
        self.flush()
        path = self._files.pop(key, None)
        self._counts.pop(key, None)
        if path is None:
            return
        with path.open("rb") as fh:
            while True:
                part = np.fromfile(fh, dtype=self.dtype, count=chunk)
                if part.size == 0:
                    break
                yield part
        path.unlink()

    def close(self) -> None:
        """Remove the spill folder and everything left in it."""
        self._buffers.clear()
        self._counts.clear()
        self._files.clear()
        shutil.rmtree(self._folder, ignore_errors=True)
