"""Pairs of sources that overlap on the output grid, and their co-located samples (for the
colour and height statistics of the merge)."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
from numpy.typing import NDArray
from rasterio.enums import Resampling
from rasterio.windows import Window

from prefect_odm.align.stage_records import DsmSeam
from prefect_odm.grid import intersect
from prefect_odm.merge.source_lifetimes import SourceLifetimes
from prefect_odm.merge.sources import GridPlan, RasterSource, SourceReader, Window4

_STATS_MAX_PIXELS = 250_000
"""Largest number of pixels sampled from one overlap for colour or height statistics."""

_STRIP_ROWS = 512
"""Full-resolution rows read at a time by :func:`read_decimated_direct` (memory: this many rows
of the window's width, every value band)."""


def read_decimated_direct(
    reader: SourceReader, src: RasterSource, window: Window4, factor: int
) -> tuple[NDArray[np.float32], NDArray[np.bool_], Window4]:
    """:meth:`SourceReader.read_decimated` of a source on the grid with a nodata value or an
    alpha band (no warp, no correction), by slicing full-resolution strips: the same cells
    (each coarse pixel's centre falls on full-resolution pixel ``factor // 2`` of it), without
    GDAL's warper and its coarse dataset's tiles. Other sources are read by
    :meth:`SourceReader.read_decimated`.

    Returns:
        ``(values, valid, aligned)`` as :meth:`SourceReader.read_decimated` gives them.
    """
    r0, c0 = -(-window[0] // factor), -(-window[1] // factor)
    rows = max(0, (window[0] + window[2]) // factor - r0)
    cols = max(0, (window[1] + window[3]) // factor - c0)
    direct = not src.warp and src.src_transform is None and src.heights is None
    if not (direct and (src.alpha_band or src.nodata is not None) and rows and cols):
        return reader.read_decimated(src, window, factor)
    ds, half, bands = reader.dataset(src), factor // 2, list(src.value_bands)
    read = bands + ([src.alpha_band] if src.alpha_band else [])
    values = np.empty((len(read), rows, cols), dtype=np.float32)
    step = max(1, _STRIP_ROWS // factor)
    left = c0 * factor + half - src.col_off
    for i in range(0, rows, step):
        n = min(step, rows - i)
        top = (r0 + i) * factor + half - src.row_off
        win = Window(left, top, (cols - 1) * factor + 1, (n - 1) * factor + 1)
        values[:, i : i + n] = ds.read(read, window=win)[:, ::factor, ::factor]
    aligned = (r0 * factor, c0 * factor, rows * factor, cols * factor)
    if src.alpha_band:
        return values[: len(bands)], values[len(bands)] > 0, aligned
    nd = np.float32(src.nodata)
    return values, np.any((values != nd) & np.isfinite(values), axis=0), aligned


def overlap_pairs(plan: GridPlan) -> Iterator[tuple[RasterSource, RasterSource, Window4]]:
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
    window: Window4,
    max_pixels: int = _STATS_MAX_PIXELS,
) -> tuple[NDArray[np.float32], NDArray[np.float32]]:
    """Co-located values of two sources where both have data, sampled on the output grid
    coarsened so that the window holds at most about ``max_pixels`` samples
    (:func:`read_decimated_direct`; at full resolution when it already does).

    Returns:
        ``(values_a, values_b)``, each ``(bands, n)`` float32.
    """
    factor = max(1, int(np.ceil(np.sqrt(window[2] * window[3] / max_pixels))))
    if factor == 1:
        va, ma = reader.read(a, window)
        vb, mb = reader.read(b, window)
    else:
        va, ma, _ = read_decimated_direct(reader, a, window, factor)
        vb, mb, _ = read_decimated_direct(reader, b, window, factor)
    both = ma & mb
    return va[:, both], vb[:, both]


def overlap_samples(
    plan: GridPlan,
) -> Iterator[tuple[RasterSource, RasterSource, NDArray[np.float32], NDArray[np.float32]]]:
    """:func:`sample_overlap` of every overlapping pair (nearest resampling) that has common
    data, in sorted id order: ``(a, b, values_a, values_b)`` with ``(bands, n)`` values. A
    source is closed after its last pair, so the reader holds those of the pairs around the
    current one open, not every input."""
    reader = SourceReader(plan, Resampling.nearest)
    pairs = list(overlap_pairs(plan))
    lifetimes = SourceLifetimes.of_items((a.submodel_id, b.submodel_id) for a, b, _ in pairs)
    try:
        for n, (a, b, inter) in enumerate(pairs):
            reader.close_sources(lifetimes.finished(reader.open_ids, n))
            va, vb = sample_overlap(reader, a, b, inter)
            if va.shape[1] > 0:
                yield a, b, va, vb
    finally:
        reader.close()


def dsm_seam(
    values_a: NDArray[np.float32], values_b: NDArray[np.float32], measured: bool
) -> DsmSeam | None:
    """Two DSMs' co-located samples (``(bands, n)``, as :func:`overlap_samples` gives them)
    against each other: ``z_b - z_a`` where both measured a height (band 2 is the measured flag
    when ``measured``), or None without such a sample. One function for the DEM merge's report
    and the alignment's stage checks, so the two give the same figures for the same corrections.
    """
    both = np.ones(values_a.shape[1], dtype=bool)
    if measured:
        both = (values_a[1] == 1) & (values_b[1] == 1)
    if not both.any():
        return None
    dz = (values_b[0][both] - values_a[0][both]).astype(np.float64)
    return DsmSeam(
        samples=int(both.sum()),
        median_m=float(np.median(dz)),
        p90_m=float(np.percentile(np.abs(dz), 90)),
    )
