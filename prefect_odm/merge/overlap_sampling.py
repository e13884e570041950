"""Pairs of sources that overlap on the output grid, and their co-located samples (for the
colour and height statistics of the merge)."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
from numpy.typing import NDArray
from rasterio.enums import Resampling

from prefect_odm.align.stage_records import DsmSeam
from prefect_odm.grid import intersect
from prefect_odm.merge.sources import GridPlan, RasterSource, SourceReader, Window4

_STATS_MAX_PIXELS = 250_000
"""Largest number of pixels sampled from one overlap for colour or height statistics."""


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
    (:meth:`SourceReader.read_decimated`; at full resolution when it already does).

    Returns:
        ``(values_a, values_b)``, each ``(bands, n)`` float32.
    """
    factor = max(1, int(np.ceil(np.sqrt(window[2] * window[3] / max_pixels))))
    if factor == 1:
        va, ma = reader.read(a, window)
        vb, mb = reader.read(b, window)
    else:
        va, ma, _ = reader.read_decimated(a, window, factor)
        vb, mb, _ = reader.read_decimated(b, window, factor)
    both = ma & mb
    return va[:, both], vb[:, both]


def overlap_samples(
    plan: GridPlan,
) -> Iterator[tuple[RasterSource, RasterSource, NDArray[np.float32], NDArray[np.float32]]]:
    """:func:`sample_overlap` of every overlapping pair (nearest resampling) that has common
    data, in sorted id order: ``(a, b, values_a, values_b)`` with ``(bands, n)`` values."""
    reader = SourceReader(plan, Resampling.nearest)
    try:
        for a, b, inter in overlap_pairs(plan):
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
