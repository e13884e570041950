"""A COPC file written node by node (laspy writes the header, lazrs compresses the nodes).

The layout is COPC 1.0's (https://copc.io): a LAS 1.4 header; the VLRs, the COPC info VLR first
(``copc``/1, 160 bytes: cube centre and halfsize, spacing, the root hierarchy page's offset and
size, GPS time range), then the CRS as an OGC WKT VLR (``LASF_Projection``/2112, where every
reader looks for it) and the LAZ VLR with variable-size chunks; the points as LAZ with one chunk per
octree node, compressed in batches on every core (``lazrs.ParLasZipCompressor.compress_chunks``);
LAZ's chunk table; and the hierarchy as one EVLR (``copc``/1000) holding one 32-byte entry per
node (key, offset, byte size, point count). The header and the info VLR are rewritten in place
when the file is closed. The file is written under ``.partial`` and renamed.
"""

from __future__ import annotations

import io
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import laspy
import lazrs
import numpy as np
import pyproj
from numpy.typing import NDArray

from prefect_odm.merge.encode_ahead import EncodeAhead
from prefect_odm.merge.octree import CELLS_PER_NODE_SIDE, NodeKey, OctreeCube

BATCH_POINTS = 1_000_000
"""Points compressed together (in parallel) before they are written."""

_INFO_SIZE = 160
_EVLR_HEADER_SIZE = 60
_ENTRY = struct.Struct("<iiiiQii")  # key (level, x, y, z), offset, byte size, point count


@dataclass(frozen=True)
class CopcHeader:
    """What the COPC file's header says besides its nodes.

    Attributes:
        point_format: LAS point format id (6, 7 or 8).
        scales, offsets: ``(x, y, z)`` of the integer coordinates, CRS units.
        crs: the CRS (the WKT VLR); None for none.
        mins, maxs: ``(x, y, z)`` bounds of the points written, CRS units.
        points_by_return: 15 counts, points of return number 1 .. 15.
        gps_time: ``(minimum, maximum)`` GPS time of the points.
        cube: the octree's root cube (COPC info centre, halfsize and spacing).
    """

    point_format: int
    scales: tuple[float, float, float]
    offsets: tuple[float, float, float]
    crs: pyproj.CRS | None
    mins: tuple[float, float, float]
    maxs: tuple[float, float, float]
    points_by_return: tuple[int, ...]
    gps_time: tuple[float, float]
    cube: OctreeCube


def _info_record(header: CopcHeader, hierarchy_offset: int, hierarchy_size: int) -> bytes:
    """The COPC info VLR's 160 bytes."""
    cube = header.cube
    data = struct.pack(
        "<5d2Q2d",
        *cube.centre,
        cube.size_m / 2.0,
        cube.size_m / CELLS_PER_NODE_SIDE,
        hierarchy_offset,
        hierarchy_size,
        *header.gps_time,
    )
    return data + bytes(_INFO_SIZE - len(data))


def _las_header(header: CopcHeader, laz_vlr: bytes) -> laspy.LasHeader:
    las = laspy.LasHeader(point_format=header.point_format, version="1.4")
    las.scales = np.asarray(header.scales, dtype=np.float64)
    las.offsets = np.asarray(header.offsets, dtype=np.float64)
    las.mins = np.asarray(header.mins, dtype=np.float64)
    las.maxs = np.asarray(header.maxs, dtype=np.float64)
    las.generating_software = "prefect-odm"
    las.vlrs.append(laspy.VLR("copc", 1, "COPC info", _info_record(header, 0, 0)))
    if header.crs is not None:
        las.add_crs(header.crs)
    las.vlrs.append(laspy.vlrs.known.LasZipVlr(laz_vlr))
    las.are_points_compressed = True
    return las


