"""Orthophoto merge (adapter: rasterio; the mathematics lives in :mod:`.balance`, :mod:`.seams`
and :mod:`.blend`).

The merge runs in four steps, each in its own module:

1. **Grid** (:mod:`.sources`): one CRS and one grid snapped to the resolution; inputs off that
   grid are warped onto it.
2. **Colour balance** (:mod:`.balance`): per band gain and offset per submodel, solved jointly
   over all overlaps from statistics sampled at a decimated resolution.
3. **Blocks** (:mod:`.blocks`): the grid is cut into ``block_size`` blocks blended on a thread
   pool with the seam weights of the seam method ``MergeOptions.seam_method``
   (:func:`.seams.seam_method`; ``ownership``: ownership seams, feathering in a band around
   them, no hole wherever any submodel has data). Inputs are always visited in sorted id order,
   so the same inputs in any order give byte-identical pixels, for any ``workers`` and
   ``block_size``.
4. **COG** (:mod:`.cog`): DEFLATE level 3 with predictor by default, validated, then moved to
   ``out``. GDAL's block cache is bounded by ``gdal_cache_mb`` for the whole merge.

``seam_method='least-cost'`` moves the seams onto least-cost cuts through the overlaps
(:mod:`.seamlines`) and adds colour offsets along them (:func:`.balance.seam_colour_offsets`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Unpack

import numpy as np
from numpy.typing import NDArray
from rasterio.windows import Window

from prefect_odm.align.report import AlignmentReport
from prefect_odm.align.similarity import RasterCorrection
from prefect_odm.errors import MergeError
from prefect_odm.grid import Block
from prefect_odm.merge.balance import GainOffset
from prefect_odm.merge.blend import (
    BandCorrection,
    SeamSums,
    balance_and_measure_seams,
    seam_band_m,
    to_rgba,
    weighted_sum,
)
from prefect_odm.merge.blocks import (
    RasterMergeKeywords,
    RasterRun,
    raster_report,
    write_merged_raster,
)
from prefect_odm.merge.cog import with_gdal_cache
from prefect_odm.merge.colour import colour_corrections
from prefect_odm.merge.footprints import resolve_ownership
from prefect_odm.merge.rasterio_options import CogOptions, GeoTiffOptions
from prefect_odm.merge.reports import OrthoMergeReport, SeamQuality
from prefect_odm.merge.seamline_rasters import seams_for
from prefect_odm.merge.seamlines import OwnerLabels
from prefect_odm.merge.seams import SeamMethod
from prefect_odm.merge.shared_readers import SharedReaders, ThreadReaders
from prefect_odm.merge.source_lifetimes import SourceLifetimes
from prefect_odm.merge.sources import GridPlan, placed_reads, plan_grid, sources_in
from prefect_odm.models import MergeOptions
from prefect_odm.ownership import Ownership

log = logging.getLogger(__name__)

_RGBA_OPTIONS: GeoTiffOptions = {
    "count": 4,
    "dtype": "uint8",
    "SPARSE_OK": "TRUE",
    "photometric": "RGB",
    "ALPHA": "YES",
}
"""GeoTIFF options of the merged orthophoto's blocks."""

_BLEND_ROWS = 128
"""Rows of a block blended at a time (about 30 bytes per pixel and orthophoto present: 80 MiB
for a 512-pixel block under 10 of them); each strip is blended on its own, as a block is, so
the pixels are the same for a quarter of the memory."""

_OrthoBlock = tuple[NDArray[np.uint8], int, int, SeamSums]
"""One block's ``(rgba, pixels, union_pixels, seam sums)``."""


def _plan_rgb(
    inputs: Mapping[str, Path],
    resolution_m: float | None,
    crs_epsg: int | None,
    corrections: Mapping[str, RasterCorrection] | None = None,
) -> GridPlan:
    """The grid plan of 8-bit RGB(A) inputs (see :func:`.sources.plan_grid`).

    Raises:
        MergeError: as :func:`.sources.plan_grid`, or an input that is not 8-bit RGB(A).
    """
    plan = plan_grid(
        inputs, resolution_m=resolution_m, crs_epsg=crs_epsg, value_bands=3,
        corrections=corrections,
    )  # fmt: skip
    for src in plan.sources:
        if len(src.value_bands) < 3:
            raise MergeError(f"input {src.submodel_id} ({src.path}) is not an RGB(A) raster")
        if src.dtype != "uint8":
            raise MergeError(
                f"input {src.submodel_id} ({src.path}) is {src.dtype}; orthophotos must be uint8"
            )
    return plan


