"""Block iteration of the raster merges (adapter: rasterio; threads).

The output grid is cut into ``block_size`` blocks processed by a thread pool (:func:`run_blocks`);
the threads read through the merge's readers (:mod:`.shared_readers`); at most ``workers + 1``
blocks are in flight, so memory does not depend on the mosaic size. Results are written in the calling thread, in block order, to a
tiled temporary GeoTIFF that becomes the COG (:func:`write_merged_raster`, :mod:`.cog`).

The blocks run in bands across the grid's shorter side (:func:`block_order`: column by column
when the grid is wider than tall), and a source is closed once no later block reads it
(:mod:`.source_lifetimes`), so the readers hold the sources of one band, not every input: a long
survey's merge no longer grows with its number of submodels. Each block's pixels depend on the
block alone, so the order changes no pixel.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypedDict, TypeVar

import rasterio
from rasterio.transform import Affine

from prefect_odm.errors import MergeError
from prefect_odm.grid import Block, Grid, iter_blocks
from prefect_odm.merge.cog import (
    DEFAULT_GDAL_CACHE_MB,
    FINISH_GDAL_CACHE_MB,
    build_overviews,
    gdal_cache_env,
    temporary_sibling,
    write_cog,
)
from prefect_odm.merge.coverage import MIN_COVERAGE_OF_UNION
from prefect_odm.merge.rasterio_options import BlocksProfile, CogOptions, GeoTiffOptions
from prefect_odm.merge.reports import RasterMergeReport
from prefect_odm.merge.shared_readers import ThreadReaders
from prefect_odm.merge.source_lifetimes import SourceLifetimes
from prefect_odm.merge.sources import GridPlan

_R = TypeVar("_R")


class RasterMergeKeywords(TypedDict, total=False):
    """The keywords every raster merge takes; what they mean and their defaults: :class:`RasterRun`."""

    resolution_m: float | None
    crs_epsg: int | None
    workers: int
    block_size: int
    progress: Callable[[int, int], None] | None
    lattice_step_px: int
    gdal_cache_mb: int


@dataclass(frozen=True)
class RasterRun:
    """How a raster merge runs (the same for the orthophoto and the DEMs).

    Attributes:
        resolution_m: output pixel size in CRS units (metres); None: the finest resolution of
            the inputs already in the output CRS (of the warped ones only when none is).
        crs_epsg: output CRS; None: the CRS of the first input by sorted id.
        workers: threads reading and blending blocks (and compressing the COG).
        block_size: block side in pixels; memory is about ``workers + 1`` blocks' results
            plus, per worker, a strip of 128 rows of ``inputs_in_block * 40`` bytes per pixel
            (the blend's), plus ``gdal_cache_mb``.
        progress: called with ``(blocks_done, blocks_total)`` from the calling thread.
        lattice_step_px: step of the exact seam-distance lattice (see :class:`.seams.SeamField`).
        gdal_cache_mb: GDAL block cache for this merge, MiB (``GDAL_CACHEMAX`` in a
            ``rasterio.Env`` around the whole merge, :func:`.cog.with_gdal_cache`; GDAL's block
            cache is process-wide, so other rasterio work running at the same time shares it).
    """

    resolution_m: float | None = None
    crs_epsg: int | None = None
    workers: int = 2
    block_size: int = 512
    progress: Callable[[int, int], None] | None = None
    lattice_step_px: int = 8
    gdal_cache_mb: int = DEFAULT_GDAL_CACHE_MB


class BlockMerge(Protocol[_R]):
    """One raster merge's per-block work: blend on a worker thread, write in the caller's."""

    def work(self, block: Block) -> _R:
        """Read and blend one block (runs on a worker thread)."""
        ...

    def retire(self, lifetimes: SourceLifetimes, item: int) -> None:
        """Drop what the merge holds per source for the sources that no block from the
        ``item``-th on reads (runs on the worker thread of block ``item``, before :meth:`work`)."""
        ...

    def write(self, dst: Any, block: Block, result: _R) -> tuple[int, int]:
        """Write one block's result to the open temporary dataset (calling thread).

        Returns:
            ``(pixels, union_pixels)``: the block's pixels with data and those where at least
            one input has data.
        """
        ...


def run_blocks(
    blocks: Sequence[Block],
    work: Callable[[Block], _R],
    consume: Callable[[Block, _R], None],
    *,
    workers: int,
    progress: Callable[[int, int], None] | None,
) -> None:
    """Run ``work`` over blocks on a thread pool, at most ``workers + 1`` in flight.

    ``consume`` is called in the calling thread (so it may write to one dataset), for the blocks
    finished together in the order of ``blocks``.

    Raises:
        Whatever ``work`` raised, after cancelling the blocks not started.
    """
    total = len(blocks)
    done = 0
    pending: set[Future[_R]] = set()
    owner: dict[Future[_R], tuple[int, Block]] = {}
    it = iter(enumerate(blocks))
    limit = max(1, workers) + 1
    with ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="merge") as pool:
        exhausted = False
        while pending or not exhausted:
            while not exhausted and len(pending) < limit:
                item = next(it, None)
                if item is None:
                    exhausted = True
                    break
                fut = pool.submit(work, item[1])
                pending.add(fut)
                owner[fut] = item
            if not pending:
                break
            finished, pending = wait(pending, return_when=FIRST_COMPLETED)
            for fut in sorted(finished, key=lambda f: owner[f][0]):
                _, block = owner.pop(fut)
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


def block_order(grid: Grid, block_size: int) -> list[Block]:
    """The blocks of :func:`prefect_odm.grid.iter_blocks`, in bands across the grid's shorter
    side: row by row when the grid is at least as tall as wide, else column by column. A band
    then crosses the fewest sources, so the readers of :func:`write_merged_raster` hold the
    fewest open (a 100-submodel strip 16,041 x 2,128 pixels: 11 sources at once instead of 62)."""
    blocks = list(iter_blocks(grid, block_size))
    if grid.width > grid.height:
        blocks.sort(key=lambda b: (b.col_off, b.row_off))
    return blocks


def block_lifetimes(plan: GridPlan, blocks: Sequence[Block], block_size: int) -> SourceLifetimes:
    """The index in ``blocks`` (those of :func:`block_order`) of the last block that reads
    each source: the latest of the ``block_size`` blocks its window crosses."""
    index = {(b.row_off, b.col_off): n for n, b in enumerate(blocks)}
    last: dict[str, int] = {}
    for src in plan.sources:
        r0, r1 = src.row_off // block_size, (src.row_off + src.height - 1) // block_size
        c0, c1 = src.col_off // block_size, (src.col_off + src.width - 1) // block_size
        found = [
            index[(r * block_size, c * block_size)]
            for r in range(max(0, r0), r1 + 1)
            for c in range(max(0, c0), c1 + 1)
            if (r * block_size, c * block_size) in index
        ]
        if found:
            last[src.submodel_id] = max(found)
    return SourceLifetimes(last)


def check_union_coverage(out: Path, pixels: int, union: int) -> None:
    """Raise MergeError for an empty merge or one covering less than 99.5 % of the union.

    Args:
        out: the output (named in the message).
        pixels: output pixels with data.
        union: grid pixels where at least one input has data.
    """
    if union == 0 or pixels == 0:
        raise MergeError(f"{out}: the merged result is empty (no input has data on the grid)")
    fraction = pixels / union
    if fraction < MIN_COVERAGE_OF_UNION:
        raise MergeError(
            f"{out}: the merged result covers {fraction:.1%} of the inputs' union "
            f"(minimum {MIN_COVERAGE_OF_UNION:.1%})"
        )


def _blocks_profile(plan: GridPlan, creation_options: GeoTiffOptions) -> BlocksProfile:
    return {
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


def write_merged_raster(
    out: Path,
    plan: GridPlan,
    creation_options: GeoTiffOptions,
    merge: BlockMerge[Any],
    readers: ThreadReaders,
    run: RasterRun,
    *,
    cog_options: CogOptions,
    blocks_done: Callable[[], None] | None = None,
) -> tuple[int, int]:
    """Merge ``plan``'s grid block by block into a tiled GeoTIFF, check it, write the COG.

    The blocks go to a temporary tiled GeoTIFF beside ``out`` (256-pixel tiles, BigTIFF if
    needed), which gets overviews and is converted to the COG ``out`` by :func:`.cog.write_cog`;
    the temporary file is removed in every case.

    Args:
        out: the output COG path.
        plan: the output grid (size, CRS, transform).
        creation_options: the product's own GeoTIFF options (``count``, ``dtype``, ``nodata``,
            ``photometric``...), added to the common ones.
        merge: the per-block work and writing (see :class:`BlockMerge`).
        readers: closed once every block is done.
        run: block size, threads over blocks (and for COG compression), progress callback.
        cog_options: keyword arguments of :func:`.cog.write_cog` other than ``workers``.
        blocks_done: called after the last block, before the coverage check (phase timing).

    Returns:
        ``(pixels, union_pixels)`` over the whole grid.

    Raises:
        MergeError: an empty result, one covering less than 99.5 % of the union (see
            :func:`check_union_coverage`), or an invalid COG.
    """
    blocks = block_order(plan.grid, run.block_size)
    lifetimes = block_lifetimes(plan, blocks, run.block_size)
    index = {(b.row_off, b.col_off): n for n, b in enumerate(blocks)}
    tmp_blocks = temporary_sibling(out, "blocks")
    totals = [0, 0]

    def work(block: Block) -> Any:
        n = index[(block.row_off, block.col_off)]
        readers.retire(lifetimes, n)
        merge.retire(lifetimes, n)
        return merge.work(block)

    def consume(block: Block, result: Any) -> None:
        pixels, union = merge.write(dst, block, result)
        totals[0] += pixels
        totals[1] += union

    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        with rasterio.open(tmp_blocks, "w", **_blocks_profile(plan, creation_options)) as dst:
            try:
                run_blocks(blocks, work, consume, workers=run.workers, progress=run.progress)
            finally:
                readers.close()
            if blocks_done is not None:
                blocks_done()
            check_union_coverage(out, totals[0], totals[1])
            finish_cache_mb = min(run.gdal_cache_mb, FINISH_GDAL_CACHE_MB)
            with gdal_cache_env(finish_cache_mb):
                build_overviews(dst, run.workers)
        with gdal_cache_env(finish_cache_mb):
            write_cog(tmp_blocks, out, workers=run.workers, **cog_options)
    finally:
        if tmp_blocks.exists():
            tmp_blocks.unlink()
    return totals[0], totals[1]


def raster_report(
    out: Path,
    plan: GridPlan,
    pixels: int,
    union_pixels: int,
    *,
    ownership_from_footprints: bool,
    elapsed_seconds: float,
) -> RasterMergeReport:
    """The :class:`.reports.RasterMergeReport` of a finished raster merge: the figures its grid
    plan and pixel counts give (a product's merge extends it with its own,
    ``OrthoMergeReport(**dict(report), ...)``).

    Args:
        out: the output COG.
        plan: the grid the merge wrote.
        pixels: output pixels with data.
        union_pixels: grid pixels where at least one input has data (> 0, see
            :func:`check_union_coverage`).
        ownership_from_footprints: see :class:`.reports.ProductMergeReport`.
        elapsed_seconds: wall time of the merge.
    """
    return RasterMergeReport(
        path=str(out),
        submodel_ids=plan.submodel_ids,
        crs_wkt=plan.crs.to_wkt(),
        crs_epsg=plan.crs.to_epsg(),
        ownership_from_footprints=ownership_from_footprints,
        elapsed_seconds=elapsed_seconds,
        resolution_m=plan.grid.resolution_m,
        width=plan.grid.width,
        height=plan.grid.height,
        pixels=pixels,
        union_pixels=union_pixels,
        covered_area_m2=pixels * plan.grid.pixel_area_m2,
        coverage_of_union=pixels / union_pixels,
        warped=tuple(s.submodel_id for s in plan.sources if s.warp),
    )
