"""Point-cloud merge (adapter: laspy with lazrs, pyproj).

Each submodel's points are kept only where the ownership rule says that submodel owns them
(the same nearest-core-camera cells that bound the orthophoto seams), so overlaps are not
doubled. Inputs are streamed chunk by chunk (``laspy`` ``chunk_iterator``) into one
``LasWriter``; memory is a few chunks whatever the cloud size.

The output header is fixed before the first point is written, from all input headers: the
finest scale of any input per axis, offsets at whole metres below the union of the bounds (the
scale is coarsened by powers of ten only if the extent would not fit 32-bit integers), the point
format shared by the inputs (or the highest one among them, copying the dimensions they have in
common), the extra dimensions common to all inputs, and the output CRS as a WKT VLR (LAS 1.4 /
point formats >= 6) or GeoTIFF keys (older), via ``LasHeader.add_crs``. The writer updates the
point count and bounds from the points actually written, so the header is exact.

Ownership is decided per point with :class:`CellOwners` (the nearest-core-camera rule with a
lookup table for cells whose owner is certain, exact k-d tree queries near seams), and points
whose format and scales match the output are moved to the output offsets by an exact integer
shift instead of being rescaled.

COPC is not written: laspy reads COPC but cannot write it; ``copclib`` (PyPI) can write COPC but
leaves building the octree to the caller, which is future work.
"""

from __future__ import annotations

import logging
import math
import os
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import laspy
import numpy as np
import pyproj
from laspy.point.dims import DimensionInfo
from numpy.typing import NDArray
from scipy.spatial import cKDTree

from prefect_odm.align.report import AlignmentReport
from prefect_odm.errors import MergeError
from prefect_odm.merge.reports import PointCloudMergeReport, SubmodelPoints
from prefect_odm.merge.seamlines import LabelOwners, OwnerLabels
from prefect_odm.merge.seams import ownership_from_centres
from prefect_odm.ownership import Ownership

log = logging.getLogger(__name__)

PointMover = Callable[[NDArray[np.float64]], NDArray[np.float64]]
"""One submodel's alignment on points: ``(n, 3)`` plan-CRS metres in and out."""

_INT32_MAX = 2**31 - 1


@dataclass(frozen=True)
class _Input:
    submodel_id: str
    path: Path
    header: laspy.LasHeader
    crs: pyproj.CRS | None


def _read_headers(inputs: Mapping[str, Path]) -> list[_Input]:
    out = []
    for sid in sorted(inputs):
        path = Path(inputs[sid])
        try:
            with laspy.open(path) as reader:
                header = reader.header
                try:
                    crs = header.parse_crs()
                except Exception as exc:  # noqa: BLE001 - laspy raises several types here
                    raise MergeError(f"input {sid} ({path}): unreadable CRS: {exc}") from exc
        except (laspy.LaspyException, OSError) as exc:
            raise MergeError(f"input {sid} ({path}) cannot be opened: {exc}") from exc
        out.append(_Input(sid, path, header, crs))
    return out


