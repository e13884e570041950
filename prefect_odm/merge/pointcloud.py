"""Point-cloud merge (adapter: laspy with lazrs, pyproj).

Each submodel's points are kept only where the ownership rule says that submodel owns them
(the same nearest-core-camera cells that bound the orthophoto seams, :class:`.CellOwners`), so
overlaps are not doubled. Inputs are streamed chunk by chunk (``laspy`` ``chunk_iterator``) into
one sink: a ``LasWriter`` for a plain LAZ, or a :class:`.copc.CopcBuilder` for a COPC file (points
spilled by octree cell while streaming, each cell built and compressed after); memory is a few
chunks (and, for COPC, the spill budget and one cell) whatever the cloud size.

The output header is fixed before the first point is written, from all input headers
(:func:`.las_points.output_header`); the writer records the point count and bounds of the points
actually written, so the header is exact. A COPC file holds point format 6, 7 or 8: ODM's format
3 (RGB) is written as 7.
"""

from __future__ import annotations

import logging
import math
import os
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Protocol

import laspy
import lazrs
import numpy as np
import pyproj
from numpy.typing import NDArray

from prefect_odm.align.report import AlignmentReport
from prefect_odm.errors import MergeError
from prefect_odm.merge.cell_owners import CellOwners
from prefect_odm.merge.copc import CopcBuilder
from prefect_odm.merge.decode_ahead import DecodeAhead, read_chunks
from prefect_odm.merge.las_points import (
    InputCloud,
    PointMover,
    bounds_in,
    convert_points,
    header_centres,
    integer_shift,
    output_crs,
    output_header,
    read_headers,
    select_points,
    shifted,
    union_bounds,
)
from prefect_odm.merge.octree import OctreeCube
from prefect_odm.merge.point_kernels import warm_up
from prefect_odm.merge.reports import PointCloudMergeReport, SubmodelPoints
from prefect_odm.merge.seamlines import LabelOwners, OwnerLabels
from prefect_odm.merge.seams import ownership_from_centres
from prefect_odm.ownership import Ownership
from prefect_odm.registry import PointCloudFormat

__all__ = ["CellOwners", "PointCloudFormat", "PointMover", "merge_point_clouds"]

log = logging.getLogger(__name__)


class PointSink(Protocol):
    """Where the streamed points go (``laspy.LasWriter`` or :class:`.copc.CopcBuilder`)."""

    def write_points(self, points: laspy.ScaleAwarePointRecord) -> None: ...


def _resolve_owners(
    infos: list[InputCloud], crs: pyproj.CRS, ownership: Ownership | None
) -> Ownership:
    """The given ownership checked against the inputs, or one from their bounds' centres."""
    owners = ownership or ownership_from_centres(header_centres(infos, crs))
    unknown = sorted({i.submodel_id for i in infos} - set(owners.submodel_ids))
    if unknown:
        raise MergeError(f"point clouds {unknown} own no camera in the ownership rule")
    return owners


