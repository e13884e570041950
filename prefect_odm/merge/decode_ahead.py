"""LAZ inputs decoded one chunk ahead in a worker process, while the merge works on the last.

lazrs decodes a LAZ file's chunks on every core but holds the GIL for the whole call (measured:
a Python thread ran at 5 % of its speed during ``decompress_many``), so the merge's own work (the
``nogil`` kernels of :mod:`.point_kernels`, the spill) cannot overlap it in a thread. Here a
spawned worker process decodes the inputs in order, with laspy's reader (lazrs, parallel), into
two shared-memory slots of one chunk each; the merge takes a chunk, works on it and gives its
slot back, so the worker decodes the next chunk meanwhile. The chunks are the same points, bytes
and order as ``laspy`` ``chunk_iterator`` gives in process: the merged file is the same.

The worker imports laspy, lazrs and numpy only (this module's imports); its CPU time is the
parent's children's time (``os.times``) once it is joined.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator, Sequence
from multiprocessing import resource_tracker
from multiprocessing.shared_memory import SharedMemory
from pathlib import Path

import laspy
import numpy as np

_SLOTS = 2
"""Chunks in flight: one the merge works on, one the worker decodes."""


def _buffer(memory: SharedMemory) -> memoryview:
    """The bytes of an open shared-memory segment."""
    assert memory.buf is not None, "an open segment has its buffer"
    return memory.buf


def peak_mib() -> float:
    """This process's peak resident memory (``VmHWM``), MiB; 0 where unknown."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return 0.0