class CopcFileWriter:
    """Write octree nodes into a COPC file.

    Args:
        destination: the ``.copc.laz`` file; written as ``<name>.partial`` until :meth:`close`.
        header: the header fields (:class:`CopcHeader`).
    """

    def __init__(
        self, destination: Path, header: CopcHeader, compress_in_worker: bool = False
    ) -> None:
        """Open ``<name>.partial`` and write the header; the chunk table's offset is reserved
        (by the worker process that compresses the nodes, with ``compress_in_worker``)."""
        self.destination = destination
        self._header = header
        self._partial = destination.with_name(destination.name + ".partial")
        destination.parent.mkdir(parents=True, exist_ok=True)
        self._vlr = lazrs.LazVlr.new_for_compression(header.point_format, 0, True)
        self._las = _las_header(header, self._vlr.record_data())
        self._fh: BinaryIO = self._partial.open("w+b")
        self._las.write_to(self._fh)
        self._compressor: lazrs.ParLasZipCompressor | EncodeAhead
        if compress_in_worker:
            offset = self._fh.tell()
            self._fh.close()  # the worker writes the points; reopened by close()
            self._compressor = EncodeAhead(self._partial, offset, self._vlr)
        else:
            self._compressor = lazrs.ParLasZipCompressor(self._fh, self._vlr)
            self._compressor.reserve_offset_to_chunk_table()
        self._batch: list[NDArray[np.void]] = []
        self._batch_points = 0
        self._nodes: list[tuple[NodeKey, int]] = []
        self.points = 0

    @property
    def nodes(self) -> int:
        """Nodes added so far."""
        return len(self._nodes)

    def add(self, key: NodeKey, records: NDArray[np.void]) -> None:
        """Queue one node's raw point records (``(n,)`` of the file's point format, n > 0)."""
        self._batch.append(np.ascontiguousarray(records))
        self._nodes.append((key, int(records.size)))
        self._batch_points += int(records.size)
        self.points += int(records.size)
        if self._batch_points >= BATCH_POINTS:
            self._flush()

    def _flush(self) -> None:
        if self._batch:
            self._compressor.compress_chunks([r.view(np.uint8) for r in self._batch])
        self._batch.clear()
        self._batch_points = 0

    def _hierarchy(self) -> bytes:
        """The hierarchy entries, from LAZ's chunk table (one chunk per node, in order)."""
        start = self._las.offset_to_point_data
        self._fh.seek(start)
        table_at = int.from_bytes(self._fh.read(8), "little")
        self._fh.seek(table_at)
        table = lazrs.read_chunk_table_only(self._fh, self._vlr)
        if len(table) != len(self._nodes):
            raise RuntimeError(f"{len(table)} LAZ chunks for {len(self._nodes)} COPC nodes")
        entries = io.BytesIO()
        offset = start + 8
        for ((level, x, y, z), count), (chunk_count, size) in zip(self._nodes, table, strict=True):
            if chunk_count != count:
                raise RuntimeError(f"node {(level, x, y, z)}: {chunk_count} points, not {count}")
            entries.write(_ENTRY.pack(level, x, y, z, offset, size, count))
            offset += size
        return entries.getvalue()

    def close(self) -> None:
        """Write what is queued, the chunk table, the hierarchy and the final header; rename."""
        self._flush()
        self._compressor.done()
        if self._fh.closed:  # the worker wrote the points and closed the file
            self._fh = self._partial.open("r+b")
        entries = self._hierarchy()
        self._fh.seek(0, io.SEEK_END)
        evlr_at = self._fh.tell()
        self._fh.write(struct.pack("<H16sHQ32s", 0, b"copc", 1000, len(entries), b"EPT hierarchy"))
        self._fh.write(entries)
        las = self._las
        las.point_count = self.points
        las.number_of_points_by_return = np.asarray(self._header.points_by_return)
        las.start_of_first_evlr = evlr_at
        las.number_of_evlrs = 1
        las.vlrs[0].record_data = _info_record(
            self._header, evlr_at + _EVLR_HEADER_SIZE, len(entries)
        )
        self._fh.seek(0)
        las.write_to(self._fh, ensure_same_size=True)
        self._fh.close()
        self._partial.replace(self.destination)

    def abort(self) -> None:
        """Close and remove the partial file (after a failure)."""
        try:
            if isinstance(self._compressor, EncodeAhead):
                self._compressor.close()
            self._fh.close()
        finally:
            self._partial.unlink(missing_ok=True)
