"""ODM's depth-map size rule (pure core): the image scale of the dense depth maps at each
``pc-quality``, as ODM and OpenMVS choose it. The memory model (:mod:`.memory`) and the built-in
engine's dense stage both use it, so it lives in the core."""

from __future__ import annotations

import math

PC_QUALITY_SCALE: dict[str, float] = {
    "ultra": 0.5,
    "high": 0.25,
    "medium": 0.125,
    "low": 0.0675,
    "lowest": 0.03375,
}
"""ODM's ``pc-quality`` -> depth-map resolution as a share of the largest image side, before
ODM's small-image multiplier and OpenMVS's minimum size (:func:`depthmap_scale`)."""

DEPTHMAP_MIN_PX = 320
"""ODM never asks for depth maps smaller than this (``get_depthmap_resolution``)."""


def depthmap_scale(width_px: int, height_px: int, quality: str) -> float:
    """The image scale of the depth maps at ODM's ``pc-quality``, as ODM and OpenMVS choose it.

    ODM's ``opendm/utils.get_depthmap_resolution`` asks for ``max side x``
    :data:`PC_QUALITY_SCALE` ``x`` 2 below 6 MP (0.5 above 42 MP), at least 320 px; its
    ``openmvs`` stage turns that into ``--resolution-level round(log2(side / asked))`` with
    ``--min-resolution`` 640 (320 at ``low`` and ``lowest``), and OpenMVS's
    ``Image::computeMaxResolution`` then halves the image ``level`` times, but never below the
    minimum: it takes the most halvings that stay at or above it (none when one already goes
    below). So brighton's 1600 px images get depth maps of 800 px at ``medium`` and seneca's
    1200 px images stay at 1200 px.

    Args:
        width_px, height_px: the image size, pixels.
        quality: one of :data:`PC_QUALITY_SCALE`.

    Returns:
        The depth maps' side over the image's, in (0, 1].

    Raises:
        KeyError: an unknown ``quality``.
    """
    side = max(width_px, height_px)
    megapixels = width_px * height_px / 1e6
    multiplier = 2.0 if megapixels < 6 else 0.5 if megapixels > 42 else 1.0
    asked = max(DEPTHMAP_MIN_PX, int(side * PC_QUALITY_SCALE[quality] * multiplier))
    level = 0 if side <= asked else round(math.log2(side / asked))
    minimum = 320 if quality in ("low", "lowest") else 640
    if level > 0 and side >> level < minimum:
        level = 0
        while side >> (level + 1) >= minimum:
            level += 1
    return (side >> level) / side


PC_QUALITY_LEVELS: tuple[str, ...] = ("ultra", "high", "medium", "low", "lowest")
"""ODM's ``pc-quality`` levels (the depth maps' image scale of each: :func:`depthmap_scale`)."""