class _OrthoBlocks:
    """The orthophoto's :class:`.blocks.BlockMerge`: read, balance and blend one block; sums
    the seam differences of the blocks written."""

    def __init__(
        self,
        plan: GridPlan,
        readers: ThreadReaders,
        seams: SeamMethod,
        corrections: Mapping[str, GainOffset],
        feather_m: float,
    ) -> None:
        self.plan = plan
        self.readers = readers
        self.seams = seams
        self.corrections_in = dict(corrections)
        self.corrections = {sid: BandCorrection.of(c) for sid, c in corrections.items()}
        self.feather_m = feather_m
        self.band_m = seam_band_m(feather_m, plan.grid.resolution_m)
        self.seam_totals: SeamSums = {}

    def work(self, block: Block) -> _OrthoBlock:
        rgba = np.zeros((4, block.height, block.width), dtype=np.uint8)
        merged = union = 0
        sums: SeamSums = {}
        for r in range(0, block.height, _BLEND_ROWS):
            rows = slice(r, min(block.height, r + _BLEND_ROWS))
            strip = Block(block.row_off + r, block.col_off, rows.stop - r, block.width)
            done = self._blend(strip, rgba[:, rows])
            merged, union = merged + done[0], union + done[1]
            for key, val in done[2].items():
                sums[key] = sums[key] + val if key in sums else val
        return rgba, merged, union, sums

    def _blend(self, strip: Block, rgba: NDArray[np.uint8]) -> tuple[int, int, SeamSums]:
        """Read, balance and blend one strip of a block into ``rgba`` (its rows of the block's
        array); returns ``(pixels, union_pixels, seam sums)``."""
        present = sources_in(self.plan, strip)
        h, w = strip.height, strip.width
        if not present:
            return 0, 0, {}
        k = len(present)
        raw = np.zeros((k, 3, h, w), dtype=np.float32)
        valid = np.zeros((k, h, w), dtype=bool)
        for n, _, _, (rows, cols), values, ok in placed_reads(self.readers.get(), present, strip):
            raw[n, :, rows, cols] = values[:3]
            valid[n, rows, cols] = ok
        any_valid = np.asarray(valid.any(axis=0))
        union = int(any_valid.sum())
        if union == 0:
            return 0, 0, {}
        ids = [s.submodel_id for s, _ in present]
        sums: SeamSums = {}
        counts = valid.sum(axis=(1, 2))
        if k == 1 or int(np.count_nonzero(counts)) == 1:
            n = int(np.argmax(counts))
            corr = self.corrections[ids[n]]
            blended = raw[n] * corr.gain + corr.offset
        else:
            e = self.seams.seam_distance(strip, ids)
            near = e <= self.band_m
            sums = balance_and_measure_seams(
                raw, valid, near, ids, [self.corrections[sid] for sid in ids],
                self.seams.colour_offsets(strip, ids),
            )  # fmt: skip
            del near
            weights = self.seams.weights(e, valid, self.feather_m)
            del e
            blended = weighted_sum(weights, raw)
        rgba[:], merged = to_rgba(blended, any_valid)
        return merged, union, sums

    def retire(self, lifetimes: SourceLifetimes, item: int) -> None:
        """Nothing to drop: the orthophoto holds nothing per source but its readers'."""

    def write(self, dst: Any, block: Block, result: _OrthoBlock) -> tuple[int, int]:
        rgba, merged, union, sums = result
        for key, val in sums.items():
            self.seam_totals[key] = self.seam_totals.get(key, np.zeros(3)) + val
        if union:
            dst.write(rgba, window=Window(block.col_off, block.row_off, block.width, block.height))
        return merged, union

    def seam_quality(self) -> tuple[tuple[SeamQuality, ...], float, float]:
        """Per seam and overall mean absolute differences ``(seams, before, after)``, DN."""
        seams = tuple(
            SeamQuality(
                a=id_a,
                b=id_b,
                pixels=int(cnt),
                mean_abs_diff_before=float(before / cnt),
                mean_abs_diff_after=float(after / cnt),
            )
            for (id_a, id_b), (cnt, before, after) in sorted(self.seam_totals.items())
        )
        n_seam = sum(s.pixels for s in seams)
        if not n_seam:
            return seams, 0.0, 0.0
        before_all = float(sum(s.mean_abs_diff_before * s.pixels for s in seams) / n_seam)
        after_all = float(sum(s.mean_abs_diff_after * s.pixels for s in seams) / n_seam)
        return seams, before_all, after_all


class _Phases:
    """Wall time of each phase since ``started``, seconds."""

    def __init__(self, started: float) -> None:
        self.started = started
        self.seconds: dict[str, float] = {}

    def done(self, name: str) -> None:
        self.seconds[name] = time.perf_counter() - self.started - sum(self.seconds.values())


