"""A COPC file written node by node: copclib lays out the file, lazrs compresses the nodes.

``copclib.FileWriter`` writes the LAS 1.4 header, the COPC info VLR (first, as the specification
requires), the LAZ VLR with variable chunks, the WKT VLR, one LAZ chunk per node and the hierarchy
EVLR. Nodes are compressed in batches by ``lazrs.ParLasZipCompressor.compress_chunks`` (one chunk
per node, every core) and handed over with ``AddNodeCompressed``; copclib's own ``AddNode``
compresses on one core. The file is written under ``.partial`` and renamed when closed.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path

import copclib
import lazrs
import numpy as np
from numpy.typing import NDArray

from prefect_odm.merge.octree import CELLS_PER_NODE_SIDE, NodeKey, OctreeCube

BATCH_POINTS = 1_000_000
"""Points compressed together (in parallel) before their nodes are added to the file."""


@dataclass(frozen=True)
class CopcHeader:
    """What the COPC file's header says besides its nodes.

    Attributes:
        point_format: LAS point format id (6, 7 or 8).
        scales, offsets: ``(x, y, z)`` of the integer coordinates, CRS units.
        wkt: the CRS as WKT (the WKT VLR); empty for none.
        mins, maxs: ``(x, y, z)`` bounds of the points written, CRS units.
        points_by_return: 15 counts, points of return number 1 .. 15.
        cube: the octree's root cube (COPC info centre, halfsize and spacing).
    """

    point_format: int
    scales: tuple[float, float, float]
    offsets: tuple[float, float, float]
    wkt: str
    mins: tuple[float, float, float]
    maxs: tuple[float, float, float]
    points_by_return: tuple[int, ...]
    cube: OctreeCube


def _config(header: CopcHeader) -> copclib.CopcConfigWriter:
    config = copclib.CopcConfigWriter(
        header.point_format,
        copclib.Vector3(*header.scales),
        copclib.Vector3(*header.offsets),
        header.wkt,
    )
    config.las_header.min = copclib.Vector3(*header.mins)
    config.las_header.max = copclib.Vector3(*header.maxs)
    config.las_header.points_by_return = list(header.points_by_return)
    info = config.copc_info
    info.center_x, info.center_y, info.center_z = header.cube.centre
    info.halfsize = header.cube.size_m / 2.0
    info.spacing = header.cube.size_m / CELLS_PER_NODE_SIDE
    return config


class CopcFileWriter:
    """Write octree nodes into a COPC file.

    Args:
        destination: the ``.copc.laz`` file; written as ``<name>.partial`` until :meth:`close`.
        header: the header fields (:class:`CopcHeader`).
    """

    def __init__(self, destination: Path, header: CopcHeader) -> None:
        self.destination = destination
        self._partial = destination.with_name(destination.name + ".partial")
        destination.parent.mkdir(parents=True, exist_ok=True)
        self._writer = copclib.FileWriter(str(self._partial), _config(header))
        self._vlr = lazrs.LazVlr.new_for_compression(header.point_format, 0, True)
        self._batch: list[tuple[NodeKey, NDArray[np.void]]] = []
        self._batch_points = 0
        self.points = 0
        self.nodes = 0

    def add(self, key: NodeKey, records: NDArray[np.void]) -> None:
        """Queue one node's raw point records (``(n,)`` of the file's point format)."""
        self._batch.append((key, np.ascontiguousarray(records)))
        self._batch_points += int(records.size)
        if self._batch_points >= BATCH_POINTS:
            self._flush()

    def _flush(self) -> None:
        if not self._batch:
            return
        buffer = io.BytesIO()
        compressor = lazrs.ParLasZipCompressor(buffer, self._vlr)
        compressor.reserve_offset_to_chunk_table()
        compressor.compress_chunks([records.view(np.uint8) for _, records in self._batch])
        compressor.done()
        data = buffer.getbuffer()
        table_at = int.from_bytes(data[:8], "little")
        table = lazrs.read_chunk_table_only(io.BytesIO(data[table_at:]), self._vlr)
        position = 8
        for (key, records), (count, size) in zip(self._batch, table, strict=True):
            assert count == records.size, "lazrs wrote a chunk of another size"
            chunk = np.frombuffer(data[position : position + size], dtype=np.int8)
            self._writer.AddNodeCompressed(
                copclib.VoxelKey(*key), copclib.VectorChar(chunk), int(records.size)
            )
            position += size
            self.points += int(records.size)
            self.nodes += 1
        del data
        self._batch.clear()
        self._batch_points = 0

    def close(self) -> None:
        """Write what is queued, the hierarchy and the header; rename to the destination."""
        self._flush()
        self._writer.Close()
        self._partial.replace(self.destination)

    def abort(self) -> None:
        """Close and remove the partial file (after a failure)."""
        try:
            self._writer.Close()
        finally:
            self._partial.unlink(missing_ok=True)
