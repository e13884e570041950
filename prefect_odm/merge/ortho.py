"""Orthophoto merge (adapter: rasterio, rio-cogeo; the mathematics lives in :mod:`.seams`).

The merge runs in four steps:

1. **Grid**: one CRS (``crs_epsg`` or the CRS of the first input by sorted id) and one grid
   snapped to the resolution (default: the finest input resolution in that CRS). An input on that
   grid is read directly; any other one (another CRS, resolution or pixel phase) is warped onto
   it with :class:`rasterio.vrt.WarpedVRT` (bilinear).
2. **Colour balance**: per band gain and offset per submodel, solved jointly over all overlaps
   from statistics sampled at a decimated resolution (:func:`.seams.solve_gain_offset`).
3. **Blocks**: the output grid is cut into ``block_size`` blocks processed by a thread pool; each
   thread opens its own datasets; at most ``workers + 1`` blocks are in flight, so memory does not
   depend on the mosaic size. Each block blends the submodels with the seam weights of
   :mod:`.seams` (ownership seams, feathering in a band around them, no hole wherever any
   submodel has data). Inputs are always visited in sorted id order, so the same inputs in any
   order give byte-identical pixels, for any ``workers`` and ``block_size``.
4. **COG**: blocks go to a tiled, uncompressed temporary GeoTIFF; its overviews are built there
   (average, down to one 512-pixel tile) and GDAL's COG driver copies data and overviews into a
   Cloud Optimized GeoTIFF (DEFLATE level 3 with predictor by default, compressed on
   ``workers`` threads); the result is checked with ``rio_cogeo.cog_validate`` and only then
   moved to ``out``. GDAL's block cache is bounded by ``gdal_cache_mb`` for the whole merge.

Not done yet: refining seams by a least-cost path through the overlap (avoiding buildings and
roads); seams are the ownership boundaries, feathered.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

import numpy as np
import rasterio
import rasterio.shutil
from numpy.typing import NDArray
from rasterio.crs import CRS
from rasterio.enums import ColorInterp, Resampling
from rasterio.transform import Affine
from rasterio.vrt import WarpedVRT
from rasterio.warp import calculate_default_transform, transform_bounds
from rasterio.windows import Window

from prefect_odm.errors import MergeError
from prefect_odm.merge.grid import Block, Grid, intersect, iter_blocks, snap_grid
from prefect_odm.merge.seams import (
    GainOffset,
    OverlapStats,
    SeamField,
    blend_weights,
    overlap_stats,
    ownership_from_centres,
    solve_gain_offset,
)
from prefect_odm.ownership import Ownership

log = logging.getLogger(__name__)

MIN_COVERAGE_OF_UNION = 0.995
"""Merged covered area / union of the inputs' covered areas below which a merge fails."""

_STATS_MAX_PIXELS = 250_000
"""Largest number of pixels sampled from one overlap for colour statistics."""

_FOOTPRINT_MAX_SIDE_PX = 512
"""Longest side of the decimated masks used to find footprint centres."""


# --------------------------------------------------------------------------------------------
# Sources: one input raster placed on the output grid (shared with the DEM merge)
# --------------------------------------------------------------------------------------------


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

    @property
    def window(self) -> tuple[int, int, int, int]:
        """``(row_off, col_off, height, width)`` on the output grid."""
        return (self.row_off, self.col_off, self.height, self.width)


@dataclass(frozen=True)
class GridPlan:
    """The output grid, its CRS and the placed sources (sorted by submodel id)."""

    crs: CRS
    grid: Grid
    sources: tuple[RasterSource, ...]