def _bounds_in(
    inp: _Input, crs: pyproj.CRS, moved: PointMover | None = None
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """The input's header bounds in ``crs`` (after the alignment's transform ``moved``)."""
    mins, maxs = _reprojected_bounds(inp, crs)
    if moved is None:
        return mins, maxs
    corners = np.array(np.meshgrid(*zip(mins, maxs, strict=True))).reshape(3, -1).T
    after = moved(corners)
    return after.min(axis=0), after.max(axis=0)


def _reprojected_bounds(
    inp: _Input, crs: pyproj.CRS
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    mins = np.asarray(inp.header.mins, dtype=np.float64)
    maxs = np.asarray(inp.header.maxs, dtype=np.float64)
    if inp.crs is None or inp.crs == crs:
        return mins, maxs
    tr = pyproj.Transformer.from_crs(inp.crs, crs, always_xy=True)
    xs = np.linspace(mins[0], maxs[0], 11)
    ys = np.linspace(mins[1], maxs[1], 11)
    gx, gy = np.meshgrid(xs, ys)
    tx, ty, tz = tr.transform(gx.ravel(), gy.ravel(), np.full(gx.size, mins[2]))
    _, _, tz2 = tr.transform(gx.ravel(), gy.ravel(), np.full(gx.size, maxs[2]))
    lo = np.array([tx.min(), ty.min(), min(tz.min(), tz2.min())])
    hi = np.array([tx.max(), ty.max(), max(tz.max(), tz2.max())])
    return lo, hi


def _output_header(
    inputs: list[_Input], crs: pyproj.CRS, moving: Mapping[str, PointMover]
) -> laspy.LasHeader:
    formats = {i.header.point_format.id for i in inputs}
    fmt = formats.pop() if len(formats) == 1 else max(i.header.point_format.id for i in inputs)
    version = max((i.header.version for i in inputs), key=lambda v: (v.major, v.minor))
    if fmt >= 6:
        version = laspy.header.Version(1, 4)
    header = laspy.LasHeader(point_format=fmt, version=f"{version.major}.{version.minor}")
    common: dict[str, DimensionInfo] | None = None
    for inp in inputs:
        extra = {d.name: d for d in inp.header.point_format.extra_dimensions}
        if common is None:
            common = extra
        else:
            common = {n: d for n, d in common.items() if n in extra and extra[n].dtype == d.dtype}
    for name, dim in sorted((common or {}).items()):
        header.add_extra_dim(laspy.ExtraBytesParams(name=name, type=dim.dtype))
    scales = np.min(np.array([i.header.scales for i in inputs], dtype=np.float64), axis=0)
    lows, highs = zip(*(_bounds_in(i, crs, moving.get(i.submodel_id)) for i in inputs), strict=True)
    lo = np.min(np.array(lows), axis=0)
    hi = np.max(np.array(highs), axis=0)
    offsets = np.floor(lo)
    for axis in range(3):
        while (
            max(abs(hi[axis] - offsets[axis]), abs(lo[axis] - offsets[axis])) / scales[axis]
            > _INT32_MAX * 0.99
        ):
            scales[axis] *= 10.0
            log.info("point cloud axis %d scale coarsened to %g to fit 32 bits", axis, scales[axis])
    header.scales = scales
    header.offsets = offsets
    header.add_crs(crs)
    return header


class CellOwners:
    """:meth:`Ownership.label_of_points` sped up by a grid of cells whose owner is certain.

    A cell of half-diagonal ``r`` centred at ``p`` belongs wholly to the owner ``L`` of ``p``
    when the nearest camera of any other submodel is more than ``2 r`` farther from ``p`` than
    ``p``'s nearest camera (triangle inequality). Points in such cells take ``L`` from a table;
    the others (near seams, or outside the grid) are queried exactly in the k-d tree. Same rule,
    same tree, hence the same labels as :meth:`Ownership.label_of_points`.

    Args:
        ownership: the ownership rule.
        bounds: ``(xmin, ymin, xmax, ymax)`` the points are expected in, CRS units.
        max_cells: number of cells of the table (memory about 20 bytes per cell at build).
    """

    def __init__(
        self,
        ownership: Ownership,
        bounds: tuple[float, float, float, float],
        max_cells: int = 262_144,
    ) -> None:
        index = {sid: n for n, sid in enumerate(ownership.submodel_ids)}
        self._labels = np.array([index[s] for s in ownership.camera_submodel], dtype=np.int32)
        self._tree = cKDTree(np.column_stack([ownership.x_m, ownership.y_m]).astype(np.float64))
        xmin, ymin, xmax, ymax = (float(v) for v in bounds)
        width = max(xmax - xmin, 1e-6)
        height = max(ymax - ymin, 1e-6)
        cell = max(math.sqrt(width * height / max_cells), 1e-3)
        self._x0, self._y0, self._cell = xmin, ymin, cell
        self._nx = int(math.ceil(width / cell)) + 1
        self._ny = int(math.ceil(height / cell)) + 1
        cx = xmin + (np.arange(self._nx) + 0.5) * cell
        cy = ymin + (np.arange(self._ny) + 0.5) * cell
        gx, gy = np.meshgrid(cx, cy)
        k = min(8, len(self._labels))
        dist, idx = self._tree.query(np.column_stack([gx.ravel(), gy.ravel()]), k=k)
        dist = np.asarray(dist, dtype=np.float64).reshape(-1, k)
        idx = np.asarray(idx).reshape(-1, k)
        labs = self._labels[idx]
        first = labs[:, 0]
        other = labs != first[:, None]
        d_other = np.where(other, dist, np.inf).min(axis=1)
        if k < len(self._labels):  # another submodel may lie beyond the k nearest
            d_other = np.minimum(d_other, np.where(other.any(axis=1), np.inf, dist[:, -1]))
        margin = 2.0 * (cell * math.sqrt(0.5)) * (1.0 + 1e-9) + 1e-9
        self._table = np.where(d_other - dist[:, 0] > margin, first, -1).astype(np.int32)

    def label_of_points(self, x: NDArray[np.float64], y: NDArray[np.float64]) -> NDArray[np.int32]:
        """Owner index (into ``ownership.submodel_ids``) of each point, shape of ``x``."""
        fx = np.floor((x - self._x0) / self._cell)
        fy = np.floor((y - self._y0) / self._cell)
        inside = (fx >= 0) & (fx < self._nx) & (fy >= 0) & (fy < self._ny)
        flat = np.where(inside, fy * self._nx + fx, 0).astype(np.int64)
        labels = self._table[flat]
        labels[~inside] = -1
        unsure = labels < 0
        if unsure.any():
            _, nearest = self._tree.query(np.column_stack([x[unsure], y[unsure]]), k=1)
            labels[unsure] = self._labels[nearest]
        return labels


def _integer_shift(inp: laspy.LasHeader, header: laspy.LasHeader) -> tuple[int, int, int] | None:
    """Integer steps to add to X, Y, Z to move points from ``inp``'s offsets to ``header``'s.

    None unless the point formats and scales are equal and the offsets differ by whole steps
    (then the copy is exact and needs no floating-point rescaling).
    """
    if inp.point_format != header.point_format or not np.array_equal(inp.scales, header.scales):
        return None
    steps = (np.asarray(inp.offsets) - np.asarray(header.offsets)) / np.asarray(header.scales)
    rounded = np.rint(steps)
    if np.any(np.abs(steps - rounded) > 1e-6):
        return None
    return (int(rounded[0]), int(rounded[1]), int(rounded[2]))


def _shifted(
    points: laspy.ScaleAwarePointRecord, shift: tuple[int, int, int], header: laspy.LasHeader
) -> laspy.ScaleAwarePointRecord:
    """The same points expressed in ``header``'s offsets (integer shift; exact)."""
    array = points.array
    for name, step in zip(("X", "Y", "Z"), shift, strict=True):
        if step:
            array[name] += np.int32(step)
    return laspy.ScaleAwarePointRecord(array, header.point_format, header.scales, header.offsets)


def _convert(
    chunk: laspy.ScaleAwarePointRecord,
    header: laspy.LasHeader,
    xyz: tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64]] | None,
) -> laspy.ScaleAwarePointRecord:
    """Copy a chunk into the output point format/scales (and new coordinates when given)."""
    out = laspy.ScaleAwarePointRecord.zeros(len(chunk), header=header)
    skip = {"X", "Y", "Z"}
    have = set(chunk.point_format.dimension_names)
    for name in out.point_format.dimension_names:
        if name in have and name not in skip:
            out[name] = chunk[name]
    if xyz is None:
        out.x, out.y, out.z = chunk.x, chunk.y, chunk.z
    else:
        out.x, out.y, out.z = xyz
    return out


