"""COPC (Cloud Optimized Point Cloud) writing, streamed with bounded memory.

A COPC file is one LAZ 1.4 file whose points are grouped into the nodes of an octree, each node a
separately compressed chunk listed in a hierarchy, so a viewer (QGIS, Potree 2, a browser) or laspy's
``CopcReader`` reads only the nodes that intersect its query by range request.

:class:`CopcBuilder` is a point sink: the merge (or :func:`write_copc`) hands it chunks of points
in the COPC point format; each point gets its Morton key in the octree's cube and is spilled to
the file of its spill cell (:mod:`.spill`, :func:`.octree.spill_depth`; the key is not spilled but
computed again from ``X, Y, Z`` when the cell is read). When the stream ends, each spill cell is
read back alone (a cell over :data:`.octree.CELL_POINTS` is first split into its eight children,
streamed), its nodes are built (:func:`.octree.build_cell`) and written
(:mod:`.copc_file`); the picks of the levels above the spill cells are gathered per node and written
last. Memory is the spill budget, one cell and one compression batch, whatever the cloud's size.

Point formats: COPC holds formats 6, 7 and 8 only; ODM's format 3 (RGB) becomes 7 (RGB,
classification, intensity, returns, GPS time and scan angle carried over), 0/1 become 6, 2 becomes
7. Extra dimensions are not carried (OpenDroneMap writes none; a plain LAZ keeps them). Sources: the
COPC 1.0 specification (https://copc.io); Untwine (hobuinc/untwine) for spilling by voxel.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import laspy
import numpy as np
import pyproj
from numpy.typing import NDArray

from prefect_odm.errors import MergeError
from prefect_odm.merge import spill
from prefect_odm.merge.copc_file import CopcFileWriter, CopcHeader
from prefect_odm.merge.las_points import (
    COPC_FORMAT,
    convert_points,
    record_layout,
    select_points,
    take_records,
    whole_steps,
)
from prefect_odm.merge.octree import (
    CELL_POINTS,
    GRID_BITS,
    MAX_DEPTH,
    MORTON_SPREAD,
    OctreeCube,
    build_cell,
    cell_of,
    spill_depth,
)
from prefect_odm.merge.point_kernels import copy_rows, record_keys, spill_order
from prefect_odm.merge.spill import SpillStore

log = logging.getLogger(__name__)

COPC_MEDIA_TYPE = "application/vnd.laszip+copc"
"""Media type of a COPC file (the STAC point-cloud extension's and copc.io's)."""

_SPLIT_CHUNK = 1_000_000  # points read at once when an oversized spill cell is split


def copc_header(header: laspy.LasHeader, crs: pyproj.CRS | None) -> laspy.LasHeader:
    """A LAS 1.4 header in the COPC point format of ``header``'s, same scales and offsets, with
    ``crs`` (WKT VLR) and no extra dimensions.

    Raises:
        MergeError: a point format COPC cannot hold (4, 5, 9, 10: waveforms).
    """
    fmt = header.point_format.id
    if fmt not in COPC_FORMAT:
        raise MergeError(f"point format {fmt} cannot be written as COPC (formats 0-3, 6-8)")
    out = laspy.LasHeader(point_format=COPC_FORMAT[fmt], version="1.4")
    out.scales = np.asarray(header.scales, dtype=np.float64)
    out.offsets = np.asarray(header.offsets, dtype=np.float64)
    if crs is not None:
        out.add_crs(crs)
    return out


class CopcBuilder:
    """A point sink that writes a COPC file (see the module docstring).

    Args:
        header: the output header, in a COPC point format (:func:`copc_header`).
        cube: the octree's cube; every point must lie inside it.
        total_points: about how many points will come (sets the spill depth).
        work: folder for the spill files (None: the system's temporary folder).
    """

    def __init__(
        self,
        header: laspy.LasHeader,
        cube: OctreeCube,
        total_points: int,
        work: Path | None = None,
    ) -> None:
        """Check the point format and open the spill store.

        Raises:
            MergeError: a point format other than 6-8, or one with extra bytes.
        """
        if header.point_format.id not in (6, 7, 8) or header.point_format.num_extra_bytes:
            raise MergeError(f"COPC holds point formats 6-8 without extra bytes, not {header}")
        self.header = header
        self.cube = cube
        self.depth = spill_depth(total_points)
        self._dtype = header.point_format.dtype()
        # the points of each spill cell; their Morton keys are computed again when a cell is read
        # back (not spilled: 8 of 44 bytes a point less written, issue 36), and the budget the
        # keys had goes to the points
        budget = spill.SPILL_BUDGET_BYTES + spill.SPILL_BUDGET_BYTES // 4
        self._cells = SpillStore(self._dtype, parent=work, budget_bytes=budget)
        self._work = work
        self._lo = np.full(3, np.inf)
        self._hi = np.full(3, -np.inf)
        self._returns = np.zeros(16, dtype=np.int64)
        self._gps = [np.inf, -np.inf]
        self.points = 0
        self.compress_in_worker = False
        """Compress the nodes in a worker process (:mod:`.encode_ahead`; the same file)."""

    def write_points(
        self, points: laspy.ScaleAwarePointRecord, keep: NDArray[np.bool_] | None = None
    ) -> None:
        """Spill a chunk of points to their spill cells.

        Args:
            points: in the header's point format, or one it is converted from (formats 0-3 or
                6-8, :func:`.las_points.convert_points`).
            keep: ``(n,)`` the points to write (None: all).

        Points whose scales are the header's and offsets whole steps from its are keyed from
        their integer coordinates, sorted by cell, gathered once and converted after (one pass
        over the records); others are converted first.

        Raises:
            MergeError: a point outside the octree's cube.
        """
        index = np.flatnonzero(keep) if keep is not None else np.arange(len(points))
        if index.size == 0:
            return
        steps = whole_steps(points, self.header)
        layout = None
        if steps is not None:
            layout = record_layout(
                points.point_format, points.array.dtype, self.header.point_format
            )
        if steps is None or layout is None:  # rescaled, or not by bytes: convert first
            points = convert_points(select_points(points, index), self.header)
            index, steps = np.arange(len(points)), (0, 0, 0)
            layout = record_layout(
                points.point_format, points.array.dtype, self.header.point_format
            )
            assert layout is not None, "a record in the header's own format is copied by bytes"
        array = points.array
        s, o = self.header.scales, self.header.offsets
        keys, dest, counts, lo, hi = spill_order(
            (array["X"], array["Y"], array["Z"]), index, steps, (s, o), self._grid, self.depth
        )
        self._check_bounds(lo, hi)
        records, returns = copy_rows(
            array, index, dest, self._dtype, (layout.byte_map, layout.legacy), steps, layout.tables
        )
        gps = records["gps_time"]
        self._gps = [min(self._gps[0], float(gps.min())), max(self._gps[1], float(gps.max()))]
        self._returns += returns
        cells = np.flatnonzero(counts)
        stops = np.cumsum(counts)[cells]
        self._append_runs(self.depth, cells, stops - counts[cells], records)
        self.points += int(records.size)

    @property
    def _grid(self) -> tuple[tuple[float, float, float], float, int, NDArray[np.uint64]]:
        """The cube's origin, grid cells per metre and per axis, and the Morton table."""
        return (
            self.cube.origin,
            float(2**GRID_BITS) / self.cube.size_m,
            2**GRID_BITS,
            MORTON_SPREAD,
        )

    def _keys_of(self, records: NDArray[Any]) -> NDArray[np.uint64]:
        """The Morton keys ``(n,)`` of spilled records (those :func:`.spill_order` gave them)."""
        xyz = (records["X"], records["Y"], records["Z"])
        return record_keys(xyz, (self.header.scales, self.header.offsets), self._grid)

    def _check_bounds(self, lo: NDArray[np.int64], hi: NDArray[np.int64]) -> None:
        """Widen the bounds by a chunk's least and greatest integer ``X, Y, Z`` ``(3,)`` (the
        header's offsets; the same floats as laspy's scaling).

        Raises:
            MergeError: a point outside the octree's cube.
        """
        per_m = float(2**GRID_BITS) / self.cube.size_m
        for axis in range(3):
            scale, offset = self.header.scales[axis], self.header.offsets[axis]
            ends = np.array([lo[axis], hi[axis]]) * scale + offset  # x is monotonic in X
            self._lo[axis] = min(self._lo[axis], float(ends[0]))
            self._hi[axis] = max(self._hi[axis], float(ends[1]))
            cells = np.floor((ends - self.cube.origin[axis]) * per_m)
            if cells[0] < 0 or cells[1] >= 2**GRID_BITS:
                raise MergeError("a point lies outside the bounds of the input headers")

    def _append_runs(
        self,
        depth: int,
        cells: NDArray[np.int64],
        starts: NDArray[np.int64],
        records: NDArray[Any],
    ) -> set[tuple[int, ...]]:
        """Append the runs ``starts[i]`` .. ``starts[i + 1]`` (the last to the end) of points,
        sorted by spill cell, to their cells ``(depth, cells[i])``; returns those."""
        touched: set[tuple[int, ...]] = set()
        stops = np.r_[starts[1:], records.size]
        for cell, start, stop in zip(cells.tolist(), starts.tolist(), stops.tolist(), strict=True):
            key = (depth, int(cell))
            self._cells.append(key, records[start:stop])
            touched.add(key)
        return touched

    def _spill(
        self, depth: int, cells: NDArray[Any], records: NDArray[Any]
    ) -> set[tuple[int, ...]]:
        """Append points to the spill cells ``(depth, cell)``; returns those cells."""
        order = np.argsort(cells, kind="stable")
        cells = cells[order]
        starts = np.flatnonzero(np.r_[True, cells[1:] != cells[:-1]])
        return self._append_runs(depth, cells[starts], starts, take_records(records, order))

    def discard(self) -> None:
        """Remove the spilled points without writing a file (after a failure upstream)."""
        self._cells.close()

    def _copc_header(self) -> CopcHeader:
        crs = self.header.parse_crs()
        s, o = self.header.scales, self.header.offsets
        return CopcHeader(
            point_format=int(self.header.point_format.id),
            scales=(float(s[0]), float(s[1]), float(s[2])),
            offsets=(float(o[0]), float(o[1]), float(o[2])),
            crs=crs,
            mins=(float(self._lo[0]), float(self._lo[1]), float(self._lo[2])),
            maxs=(float(self._hi[0]), float(self._hi[1]), float(self._hi[2])),
            points_by_return=tuple(int(v) for v in self._returns[1:16]),
            gps_time=(float(self._gps[0]), float(self._gps[1])),
            cube=self.cube,
        )

    def finish(self, destination: Path) -> int:
        """Build every cell, write the COPC file (through ``.partial``); returns its points.

        Raises:
            MergeError: no points were written.
        """
        try:
            if self.points == 0:
                raise MergeError(f"{destination}: no points to write as COPC")
            writer = CopcFileWriter(destination, self._copc_header(), self.compress_in_worker)
            try:
                self._write_nodes(writer)
                writer.close()
            except BaseException:
                writer.abort()
                raise
            if writer.points != self.points:
                raise MergeError(f"{destination}: {writer.points} of {self.points} points written")
            log.info("COPC %s: %d points in %d nodes", destination, writer.points, writer.nodes)
            return writer.points
        finally:
            self.discard()

    def _write_nodes(self, writer: CopcFileWriter) -> None:
        ancestors = SpillStore(self._dtype, parent=self._work)
        try:
            pending = sorted(self._cells.keys(), reverse=True)
            while pending:
                key = pending.pop()
                depth, cell = key
                if self._cells.count(key) > CELL_POINTS and depth < MAX_DEPTH - 1:
                    pending.extend(sorted(self._split(depth, cell), reverse=True))
                    continue
                records = self._cells.take(key)
                build = build_cell(self._keys_of(records), depth)
                ordered = take_records(records, build.order)
                del records
                for node, start, stop in build.nodes:
                    writer.add(node, ordered[start:stop])
                for node, start, stop in build.ancestors:  # copied: not the whole cell kept
                    ancestors.append(node, ordered[start:stop], copy=True)
            for upper in ancestors.keys():
                level, x, y, z = upper
                writer.add((level, x, y, z), ancestors.take(upper))
        finally:
            ancestors.close()

    def _split(self, depth: int, cell: int) -> set[tuple[int, ...]]:
        """Move an oversized cell's points into its eight children (streamed); their keys."""
        children: set[tuple[int, ...]] = set()
        for part in self._cells.take_chunks((depth, cell), _SPLIT_CHUNK):
            children |= self._spill(depth + 1, cell_of(self._keys_of(part), depth + 1), part)
        return children


