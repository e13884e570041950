"""COPC nodes compressed in a worker process while the builder makes the next nodes.

lazrs compresses on every core but holds the GIL for the whole ``compress_chunks`` call, so the
builder's own work (sorting a spill cell, its levels, the reorder) could not overlap it in a
thread. Here a worker process (``python -m`` this module, with the caller's import path) owns
lazrs's ``ParLasZipCompressor`` on the file: each batch of nodes is copied into a shared-memory
segment, handed over and compressed there while the builder goes on; at most one batch waits
in the worker. The chunks are compressed by the same call in the same order, so the file is the
same byte for byte. The worker's CPU time is the caller's children's time once it is waited for.
"""

from __future__ import annotations

import json
import sys
from multiprocessing import resource_tracker
from multiprocessing.shared_memory import SharedMemory
from pathlib import Path

import lazrs
import numpy as np
from numpy.typing import NDArray

from prefect_odm.merge.decode_ahead import peak_mib, start_worker, stop_worker


def _compress_batches(path: str, offset: int, vlr_data: bytes) -> None:
    """The worker: compress each batch named on stdin into ``path`` from ``offset`` on.

    Lines in: ``batch <segment> <bytes,bytes,...>`` (one LAZ chunk per size) and ``done``; out:
    ``ok`` per batch, ``closed`` once the chunk table is written, ``error <message>`` on a
    failure (then it stops).
    """
    with open(path, "r+b") as fh:
        fh.seek(offset)
        compressor = lazrs.ParLasZipCompressor(fh, lazrs.LazVlr(vlr_data))
        compressor.reserve_offset_to_chunk_table()
        for line in sys.stdin:
            word = line.split()
            if word[0] == "done":
                compressor.done()
                break
            memory = SharedMemory(name=word[1])
            resource_tracker.unregister(memory._name, "shared_memory")  # type: ignore[attr-defined]
            try:
                assert memory.buf is not None
                data = np.frombuffer(memory.buf, dtype=np.uint8)
                sizes = [int(v) for v in word[2].split(",")]
                stops = np.cumsum(sizes)
                compressor.compress_chunks(
                    [data[stop - size : stop] for size, stop in zip(sizes, stops, strict=True)]
                )
                del data
            finally:
                memory.close()
            sys.stdout.write("ok\n")
            sys.stdout.flush()
    sys.stdout.write(f"closed {peak_mib()}\n")
    sys.stdout.flush()


class EncodeAhead:
    """lazrs's parallel LAZ compressor, run in a worker process (the calls of
    ``ParLasZipCompressor`` that :class:`.copc_file.CopcFileWriter` makes).

    Args:
        path: the file, written up to ``offset`` and closed by the caller meanwhile.
        offset: where the points start (the reserved chunk-table offset first).
        vlr: the LAZ VLR the chunks are compressed with.
    """

    def __init__(self, path: Path, offset: int, vlr: lazrs.LazVlr) -> None:
        """Start the worker (it opens the file, reserves the chunk table's offset)."""
        job = {"path": str(path), "offset": offset, "vlr": bytes(vlr.record_data()).hex()}
        self._proc = start_worker(__name__, job)
        self._waiting: list[SharedMemory] = []
        self._spare: list[SharedMemory] = []
        self.worker_peak_mib = 0.0
        """The worker's peak resident memory, MiB (its shared segments included), once done."""

    def _say(self, line: str) -> None:
        assert self._proc.stdin is not None
        try:
            self._proc.stdin.write(line.encode() + b"\n")
            self._proc.stdin.flush()
        except BrokenPipeError:
            self._hear()  # says why, or that it ended

    def _hear(self) -> str:
        assert self._proc.stdout is not None
        line = self._proc.stdout.readline().decode().strip()
        if not line or line.startswith("error"):
            code = self._proc.wait()
            raise OSError(f"the LAZ compression worker ended (exit code {code}) {line}".strip())
        return line

    def _settle(self, keep: int) -> None:
        """Wait until at most ``keep`` batches are left in the worker; free the others."""
        while len(self._waiting) > keep:
            self._hear()
            self._spare.append(self._waiting.pop(0))

    def _segment(self, size: int) -> SharedMemory:
        """A shared-memory segment of at least ``size`` bytes: a spare one (its pages already
        mapped) when it is large enough, else a new one."""
        while self._spare:
            memory = self._spare.pop()
            if memory.size >= size:
                return memory
            memory.close()
            memory.unlink()
        return SharedMemory(create=True, size=size)

    def compress_chunks(self, chunks: list[NDArray[np.uint8]]) -> None:
        """Hand one batch (a LAZ chunk per array) to the worker; returns once it is copied and at
        most this batch is still waiting there."""
        sizes = [int(c.size) for c in chunks]
        memory = self._segment(max(1, sum(sizes)))
        try:
            assert memory.buf is not None
            data = np.frombuffer(memory.buf, dtype=np.uint8)
            at = 0
            for chunk in chunks:
                data[at : at + chunk.size] = chunk
                at += chunk.size
            del data
        except BaseException:
            memory.close()
            memory.unlink()
            raise
        self._settle(0)
        self._waiting.append(memory)
        self._say(f"batch {memory.name} {','.join(map(str, sizes))}")

    def done(self) -> None:
        """Compress what waits, write the chunk table; the worker closes the file and ends.

        Raises:
            OSError: the worker failed (its message) or ended.
        """
        self._settle(0)
        self._say("done")
        word = self._hear().split()
        if word[0] != "closed":
            raise OSError("the LAZ compression worker did not close the file")
        self.worker_peak_mib = float(word[1])
        self._proc.wait()
        self.close()

    def close(self) -> None:
        """Stop the worker if it still runs; free every segment."""
        stop_worker(self._proc)
        for memory in self._waiting + self._spare:
            memory.close()
            memory.unlink()
        self._waiting.clear()
        self._spare.clear()


def _main() -> None:
    job = json.loads(sys.argv[1])
    try:
        _compress_batches(job["path"], int(job["offset"]), bytes.fromhex(job["vlr"]))
    except Exception as exc:  # noqa: BLE001 - reported to the parent, one line
        sys.stdout.write(f"error {type(exc).__name__}: {exc}".replace("\n", " ") + "\n")
        sys.stdout.flush()
        raise SystemExit(1) from None


if __name__ == "__main__":
    _main()