def plan_grid(
    inputs: Mapping[str, Path],
    *,
    resolution_m: float | None,
    crs_epsg: int | None,
    value_bands: int | None,
) -> GridPlan:
    """Choose the output CRS and snapped grid and place every input on it.

    Args:
        inputs: submodel id -> local raster path.
        resolution_m: output pixel size in CRS units; None: the finest resolution of the inputs
            already in the output CRS (of the warped inputs only when none is).
        crs_epsg: output CRS, None for the CRS of the first input by sorted id.
        value_bands: number of value bands to read (3 for RGB(A), 1 for a DEM), None for all
            non-alpha bands.

    Raises:
        MergeError: no inputs, an input without CRS, or an input that cannot be opened.
    """
    if not inputs:
        raise MergeError("nothing to merge: no inputs")
    ids = sorted(inputs)
    infos: dict[str, dict[str, Any]] = {}
    for sid in ids:
        try:
            with rasterio.open(inputs[sid]) as ds:
                if ds.crs is None:
                    raise MergeError(f"input {sid} ({inputs[sid]}) has no CRS")
                interp = ds.colorinterp
                alpha = next((i + 1 for i, c in enumerate(interp) if c == ColorInterp.alpha), None)
                infos[sid] = {
                    "dtype": ds.dtypes[0],
                    "crs": ds.crs,
                    "transform": ds.transform,
                    "bounds": tuple(ds.bounds),
                    "width": ds.width,
                    "height": ds.height,
                    "res": ds.res,
                    "count": ds.count,
                    "alpha": alpha,
                    "nodata": ds.nodata,
                }
        except rasterio.errors.RasterioIOError as exc:
            raise MergeError(f"input {sid} ({inputs[sid]}) cannot be opened: {exc}") from exc
    crs = CRS.from_epsg(crs_epsg) if crs_epsg is not None else infos[ids[0]]["crs"]
    bounds: dict[str, tuple[float, float, float, float]] = {}
    native: list[float] = []
    estimated: list[float] = []
    for sid in ids:
        info = infos[sid]
        if info["crs"] == crs:
            bounds[sid] = info["bounds"]
            native.append(min(abs(info["res"][0]), abs(info["res"][1])))
        else:
            bounds[sid] = tuple(transform_bounds(info["crs"], crs, *info["bounds"], densify_pts=21))
            tr, _, _ = calculate_default_transform(
                info["crs"], crs, info["width"], info["height"], *info["bounds"]
            )
            estimated.append(abs(tr.a))
    # The finest resolution of the inputs already in the output CRS; estimates for warped
    # inputs only when none is (they are approximate and would force everything to be warped).
    res = float(resolution_m) if resolution_m is not None else min(native or estimated)
    grid = snap_grid(bounds.values(), res)
    sources = []
    for sid in ids:
        info = infos[sid]
        n_values = value_bands or (info["count"] - (1 if info["alpha"] else 0))
        bands = tuple(b for b in range(1, info["count"] + 1) if b != info["alpha"])[:n_values]
        t: Affine = info["transform"]
        aligned = (
            info["crs"] == crs
            and abs(t.b) < 1e-12
            and abs(t.d) < 1e-12
            and abs(t.a - res) <= 1e-9 * res
            and abs(t.e + res) <= 1e-9 * res
            and grid.offset_of(t.c, t.f) is not None
        )
        if aligned:
            row, col = grid.offset_of(t.c, t.f)  # type: ignore[misc]
            src_grid = Grid(t.c, t.f, res, info["width"], info["height"])
            sources.append(
                RasterSource(
                    sid,
                    Path(inputs[sid]),
                    row,
                    col,
                    info["height"],
                    info["width"],
                    bands,
                    info["alpha"],
                    info["nodata"],
                    False,
                    src_grid,
                    dtype=info["dtype"],
                )
            )
        else:
            row, col, sub = grid.sub_grid(bounds[sid])
            if info["alpha"]:
                alpha_band: int | None = info["alpha"]
            elif info["nodata"] is not None:
                alpha_band = None
            else:
                alpha_band = info["count"] + 1
            sources.append(
                RasterSource(
                    sid,
                    Path(inputs[sid]),
                    row,
                    col,
                    sub.height,
                    sub.width,
                    bands,
                    alpha_band,
                    info["nodata"],
                    True,
                    sub,
                    src_alpha=info["alpha"],
                    dtype=info["dtype"],
                )
            )
            log.info("input %s is warped onto the output grid", sid)
    return GridPlan(crs=crs, grid=grid, sources=tuple(sources))


