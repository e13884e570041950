"""LAZ inputs decoded one chunk ahead in a thread of this process, while the merge works on the
last.

lazrs holds the GIL for the whole of each call, but a ``nogil`` kernel already entered in another
thread (:mod:`.point_kernels`) and numpy's loops keep running meanwhile. So the thread here decodes
each chunk in several short calls (:data:`STEP_POINTS` points each, still decoded on every core
by lazrs's parallel decompressor): between two calls the merge's thread takes the GIL, starts its
next kernel or numpy loop and gives the GIL back, and the decoding goes on beside it. The chunks
are the same points, bytes and order as ``laspy`` ``chunk_iterator`` gives (two buffers used in
turn: one the merge works on, one being decoded), so the merged file is the same.

A failure in the thread (an unreadable or truncated input) is handed to the merge with the
chunks and raised there; :meth:`DecodeThread.close` stops and joins the thread (after an error,
a ``KeyboardInterrupt`` or the end), so no thread outlives the merge.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

import laspy
import numpy as np

STEP_POINTS = 262_144
"""Points decoded per lazrs call: the longest the merge's thread waits for the GIL is one call
(about 50 ms on two cores)."""

_SLOTS = 2
"""Chunks in flight: one the merge works on, one the thread decodes."""


def _decode_steps(reader: laspy.LasReader, buffer: memoryview, size: int, step: int) -> None:
    """The next ``size`` bytes of points of ``reader`` into ``buffer``, ``step`` bytes per call
    (lazrs), or copied at once (an uncompressed LAS or another backend).

    Raises:
        OSError: fewer points than asked for.
    """
    source = reader.point_source
    decompressor = getattr(source, "decompressor", None)
    if decompressor is None:
        data = source.read_n_points(size // reader.header.point_format.size)
        if len(data) != size:
            raise OSError(f"{len(data)} bytes of points read, {size} expected")
        buffer[:size] = data
        return
    for start in range(0, size, step):
        view = buffer[start : min(size, start + step)]
        try:
            decompressor.decompress_many(view)
        finally:
            view.release()


class DecodeThread:
    """Decode LAZ (or LAS) inputs in a thread, one chunk ahead of the merge.

    Use as a context manager; :meth:`chunks` yields each input's chunks, in order, as laspy point
    records: valid until the next chunk is asked for (the merge copies what it keeps).

    Args:
        paths: the inputs, in the order they will be read.
        chunk_points: points per chunk (the last of each input shorter).
        point_size: bytes of the largest point record of any input.
        step_points: points decoded per lazrs call (:data:`STEP_POINTS`).
    """

    def __init__(
        self,
        paths: Sequence[Path],
        chunk_points: int,
        point_size: int,
        step_points: int = STEP_POINTS,
    ) -> None:
        """Make the two buffers and start the thread."""
        self._paths = list(paths)
        self._chunk_points = chunk_points
        self._buffers = [bytearray(max(1, chunk_points * point_size)) for _ in range(_SLOTS)]
        self._step_points = step_points
        self._free: queue.Queue[int | None] = queue.Queue()
        self._ready: queue.Queue[tuple[str, int, int, str]] = queue.Queue()
        for slot in range(_SLOTS):
            self._free.put(slot)
        self._stop = threading.Event()
        self._next = 0
        self._thread = threading.Thread(target=self._run, name="laz-decode", daemon=True)
        self._thread.start()

    def __enter__(self) -> DecodeThread:
        """The decoder itself."""
        return self

    def __exit__(self, *exc: object) -> None:
        """Stop and join the thread."""
        self.close()

    def _run(self) -> None:
        """The thread: decode every input in order into the free buffers; ``chunk``, ``end``
        and ``error`` words on the ready queue (the first failure ends the thread)."""
        for number, path in enumerate(self._paths):
            try:
                with laspy.open(path) as reader:
                    size = reader.header.point_format.size
                    left = int(reader.header.point_count)
                    while left > 0:
                        slot = self._free.get()
                        if slot is None or self._stop.is_set():
                            return
                        n = min(self._chunk_points, left)
                        view = memoryview(self._buffers[slot])
                        try:
                            _decode_steps(reader, view, n * size, self._step_points * size)
                        finally:
                            view.release()
                        self._ready.put(("chunk", number, slot, str(n)))
                        left -= n
            except Exception as exc:  # noqa: BLE001 - any failure is handed on, named
                message = f"{type(exc).__name__}: {exc}".replace("\n", " ")
                self._ready.put(("error", number, -1, message))
                return
            self._ready.put(("end", number, -1, ""))

    def chunks(self, number: int, header: laspy.LasHeader) -> Iterator[laspy.ScaleAwarePointRecord]:
        """The chunks of input ``number`` (read in order: 0, 1, ...), with ``header``'s format.

        Raises:
            ValueError: inputs asked for out of order.
            OSError: the thread failed to read the input (its exception's type and message).
        """
        if number != self._next:
            raise ValueError(f"input {number} asked for, the thread decodes {self._next}")
        fmt = header.point_format
        dtype = fmt.dtype()
        held: int | None = None
        try:
            while True:
                word, _, slot, text = self._ready.get()
                if held is not None:
                    self._free.put(held)
                    held = None
                if word == "error":
                    raise OSError(text)
                if word == "end":
                    break
                held = slot
                array = np.frombuffer(self._buffers[slot], dtype=dtype, count=int(text))
                yield laspy.ScaleAwarePointRecord(array, fmt, header.scales, header.offsets)
                del array
        finally:
            if held is not None:
                self._free.put(held)
        self._next += 1

    def close(self) -> None:
        """Stop the thread (after the lazrs call it is in, if any) and wait for it."""
        self._stop.set()
        self._free.put(None)
        self._thread.join()