def _centres(inputs: list[_Input], crs: pyproj.CRS) -> dict[str, tuple[float, float]]:
    centres = {}
    for inp in inputs:
        lo, hi = _bounds_in(inp, crs)
        centres[inp.submodel_id] = (float((lo[0] + hi[0]) / 2), float((lo[1] + hi[1]) / 2))
    return centres


def _output_crs(infos: list[_Input], crs_epsg: int | None) -> pyproj.CRS:
    """``crs_epsg``, else the CRS of the first input (sorted ids) that has one."""
    if crs_epsg is not None:
        return pyproj.CRS.from_epsg(crs_epsg)
    with_crs = [i.crs for i in infos if i.crs is not None]
    if not with_crs:
        raise MergeError("no input point cloud carries a CRS and no crs_epsg was given")
    return with_crs[0]


def _resolve_owners(infos: list[_Input], crs: pyproj.CRS, ownership: Ownership | None) -> Ownership:
    """The given ownership checked against the inputs, or one from their bounds' centres."""
    owners = ownership if ownership is not None else ownership_from_centres(_centres(infos, crs))
    unknown = sorted({i.submodel_id for i in infos} - set(owners.submodel_ids))
    if unknown:
        raise MergeError(f"point clouds {unknown} own no camera in the ownership rule")
    return owners