class SourceReader:
    """Reads sources onto output-grid windows; one instance per thread (datasets are not shared).

    Args:
        plan: the grid plan.
        resampling: resampling for warped sources.
    """

    def __init__(self, plan: GridPlan, resampling: Resampling = Resampling.bilinear) -> None:
        self._plan = plan
        self._resampling = resampling
        self._open: dict[str, Any] = {}
        self._handles: list[Any] = []

    def dataset(self, src: RasterSource) -> Any:
        """The (possibly warped) dataset of a source, opened on first use."""
        ds = self._open.get(src.submodel_id)
        if ds is not None:
            return ds
        raw = rasterio.open(src.path)
        self._handles.append(raw)
        if src.warp:
            kwargs: dict[str, Any] = {
                "crs": self._plan.crs,
                "transform": Affine(*src.grid.transform),
                "width": src.width,
                "height": src.height,
                "resampling": self._resampling,
            }
            if src.src_alpha:
                kwargs.update(src_alpha=src.src_alpha, dst_alpha=src.src_alpha)
            elif src.nodata is not None:
                kwargs.update(src_nodata=src.nodata, nodata=src.nodata)
            else:
                kwargs.update(add_alpha=True)
            ds = WarpedVRT(raw, **kwargs)
            self._handles.append(ds)
        else:
            ds = raw
        self._open[src.submodel_id] = ds
        return ds

    def read(
        self,
        src: RasterSource,
        window: tuple[int, int, int, int],
        out_shape: tuple[int, int] | None = None,
    ) -> tuple[NDArray[np.float32], NDArray[np.bool_]]:
        """Values and validity of ``src`` over a window of the output grid.

        Args:
            window: ``(row_off, col_off, height, width)`` on the output grid, inside the
                source's window.
            out_shape: ``(rows, cols)`` to decimate to (nearest), None for full resolution.

        Returns:
            ``(values, valid)``: ``(bands, rows, cols)`` float32 and ``(rows, cols)`` bool.
        """
        ds = self.dataset(src)
        win = Window(window[1] - src.col_off, window[0] - src.row_off, window[3], window[2])
        shape = out_shape or (window[2], window[3])
        kw: dict[str, Any] = {"window": win}
        if out_shape is not None:
            kw.update(resampling=Resampling.nearest)
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
        return values, valid

    def close(self) -> None:
        for handle in reversed(self._handles):
            handle.close()
        self._handles.clear()
        self._open.clear()


class ThreadReaders:
    """One :class:`SourceReader` per worker thread, all closed together."""

    def __init__(self, plan: GridPlan) -> None:
        self._plan = plan
        self._local = threading.local()
        self._lock = threading.Lock()
        self._all: list[SourceReader] = []

    def get(self) -> SourceReader:
        reader = getattr(self._local, "reader", None)
        if reader is None:
            reader = SourceReader(self._plan)
            self._local.reader = reader
            with self._lock:
                self._all.append(reader)
        return reader

    def close(self) -> None:
        with self._lock:
            for reader in self._all:
                reader.close()
            self._all.clear()


def sources_in(
    plan: GridPlan, block: Block
) -> list[tuple[RasterSource, tuple[int, int, int, int]]]:
    """Sources intersecting a block (sorted by id) with the intersection windows."""
    bw = (block.row_off, block.col_off, block.height, block.width)
    out = []
    for src in plan.sources:
        inter = intersect(bw, src.window)
        if inter is not None:
            out.append((src, inter))
    return out