@with_gdal_cache
def merge_orthophotos(
    inputs: Mapping[str, Path],
    out: Path,
    *,
    ownership: Ownership | None,
    options: MergeOptions | None = None,
    alignment: AlignmentReport | None = None,
    compress: str = "DEFLATE",
    compress_level: int | None = 3,
    seamlines: OwnerLabels | None = None,
    **raster: Unpack[RasterMergeKeywords],
) -> OrthoMergeReport:
    """Merge per-submodel orthophotos into one RGBA COG.

    Args:
        inputs: submodel id -> local RGBA GeoTIFF (or RGB with nodata or an internal mask).
        out: the output COG path (written through a temporary name).
        ownership: who owns each ground position (nearest core camera), in the output CRS;
            None derives one from the centre of each input's data footprint
            (:func:`.seams.ownership_from_centres`).
        options: seam method, feathering width (``orthophoto_feather_m``, metres; 0 for hard
            seams) and colour balancing; None for the defaults.
        alignment: the alignment between submodels: each input is placed with its corrected
            geotransform (:meth:`AlignmentReport.raster_corrections`), so the warp onto the grid
            resamples it once; None, or identity transforms, leave the inputs as they are.
        compress: COG compression (GDAL name: DEFLATE, ZSTD, LZW, JPEG...).
        compress_level: compression level (GDAL ``LEVEL``; None for GDAL's default). DEFLATE
            level 3 is about twice as fast as GDAL's default 6 for ~30 % larger files.
        seamlines: the merge's owner labels for ``seam_method='least-cost'``; None computes
            them from ``inputs`` (:func:`.seamline_rasters.seams_for`).
        **raster: ``resolution_m``, ``crs_epsg``, ``workers``, ``block_size``, ``progress``,
            ``lattice_step_px``, ``gdal_cache_mb`` (see :class:`.blocks.RasterRun`).

    Returns:
        An :class:`.reports.OrthoMergeReport`.

    Raises:
        MergeError: no inputs, unreadable inputs, an input unknown to ``ownership``, an empty
            result, a merged coverage below 99.5 % of the inputs' union, or an invalid COG.
        InputError: an unknown seam method.
    """
    opts, run = options or MergeOptions(), RasterRun(**raster)
    phases = _Phases(time.perf_counter())
    fixes = alignment.raster_corrections() if alignment is not None else None
    plan = _plan_rgb(inputs, run.resolution_m, run.crs_epsg, fixes)
    owners = resolve_ownership(plan, ownership)
    phases.done("plan")
    corrections = colour_corrections(plan, opts.colour_balance)
    phases.done("colour_balance")
    seams = seams_for(opts.seam_method, owners, plan, run.lattice_step_px, seamlines=seamlines,
                      orthophotos={k: Path(v) for k, v in inputs.items()},
                      corrections=corrections if opts.colour_balance else None,
                      alignment=fixes)  # fmt: skip
    phases.done("seamlines")
    readers = SharedReaders(plan, run.workers)
    blocks = _OrthoBlocks(plan, readers, seams, corrections, opts.orthophoto_feather_m)
    cog: CogOptions = {
        "compress": compress,
        "predictor": compress != "JPEG",
        "compress_level": compress_level,
    }
    counts = write_merged_raster(
        Path(out), plan, _RGBA_OPTIONS, blocks, readers, run, cog_options=cog,
        blocks_done=lambda: phases.done("blocks"),
    )  # fmt: skip
    phases.done("cog")
    return _report(Path(out), blocks, counts, ownership is None, run, phases)


def _report(
    out: Path,
    blocks: _OrthoBlocks,
    counts: tuple[int, int],
    derived: bool,
    run: RasterRun,
    phases: _Phases,
) -> OrthoMergeReport:
    """The report of a finished orthophoto merge (logged)."""
    seams, before, after = blocks.seam_quality()
    elapsed = time.perf_counter() - phases.started
    grid = raster_report(
        out, blocks.plan, *counts, ownership_from_footprints=derived, elapsed_seconds=elapsed
    )
    report = OrthoMergeReport(
        **dict(grid),
        seams=seams,
        seam_mean_abs_diff_before=before,
        seam_mean_abs_diff_after=after,
        colour_correction=blocks.corrections_in,
        workers=run.workers,
        block_size=run.block_size,
        phase_seconds=phases.seconds,
    )
    log.info(
        "merged %d orthophotos into %s: %d px, seam |diff| %.2f -> %.2f DN in %.1f s",
        len(blocks.plan.sources),
        out,
        report.pixels,
        before,
        after,
        report.elapsed_seconds,
    )
    return report