def start_worker(module: str, job: dict[str, object]) -> subprocess.Popen[bytes]:
    """``python -m module JOB`` with this process's import path, talking over its stdin and
    stdout (not :mod:`multiprocessing`, which would import the caller's ``__main__`` again)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    return subprocess.Popen(
        [sys.executable, "-m", module, json.dumps(job)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
    )


def stop_worker(proc: subprocess.Popen[bytes]) -> None:
    """Stop a :func:`start_worker` process if it still runs, wait for it, close its pipes."""
    if proc.poll() is None:
        proc.terminate()
    proc.wait()
    for pipe in (proc.stdin, proc.stdout):
        try:
            if pipe is not None:
                pipe.close()
        except BrokenPipeError:  # a last word written after the worker ended
            pass


def _read_into(reader: laspy.LasReader, buffer: memoryview, size: int) -> None:
    """The next ``size`` bytes of points of ``reader`` into ``buffer``: decoded straight into it
    (lazrs), or copied (an uncompressed LAS or another backend)."""
    source = reader.point_source
    view = buffer[:size]
    try:
        decompressor = getattr(source, "decompressor", None)
        if decompressor is not None:
            decompressor.decompress_many(view)
        else:
            data = source.read_n_points(size // reader.header.point_format.size)
            if len(data) != size:
                raise OSError(f"{len(data)} bytes of points read, {size} expected")
            view[:] = data
    finally:
        view.release()


def read_chunks(path: Path, chunk_points: int) -> Iterator[laspy.ScaleAwarePointRecord]:
    """The chunks of a LAS/LAZ file read in this process, like ``laspy`` ``chunk_iterator``
    (the same points, bytes and order), decoded into one buffer used again for every chunk.

    laspy allocates and zero-fills a new buffer per chunk (a page fault per 4 KiB of every chunk:
    0.56 CPU-s of 12 million points, issue 36's profile); here each chunk is decoded straight into
    the pages of the last one. A chunk is valid until the next is asked for (the merge copies
    what it keeps).

    Raises:
        OSError: the file cannot be read, or holds fewer points than its header says.
        laspy.LaspyException: not a LAS/LAZ file.
    """
    with laspy.open(path) as reader:
        header = reader.header
        fmt = header.point_format
        left = int(header.point_count)
        buffer = bytearray(max(1, min(chunk_points, left)) * fmt.size)
        view = memoryview(buffer)
        while left > 0:
            n = min(chunk_points, left)
            _read_into(reader, view, n * fmt.size)
            array = np.frombuffer(buffer, dtype=fmt.dtype(), count=n)
            yield laspy.ScaleAwarePointRecord(array, fmt, header.scales, header.offsets)
            left -= n


def _decode_inputs(paths: Sequence[str], chunk_points: int, slots: Sequence[str]) -> None:
    """The worker: decode every input in order, chunk by chunk, into the free slots.

    Reads a free slot's number per line on stdin; writes ``chunk <input> <slot> <points>`` per
    chunk, ``end <input>`` at each input's end, ``error <input> <message>`` on a failure (then
    stops) and ``peak <MiB>`` last, a line each on stdout.
    """
    memories = [SharedMemory(name=name) for name in slots]
    buffers = [_buffer(m) for m in memories]
    for memory in memories:  # the parent owns them: not unlinked when this process ends
        resource_tracker.unregister(memory._name, "shared_memory")  # type: ignore[attr-defined]
    out = sys.stdout
    try:
        for number, path in enumerate(paths):
            try:
                with laspy.open(path) as reader:
                    size = reader.header.point_format.size
                    left = int(reader.header.point_count)
                    while left > 0:
                        slot = int(sys.stdin.readline())
                        n = min(chunk_points, left)
                        _read_into(reader, buffers[slot], n * size)
                        out.write(f"chunk {number} {slot} {n}\n")
                        out.flush()
                        left -= n
            except Exception as exc:  # noqa: BLE001 - any failure is reported, named
                message = f"{type(exc).__name__}: {exc}".replace("\n", " ")
                out.write(f"error {number} {message}\n")
                out.flush()
                return
            out.write(f"end {number}\n")
            out.flush()
        out.write(f"peak {peak_mib()}\n")
        out.flush()
    finally:
        buffers.clear()
        for memory in memories:
            memory.close()


class DecodeAhead:
    """Decode LAZ (or LAS) inputs in a worker process, one chunk ahead of the merge.

    Use as a context manager; :meth:`chunks` yields each input's chunks, in order, as laspy point
    records whose arrays lie in shared memory: valid until the next chunk is asked for (the merge
    copies what it keeps).

    Args:
        paths: the inputs, in the order they will be read.
        chunk_points: points per chunk (the last of each input shorter).
        point_size: bytes of the largest point record of any input.
    """

    def __init__(self, paths: Sequence[Path], chunk_points: int, point_size: int) -> None:
        """Make the slots and start the worker (``python -m`` this module, with this process's
        import path: nothing of the caller's ``__main__`` is imported again)."""
        self._paths = [str(p) for p in paths]
        self._memories = [
            SharedMemory(create=True, size=max(1, chunk_points * point_size)) for _ in range(_SLOTS)
        ]
        self._buffers = [_buffer(m) for m in self._memories]
        job = {"paths": self._paths, "chunk_points": chunk_points}
        job["slots"] = [m.name for m in self._memories]
        self._proc = start_worker(__name__, job)
        self._next = 0
        self.worker_peak_mib = 0.0
        """The worker's peak resident memory, MiB (shared slots included), once all is read."""
        for slot in range(_SLOTS):
            self._give(slot)

    def __enter__(self) -> DecodeAhead:
        """The decoder itself."""
        return self

    def __exit__(self, *exc: object) -> None:
        """Stop the worker and free the shared memory."""
        self.close()

    def _give(self, slot: int) -> None:
        assert self._proc.stdin is not None
        try:
            self._proc.stdin.write(b"%d\n" % slot)
            self._proc.stdin.flush()
        except BrokenPipeError:  # the worker has ended: its last lines say why
            pass

    def _get(self) -> list[str]:
        assert self._proc.stdout is not None
        line = self._proc.stdout.readline()
        if not line:
            code = self._proc.wait()
            raise OSError(f"the LAZ decoding worker ended (exit code {code})")
        return line.decode().rstrip("\n").split(" ", 2)

    def chunks(self, number: int, header: laspy.LasHeader) -> Iterator[laspy.ScaleAwarePointRecord]:
        """The chunks of input ``number`` (read in order: 0, 1, ...), with ``header``'s format.

        Raises:
            ValueError: inputs asked for out of order.
            OSError: the worker failed to read the input (its message) or ended.
        """
        if number != self._next:
            raise ValueError(f"input {number} asked for, the worker decodes {self._next}")
        fmt = header.point_format
        dtype = fmt.dtype()
        held: int | None = None
        try:
            while True:
                word = self._get()
                if held is not None:
                    self._give(held)
                    held = None
                if word[0] == "error":
                    raise OSError(word[2])
                if word[0] == "end":
                    break
                slot, n = (int(v) for v in word[2].split())
                held = slot
                array = np.frombuffer(self._buffers[slot], dtype=dtype, count=n)
                yield laspy.ScaleAwarePointRecord(array, fmt, header.scales, header.offsets)
                del array
        finally:
            if held is not None:
                self._give(held)
        self._next += 1

    def close(self) -> None:
        """Stop the worker (if still running), wait for it and free the shared memory."""
        if self._next == len(self._paths):  # all read: the worker's last word, its peak
            try:
                word = self._get()
                if word[0] == "peak":
                    self.worker_peak_mib = float(word[1])
            except OSError:
                pass
        stop_worker(self._proc)
        self._buffers.clear()
        for memory in self._memories:
            try:
                memory.close()
            except BufferError:  # a chunk still referenced: the mapping goes with it
                pass
            memory.unlink()


def _main() -> None:
    job = json.loads(sys.argv[1])
    _decode_inputs(job["paths"], int(job["chunk_points"]), job["slots"])


if __name__ == "__main__":
    _main()