def footprint_centres(plan: GridPlan) -> dict[str, tuple[float, float]]:
    """Centroid of each source's valid pixels (decimated), in the output CRS."""
    reader = SourceReader(plan, Resampling.nearest)
    centres: dict[str, tuple[float, float]] = {}
    try:
        for src in plan.sources:
            factor = max(1, -(-max(src.height, src.width) // _FOOTPRINT_MAX_SIDE_PX))
            shape = (max(1, src.height // factor), max(1, src.width // factor))
            _, valid = reader.read(src, src.window, out_shape=shape)
            rows, cols = np.nonzero(valid)
            if rows.size == 0:
                raise MergeError(f"input {src.submodel_id} ({src.path}) holds no data")
            sy = src.height / shape[0]
            sx = src.width / shape[1]
            res = plan.grid.resolution_m
            x = plan.grid.left + (src.col_off + (cols.mean() + 0.5) * sx) * res
            y = plan.grid.top - (src.row_off + (rows.mean() + 0.5) * sy) * res
            centres[src.submodel_id] = (float(x), float(y))
    finally:
        reader.close()
    return centres


def ownership_from_rasters(inputs: Mapping[str, Path], *, crs_epsg: int | None = None) -> Ownership:
    """An ownership for outputs merged without a split plan, from their rasters' footprints.

    One pseudo-camera per input at the centroid of its valid pixels (decimated), in ``crs_epsg``
    (None: the CRS of the first input by sorted id). Pass the result to all three merges so the
    orthophoto, DEM and point cloud agree on the seams.

    Raises:
        MergeError: no inputs, an unreadable input, or an input without data.
    """
    plan = plan_grid(inputs, resolution_m=None, crs_epsg=crs_epsg, value_bands=None)
    return ownership_from_centres(footprint_centres(plan))


def resolve_ownership(plan: GridPlan, ownership: Ownership | None) -> Ownership:
    """The given ownership checked against the inputs, or one derived from footprint centres.

    Raises:
        MergeError: an input that the ownership does not know.
    """
    if ownership is None:
        return ownership_from_centres(footprint_centres(plan))
    unknown = sorted({s.submodel_id for s in plan.sources} - set(ownership.submodel_ids))
    if unknown:
        raise MergeError(f"inputs {unknown} own no camera in the ownership rule")
    return ownership


def overlap_pairs(
    plan: GridPlan,
) -> Iterator[tuple[RasterSource, RasterSource, tuple[int, int, int, int]]]:
    """Every pair of sources (sorted ids) whose windows intersect, with the intersection."""
    srcs = plan.sources
    for i, a in enumerate(srcs):
        for b in srcs[i + 1 :]:
            inter = intersect(a.window, b.window)
            if inter is not None:
                yield a, b, inter


def sample_overlap(
    reader: SourceReader,
    a: RasterSource,
    b: RasterSource,
    window: tuple[int, int, int, int],
    max_pixels: int = _STATS_MAX_PIXELS,
) -> tuple[NDArray[np.float32], NDArray[np.float32]]:
    """Co-located values of two sources where both have data, sampled at a decimated resolution.

    Returns:
        ``(values_a, values_b)``, each ``(bands, n)`` float32.
    """
    factor = max(1, int(np.ceil(np.sqrt(window[2] * window[3] / max_pixels))))
    shape = (max(1, window[2] // factor), max(1, window[3] // factor))
    va, ma = reader.read(a, window, out_shape=shape if factor > 1 else None)
    vb, mb = reader.read(b, window, out_shape=shape if factor > 1 else None)
    both = ma & mb
    return va[:, both], vb[:, both]


# --------------------------------------------------------------------------------------------
# COG output
# --------------------------------------------------------------------------------------------


def temporary_sibling(out: Path, tag: str) -> Path:
    return out.with_name(f".{out.stem}.{tag}.{uuid.uuid4().hex[:8]}.tif")


DEFAULT_GDAL_CACHE_MB = 64
"""GDAL block cache of a merge, MiB (see ``gdal_cache_mb``)."""

_P = ParamSpec("_P")
_R = TypeVar("_R")


def with_gdal_cache(fn: Callable[_P, _R]) -> Callable[_P, _R]:
    """Run ``fn`` inside ``rasterio.Env(GDAL_CACHEMAX=gdal_cache_mb)`` (keyword, default 64)."""

    @functools.wraps(fn)
    def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        cache_mb = kwargs.get("gdal_cache_mb", DEFAULT_GDAL_CACHE_MB)
        # in bytes: a small integer is not read as megabytes here
        with rasterio.Env(GDAL_CACHEMAX=int(cache_mb) * 1024 * 1024):  # type: ignore[call-overload]
            return fn(*args, **kwargs)

    return wrapper


COG_BLOCK_SIZE = 512
"""Tile side of the written COGs, pixels."""


def overview_factors(width: int, height: int, block: int = COG_BLOCK_SIZE) -> list[int]:
    """Overview decimation factors down to the first level that fits in one tile (as GDAL's COG
    driver's ``OVERVIEWS=AUTO`` chooses them)."""
    factors = []
    f = 2
    while -(-max(width, height) // (f // 2)) > block:
        factors.append(f)
        f *= 2
    return factors


def build_overviews(dataset: Any) -> None:
    """Build internal overviews (average) on the uncompressed temporary GeoTIFF.

    Building them here, on uncompressed data, and letting the COG driver copy them is about
    twice as fast as letting the COG driver compute them into a compressed temporary file.
    """
    factors = overview_factors(dataset.width, dataset.height)
    if factors:
        dataset.build_overviews(factors, Resampling.average)


def write_cog(
    blocks_path: Path,
    out: Path,
    *,
    workers: int,
    compress: str,
    predictor: bool,
    compress_level: int | None = None,
    overview_resampling: str = "AVERAGE",
) -> None:
    """Convert a tiled GeoTIFF into a validated COG at ``out`` (temporary name, then promoted).

    Overviews present in ``blocks_path`` are reused; otherwise GDAL builds them.

    Raises:
        MergeError: GDAL failed or the result is not a valid COG.
    """
    from rio_cogeo.cogeo import cog_validate

    tmp = temporary_sibling(out, "cog")
    options: dict[str, Any] = {
        "COMPRESS": compress,
        "BLOCKSIZE": str(COG_BLOCK_SIZE),
        "OVERVIEWS": "AUTO",
        "OVERVIEW_RESAMPLING": overview_resampling,
        "NUM_THREADS": str(max(1, workers)),
        "BIGTIFF": "IF_SAFER",
    }
    if predictor:
        options["PREDICTOR"] = "YES"
    if compress_level is not None:
        options["LEVEL"] = str(compress_level)
    try:
        with rasterio.Env(GDAL_NUM_THREADS=str(max(1, workers))):
            rasterio.shutil.copy(blocks_path, tmp, driver="COG", **options)
        valid, errors, _warnings = cog_validate(str(tmp), quiet=True)
        if not valid:
            raise MergeError(f"{out}: the written COG is not valid: {errors}")
        os.replace(tmp, out)
    except rasterio.errors.RasterioError as exc:
        raise MergeError(f"{out}: writing the COG failed: {exc}") from exc
    finally:
        if tmp.exists():
            tmp.unlink()


def run_blocks(
    blocks: Sequence[Block],
    work: Callable[[Block], Any],
    consume: Callable[[Block, Any], None],
    *,
    workers: int,
    progress: Callable[[int, int], None] | None,
) -> None:
    """Run ``work`` over blocks on a thread pool, at most ``workers + 1`` in flight.

    ``consume`` is called in the calling thread (so it may write to one dataset).
    """
    total = len(blocks)
    done = 0
    pending: set[Future[Any]] = set()
    owner: dict[Future[Any], Block] = {}
    it = iter(blocks)
    limit = max(1, workers) + 1
    with ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="merge") as pool:
        exhausted = False
        while pending or not exhausted:
            while not exhausted and len(pending) < limit:
                try:
                    block = next(it)
                except StopIteration:
                    exhausted = True
                    break
                fut = pool.submit(work, block)
                pending.add(fut)
                owner[fut] = block
            if not pending:
                break
            finished, pending = wait(pending, return_when=FIRST_COMPLETED)
            for fut in sorted(finished, key=lambda f: (owner[f].row_off, owner[f].col_off)):
                block = owner.pop(fut)
                try:
                    result = fut.result()
                except BaseException:
                    for other in pending:
                        other.cancel()
                    raise
                consume(block, result)
                done += 1
                if progress is not None:
                    progress(done, total)


def write_merged_raster(
    out: Path,
    plan: GridPlan,
    creation_options: Mapping[str, Any],
    work: Callable[[Block], Any],
    write: Callable[[Any, Block, Any], tuple[int, int]],
    readers: ThreadReaders,
    *,
    block_size: int,
    workers: int,
    progress: Callable[[int, int], None] | None,
    cog_options: Mapping[str, Any],
    blocks_done: Callable[[], None] | None = None,
) -> tuple[int, int]:
    """Merge ``plan``'s grid block by block into a tiled GeoTIFF, check it, write the COG.

    The blocks go to a temporary tiled GeoTIFF beside ``out`` (256-pixel tiles, BigTIFF if
    needed), which gets overviews and is converted to the COG ``out`` by :func:`write_cog`; the
    temporary file is removed in every case.

    Args:
        out: the output COG path.
        plan: the output grid (size, CRS, transform).
        creation_options: the product's own GeoTIFF options (``count``, ``dtype``, ``nodata``,
            ``photometric``...), added to the common ones.
        work: ``work(block) -> result``, run on a thread pool (see :func:`run_blocks`).
        write: ``write(dataset, block, result) -> (pixels, union_pixels)`` writes one result to
            the open temporary dataset, in the calling thread; returns the block's pixels with
            data and the pixels where at least one input has data.
        readers: closed once every block is done.
        block_size: block side, pixels.
        workers: threads over blocks (and for COG compression).
        progress: ``(blocks_done, blocks_total)`` callback, called in the calling thread.
        cog_options: keyword arguments of :func:`write_cog` other than ``workers``.
        blocks_done: called after the last block, before the coverage check (phase timing).

    Returns:
        ``(pixels, union_pixels)`` over the whole grid.

    Raises:
        MergeError: an empty result, one covering less than 99.5 % of the union (see
            :func:`check_coverage`), or an invalid COG.
    """
    blocks = list(iter_blocks(plan.grid, block_size))
    tmp_blocks = temporary_sibling(out, "blocks")
    profile: dict[str, Any] = {
        "driver": "GTiff",
        "width": plan.grid.width,
        "height": plan.grid.height,
        "crs": plan.crs,
        "transform": Affine(*plan.grid.transform),
        "tiled": True,
        "blockxsize": 256,
        "blockysize": 256,
        "BIGTIFF": "IF_SAFER",
        **creation_options,
    }
    totals = [0, 0]
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        with rasterio.open(tmp_blocks, "w", **profile) as dst:

            def consume(block: Block, result: Any) -> None:
                pixels, union = write(dst, block, result)
                totals[0] += pixels
                totals[1] += union

            try:
                run_blocks(blocks, work, consume, workers=workers, progress=progress)
            finally:
                readers.close()
            if blocks_done is not None:
                blocks_done()
            check_coverage(out, totals[0], totals[1])
            build_overviews(dst)
        write_cog(tmp_blocks, out, workers=workers, **cog_options)
    finally:
        if tmp_blocks.exists():
            tmp_blocks.unlink()
    return totals[0], totals[1]


# --------------------------------------------------------------------------------------------
# Orthophoto merge
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SeamQuality:
    """Colour difference between two submodels along their seam.

    Attributes:
        a, b: submodel ids (a < b).
        pixels: pixels in the seam band where both have data.
        mean_abs_diff_before: mean absolute difference over RGB without balancing, DN.
        mean_abs_diff_after: the same after colour balancing, DN.
    """

    a: str
    b: str
    pixels: int
    mean_abs_diff_before: float
    mean_abs_diff_after: float


@dataclass(frozen=True)
class RasterMergeReport:
    """The figures every raster merge reports (orthophoto and DEM reports extend it).

    Attributes:
        path: the output COG.
        submodel_ids: the merged submodels, in the order of the grid plan's sources.
        crs_wkt, crs_epsg: the output CRS.
        resolution_m: output pixel size, CRS units.
        width, height: output grid size, pixels.
        pixels: output pixels with data.
        union_pixels: grid pixels where at least one input has data.
        covered_area_m2: ``pixels`` times the pixel area, square CRS units.
        coverage_of_union: ``pixels / union_pixels``.
    """

    path: str
    submodel_ids: tuple[str, ...]
    crs_wkt: str
    crs_epsg: int | None
    resolution_m: float
    width: int
    height: int
    pixels: int
    union_pixels: int
    covered_area_m2: float
    coverage_of_union: float

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict."""
        return asdict(self)


def raster_report_fields(
    out: Path, plan: GridPlan, pixels: int, union_pixels: int
) -> dict[str, Any]:
    """Keyword arguments of the :class:`RasterMergeReport` fields, plus ``warped``.

    Args:
        out: the output COG.
        plan: the grid the merge wrote.
        pixels: output pixels with data.
        union_pixels: grid pixels where at least one input has data (> 0, see
            :func:`check_coverage`).
    """
    return {
        "path": str(out),
        "submodel_ids": tuple(s.submodel_id for s in plan.sources),
        "crs_wkt": plan.crs.to_wkt(),
        "crs_epsg": plan.crs.to_epsg(),
        "resolution_m": plan.grid.resolution_m,
        "width": plan.grid.width,
        "height": plan.grid.height,
        "pixels": pixels,
        "union_pixels": union_pixels,
        "covered_area_m2": pixels * plan.grid.pixel_area_m2,
        "coverage_of_union": pixels / union_pixels,
        "warped": tuple(s.submodel_id for s in plan.sources if s.warp),
    }


@dataclass(frozen=True)
class OrthoMergeReport(RasterMergeReport):
    """What an orthophoto merge produced (figures for the manifest and report)."""

    seams: tuple[SeamQuality, ...]
    seam_mean_abs_diff_before: float
    seam_mean_abs_diff_after: float
    colour_correction: dict[str, GainOffset]
    warped: tuple[str, ...]
    ownership_from_footprints: bool
    elapsed_seconds: float
    workers: int
    block_size: int
    phase_seconds: dict[str, float] = field(default_factory=dict)


def _seam_band_m(feather_m: float, resolution_m: float) -> float:
    return max(feather_m / 2.0, 2.0 * resolution_m)


@with_gdal_cache
def merge_orthophotos(
    inputs: Mapping[str, Path],
    out: Path,
    *,
    ownership: Ownership | None,
    resolution_m: float | None = None,
    crs_epsg: int | None = None,
    feather_m: float = 2.0,
    colour_balance: bool = True,
    workers: int = 2,
    block_size: int = 512,
    progress: Callable[[int, int], None] | None = None,
    compress: str = "DEFLATE",
    compress_level: int | None = 3,
    lattice_step_px: int = 8,
    gdal_cache_mb: int = DEFAULT_GDAL_CACHE_MB,
) -> OrthoMergeReport:
    """Merge per-submodel orthophotos into one RGBA COG.

    Args:
        inputs: submodel id -> local RGBA GeoTIFF (or RGB with nodata or an internal mask).
        out: the output COG path (written through a temporary name).
        ownership: who owns each ground position (nearest core camera), in the output CRS;
            None derives one from the centre of each input's data footprint
            (:func:`.seams.ownership_from_centres`).
        resolution_m: output pixel size in CRS units (metres); None: the finest resolution of
            the inputs already in the output CRS (of the warped ones only when none is).
        crs_epsg: output CRS; None: the CRS of the first input by sorted id.
        feather_m: width of the blending band around each seam, metres (0 for hard seams).
        colour_balance: solve and apply per-band gain/offset per submodel.
        workers: threads reading and blending blocks (and compressing the COG).
        block_size: block side in pixels; memory is about ``workers + 1`` blocks of
            ``inputs_in_block * 40`` bytes per pixel plus ``gdal_cache_mb``.
        progress: called with ``(blocks_done, blocks_total)`` from the calling thread.
        compress: COG compression (GDAL name: DEFLATE, ZSTD, LZW, JPEG...).
        compress_level: compression level (GDAL ``LEVEL``; None for GDAL's default). DEFLATE
            level 3 is about twice as fast as GDAL's default 6 for ~30 % larger files.
        lattice_step_px: step of the exact seam-distance lattice (see :class:`.seams.SeamField`).
        gdal_cache_mb: GDAL block cache for this merge, MiB (``GDAL_CACHEMAX`` in a
            ``rasterio.Env`` around the whole merge; GDAL's block cache is process-wide, so
            other rasterio work running at the same time shares it).

    Returns:
        An :class:`OrthoMergeReport`.

    Raises:
        MergeError: no inputs, unreadable inputs, an input unknown to ``ownership``, an empty
            result, a merged coverage below 99.5 % of the inputs' union, or an invalid COG.
    """
    started = time.perf_counter()
    out = Path(out)
    plan = plan_grid(inputs, resolution_m=resolution_m, crs_epsg=crs_epsg, value_bands=3)
    for src in plan.sources:
        if len(src.value_bands) < 3:
            raise MergeError(f"input {src.submodel_id} ({src.path}) is not an RGB(A) raster")
        if src.dtype != "uint8":
            raise MergeError(
                f"input {src.submodel_id} ({src.path}) is {src.dtype}; orthophotos must be uint8"
            )
    derived = ownership is None
    owners = resolve_ownership(plan, ownership)
    ids = tuple(s.submodel_id for s in plan.sources)

    phases: dict[str, float] = {"plan": time.perf_counter() - started}
    corrections = {sid: GainOffset.identity(3) for sid in ids}
    if colour_balance and len(ids) > 1:
        stats: list[OverlapStats] = []
        reader = SourceReader(plan, Resampling.nearest)
        try:
            for a, b, inter in overlap_pairs(plan):
                va, vb = sample_overlap(reader, a, b, inter)
                if va.shape[1] > 0:
                    stats.append(overlap_stats(a.submodel_id, b.submodel_id, va, vb))
        finally:
            reader.close()
        corrections = solve_gain_offset(ids, stats, bands=3)
    gains = {
        sid: np.asarray(c.gain, dtype=np.float32)[:, None, None] for sid, c in corrections.items()
    }
    offsets = {
        sid: np.asarray(c.offset, dtype=np.float32)[:, None, None] for sid, c in corrections.items()
    }

    phases["colour_balance"] = time.perf_counter() - started - sum(phases.values())
    seam_field = SeamField(owners, plan.grid, lattice_step_px=lattice_step_px)
    band_m = _seam_band_m(feather_m, plan.grid.resolution_m)
    readers = ThreadReaders(plan)

    def work(
        block: Block,
    ) -> tuple[NDArray[np.uint8], int, int, dict[tuple[str, str], NDArray[np.float64]]]:
        present = sources_in(plan, block)
        h, w = block.height, block.width
        rgba = np.zeros((4, h, w), dtype=np.uint8)
        seam_sums: dict[tuple[str, str], NDArray[np.float64]] = {}
        if not present:
            return rgba, 0, 0, seam_sums
        reader = readers.get()
        k = len(present)
        raw = np.zeros((k, 3, h, w), dtype=np.float32)
        valid = np.zeros((k, h, w), dtype=bool)
        for n, (src, inter) in enumerate(present):
            values, ok = reader.read(src, inter)
            r0, c0 = inter[0] - block.row_off, inter[1] - block.col_off
            raw[n, :, r0 : r0 + inter[2], c0 : c0 + inter[3]] = values[:3]
            valid[n, r0 : r0 + inter[2], c0 : c0 + inter[3]] = ok
        any_valid = valid.any(axis=0)
        union = int(any_valid.sum())
        if union == 0:
            return rgba, 0, 0, seam_sums
        counts = valid.sum(axis=(1, 2))
        if k == 1 or int(np.count_nonzero(counts)) == 1:
            n = int(np.argmax(counts))
            sid = present[n][0].submodel_id
            blended = raw[n] * gains[sid] + offsets[sid]
        else:
            e = seam_field.seam_distance(block, [s.submodel_id for s, _ in present])
            near = e <= band_m
            pairs = []
            for i in range(k):
                for j in range(i + 1, k):
                    mask = valid[i] & valid[j] & near[i] & near[j]
                    cnt = int(mask.sum())
                    if cnt:
                        diff = np.abs(raw[i][:, mask] - raw[j][:, mask]).mean(axis=0).sum()
                        pairs.append((i, j, mask, cnt, float(diff)))
            for n, (src, _) in enumerate(present):  # balance in place (memory: one copy)
                raw[n] *= gains[src.submodel_id]
                raw[n] += offsets[src.submodel_id]
            for i, j, mask, cnt, before in pairs:
                after = float(np.abs(raw[i][:, mask] - raw[j][:, mask]).mean(axis=0).sum())
                key = (present[i][0].submodel_id, present[j][0].submodel_id)
                seam_sums[key] = np.array([cnt, before, after], dtype=np.float64)
            del pairs, near
            weights = blend_weights(e, valid, feather_m)
            del e
            blended = np.einsum("khw,kchw->chw", weights, raw, optimize=False)
        np.clip(blended, 0.0, 255.0, out=blended)
        rgba[:3] = np.where(any_valid, np.rint(blended), 0.0).astype(np.uint8)
        rgba[3] = np.where(any_valid, 255, 0).astype(np.uint8)
        merged = int((rgba[3] > 0).sum())
        return rgba, merged, union, seam_sums

    seam_totals: dict[tuple[str, str], NDArray[np.float64]] = {}

    def write(dst: Any, block: Block, result: Any) -> tuple[int, int]:
        rgba, merged, union, sums = result
        for key, val in sums.items():
            seam_totals[key] = seam_totals.get(key, np.zeros(3)) + val
        if union:
            dst.write(rgba, window=Window(block.col_off, block.row_off, block.width, block.height))
        return merged, union

    def blocks_done() -> None:
        phases["blocks"] = time.perf_counter() - started - sum(phases.values())

    pixels, union_pixels = write_merged_raster(
        out,
        plan,
        {
            "count": 4,
            "dtype": "uint8",
            "SPARSE_OK": "TRUE",
            "photometric": "RGB",
            "ALPHA": "YES",
        },
        work,
        write,
        readers,
        block_size=block_size,
        workers=workers,
        progress=progress,
        cog_options={
            "compress": compress,
            "predictor": compress != "JPEG",
            "compress_level": compress_level,
        },
        blocks_done=blocks_done,
    )
    phases["cog"] = time.perf_counter() - started - sum(phases.values())

    seams = []
    for (id_a, id_b), (cnt, before, after) in sorted(seam_totals.items()):
        seams.append(SeamQuality(id_a, id_b, int(cnt), float(before / cnt), float(after / cnt)))
    n_seam = sum(s.pixels for s in seams)
    overall_before = (
        float(sum(s.mean_abs_diff_before * s.pixels for s in seams) / n_seam) if n_seam else 0.0
    )
    overall_after = (
        float(sum(s.mean_abs_diff_after * s.pixels for s in seams) / n_seam) if n_seam else 0.0
    )
    report = OrthoMergeReport(
        **raster_report_fields(out, plan, pixels, union_pixels),
        seams=tuple(seams),
        seam_mean_abs_diff_before=overall_before,
        seam_mean_abs_diff_after=overall_after,
        colour_correction=corrections,
        ownership_from_footprints=derived,
        elapsed_seconds=time.perf_counter() - started,
        workers=workers,
        block_size=block_size,
        phase_seconds=phases,
    )
    log.info(
        "merged %d orthophotos into %s: %d px, seam |diff| %.2f -> %.2f DN in %.1f s",
        len(ids),
        out,
        report.pixels,
        overall_before,
        overall_after,
        report.elapsed_seconds,
    )
    return report


def check_coverage(out: Path, pixels: int, union: int) -> None:
    """Raise MergeError for an empty merge or one covering less than 99.5 % of the union."""
    if union == 0 or pixels == 0:
        raise MergeError(f"{out}: the merged result is empty (no input has data on the grid)")
    fraction = pixels / union
    if fraction < MIN_COVERAGE_OF_UNION:
        raise MergeError(
            f"{out}: the merged result covers {fraction:.1%} of the inputs' union "
            f"(minimum {MIN_COVERAGE_OF_UNION:.1%})"
        )
