"""Source readers the DEM merge's block threads share: GDAL's block cache belongs to a dataset
handle, so threads reading through a few shared handles decode a tile two blocks need once."""

from __future__ import annotations

import queue

import numpy as np
from numpy.typing import NDArray

from prefect_odm.merge.sources import GridPlan, RasterSource, SourceReader, ThreadReaders, Window4


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

    def close(self) -> None:
        """Close every handle's datasets."""
        for reader in self._readers:
            reader.close()


class SharedReaders(ThreadReaders):
    """:class:`.sources.ThreadReaders` whose threads share one :class:`PooledReader` of
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
