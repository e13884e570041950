"""DEM merge for DSMs and DTMs (adapter: rasterio, scipy; shares the grid code of :mod:`.ortho`).

Heights are blended with weights

    ``w_k = taper_k * edt_k``

where ``edt_k`` is the distance in metres from the pixel to the edge of submodel ``k``'s data
(``scipy.ndimage.distance_transform_edt`` on its valid mask, computed once per input at a
decimated resolution whose longer side is at most ``edt_max_side_px`` and interpolated
bilinearly) and ``taper_k`` is the seam feathering of :func:`.seams.blend_weights` over a band
``feather_m`` wide around the ownership seams. So the owner dominates its own cell, blending is
smooth across seams, and a submodel fades out towards the edge of its own data. Where the
weights vanish but some submodel has data, the one with data farthest from its edge is used.

Vertical offsets between submodels are estimated in each overlap as the median height
difference (sampled at a decimated resolution) and removed by a joint least-squares solve with
the mean offset held at zero (:func:`.seams.solve_vertical_offsets`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray
from rasterio.enums import Resampling
from rasterio.windows import Window
from scipy.ndimage import distance_transform_edt, map_coordinates

from prefect_odm.merge.grid import Block
from prefect_odm.merge.ortho import (
    DEFAULT_GDAL_CACHE_MB,
    GridPlan,
    RasterMergeReport,
    RasterSource,
    SourceReader,
    ThreadReaders,
    overlap_pairs,
    plan_grid,
    raster_report_fields,
    resolve_ownership,
    sample_overlap,
    sources_in,
    with_gdal_cache,
    write_merged_raster,
)
from prefect_odm.merge.seams import SeamField, blend_weights, solve_vertical_offsets
from prefect_odm.ownership import Ownership

log = logging.getLogger(__name__)

DEM_NODATA = -9999.0
"""Nodata value of merged DEMs (OpenDroneMap's)."""


@dataclass(frozen=True)
class EdgeDistance:
    """Distance to the data edge of one source, on a decimated copy of its window.

    Attributes:
        factor_rows, factor_cols: output-grid pixels per decimated pixel.
        distance_m: ``(rows + 2, cols + 2)`` float32 (one padding cell each side), metres.
    """

    factor_rows: float
    factor_cols: float
    distance_m: NDArray[np.float32]

    def sample(self, src: RasterSource, window: tuple[int, int, int, int]) -> NDArray[np.float32]:
        """Bilinear distance at the centres of a window of the output grid, ``(rows, cols)``."""
        rows = np.arange(window[0], window[0] + window[2]) - src.row_off + 0.5
        cols = np.arange(window[1], window[1] + window[3]) - src.col_off + 0.5
        rr = rows / self.factor_rows - 0.5 + 1.0
        cc = cols / self.factor_cols - 0.5 + 1.0
        r2, c2 = np.meshgrid(rr, cc, indexing="ij")
        return map_coordinates(self.distance_m, [r2, c2], order=1, mode="nearest").astype(  # type: ignore[no-any-return]
            np.float32
        )


def edge_distance(
    reader: SourceReader, src: RasterSource, resolution_m: float, max_side_px: int
) -> EdgeDistance:
    """Distance transform of a source's valid mask (padded so the raster edge is a data edge)."""
    factor = max(1, -(-max(src.height, src.width) // max_side_px))
    shape = (max(1, src.height // factor), max(1, src.width // factor))
    _, valid = reader.read(src, src.window, out_shape=shape if factor > 1 else None)
    padded = np.zeros((shape[0] + 2, shape[1] + 2), dtype=bool)
    padded[1:-1, 1:-1] = valid
    fr = src.height / shape[0]
    fc = src.width / shape[1]
    dist = distance_transform_edt(padded, sampling=(fr * resolution_m, fc * resolution_m))
    return EdgeDistance(fr, fc, np.asarray(dist, dtype=np.float32))


@dataclass(frozen=True)
class DemMergeReport(RasterMergeReport):
    """What a DEM merge produced (figures for the manifest and report).

    Attributes:
        vertical_offsets_m: offset removed from each submodel (subtracted), metres.
        overlap_median_diff_m: ``"a|b"`` -> median of ``z_a - z_b`` in the overlap before the
            correction, metres.
    """

    vertical_offsets_m: dict[str, float]
    overlap_median_diff_m: dict[str, float]
    warped: tuple[str, ...]
    ownership_from_footprints: bool
    elapsed_seconds: float


@with_gdal_cache
def merge_dems(
    inputs: Mapping[str, Path],
    out: Path,
    *,
    ownership: Ownership | None,
    resolution_m: float | None = None,
    remove_vertical_offsets: bool = True,
    workers: int = 2,
    block_size: int = 512,
    progress: Callable[[int, int], None] | None = None,
    crs_epsg: int | None = None,
    feather_m: float = 10.0,
    edt_max_side_px: int = 1024,
    lattice_step_px: int = 8,
    gdal_cache_mb: int = DEFAULT_GDAL_CACHE_MB,
) -> DemMergeReport:
    """Merge per-submodel DSMs (or DTMs) into one float32 COG with nodata -9999.

    Args:
        inputs: submodel id -> local single-band GeoTIFF with a nodata value (or mask).
        out: output COG path (written through a temporary name).
        ownership: who owns each ground position, in the output CRS; None derives one from the
            centre of each input's data footprint.
        resolution_m: output pixel size, CRS units; None: the finest resolution of the inputs
            already in the output CRS (of the warped ones only when none is).
        remove_vertical_offsets: estimate and remove vertical offsets between submodels.
        workers: threads over blocks (and for COG compression).
        block_size: block side, pixels.
        progress: ``(blocks_done, blocks_total)`` callback, called in the calling thread.
        crs_epsg: output CRS; None: the CRS of the first input by sorted id.
        feather_m: width of the band around ownership seams where submodels blend, metres.
        edt_max_side_px: longest side of the decimated masks for the edge distances (memory:
            about ``8 * edt_max_side_px**2`` bytes per input).
        lattice_step_px: step of the exact seam-distance lattice.
        gdal_cache_mb: GDAL block cache for this merge, MiB (see
            :func:`.ortho.merge_orthophotos`).

    Returns:
        A :class:`DemMergeReport`.

    Raises:
        MergeError: no inputs, unreadable inputs, an input unknown to ``ownership``, an empty
            result or one covering less than 99.5 % of the inputs' union, an invalid COG.
    """
    started = time.perf_counter()
    out = Path(out)
    plan: GridPlan = plan_grid(inputs, resolution_m=resolution_m, crs_epsg=crs_epsg, value_bands=1)
    derived = ownership is None
    owners = resolve_ownership(plan, ownership)
    ids = tuple(s.submodel_id for s in plan.sources)
    res = plan.grid.resolution_m

    reader = SourceReader(plan, Resampling.nearest)
    medians: dict[str, float] = {}
    try:
        diffs: list[tuple[str, str, float, int]] = []
        for a, b, inter in overlap_pairs(plan):
            va, vb = sample_overlap(reader, a, b, inter)
            if va.shape[1]:
                med = float(np.median(va[0] - vb[0]))
                diffs.append((a.submodel_id, b.submodel_id, med, int(va.shape[1])))
                medians[f"{a.submodel_id}|{b.submodel_id}"] = med
        offsets = (
            solve_vertical_offsets(ids, diffs)
            if remove_vertical_offsets
            else {sid: 0.0 for sid in ids}
        )
        edges = {
            s.submodel_id: edge_distance(reader, s, res, edt_max_side_px) for s in plan.sources
        }
    finally:
        reader.close()

    seam_field = SeamField(owners, plan.grid, lattice_step_px=lattice_step_px)
    readers = ThreadReaders(plan)

    def work(block: Block) -> tuple[NDArray[np.float32], int, int]:
        present = sources_in(plan, block)
        h, w = block.height, block.width
        dem = np.full((h, w), DEM_NODATA, dtype=np.float32)
        if not present:
            return dem, 0, 0
        rd = readers.get()
        k = len(present)
        z = np.zeros((k, h, w), dtype=np.float32)
        valid = np.zeros((k, h, w), dtype=bool)
        edt = np.zeros((k, h, w), dtype=np.float32)
        for n, (src, inter) in enumerate(present):
            values, ok = rd.read(src, inter)
            r0, c0 = inter[0] - block.row_off, inter[1] - block.col_off
            sl = (slice(r0, r0 + inter[2]), slice(c0, c0 + inter[3]))
            z[n][sl] = values[0] - np.float32(offsets[src.submodel_id])
            valid[n][sl] = ok
            if k > 1:
                edt[n][sl] = edges[src.submodel_id].sample(src, inter)
        any_valid = valid.any(axis=0)
        union = int(any_valid.sum())
        if union == 0:
            return dem, 0, 0
        if k == 1:
            dem[any_valid] = z[0][any_valid]
            return dem, union, union
        e = seam_field.seam_distance(block, [s.submodel_id for s, _ in present])
        taper = blend_weights(e, valid, feather_m)
        weights = taper * np.maximum(edt, np.float32(1e-6))
        total = weights.sum(axis=0)
        missing = (total <= 0) & any_valid
        if missing.any():
            fallback = valid * np.maximum(edt, np.float32(1e-6))
            weights[:, missing] = fallback[:, missing]
            total = weights.sum(axis=0)
        np.divide(weights, total, out=weights, where=total > 0)
        z[~valid] = 0.0
        blended = (weights * z).sum(axis=0)
        dem[any_valid] = blended[any_valid]
        return dem, int(any_valid.sum()), union

    def write(dst: Any, block: Block, result: Any) -> tuple[int, int]:
        dem, pixels, union = result
        dst.write(dem, 1, window=Window(block.col_off, block.row_off, block.width, block.height))
        return pixels, union

    pixels, union_pixels = write_merged_raster(
        out,
        plan,
        {"count": 1, "dtype": "float32", "nodata": DEM_NODATA},
        work,
        write,
        readers,
        block_size=block_size,
        workers=workers,
        progress=progress,
        cog_options={"compress": "DEFLATE", "predictor": True},
    )

    report = DemMergeReport(
        **raster_report_fields(out, plan, pixels, union_pixels),
        vertical_offsets_m=dict(sorted(offsets.items())),
        overlap_median_diff_m=medians,
        ownership_from_footprints=derived,
        elapsed_seconds=time.perf_counter() - started,
    )
    log.info(
        "merged %d DEMs into %s: %d px, vertical offsets removed %s, in %.1f s",
        len(ids),
        out,
        report.pixels,
        report.vertical_offsets_m,
        report.elapsed_seconds,
    )
    return report
