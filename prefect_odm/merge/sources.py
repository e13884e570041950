"""Input rasters placed on the output grid, and read onto its windows (adapter: rasterio).

:func:`plan_grid` chooses one CRS (``crs_epsg`` or the CRS of the first input by sorted id) and
one grid snapped to the resolution (default: the finest input resolution in that CRS). An input
on that grid is read directly; any other one (another CRS, resolution or pixel phase) is warped
onto it with :class:`rasterio.vrt.WarpedVRT` (bilinear). :class:`SourceReader` reads a source's
values and validity over any window of the output grid (the block threads' readers are in
:mod:`.shared_readers`). The pairs of sources that overlap
and their co-located samples are in :mod:`prefect_odm.merge.overlap_sampling`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import rasterio
from numpy.typing import NDArray
from rasterio.crs import CRS
from rasterio.enums import ColorInterp, Resampling
from rasterio.transform import Affine
from rasterio.vrt import WarpedVRT
from rasterio.warp import calculate_default_transform, transform_bounds
from rasterio.windows import Window

from prefect_odm.align.similarity import RasterCorrection
from prefect_odm.errors import MergeError
from prefect_odm.grid import Block, Bounds, Grid, check_mosaic_size, intersect, snap_grid
from prefect_odm.merge.rasterio_options import ReadKeywords, WarpOptions

log = logging.getLogger(__name__)

Window4 = tuple[int, int, int, int]
"""``(row_off, col_off, height, width)`` on the output grid, pixels."""


@dataclass(frozen=True)
class RasterSource:
    """One input raster placed on the output grid.

    Attributes:
        submodel_id: the input's id.
        path: local GeoTIFF path.
        row_off, col_off: offset of the input's (possibly warped) pixel (0, 0) in the grid.
        height, width: the input's size on the grid, pixels.
        value_bands: 1-based band indexes read as values (RGB: (1, 2, 3); DEM: (1,)).
        alpha_band: 1-based alpha band on the grid (after warping), or None.
        nodata: nodata value, or None.
        warp: whether the input is warped onto the grid.
        grid: the input's footprint on the output grid (the warp target when ``warp``).
        src_alpha: the input's own alpha band (warped inputs), or None.
        dtype: the input's data type (numpy name).
        src_transform: the input's geotransform after its alignment correction (the warp reads
            the input as if it had it), or None when it is not corrected.
        heights: the alignment's height correction added to the values as they are read (DEMs),
            or None.
    """

    submodel_id: str
    path: Path
    row_off: int
    col_off: int
    height: int
    width: int
    value_bands: tuple[int, ...]
    alpha_band: int | None
    nodata: float | None
    warp: bool
    grid: Grid
    src_alpha: int | None = None
    dtype: str = "uint8"
    src_transform: tuple[float, float, float, float, float, float] | None = None
    heights: RasterCorrection | None = None

    @property
    def window(self) -> Window4:
        """``(row_off, col_off, height, width)`` on the output grid."""
        return (self.row_off, self.col_off, self.height, self.width)


@dataclass(frozen=True)
class GridPlan:
    """The output grid, its CRS and the placed sources (sorted by submodel id)."""

    crs: CRS
    grid: Grid
    sources: tuple[RasterSource, ...]

    @property
    def submodel_ids(self) -> tuple[str, ...]:
        """The sources' ids, sorted."""
        return tuple(s.submodel_id for s in self.sources)


@dataclass(frozen=True)
class _InputInfo:
    """What :func:`plan_grid` needs to know of one input raster."""

    dtype: str
    crs: CRS
    transform: Affine
    bounds: Bounds
    width: int
    height: int
    res: tuple[float, float]
    count: int
    alpha: int | None
    nodata: float | None


