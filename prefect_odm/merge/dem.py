"""DEM merge for DSMs and DTMs (adapter: rasterio, scipy; the grid, blocks and COG of :mod:`.sources`,
:mod:`.blocks` and :mod:`.cog`, the blend of :mod:`.blend`).

Heights are blended with weights

    ``w_k = taper_k * edt_k``

where ``edt_k`` is the distance in metres from the pixel to the edge of submodel ``k``'s data
(``scipy.ndimage.distance_transform_edt`` on its valid mask, computed once per input at a
decimated resolution whose longer side is at most ``edt_max_side_px`` and interpolated
bilinearly; :mod:`.edge_distances`, when a block first needs it, dropped after the last) and
``taper_k`` is the seam weight of the seam method (``ownership``: the feathering of
:func:`.seams.blend_weights`) over a band ``feather_m`` wide around the ownership seams. So
the owner dominates its own cell, blending is smooth across seams, and a submodel fades out
towards the edge of its own data. Where the weights vanish but some submodel has data, the one
with data farthest from its edge is used.

Heights and tilts between submodels come from the alignment (:mod:`prefect_odm.align`): each
input is placed with its corrected geotransform and its height plane is added to the values as
they are read; the overlaps' median height differences are then reported as residuals, never
solved away. Without an alignment, vertical offsets are estimated in each overlap as the median
height difference (sampled at a decimated resolution) and removed by a joint least-squares solve
with the mean offset held at zero (:func:`.balance.solve_vertical_offsets`), bounded: an offset
above ``MergeOptions.max_dem_offset_m`` fails the merge naming the submodel (a free solve of
planes that differ because the ground slopes would otherwise flatten the slope).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar, Unpack

import numpy as np
from numpy.typing import NDArray
from rasterio.enums import Resampling
from rasterio.windows import Window

from prefect_odm.align.report import AlignmentReport
from prefect_odm.align.similarity import RasterCorrection
from prefect_odm.align.stage_records import DsmSeam
from prefect_odm.errors import MergeError
from prefect_odm.grid import Block, iter_blocks
from prefect_odm.merge.balance import solve_vertical_offsets
from prefect_odm.merge.blend import height_weights, weighted_heights
from prefect_odm.merge.blocks import (
    RasterMergeKeywords,
    RasterRun,
    raster_report,
    write_merged_raster,
)
from prefect_odm.merge.cog import with_gdal_cache
from prefect_odm.merge.edge_distances import EdgeDistances
from prefect_odm.merge.footprints import resolve_ownership
from prefect_odm.merge.overlap_sampling import dsm_seam, overlap_pairs, sample_overlap
from prefect_odm.merge.rasterio_options import CogOptions
from prefect_odm.merge.reports import DemMergeReport
from prefect_odm.merge.seamline_rasters import seams_for
from prefect_odm.merge.seamlines import OwnerLabels
from prefect_odm.merge.seams import SeamMethod
from prefect_odm.merge.shared_readers import SharedReaders, ThreadReaders
from prefect_odm.merge.source_lifetimes import SourceLifetimes
from prefect_odm.merge.sources import (
    GridPlan,
    RasterSource,
    SourceReader,
    Window4,
    placed_reads,
    plan_grid,
    sources_in,
)
from prefect_odm.models import MergeOptions
from prefect_odm.ownership import Ownership
from prefect_odm.registry import DSM_MEASURED_DESCRIPTION

log = logging.getLogger(__name__)
_T = TypeVar("_T")
_U = TypeVar("_U")

DEM_NODATA = -9999.0
"""Nodata value of merged DEMs (OpenDroneMap's)."""

MEASURED_DESCRIPTION = DSM_MEASURED_DESCRIPTION
"""The description of a DSM's second band that says which cells were measured
(:data:`prefect_odm.registry.DSM_MEASURED_BAND`): 1 measured, 0 gap-filled, nodata outside. The
merge carries it when every input has it."""

DEM_COG_OPTIONS: CogOptions = {"compress": "DEFLATE", "predictor": True, "compress_level": 1}
"""How the merged DEM's COG is compressed: DEFLATE level 1 with the floating-point predictor, as
the engine writes its DSMs. Heights are lossless at any level; level 1 wrote the benchmark's
52 Mpx merge's COG about twice as fast as GDAL's default 6 for a file 10 % larger
(``benchmarks/bench_merge_dem.py``, RESULTS.md issue 35)."""

_BLEND_ROWS = 128
"""Rows of a block blended at a time: the blend holds about 40 bytes per pixel and source
present, so a 512-pixel block crossed by 12 DSMs held 128 MiB at once; strips of 128 rows give
the same pixels (each is blended on its own, as a block is) for a quarter of it."""

COMPILED_MIN_BLEND_PX = 12_000_000
"""Pixels of the blocks that several sources cross (those the merge blends) from which the DEM
merge blends with the compiled kernels (:mod:`.raster_kernels`: the same bits, about 0.075 s of
CPU less per million such pixels at 52 Mpx) rather than numpy's passes: numba's first use costs
a process about 0.75 s of CPU and 108 MiB (RESULTS.md, h39d), more than the kernels save on a
smaller merge."""

_DemBlock = tuple[NDArray[np.float32], int, int]
"""One block's ``(bands, pixels, union_pixels)``: ``(1 or 2, rows, cols)`` float32, the heights
and, with the measured band, the measured flags."""


def has_measured_band(path: Path) -> bool:
    """True when the DEM at ``path`` has the measured band (band 2, :data:`MEASURED_DESCRIPTION`);
    False also when it cannot be opened (the grid plan then says why, naming the submodel)."""
    import rasterio

    try:
        with rasterio.open(path) as ds:
            return bool(ds.count >= 2 and ds.descriptions[1] == MEASURED_DESCRIPTION)
    except rasterio.errors.RasterioIOError:
        return False


def vertical_offsets(
    plan: GridPlan,
    remove: bool,
    max_offset_m: float = math.inf,
    measured: bool = False,
    workers: int = 1,
) -> tuple[dict[str, float], dict[str, float], dict[str, DsmSeam]]:
    """Each submodel's vertical offset, the overlaps' median height differences and their seams.

    Args:
        plan: the grid plan.
        remove: solve the offsets (:func:`.balance.solve_vertical_offsets`); False: all 0.
        max_offset_m: the largest plausible offset, metres.
        measured: band 2 of the plan's sources is the measured flag (the seams count only
            cells both measured).
        workers: threads sampling the overlaps.

    Returns:
        ``(offsets, medians, seams)``: submodel id -> offset to subtract, metres; ``"a|b"`` ->
        median of ``z_a - z_b`` over the overlap (sampled at a decimated resolution), metres;
        ``"a|b"`` -> the same samples' :func:`.overlap_sampling.dsm_seam`.

    Raises:
        MergeError: a solved offset above ``max_offset_m``, naming the submodel.
    """
    medians: dict[str, float] = {}
    seams: dict[str, DsmSeam] = {}
    diffs: list[tuple[str, str, float, int]] = []
    for a, b, med, count, seam in _overlap_figures(plan, workers, measured):
        diffs.append((a.submodel_id, b.submodel_id, med, count))
        medians[f"{a.submodel_id}|{b.submodel_id}"] = med
        if seam is not None:
            seams[f"{a.submodel_id}|{b.submodel_id}"] = seam
    ids = plan.submodel_ids
    offsets = solve_vertical_offsets(ids, diffs) if remove else {sid: 0.0 for sid in ids}
    worst = max(offsets, key=lambda sid: abs(offsets[sid]), default=None)
    if worst is not None and abs(offsets[worst]) > max_offset_m:
        raise MergeError(
            f"DEM merge: {worst} would need a vertical offset of {offsets[worst]:+.2f} m "
            f"(max_dem_offset_m={max_offset_m:g}); its neighbours disagree by "
            f"{_worst_median(medians, worst):+.2f} m in their overlap. Not applied: a free offset "
            "this large flattens a slope. Align the submodels, or raise max_dem_offset_m"
        )
    return offsets, medians, seams


def _worst_median(medians: Mapping[str, float], sid: str) -> float:
    """The overlap median of ``sid`` farthest from zero (metres; 0 when it has none)."""
    own = [v for k, v in medians.items() if sid in k.split("|")]
    return max(own, key=abs, default=0.0)


def _on_threads(
    plan: GridPlan,
    workers: int,
    items: Sequence[_T],
    fn: Callable[[SourceReader, _T], _U],
    lifetimes: SourceLifetimes,
) -> list[_U]:
    """``fn(reader, item)`` for each item on ``workers`` threads, one nearest-resampling reader
    per thread (GDAL decodes tiles outside the GIL), results in the order of ``items``. Before
    the ``n``-th item a thread closes its sources that no item from the ``n``-th on reads
    (``lifetimes``), so its reader holds those of the items around it, not every input."""
    local = threading.local()
    readers: list[SourceReader] = []
    lock = threading.Lock()

    def one(numbered: tuple[int, _T]) -> _U:
        n, item = numbered
        reader = getattr(local, "reader", None)
        if reader is None:
            reader = local.reader = SourceReader(plan, Resampling.nearest)
            with lock:
                readers.append(reader)
        reader.close_sources(lifetimes.finished(reader.open_ids, n))
        return fn(reader, item)

    try:
        with ThreadPoolExecutor(max(1, workers), thread_name_prefix="dem-read") as pool:
            return list(pool.map(one, enumerate(items)))
    finally:
        for reader in readers:
            reader.close()


def _overlap_figures(
    plan: GridPlan, workers: int, measured: bool
) -> list[tuple[RasterSource, RasterSource, float, int, DsmSeam | None]]:
    """Each overlapping pair's median height difference, sample count and
    :func:`.overlap_sampling.dsm_seam`, the pairs sampled on ``workers`` threads (the same
    figures, in the same order). Each pair is reduced on its thread as soon as it is sampled:
    holding every pair's samples until the last one was read made this step's memory grow with
    the number of pairs (a 10,000-image survey's DSM merge peaked at 1.69x the 1.8k one's)."""

    def figures(
        reader: SourceReader, pair: tuple[RasterSource, RasterSource, Window4]
    ) -> tuple[float, int, DsmSeam | None]:
        va, vb = sample_overlap(reader, *pair)
        if not va.shape[1]:
            return 0.0, 0, None
        return float(np.median(va[0] - vb[0])), int(va.shape[1]), dsm_seam(va, vb, measured)

    pairs = list(overlap_pairs(plan))
    lifetimes = SourceLifetimes.of_items((a.submodel_id, b.submodel_id) for a, b, _ in pairs)
    found = _on_threads(plan, workers, pairs, figures, lifetimes)
    return [
        (a, b, med, n, seam) for (a, b, _), (med, n, seam) in zip(pairs, found, strict=True) if n
    ]


class _DemBlocks:
    """The DEM's :class:`.blocks.BlockMerge`: read, level and blend one block of heights."""

    def __init__(
        self,
        plan: GridPlan,
        readers: ThreadReaders,
        seams: SeamMethod,
        offsets: Mapping[str, float],
        edges: EdgeDistances,
        feather_m: float,
        measured: bool = False,
        compiled: bool = False,
    ) -> None:
        self.plan = plan
        self.compiled = compiled and getattr(seams, "linear_feather", False)
        self.readers = readers
        self.seams = seams
        self.offsets = offsets
        self.edges = edges
        self.feather_m = feather_m
        self.measured = measured
        self._described = False

    def work(self, block: Block) -> _DemBlock:
        h, w = block.height, block.width
        out = np.full((2 if self.measured else 1, h, w), DEM_NODATA, dtype=np.float32)
        pixels = union = 0
        for r in range(0, h, _BLEND_ROWS):
            rows = slice(r, min(h, r + _BLEND_ROWS))
            strip = Block(block.row_off + r, block.col_off, rows.stop - r, w)
            done = self._blend(strip, out[:, rows])
            pixels, union = pixels + done[0], union + done[1]
        return out, pixels, union

    def _blend(self, strip: Block, out: NDArray[np.float32]) -> tuple[int, int]:
        """Blend one strip of a block into ``out`` (its rows of the block's ``(bands, rows,
        cols)`` array); returns ``(pixels, union_pixels)``. With a seam method whose weights are
        the linear feathering (``linear_feather``) and ``compiled``, in one compiled pass
        (:func:`.raster_kernels.blend_heights`, the numpy passes' bits), else by those passes."""
        present = sources_in(self.plan, strip)
        if not present:
            return 0, 0
        if len(present) == 1:
            return self._copy(strip, out, present)
        dem, measured = out[0], (out[1] if self.measured else None)
        k, h, w = len(present), strip.height, strip.width
        z = np.zeros((k, h, w), dtype=np.float32)
        valid = np.zeros((k, h, w), dtype=bool)
        edt = np.zeros((k, h, w), dtype=np.float32)
        flags = np.zeros((k, h, w), dtype=np.float32) if self.measured else None
        for n, src, inter, sl, values, ok in placed_reads(self.readers.get(), present, strip):
            z[n][sl] = values[0] - np.float32(self.offsets[src.submodel_id])
            if flags is not None:
                flags[n][sl] = values[1]  # the measured band (no height correction on it)
            valid[n][sl] = ok
            edt[n][sl] = self.edges.of(src).sample(src, inter)
        if not valid.any():
            return 0, 0
        e = self.seams.seam_distance(strip, [s.submodel_id for s, _ in present])
        if self.compiled:  # the seam method's weights are .seams.blend_weights
            from prefect_odm.merge.raster_kernels import blend_heights

            done = blend_heights(z, valid, edt, e, flags, self.feather_m, dem, measured)
            return done, done
        any_valid = valid.any(axis=0)
        union = int(any_valid.sum())
        taper = self.seams.weights(e, valid, self.feather_m)
        weights = height_weights(valid, edt, taper)
        if measured is not None and flags is not None:
            # measured where the sources giving the height (same weights) measured it
            blended_flags = weighted_heights(weights, flags, valid)
            measured[any_valid] = blended_flags[any_valid] >= 0.5
        blended = weighted_heights(weights, z, valid)
        dem[any_valid] = blended[any_valid]
        return int(any_valid.sum()), union

    def _copy(
        self, strip: Block, out: NDArray[np.float32], present: list[tuple[RasterSource, Window4]]
    ) -> tuple[int, int]:
        """A strip one source covers: its heights (less its offset) and measured flags copied
        where it has data, no blend arrays (the values the blend gives one source)."""
        ((_, src, _, sl, values, ok),) = placed_reads(self.readers.get(), present, strip)
        part = out[:, sl[0], sl[1]]
        part[0] = np.where(ok, values[0] - np.float32(self.offsets[src.submodel_id]), DEM_NODATA)
        if self.measured:
            part[1] = np.where(ok, values[1] >= 0.5, DEM_NODATA)
        union = int(ok.sum())
        return union, union

    def retire(self, lifetimes: SourceLifetimes, item: int) -> None:
        """Drop the edge distances of the sources no block from the ``item``-th on reads."""
        self.edges.retire(lifetimes, item)

    def write(self, dst: Any, block: Block, result: _DemBlock) -> tuple[int, int]:
        out, pixels, union = result
        if self.measured and not self._described:
            dst.set_band_description(2, MEASURED_DESCRIPTION)
            self._described = True
        dst.write(out, window=Window(block.col_off, block.row_off, block.width, block.height))
        return pixels, union


def blended_pixels(plan: GridPlan, block_size: int) -> int:
    """Pixels of the grid's ``block_size`` blocks that the windows of two sources or more cross."""
    blocks = iter_blocks(plan.grid, block_size)
    return sum(b.height * b.width for b in blocks if len(sources_in(plan, b)) > 1)


def _dem_plan(
    inputs: Mapping[str, Path], run: RasterRun, fixes: Mapping[str, RasterCorrection] | None
) -> tuple[GridPlan, bool]:
    """The merge's grid plan and whether every input has the measured band, which then rides
    along as a second value band (the height correction is band 1's)."""
    measured = all(has_measured_band(Path(p)) for p in inputs.values())
    plan = plan_grid(
        inputs, resolution_m=run.resolution_m, crs_epsg=run.crs_epsg,
        value_bands=2 if measured else 1, corrections=fixes, correct_heights=True,
    )  # fmt: skip
    return plan, measured


@with_gdal_cache
def merge_dems(
    inputs: Mapping[str, Path],
    out: Path,
    *,
    ownership: Ownership | None,
    options: MergeOptions | None = None,
    alignment: AlignmentReport | None = None,
    edt_max_side_px: int = 1024,
    seamlines: OwnerLabels | None = None,
    **raster: Unpack[RasterMergeKeywords],
) -> DemMergeReport:
    """Merge per-submodel DSMs (or DTMs) into one float32 COG with nodata -9999.

    Args:
        inputs: submodel id -> local single-band GeoTIFF with a nodata value (or mask).
        out: output COG path (written through a temporary name).
        ownership: who owns each ground position, in the output CRS; None derives one from the
            centre of each input's data footprint.
        options: seam method, blending width around seams (``dem_feather_m``, metres) and
            whether vertical offsets between submodels are estimated and removed (only without
            ``alignment``; bounded by ``max_dem_offset_m``); None for the defaults.
        alignment: the alignment between submodels: each input is placed with its corrected
            geotransform and its height plane is added to its heights as they are read; the
            overlaps' median differences are then residuals, reported, not removed. None, or
            identity transforms, leave the inputs as they are.
        edt_max_side_px: longest side of the decimated masks for the edge distances (memory:
            about ``8 * edt_max_side_px**2`` bytes per input the current blocks read).
        seamlines: the merge's owner labels for ``seam_method='least-cost'``; None computes
            them from ``inputs`` (:func:`.seamline_rasters.seams_for`).
        **raster: ``resolution_m``, ``crs_epsg``, ``workers``, ``block_size``, ``progress``,
            ``lattice_step_px``, ``gdal_cache_mb`` (see :class:`.blocks.RasterRun`).

    Returns:
        A :class:`.reports.DemMergeReport`.

    Raises:
        MergeError: no inputs, unreadable inputs, an input unknown to ``ownership``, an empty
            result or one covering less than 99.5 % of the inputs' union, an invalid COG; a
            solved offset above ``max_dem_offset_m`` (without ``alignment``).
        InputError: an unknown seam method.
    """
    opts, run, out = options or MergeOptions(), RasterRun(**raster), Path(out)
    started = time.perf_counter()
    fixes = alignment.raster_corrections() if alignment is not None else None
    plan, measured = _dem_plan(inputs, run, fixes)
    owners = resolve_ownership(plan, ownership)
    remove = opts.remove_vertical_offsets and alignment is None
    offsets, medians, seams_of = vertical_offsets(plan, remove, opts.max_dem_offset_m,
                                                  measured, run.workers)  # fmt: skip
    compiled = blended_pixels(plan, run.block_size) >= COMPILED_MIN_BLEND_PX
    edges = EdgeDistances(plan, edt_max_side_px, compiled)
    seams = seams_for(opts.seam_method, owners, plan, run.lattice_step_px, seamlines=seamlines,
                      dsms={k: Path(v) for k, v in inputs.items()}, alignment=fixes,
                      compiled=compiled)  # fmt: skip
    readers = SharedReaders(plan, run.workers)
    pixels, union_pixels = write_merged_raster(
        out,
        plan,
        {"count": 2 if measured else 1, "dtype": "float32", "nodata": DEM_NODATA},
        _DemBlocks(plan, readers, seams, offsets, edges, opts.dem_feather_m, measured, compiled),
        readers,
        run,
        cog_options=DEM_COG_OPTIONS,
    )
    grid = raster_report(out, plan, pixels, union_pixels, ownership_from_footprints=ownership is None,
                         elapsed_seconds=time.perf_counter() - started)  # fmt: skip
    report = DemMergeReport(
        **dict(grid),
        vertical_offsets_m=dict(sorted(offsets.items())),
        overlap_median_diff_m=medians,
        overlap_seams=seams_of,
        heights_from_alignment=alignment is not None,
    )
    log.info(
        "merged %d DEMs into %s: %d px, vertical offsets removed %s, in %.1f s",
        *(len(plan.sources), out, report.pixels, report.vertical_offsets_m, report.elapsed_seconds),
    )
    return report