@dataclass
class _Streamer:
    """Streams the points each input owns into one open ``LasWriter``."""

    writer: laspy.LasWriter | None
    header: laspy.LasHeader
    crs: pyproj.CRS
    owners: Ownership
    chunk_points: int
    progress: Callable[[int, int], None] | None
    total_in: int
    transforms: Mapping[str, PointMover]
    done: int = 0
    seamlines: OwnerLabels | None = None

    def write_input(self, inp: _Input) -> tuple[SubmodelPoints, bool]:
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
        shift = _integer_shift(inp.header, self.header) if exact else None
        label = self.owners.submodel_ids.index(inp.submodel_id)
        lo, hi = _bounds_in(inp, self.crs, moved)
        cells: CellOwners | LabelOwners = CellOwners(self.owners, (lo[0], lo[1], hi[0], hi[1]))
        if self.seamlines is not None:
            cells = LabelOwners(self.seamlines, self.owners)
        kept_n = 0
        read_n = 0
        with laspy.open(inp.path) as reader:
            for chunk in reader.chunk_iterator(self.chunk_points):
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
        x, y = np.asarray(chunk.x), np.asarray(chunk.y)
        xyz = None
        if transformer is not None or moved is not None:
            z = np.asarray(chunk.z)
            if transformer is not None:
                x, y, z = transformer.transform(x, y, z)
            if moved is not None:
                x, y, z = moved(np.stack([x, y, z], axis=1)).T
            xyz = (x, y, z)
        keep = cells.label_of_points(x, y) == label
        count = int(keep.sum())
        assert self.writer is not None, "the streamer writes only inside _write_all"
        if count:
            if shift is not None:
                self.writer.write_points(_shifted(chunk[keep], shift, self.header))
            else:
                sel = None if xyz is None else (xyz[0][keep], xyz[1][keep], xyz[2][keep])
                self.writer.write_points(_convert(chunk[keep], self.header, sel))
        return count


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


def _write_all(
    streamer: _Streamer, infos: list[_Input], out: Path
) -> tuple[list[SubmodelPoints], list[str], int, tuple[Any, Any]]:
    """Stream every input into ``out`` (through a temporary name), check it, promote it.

    Returns:
        ``(per-submodel points, reprojected ids, points kept, (mins, maxs))``.
    """
    per, reprojected = [], []
    tmp = out.with_name(f".{out.stem}.{uuid.uuid4().hex[:8]}.tmp{out.suffix}")
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        compress = out.suffix.lower() == ".laz"
        with laspy.open(tmp, mode="w", header=streamer.header, do_compress=compress) as writer:
            streamer.writer = writer
            for inp in infos:
                points, warped = streamer.write_input(inp)
                per.append(points)
                if warped:
                    reprojected.append(inp.submodel_id)
        kept_total = sum(p.points_kept for p in per)
        bounds = _check_written(tmp, out, kept_total, streamer.crs)
        os.replace(tmp, out)
    finally:
        if tmp.exists():
            tmp.unlink()
    return per, reprojected, kept_total, bounds


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
) -> PointCloudMergeReport:
    """Merge per-submodel LAS/LAZ point clouds into one LAZ, each point kept once.

    Args:
        inputs: submodel id -> local LAS/LAZ path.
        out: output LAZ path (written through a temporary name, then promoted).
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
    infos = _read_headers(inputs)
    crs = _output_crs(infos, crs_epsg)
    owners = _resolve_owners(infos, crs, ownership)
    moving: dict[str, PointMover] = {}
    if alignment is not None:
        moving = {sid: partial(alignment.apply_points, sid) for sid in alignment.moving_ids()}
    header = _output_header(infos, crs, moving)
    total_in = sum(int(i.header.point_count) for i in infos)
    streamer = _Streamer(None, header, crs, owners, chunk_points, progress, total_in, moving)
    streamer.seamlines = seamlines
    per, reprojected, kept_total, (mins, maxs) = _write_all(streamer, infos, out)
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
        copc=False,
        elapsed_seconds=elapsed,
        points_per_second=total_in / elapsed if elapsed > 0 else math.inf,
    )
