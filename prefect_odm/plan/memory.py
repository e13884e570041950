"""Peak memory of processing one submodel (pure core, no I/O).

The figure drives memory-gated concurrency (slots = GiB) and ``split="auto"``. Three anchors, each
a published or measured table of (image count, peak GiB), interpolated piecewise-linearly and
extrapolated on the last segment's slope:

* ``"odm"`` -- OpenDroneMap's documented *minimum* RAM (or RAM + swap) per image count, from the
  installation page of the ODM documentation (OpenDroneMap/docs, ``source/installation.rst``,
  "Hardware Recommendations", table "Minimum RAM needed for N images"): 40 images 4 GB, 250 16 GB,
  500 32 GB, 1500 64 GB, 2500 128 GB, 3500 192 GB, 5000 256 GB. The page gives GB without saying
  whether it means 10^9 or 2^30 bytes; they are taken as GiB here.
* ``"scaleodm"`` -- peaks measured on the Kubernetes deployment ScaleODM (hotosm/ScaleODM,
  ``app/workflows/standard.go``, ``odmMemoryEstimationPoints``, commit 058d298c): described there as
  "Peak RAM fit: ~0.042*images + 16 GiB (from testing)", with points 40 -> 18, 200 -> 25, 500 -> 37,
  1000 -> 58, 1500 -> 79, 2500 -> 121, 3500 -> 163, 5000 -> 227, 12000 -> 800 GiB. Its ~16 GiB
  baseline is the SIFT/OpenSfM working set of full-resolution (12-20 MP) DJI images.
* ``"builtin"`` -- the built-in engine's own measured peaks, :data:`BUILTIN_ENGINE_MEASURED_PEAKS`
  (``benchmarks/bench_engine.py``, with a safety factor of 2), one table per pipeline: ``direct``
  (``pipeline=direct``), ``sparse`` (``fast-orthophoto``) and ``dense`` (the default).

Both published tables are for full-size drone photos; we scale the per-image part by
``megapixels / REFERENCE_MEGAPIXELS`` (12 MP, a DJI Phantom 4 / Mavic frame). That scaling and the
option multipliers below are our own heuristic (not from a published source): ODM's depth maps and
features grow with pixel count, and its ``pc-quality`` steps each halve/double the depth-map
resolution.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from prefect_odm.errors import InputError

logger = logging.getLogger(__name__)

MemoryModel = Literal["odm", "scaleodm", "builtin"]

#: OpenDroneMap docs, "Minimum RAM needed for N images" (images, GiB).
ODM_DOCUMENTED_MINIMUM_GIB: tuple[tuple[int, float], ...] = (
    (40, 4.0),
    (250, 16.0),
    (500, 32.0),
    (1500, 64.0),
    (2500, 128.0),
    (3500, 192.0),
    (5000, 256.0),
)

#: ScaleODM's measured peaks on Kubernetes (images, GiB); fit ~0.042 GiB/image + 16 GiB.
SCALEODM_MEASURED_PEAKS_GIB: tuple[tuple[int, float], ...] = (
    (40, 18.0),
    (200, 25.0),
    (500, 37.0),
    (1000, 58.0),
    (1500, 79.0),
    (2500, 121.0),
    (3500, 163.0),
    (5000, 227.0),
    (12000, 800.0),
)

#: Measured peak resident memory of the built-in engine, from ``python benchmarks/bench_engine.py``
#: on 2 cores (``ru_maxrss`` of the run's process): brighton, 18 images at 1.44 MP, and the 50
#: seneca images nearest its centre at 1.08 MP. ``sparse`` (``fast-orthophoto``) 646 and 846 MiB,
#: ``direct`` 484 and 660 MiB: tables of (images, GiB) at
#: :data:`BUILTIN_ENGINE_MEASURED_MEGAPIXELS` (seneca's brought to it by the pixel scaling below,
#: / 0.825), times :data:`BUILTIN_ENGINE_SAFETY_FACTOR`: two small measurements, extrapolated
#: linearly. ``dense`` (the default) is the sparse run plus its depth maps, whose size ODM's
#: rule keeps between about 640 and 1,600 px a side whatever the photo
#: (:func:`~prefect_odm.plan.depthmaps.depthmap_scale`): 981 MiB for brighton (18 depth
#: maps of 0.36 MP) and 3,494 MiB for seneca (50 of 1.08 MP) are 0.33 and 2.58 GiB above the
#: sparse runs, :data:`BUILTIN_DENSE_GIB_PER_DEPTH_MEGAPIXEL` (0.051 and 0.048) per image per
#: depth-map megapixel.
BUILTIN_ENGINE_SAFETY_FACTOR = 2.0
BUILTIN_ENGINE_MEASURED_PEAKS: Mapping[str, tuple[tuple[int, float], ...]] = {
    method: tuple((n, round(gib * BUILTIN_ENGINE_SAFETY_FACTOR, 2)) for n, gib in points)
    for method, points in {
        "sparse": ((18, 0.63), (50, 1.00)),
        "direct": ((18, 0.47), (50, 0.78)),
    }.items()
}
#: Megapixels of the images the built-in engine's sparse and direct peaks are given at.
BUILTIN_ENGINE_MEASURED_MEGAPIXELS: float = 1.44
#: The dense pipeline's memory above the sparse one, per image per depth-map megapixel, GiB.
BUILTIN_DENSE_GIB_PER_DEPTH_MEGAPIXEL = 0.049

#: The image size the published tables are taken to describe.
REFERENCE_MEGAPIXELS = 12.0
#: Share of the published peak that grows with pixel count (heuristic).
PIXEL_SHARE = 0.7

#: ODM ``pc-quality`` -> memory multiplier (heuristic; ODM default "medium").
PC_QUALITY_FACTOR: Mapping[str, float] = {
    "ultra": 2.5,
    "high": 1.5,
    "medium": 1.0,
    "low": 0.75,
    "lowest": 0.6,
}
#: ODM ``fast-orthophoto`` skips dense reconstruction (heuristic multiplier).
FAST_ORTHOPHOTO_FACTOR = 0.6


def _interpolate(table: Sequence[tuple[int, float]], x: float) -> float:
    """Piecewise-linear through ``table``; constant below the first point, last slope above."""
    if x <= table[0][0]:
        return table[0][1]
    for (x0, y0), (x1, y1) in zip(table, table[1:], strict=False):
        if x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    (x0, y0), (x1, y1) = table[-2], table[-1]
    return y1 + (y1 - y0) / (x1 - x0) * (x - x1)


def _builtin_method(options: Mapping[str, Any] | None) -> str:
    """Which of the built-in engine's tables applies: ``direct``, ``sparse`` or ``dense``."""
    if not options:
        return "dense"
    if str(options.get("pipeline", "")) == "direct":
        return "direct"
    if options.get("fast-orthophoto") in (True, "true", "True", 1):
        return "sparse"
    return "dense"