@dataclass
class _Streamer:
    """Streams the points each input owns into one open sink."""

    writer: PointSink | None
    header: laspy.LasHeader
    crs: pyproj.CRS
    owners: Ownership
    chunk_points: int
    progress: Callable[[int, int], None] | None
    total_in: int
    transforms: Mapping[str, PointMover]
    done: int = 0
    seamlines: OwnerLabels | None = None
    workers: bool = False
    decoder: DecodeAhead | None = None
    inputs_done: int = 0

    def write_input(self, inp: InputCloud) -> tuple[SubmodelPoints, bool]:
        """Write the points of ``inp`` that it owns.

        Returns:
            ``(points, reprojected)``.

        Raises:
            MergeError: the input holds another number of points than its header says.
        """
        transformer = None
        if inp.crs is not None and inp.crs != self.crs:
            transformer = pyproj.Transformer.from_crs(inp.crs, self.crs, always_xy=True)
        moved = self.transforms.get(inp.submodel_id)
        exact = transformer is None and moved is None
        shift = integer_shift(inp.header, self.header) if exact else None
        label = self.owners.submodel_ids.index(inp.submodel_id)
        lo, hi = bounds_in(inp, self.crs, moved)
        cells: CellOwners | LabelOwners = CellOwners(self.owners, (lo[0], lo[1], hi[0], hi[1]))
        if self.seamlines is not None:
            cells = LabelOwners(self.seamlines, self.owners)
        kept_n = 0
        read_n = 0
        with self._chunks(inp) as chunks:
            for chunk in chunks:
                kept_n += self._write_chunk(chunk, (transformer, moved), shift, cells, label)
                read_n += len(chunk)
                self.done += len(chunk)
                if self.progress is not None:
                    self.progress(self.done, self.total_in)
        if read_n != int(inp.header.point_count):
            raise MergeError(
                f"input {inp.submodel_id} ({inp.path}): header says "
                f"{inp.header.point_count} points, {read_n} were read"
            )
        log.info("point cloud %s: kept %d of %d points", inp.submodel_id, kept_n, read_n)
        points = SubmodelPoints(submodel_id=inp.submodel_id, points_in=read_n, points_kept=kept_n)
        return points, transformer is not None

    @contextmanager
    def _chunks(self, inp: InputCloud) -> Iterator[Iterator[laspy.ScaleAwarePointRecord]]:
        """The chunks of ``inp``: from the decoding worker when there is one, else read here
        (:func:`.decode_ahead.read_chunks`: one buffer for every chunk).

        Raises:
            MergeError: the worker could not read the input (naming it).
        """
        if self.decoder is None:
            yield _read_named(inp, self.chunk_points)
            return
        try:
            yield self.decoder.chunks(self.inputs_done, inp.header)
        except OSError as exc:
            raise MergeError(
                f"input {inp.submodel_id} ({inp.path}) cannot be read: {exc}"
            ) from None
        self.inputs_done += 1

    def _write_chunk(
        self,
        chunk: laspy.ScaleAwarePointRecord,
        moves: tuple[pyproj.Transformer | None, PointMover | None],
        shift: tuple[int, int, int] | None,
        cells: CellOwners | LabelOwners,
        label: int,
    ) -> int:
        """Write the points of one chunk that ``label`` owns (reprojected, then moved by the
        alignment's transform, when given); returns how many."""
        transformer, moved = moves
        xyz = None
        if transformer is None and moved is None and isinstance(cells, CellOwners):
            ints = (chunk.array["X"], chunk.array["Y"])
            keep = cells.label_of_integers(ints, chunk.scales, chunk.offsets) == label
        else:
            keep, xyz = self._owned(chunk, moves, cells, label)
        count = int(keep.sum())
        assert self.writer is not None, "the streamer writes only inside _write_all"
        if count:
            if isinstance(self.writer, CopcBuilder) and xyz is None:
                self.writer.write_points(chunk, keep)  # selects, sorts and converts at once
            elif shift is not None:
                self.writer.write_points(shifted(select_points(chunk, keep), shift, self.header))
            else:
                sel = None if xyz is None else (xyz[0][keep], xyz[1][keep], xyz[2][keep])
                self.writer.write_points(
                    convert_points(select_points(chunk, keep), self.header, sel)
                )
        return count

    @staticmethod
    def _owned(
        chunk: laspy.ScaleAwarePointRecord,
        moves: tuple[pyproj.Transformer | None, PointMover | None],
        cells: CellOwners | LabelOwners,
        label: int,
    ) -> tuple[NDArray[np.bool_], tuple[Any, Any, Any] | None]:
        """Which points of ``chunk`` ``label`` owns, from their coordinates in the output CRS
        (reprojected, then moved, when given); and those coordinates (None: not moved)."""
        transformer, moved = moves
        x, y = np.asarray(chunk.x), np.asarray(chunk.y)
        xyz = None
        if transformer is not None or moved is not None:
            z = np.asarray(chunk.z)
            if transformer is not None:
                x, y, z = transformer.transform(x, y, z)
            if moved is not None:
                x, y, z = moved(np.stack([x, y, z], axis=1)).T
            xyz = (x, y, z)
        return cells.label_of_points(x, y) == label, xyz


def _read_named(inp: InputCloud, chunk_points: int) -> Iterator[laspy.ScaleAwarePointRecord]:
    """:func:`.decode_ahead.read_chunks` of ``inp``; a failed read (a truncated or corrupt file)
    names the input, as the decoding worker's failure does.

    Raises:
        MergeError: the input cannot be read.
    """
    try:
        yield from read_chunks(inp.path, chunk_points)
    except (OSError, laspy.LaspyException, lazrs.LazrsError) as exc:  # as the worker's words
        message = f"{type(exc).__name__}: {exc}".replace("\n", " ")
        raise MergeError(
            f"input {inp.submodel_id} ({inp.path}) cannot be read: {message}"
        ) from None