def _chunks(path: Path, chunk_points: int) -> Iterator[laspy.ScaleAwarePointRecord]:
    with laspy.open(path) as reader:
        yield from reader.chunk_iterator(chunk_points)


def write_copc(
    source: Path, destination: Path, *, chunk_points: int = 2_000_000, work: Path | None = None
) -> int:
    """Write the points of a LAS/LAZ file as a COPC file, streamed (memory bounded).

    Args:
        source: LAS/LAZ file, any point format COPC can hold (0-3, 6-8).
        destination: the ``.copc.laz`` file to write; written to a temporary name and renamed.
        chunk_points: points read at once.
        work: folder for the spill files (None: the system's temporary folder).

    Returns:
        The number of points written (equal to the source's).

    Raises:
        MergeError: the source cannot be read, has no points or a point format COPC cannot
            hold, or holds points outside its header's bounds.
    """
    try:
        with laspy.open(source) as reader:
            in_header = reader.header
            crs = in_header.parse_crs()
    except (laspy.LaspyException, OSError) as exc:
        raise MergeError(f"{source} cannot be opened: {exc}") from exc
    header = copc_header(in_header, crs)
    cube = OctreeCube.around(np.asarray(in_header.mins), np.asarray(in_header.maxs))
    builder = CopcBuilder(header, cube, int(in_header.point_count), work)
    try:
        for chunk in _chunks(source, chunk_points):
            builder.write_points(chunk)
    except MergeError as exc:
        builder.discard()
        raise MergeError(f"{source}: {exc}") from None
    return builder.finish(destination)