def _read_info(sid: str, path: Path) -> _InputInfo:
    try:
        with rasterio.open(path) as ds:
            if ds.crs is None:
                raise MergeError(f"input {sid} ({path}) has no CRS")
            interp = ds.colorinterp
            alpha = next((i + 1 for i, c in enumerate(interp) if c == ColorInterp.alpha), None)
            return _InputInfo(
                dtype=ds.dtypes[0],
                crs=ds.crs,
                transform=ds.transform,
                bounds=tuple(ds.bounds),
                width=ds.width,
                height=ds.height,
                res=ds.res,
                count=ds.count,
                alpha=alpha,
                nodata=ds.nodata,
            )
    except rasterio.errors.RasterioIOError as exc:
        raise MergeError(f"input {sid} ({path}) cannot be opened: {exc}") from exc


def _bounds_and_resolution(
    infos: Mapping[str, _InputInfo], crs: CRS, resolution_m: float | None
) -> tuple[dict[str, Bounds], float]:
    """Each input's bounds in ``crs`` and the output resolution.

    Without ``resolution_m``: the finest resolution of the inputs already in ``crs``; estimates
    for warped inputs only when none is (they are approximate and would force everything to be
    warped).
    """
    bounds: dict[str, Bounds] = {}
    native: list[float] = []
    estimated: list[float] = []
    for sid, info in infos.items():
        if info.crs == crs:
            bounds[sid] = info.bounds
            native.append(min(abs(info.res[0]), abs(info.res[1])))
        else:
            bounds[sid] = tuple(transform_bounds(info.crs, crs, *info.bounds, densify_pts=21))
            tr, _, _ = calculate_default_transform(
                info.crs, crs, info.width, info.height, *info.bounds
            )
            estimated.append(abs(tr.a))
    res = float(resolution_m) if resolution_m is not None else min(native or estimated)
    return bounds, res


def _aligned_offset(info: _InputInfo, crs: CRS, grid: Grid) -> tuple[int, int] | None:
    """The input's whole-pixel ``(row, col)`` on ``grid`` when it is on it (no warp needed)."""
    t = info.transform
    res = grid.resolution_m
    if not (
        info.crs == crs
        and abs(t.b) < 1e-12
        and abs(t.d) < 1e-12
        and abs(t.a - res) <= 1e-9 * res
        and abs(t.e + res) <= 1e-9 * res
    ):
        return None
    return grid.offset_of(t.c, t.f)


def _place(
    sid: str,
    path: Path,
    info: _InputInfo,
    crs: CRS,
    grid: Grid,
    bounds: Bounds,
    value_bands: int | None,
) -> RasterSource:
    """One input placed on ``grid``: read directly when aligned, else warped onto a sub-grid."""
    n_values = value_bands or (info.count - (1 if info.alpha else 0))
    bands = tuple(b for b in range(1, info.count + 1) if b != info.alpha)[:n_values]
    offset = _aligned_offset(info, crs, grid)
    if offset is not None:
        t = info.transform
        own = Grid(t.c, t.f, grid.resolution_m, info.width, info.height)
        row, col = offset
        return RasterSource(
            sid, path, row, col, info.height, info.width, bands, info.alpha, info.nodata,
            False, own, dtype=info.dtype,
        )  # fmt: skip
    row, col, sub = grid.sub_grid(bounds)
    if info.alpha:
        alpha_band: int | None = info.alpha
    elif info.nodata is not None:
        alpha_band = None
    else:
        alpha_band = info.count + 1
    log.info("input %s is warped onto the output grid", sid)
    return RasterSource(
        sid, path, row, col, sub.height, sub.width, bands, alpha_band, info.nodata, True, sub,
        src_alpha=info.alpha, dtype=info.dtype,
    )  # fmt: skip