def _builtin_dense_depth_gib(
    image_count: int, megapixels: float, options: Mapping[str, Any] | None
) -> float:
    """The built-in engine's dense depth maps: per image x depth-map megapixels (4:3 photos
    assumed), times the safety factor.

    Raises:
        InputError: an unknown ``pc-quality``.
    """
    from prefect_odm.plan.depthmaps import depthmap_scale

    quality = str((options or {}).get("pc-quality", "medium"))
    if quality not in PC_QUALITY_FACTOR:
        raise InputError(
            f"unknown pc-quality {quality!r}; expected one of {sorted(PC_QUALITY_FACTOR)}"
        )
    side = (megapixels * 1e6 * 4.0 / 3.0) ** 0.5
    depth_mp = megapixels * depthmap_scale(round(side), round(side * 0.75), quality) ** 2
    per = BUILTIN_DENSE_GIB_PER_DEPTH_MEGAPIXEL * BUILTIN_ENGINE_SAFETY_FACTOR
    return per * image_count * depth_mp


def _options_factor(options: Mapping[str, Any] | None) -> float:
    if not options:
        return 1.0
    factor = 1.0
    quality = options.get("pc-quality")
    if quality is not None:
        try:
            factor *= PC_QUALITY_FACTOR[str(quality)]
        except KeyError:
            raise InputError(
                f"unknown pc-quality {quality!r}; expected one of {sorted(PC_QUALITY_FACTOR)}"
            ) from None
    if options.get("fast-orthophoto") in (True, "true", "True", 1):
        factor *= FAST_ORTHOPHOTO_FACTOR
    return factor


