"""The block threads' source readers (adapter: rasterio): one per thread (:class:`ThreadReaders`,
the orthophoto's), or a few handles per source shared by all threads (:class:`SharedReaders`,
the DEM's: GDAL's block cache belongs to a dataset handle, so threads reading through a few
shared handles decode a tile two blocks need once). Both close a source once no block from the
current one on reads it (:meth:`ThreadReaders.retire`), so they hold open the sources of the
blocks around the current one, not every input."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterable

import numpy as np
from numpy.typing import NDArray

from prefect_odm.merge.source_lifetimes import SourceLifetimes
from prefect_odm.merge.sources import GridPlan, RasterSource, SourceReader, Window4


class ThreadReaders:
    """One :class:`.sources.SourceReader` per worker thread, all closed together."""

    def __init__(self, plan: GridPlan) -> None:
        """No reader exists until a thread asks for one (:meth:`get`)."""
        self._plan = plan
        self._local = threading.local()
        self._lock = threading.Lock()
        self._all: list[SourceReader] = []

    def get(self) -> SourceReader:
        """This thread's reader, made on first use."""
        reader = getattr(self._local, "reader", None)
        if reader is None:
            reader = SourceReader(self._plan)
            self._local.reader = reader
            with self._lock:
                self._all.append(reader)
        return reader

    def retire(self, lifetimes: SourceLifetimes, item: int) -> None:
        """Close this thread's sources that no block from the ``item``-th on reads (called by
        the block's thread before it reads; a source read again is opened again)."""
        reader = self.get()
        reader.close_sources(lifetimes.finished(reader.open_ids, item))

    def close(self) -> None:
        """Close every thread's reader."""
        with self._lock:
            for reader in self._all:
                reader.close()
            self._all.clear()


class PooledReader(SourceReader):
    """The block threads' reader: ``handles`` :class:`.sources.SourceReader` s, each source read
    through whichever of them is free for it. GDAL's block cache belongs to a dataset handle,
    so with one handle per thread a source tile that two neighbouring blocks need (blocks and
    tiles rarely line up) was decoded once per thread; with fewer handles than threads it is
    decoded fewer times, and threads still read different sources, or the same one through
    another handle, at once."""

    def __init__(self, plan: GridPlan, handles: int) -> None:
        """Nothing is opened until a source is first read."""
        super().__init__(plan)
        self._readers = [SourceReader(plan) for _ in range(max(1, handles))]
        self._free: dict[str, queue.SimpleQueue[int]] = {}
        self._closing = threading.Lock()
        for s in plan.sources:
            self._free[s.submodel_id] = queue.SimpleQueue()
            for i in range(len(self._readers)):
                self._free[s.submodel_id].put(i)

    def read(
        self, src: RasterSource, window: Window4, out_shape: tuple[int, int] | None = None
    ) -> tuple[NDArray[np.float32], NDArray[np.bool_]]:
        """:meth:`.sources.SourceReader.read` through a handle free for the source."""
        free = self._free[src.submodel_id]
        i = free.get()
        try:
            return self._readers[i].read(src, window, out_shape)
        finally:
            free.put(i)

    @property
    def open_ids(self) -> tuple[str, ...]:
        """The sources open in any handle."""
        return tuple({sid: None for r in self._readers for sid in r.open_ids})

    def close_sources(self, submodel_ids: Iterable[str]) -> None:
        """Close these sources in every handle, each once no thread reads through it (one
        closing thread at a time, so two never wait on each other's handles)."""
        with self._closing:
            for sid in submodel_ids:
                free = self._free[sid]
                held = [free.get() for _ in self._readers]
                for i in held:
                    self._readers[i].close_sources([sid])
                for i in held:
                    free.put(i)

    def close(self) -> None:
        """Close every handle's datasets."""
        for reader in self._readers:
            reader.close()


class SharedReaders(ThreadReaders):
    """:class:`ThreadReaders` whose threads share one :class:`PooledReader` of
    ``max(1, workers // 2)`` handles per source (one for the default two threads)."""

    def __init__(self, plan: GridPlan, workers: int) -> None:
        """The shared reader opens nothing until a source is first read."""
        super().__init__(plan)
        self._shared = PooledReader(plan, max(1, workers // 2))

    def get(self) -> SourceReader:
        """The shared reader."""
        return self._shared

    def close(self) -> None:
        """Close the shared reader's datasets."""
        self._shared.close()