def plan_grid(
    inputs: Mapping[str, Path],
    *,
    resolution_m: float | None,
    crs_epsg: int | None,
    value_bands: int | None,
    corrections: Mapping[str, RasterCorrection] | None = None,
    correct_heights: bool = False,
) -> GridPlan:
    """Choose the output CRS and snapped grid and place every input on it.

    Args:
        inputs: submodel id -> local raster path.
        resolution_m: output pixel size in CRS units; None: the finest resolution of the inputs
            already in the output CRS (of the warped inputs only when none is).
        crs_epsg: output CRS, None for the CRS of the first input by sorted id.
        value_bands: number of value bands to read (3 for RGB(A), 1 for a DEM), None for all
            non-alpha bands.
        corrections: submodel id -> the alignment's correction (plan CRS = output CRS): the
            input is placed with its corrected geotransform, so the one warp onto the grid is
            the only resampling. Inputs without one are placed as they are (same bytes).
        correct_heights: also add each correction's height plane to the values (DEMs).

    Raises:
        MergeError: no inputs, an input without CRS, or an input that cannot be opened; a
            corrected input not in the output CRS; a grid far larger than the inputs
            (:func:`prefect_odm.grid.check_mosaic_size`: an input lies somewhere else).
    """
    if not inputs:
        raise MergeError("nothing to merge: no inputs")
    ids = sorted(inputs)
    infos = {sid: _read_info(sid, inputs[sid]) for sid in ids}
    crs = CRS.from_epsg(crs_epsg) if crs_epsg is not None else infos[ids[0]].crs
    fixes = dict(corrections or {})
    for sid in sorted(set(fixes) & set(ids)):
        infos[sid] = _corrected_info(sid, inputs[sid], infos[sid], crs, fixes[sid])
    bounds, res = _bounds_and_resolution(infos, crs, resolution_m)
    grid = snap_grid(bounds.values(), res)
    check_mosaic_size(grid, bounds)
    sources = []
    for sid in ids:
        src = _place(sid, Path(inputs[sid]), infos[sid], crs, grid, bounds[sid], value_bands)
        if sid in fixes:
            src = replace(
                src,
                src_transform=tuple(infos[sid].transform)[:6],
                heights=fixes[sid] if correct_heights else None,
            )
        sources.append(src)
    return GridPlan(crs=crs, grid=grid, sources=tuple(sources))


def _corrected_info(
    sid: str, path: Path, info: _InputInfo, crs: CRS, fix: RasterCorrection
) -> _InputInfo:
    """``info`` with the corrected geotransform and the bounds of its corrected corners.

    Raises:
        MergeError: the input is not in the output CRS (the correction is in the plan CRS).
    """
    if info.crs != crs:
        raise MergeError(
            f"input {sid} ({path}) is in {info.crs}, not the output CRS {crs}: its alignment "
            "correction cannot be applied"
        )
    t = info.transform
    corrected = Affine(*fix.corrected_geotransform((t.a, t.b, t.c, t.d, t.e, t.f)))
    cols = np.array([0, info.width, 0, info.width], dtype=np.float64)
    rows = np.array([0, 0, info.height, info.height], dtype=np.float64)
    xs = corrected.a * cols + corrected.b * rows + corrected.c
    ys = corrected.d * cols + corrected.e * rows + corrected.f
    bounds = (float(xs.min()), float(ys.min()), float(xs.max()), float(ys.max()))
    return replace(info, transform=corrected, bounds=bounds)