def estimate_peak_memory_gib(
    image_count: int,
    megapixels: float,
    options: Mapping[str, Any] | None = None,
    *,
    model: MemoryModel = "odm",
) -> float:
    """Estimated peak memory of one submodel, in GiB.

    Args:
        image_count: images the node processes (core plus overlap), >= 0.
        megapixels: mean image size in millions of pixels (> 0).
        options: NodeODM options by name (``ProcessingOptions.to_nodeodm()``); ``pc-quality``
            and ``fast-orthophoto`` change the estimate, and for ``"builtin"`` ``pipeline``
            (``direct``) and ``fast-orthophoto`` pick the measured table.
        model: which anchor table to use (see the module docstring): ``"odm"`` (ODM's documented
            minimum RAM per image count), ``"scaleodm"`` (ScaleODM's measured Kubernetes peaks) or
            ``"builtin"`` (the built-in engine's measured peaks).

    Returns:
        Peak memory in GiB, rounded to 0.01 GiB.

    Raises:
        InputError: for a negative image count, non-positive megapixels, an unknown model or an
            unknown ``pc-quality``.
    """
    if image_count < 0:
        raise InputError(f"image_count must be >= 0, got {image_count}")
    if not megapixels > 0:
        raise InputError(f"megapixels must be > 0, got {megapixels}")
    if image_count == 0:
        return 0.0
    if model == "odm":
        table, reference_mp = ODM_DOCUMENTED_MINIMUM_GIB, REFERENCE_MEGAPIXELS
    elif model == "scaleodm":
        table, reference_mp = SCALEODM_MEASURED_PEAKS_GIB, REFERENCE_MEGAPIXELS
    elif model == "builtin":
        method = _builtin_method(options)
        depth_gib = 0.0
        if method == "dense":  # the sparse run plus the depth maps
            depth_gib = _builtin_dense_depth_gib(image_count, float(megapixels), options)
            method = "sparse"
        peak = _interpolate(BUILTIN_ENGINE_MEASURED_PEAKS[method], float(image_count))
        share = float(megapixels) / BUILTIN_ENGINE_MEASURED_MEGAPIXELS
        return round(peak * ((1.0 - PIXEL_SHARE) + PIXEL_SHARE * share) + depth_gib, 2)
    else:
        raise InputError(f"unknown memory model {model!r}; expected odm, scaleodm or builtin")
    published = _interpolate(table, float(image_count))
    pixel_scale = (1.0 - PIXEL_SHARE) + PIXEL_SHARE * (float(megapixels) / reference_mp)
    return round(published * pixel_scale * _options_factor(options), 2)


def max_images_within(
    memory_gib: float,
    megapixels: float,
    options: Mapping[str, Any] | None = None,
    *,
    model: MemoryModel = "odm",
    upper: int = 100_000,
) -> int:
    """The largest image count whose estimated peak fits in ``memory_gib`` (0 if none fits).

    The estimate is monotonic in the image count, so a binary search finds it.
    """
    lo, hi = 0, upper
    if estimate_peak_memory_gib(1, megapixels, options, model=model) > memory_gib:
        return 0
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if estimate_peak_memory_gib(mid, megapixels, options, model=model) <= memory_gib:
            lo = mid
        else:
            hi = mid - 1
    return lo