def _check_written(
    path: Path, out: Path, kept_total: int, crs: pyproj.CRS
) -> tuple[tuple[float, float, float], tuple[float, float, float]]:
    """The written file's header bounds ``(mins, maxs)``, after checking its count and CRS.

    Raises:
        MergeError: nothing kept, or a header that disagrees with what was written.
    """
    if kept_total == 0:
        raise MergeError(f"{out}: the merged point cloud is empty")
    with laspy.open(path) as check:
        h = check.header
        if int(h.point_count) != kept_total:
            raise MergeError(
                f"{out}: header counts {h.point_count} points, {kept_total} were written"
            )
        mins = (float(h.mins[0]), float(h.mins[1]), float(h.mins[2]))
        maxs = (float(h.maxs[0]), float(h.maxs[1]), float(h.maxs[2]))
        out_crs = h.parse_crs()
    if out_crs is None or not out_crs.equals(crs):
        raise MergeError(f"{out}: the written CRS {out_crs} is not {crs}")
    return mins, maxs


def _stream_inputs(
    streamer: _Streamer, infos: list[InputCloud]
) -> tuple[list[SubmodelPoints], list[str]]:
    """Every input through the streamer's sink (decoded ahead in a worker process when the
    streamer says so, :func:`_decoder`): ``(per-submodel points, reprojected ids)``."""
    per, reprojected = [], []
    with _decoder(infos, streamer.chunk_points, streamer.workers) as streamer.decoder:
        for inp in infos:
            points, warped = streamer.write_input(inp)
            per.append(points)
            if warped:
                reprojected.append(inp.submodel_id)
    streamer.decoder = None
    return per, reprojected


def _write_copc(
    streamer: _Streamer, infos: list[InputCloud], tmp: Path, cube: OctreeCube
) -> tuple[list[SubmodelPoints], list[str]]:
    """Stream every input into a :class:`.copc.CopcBuilder` and write the COPC file ``tmp``."""
    builder = CopcBuilder(streamer.header, cube, streamer.total_in, work=tmp.parent)
    builder.compress_in_worker = streamer.workers
    streamer.writer = builder
    try:
        per, reprojected = _stream_inputs(streamer, infos)
    except BaseException:
        builder.discard()
        raise
    if sum(p.points_kept for p in per):
        builder.finish(tmp)
    else:
        builder.discard()
    return per, reprojected


def _write_all(
    streamer: _Streamer, infos: list[InputCloud], out: Path, cube: OctreeCube | None
) -> tuple[list[SubmodelPoints], list[str], int, tuple[Any, Any]]:
    """Stream every input into ``out`` (through a temporary name), check it, promote it.

    Args:
        cube: the octree's cube for a COPC file; None: a plain LAS/LAZ (by ``out``'s suffix).

    Returns:
        ``(per-submodel points, reprojected ids, points kept, (mins, maxs))``.
    """
    tmp = out.with_name(f".{out.stem}.{uuid.uuid4().hex[:8]}.tmp{out.suffix}")
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        if cube is not None:
            per, reprojected = _write_copc(streamer, infos, tmp, cube)
        else:
            compress = out.suffix.lower() == ".laz"
            with laspy.open(tmp, mode="w", header=streamer.header, do_compress=compress) as w:
                streamer.writer = w
                per, reprojected = _stream_inputs(streamer, infos)
        kept_total = sum(p.points_kept for p in per)
        bounds = _check_written(tmp, out, kept_total, streamer.crs)
        os.replace(tmp, out)
    finally:
        if tmp.exists():
            tmp.unlink()
    return per, reprojected, kept_total, bounds


@contextmanager
def _decoder(
    infos: list[InputCloud], chunk_points: int, wanted: bool
) -> Iterator[DecodeAhead | None]:
    """A :class:`.decode_ahead.DecodeAhead` over ``infos`` when wanted, or None."""
    if not wanted:
        yield None
        return
    size = max(int(i.header.point_format.size) for i in infos)
    with DecodeAhead([i.path for i in infos], chunk_points, size) as decoder:
        warm_up()  # numba's first call while the worker decodes the first chunk
        yield decoder