class SourceReader:
    """Reads sources onto output-grid windows; one instance per thread (datasets are not shared).

    Args:
        plan: the grid plan.
        resampling: resampling for warped sources.
    """

    def __init__(self, plan: GridPlan, resampling: Resampling = Resampling.bilinear) -> None:
        """Nothing is opened until a source is first read."""
        self._plan = plan
        self._resampling = resampling
        self._open: dict[str, dict[int, Any]] = {}  # id -> {0: dataset, factor: (coarse, alpha)}
        self._handles: dict[str, list[Any]] = {}

    def _warp_options(self, src: RasterSource, grid: Grid, resampling: Resampling) -> WarpOptions:
        """``WarpedVRT`` keywords that put ``src`` onto ``grid`` (in the plan CRS), its own alpha,
        nodata or mask carried into the VRT's validity."""
        kwargs: WarpOptions = {
            "crs": self._plan.crs,
            "transform": Affine(*grid.transform),
            "width": grid.width,
            "height": grid.height,
            "resampling": resampling,
        }
        if src.src_transform is not None:
            kwargs["src_transform"] = Affine(*src.src_transform)
        own_alpha = src.src_alpha if src.warp else src.alpha_band
        if own_alpha:
            kwargs.update({"src_alpha": own_alpha, "dst_alpha": own_alpha})
        elif src.nodata is not None:
            kwargs.update({"src_nodata": src.nodata, "nodata": src.nodata})
        else:
            kwargs["add_alpha"] = True
        return kwargs

    def dataset(self, src: RasterSource) -> Any:
        """The (possibly warped) dataset of a source, opened on first use."""
        opened = self._open.setdefault(src.submodel_id, {})
        ds = opened.get(0)
        if ds is not None:
            return ds
        handles = self._handles.setdefault(src.submodel_id, [])
        ds = rasterio.open(src.path)
        handles.append(ds)
        if src.warp:
            ds = WarpedVRT(ds, **self._warp_options(src, src.grid, self._resampling))
            handles.append(ds)
        opened[0] = ds
        return ds

    def coarse_dataset(self, src: RasterSource, factor: int) -> tuple[Any, int | None]:
        """The source warped (nearest) onto the output grid coarsened ``factor`` times, and its
        alpha band (None where nodata marks validity); opened on first use.

        Coarse pixel ``(i, j)`` covers output rows ``i * factor`` to ``(i + 1) * factor`` and is
        sampled at its centre, the same place for every source, so two sources' samples of an
        overlap are co-located. GDAL warps only the coarse pixels asked for: decimating a read
        of the full-resolution warp warped every output pixel first (283 of a 612 s merge at
        1,800 images).
        """
        opened = self._open.setdefault(src.submodel_id, {})
        found = opened.get(factor)
        if found is None:
            coarse = self._plan.grid.coarsened(factor)
            options = self._warp_options(src, coarse, Resampling.nearest)
            raw = rasterio.open(src.path)
            ds = WarpedVRT(raw, **options)
            self._handles.setdefault(src.submodel_id, []).extend([raw, ds])
            alpha = options.get("dst_alpha") or (ds.count if options.get("add_alpha") else None)
            found = opened[factor] = (ds, alpha)
        return found

    def read_decimated(
        self, src: RasterSource, window: Window4, factor: int
    ) -> tuple[NDArray[np.float32], NDArray[np.bool_], Window4]:
        """Values and validity of ``src`` on the output grid coarsened ``factor`` times
        (:meth:`coarse_dataset`), over the coarse pixels that lie wholly inside ``window``.

        Returns:
            ``(values, valid, aligned)``: ``(bands, rows, cols)`` float32, ``(rows, cols)``
            bool, and the window on the output grid they cover (``factor``-aligned; empty
            arrays when no coarse pixel fits).
        """
        r0, c0 = -(-window[0] // factor), -(-window[1] // factor)
        r1, c1 = (window[0] + window[2]) // factor, (window[1] + window[3]) // factor
        rows, cols = max(0, r1 - r0), max(0, c1 - c0)
        aligned = (r0 * factor, c0 * factor, rows * factor, cols * factor)
        if rows == 0 or cols == 0:
            empty = np.zeros((len(src.value_bands), rows, cols), dtype=np.float32)
            return empty, np.zeros((rows, cols), dtype=bool), aligned
        ds, alpha = self.coarse_dataset(src, factor)
        win = Window(c0, r0, cols, rows)
        values = ds.read(list(src.value_bands), window=win).astype(np.float32, copy=False)
        if alpha is not None:
            valid = ds.read(alpha, window=win) > 0
        else:
            nd = np.float32(src.nodata)
            valid = np.any((values != nd) & np.isfinite(values), axis=0)
        if src.heights is not None:
            g = self._plan.grid
            values = src.heights.heights_on_grid(
                (g.left, g.top, g.resolution_m), aligned, values, valid
            )
        return values, valid, aligned

    def read(
        self,
        src: RasterSource,
        window: Window4,
        out_shape: tuple[int, int] | None = None,
    ) -> tuple[NDArray[np.float32], NDArray[np.bool_]]:
        """Values and validity of ``src`` over a window of the output grid.

        Args:
            src: the source.
            window: ``(row_off, col_off, height, width)`` on the output grid, inside the
                source's window.
            out_shape: ``(rows, cols)`` to decimate to (nearest), None for full resolution.

        Returns:
            ``(values, valid)``: ``(bands, rows, cols)`` float32 and ``(rows, cols)`` bool.
        """
        ds = self.dataset(src)
        win = Window(window[1] - src.col_off, window[0] - src.row_off, window[3], window[2])
        shape = out_shape or (window[2], window[3])
        kw: ReadKeywords = {"window": win}
        if out_shape is not None:
            kw["resampling"] = Resampling.nearest
        values = ds.read(
            list(src.value_bands), out_shape=(len(src.value_bands), *shape), **kw
        ).astype(np.float32, copy=False)
        if src.alpha_band is not None:
            alpha = ds.read(src.alpha_band, out_shape=shape, **kw)
            valid = alpha > 0
        elif src.nodata is not None:
            nd = np.float32(src.nodata)
            valid = np.any((values != nd) & np.isfinite(values), axis=0)
        else:
            valid = ds.read_masks(src.value_bands[0], out_shape=shape, **kw) > 0
        if src.heights is not None:
            g = self._plan.grid
            values = src.heights.heights_on_grid(
                (g.left, g.top, g.resolution_m), window, values, valid
            )
        return values, valid

    @property
    def open_ids(self) -> tuple[str, ...]:
        """The submodel ids of the sources this reader holds open."""
        return tuple(self._handles)

    def close_sources(self, submodel_ids: Iterable[str]) -> None:
        """Close the datasets of these sources (a later read opens them again). Each open
        source holds a decoded tile and libtiff's buffers, about 0.6-0.9 MiB outside GDAL's
        block cache, so a reader that keeps every source open grows with the merge's inputs."""
        for sid in submodel_ids:
            for handle in reversed(self._handles.pop(sid, [])):
                handle.close()
            self._open.pop(sid, None)

    def close(self) -> None:
        """Close every dataset this reader opened."""
        self.close_sources(list(self._handles))


def sources_in(plan: GridPlan, block: Block) -> list[tuple[RasterSource, Window4]]:
    """Sources intersecting a block (sorted by id) with the intersection windows."""
    bw = (block.row_off, block.col_off, block.height, block.width)
    out = []
    for src in plan.sources:
        inter = intersect(bw, src.window)
        if inter is not None:
            out.append((src, inter))
    return out


def placed_reads(
    reader: SourceReader, present: list[tuple[RasterSource, Window4]], block: Block
) -> Iterator[
    tuple[int, RasterSource, Window4, tuple[slice, slice], NDArray[np.float32], NDArray[np.bool_]]
]:
    """Read each present source over its part of ``block``.

    Yields:
        ``(n, source, window, (rows, cols), values, valid)``: the source's index in
        ``present``, its window on the output grid, the slices of that window in the block's
        own coordinates, and what :meth:`SourceReader.read` returns.
    """
    for n, (src, inter) in enumerate(present):
        values, ok = reader.read(src, inter)
        r0, c0 = inter[0] - block.row_off, inter[1] - block.col_off
        yield n, src, inter, (slice(r0, r0 + inter[2]), slice(c0, c0 + inter[3])), values, ok