def _movers(alignment: AlignmentReport | None) -> dict[str, PointMover]:
    """Each moving submodel's transform on points (none without an alignment)."""
    if alignment is None:
        return {}
    return {sid: partial(alignment.apply_points, sid) for sid in alignment.moving_ids()}


def _xyz(values: Any) -> tuple[float, float, float]:
    return (float(values[0]), float(values[1]), float(values[2]))


def merge_point_clouds(
    inputs: Mapping[str, Path],
    out: Path,
    *,
    ownership: Ownership | None,
    crs_epsg: int | None = None,
    chunk_points: int = 2_000_000,
    progress: Callable[[int, int], None] | None = None,
    alignment: AlignmentReport | None = None,
    seamlines: OwnerLabels | None = None,
    point_cloud_format: PointCloudFormat = "laz",
    workers: bool = False,
) -> PointCloudMergeReport:
    """Merge per-submodel LAS/LAZ point clouds into one LAZ or COPC file, each point kept once.

    Args:
        inputs: submodel id -> local LAS/LAZ path.
        out: output path (written through a temporary name, then promoted).
        ownership: who owns each ground position (in the output CRS); None derives one from the
            centre of each input's header bounds (:func:`.seams.ownership_from_centres`).
        crs_epsg: output CRS; None: the CRS of the first input (sorted ids) that has one. Inputs
            in another CRS are reprojected with pyproj; inputs without a CRS are taken to be in
            the output CRS.
        chunk_points: points per streamed chunk (memory is a few chunks).
        progress: ``(points_done, points_total)`` callback.
        alignment: the alignment between submodels: each input's points are moved by its
            transform (plan CRS = output CRS) as they are streamed; None, or identity
            transforms, copy the points as they are (same bytes).
        seamlines: owner labels (output CRS) followed instead of ``ownership``, or None.
        point_cloud_format: ``laz``: a plain LAS/LAZ (by ``out``'s suffix) in the inputs' point
            format; ``copc``: a COPC file (LAZ 1.4, point format 6/7/8: ODM's 3 becomes 7),
            its octree built from spill files beside ``out`` (memory bounded).
        workers: decode the inputs and compress COPC nodes in worker processes (the same file,
            :mod:`.decode_ahead`); off by default: measured, it lowers wall time but costs CPU.

    Returns:
        A :class:`.reports.PointCloudMergeReport`.

    Raises:
        MergeError: no inputs, an unreadable input, no CRS anywhere, an input unknown to the
            ownership, an empty result, or a written file whose header disagrees with what was
            written.
    """
    started = time.perf_counter()
    out = Path(out)
    if not inputs:
        raise MergeError("nothing to merge: no point clouds")
    if chunk_points <= 0:
        raise MergeError(f"chunk_points must be positive, got {chunk_points}")
    infos = read_headers(inputs)
    crs = output_crs(infos, crs_epsg)
    owners = _resolve_owners(infos, crs, ownership)
    moving = _movers(alignment)
    header = output_header(infos, crs, moving, copc=(copc := point_cloud_format == "copc"))
    cube = OctreeCube.around(*union_bounds(infos, crs, moving)) if copc else None
    total_in = sum(int(i.header.point_count) for i in infos)
    streamer = _Streamer(None, header, crs, owners, chunk_points, progress, total_in, moving)
    streamer.seamlines, streamer.workers = seamlines, workers
    per, reprojected, kept_total, (mins, maxs) = _write_all(streamer, infos, out, cube)
    elapsed = time.perf_counter() - started
    return PointCloudMergeReport(
        path=str(out),
        submodel_ids=tuple(i.submodel_id for i in infos),
        points_in=total_in,
        points_kept=kept_total,
        per_submodel=tuple(per),
        crs_wkt=crs.to_wkt(),
        crs_epsg=crs.to_epsg(),
        point_format=int(header.point_format.id),
        las_version=f"{header.version.major}.{header.version.minor}",
        scales=_xyz(header.scales),
        offsets=_xyz(header.offsets),
        mins=mins,
        maxs=maxs,
        reprojected=tuple(reprojected),
        ownership_from_footprints=ownership is None,
        copc=copc,
        elapsed_seconds=elapsed,
        points_per_second=total_in / elapsed if elapsed > 0 else math.inf,
    )
