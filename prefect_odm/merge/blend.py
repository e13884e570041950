"""Per-block blending of the raster merges (pure core: numpy).

Every function works on the stacks of the submodels present in one block, in sorted id order:
``k`` submodels, ``(rows, cols)`` pixels. Seam distances and blending weights come from a
:class:`.seams.SeamMethod`; colour corrections from :mod:`.balance`; nothing here reads or writes
files, so the arithmetic (and hence every output byte) depends only on these arrays.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from prefect_odm.merge.balance import GainOffset

SeamSums = dict[tuple[str, str], NDArray[np.float64]]
"""``(a, b)`` -> ``[pixels, sum of |diff| before, sum of |diff| after balancing]`` over the seam
band pixels where both have data (mean over RGB per pixel, DN)."""


@dataclass(frozen=True)
class BandCorrection:
    """A :class:`.balance.GainOffset` as ``(bands, 1, 1)`` float32 arrays, ready to broadcast."""

    gain: NDArray[np.float32]
    offset: NDArray[np.float32]

    @staticmethod
    def of(correction: GainOffset) -> BandCorrection:
        """The arrays of one submodel's correction."""
        return BandCorrection(
            gain=np.asarray(correction.gain, dtype=np.float32)[:, None, None],
            offset=np.asarray(correction.offset, dtype=np.float32)[:, None, None],
        )


def seam_band_m(feather_m: float, resolution_m: float) -> float:
    """Half-width of the band around seams where seam colour differences are measured, metres:
    half the feathering width, at least two pixels."""
    return max(feather_m / 2.0, 2.0 * resolution_m)


def _pair_masks(
    valid: NDArray[np.bool_], near: NDArray[np.bool_]
) -> list[tuple[int, int, NDArray[np.bool_], int]]:
    """``(i, j, mask, count)`` for each pair of submodels with common data near their seams."""
    k = valid.shape[0]
    pairs = []
    for i in range(k):
        for j in range(i + 1, k):
            mask = valid[i] & valid[j] & near[i] & near[j]
            cnt = int(mask.sum())
            if cnt:
                pairs.append((i, j, mask, cnt))
    return pairs


def _abs_diff_sum(raw: NDArray[np.float32], i: int, j: int, mask: NDArray[np.bool_]) -> float:
    return float(np.abs(raw[i][:, mask] - raw[j][:, mask]).mean(axis=0).sum())


def balance_and_measure_seams(
    raw: NDArray[np.float32],
    valid: NDArray[np.bool_],
    near: NDArray[np.bool_],
    ids: list[str],
    corrections: list[BandCorrection],
    offsets: NDArray[np.float32] | None = None,
) -> SeamSums:
    """Apply each submodel's colour correction to ``raw`` in place, measuring the seams' colour
    differences before and after.

    Args:
        raw: ``(k, bands, rows, cols)`` float32 values, corrected in place (one copy in memory).
        valid: ``(k, rows, cols)`` data masks.
        near: ``(k, rows, cols)`` True within the seam band of each submodel.
        ids: the ``k`` submodel ids, sorted.
        corrections: the ``k`` corrections.
        offsets: ``(k, bands, rows, cols)`` colour offsets added after the corrections
            (:meth:`.seams.SeamMethod.colour_offsets`), or None.

    Returns:
        The block's :data:`SeamSums`.
    """
    pairs = [(i, j, m, n, _abs_diff_sum(raw, i, j, m)) for i, j, m, n in _pair_masks(valid, near)]
    for n, corr in enumerate(corrections):
        raw[n] *= corr.gain
        raw[n] += corr.offset
    if offsets is not None:
        raw += offsets
    sums: SeamSums = {}
    for i, j, mask, cnt, before in pairs:
        after = _abs_diff_sum(raw, i, j, mask)
        sums[(ids[i], ids[j])] = np.array([cnt, before, after], dtype=np.float64)
    return sums


def weighted_sum(weights: NDArray[np.float32], raw: NDArray[np.float32]) -> NDArray[np.float32]:
    """``sum_k weights[k] * raw[k]``: ``(k, rows, cols)`` x ``(k, bands, rows, cols)`` ->
    ``(bands, rows, cols)``."""
    out: NDArray[np.float32] = np.einsum("khw,kchw->chw", weights, raw, optimize=False)
    return out


def to_rgba(
    blended: NDArray[np.float32], any_valid: NDArray[np.bool_]
) -> tuple[NDArray[np.uint8], int]:
    """Round and clip ``(3, rows, cols)`` blended colours into RGBA (alpha 255 where any
    submodel has data, colour 0 elsewhere).

    Returns:
        ``(rgba, pixels)``: ``(4, rows, cols)`` uint8 and the number of pixels with alpha.
    """
    rgba = np.zeros((4, *blended.shape[1:]), dtype=np.uint8)
    np.clip(blended, 0.0, 255.0, out=blended)
    rgba[:3] = np.where(any_valid, np.rint(blended), 0.0).astype(np.uint8)
    rgba[3] = np.where(any_valid, 255, 0).astype(np.uint8)
    return rgba, int((rgba[3] > 0).sum())


def height_weights(
    valid: NDArray[np.bool_],
    edge_distance_m: NDArray[np.float32],
    taper: NDArray[np.float32],
) -> NDArray[np.float32]:
    """The normalised weights of :func:`blend_heights`, ``(k, rows, cols)`` float32 (summing to
    1 where any submodel has data), for blending several bands with the same weights."""
    any_valid = valid.any(axis=0)
    weights = taper * np.maximum(edge_distance_m, np.float32(1e-6))
    total = weights.sum(axis=0)
    missing = (total <= 0) & any_valid
    if missing.any():
        fallback = valid * np.maximum(edge_distance_m, np.float32(1e-6))
        weights[:, missing] = fallback[:, missing]
        total = weights.sum(axis=0)
    np.divide(weights, total, out=weights, where=total > 0)
    return weights


def weighted_heights(
    weights: NDArray[np.float32], z: NDArray[np.float32], valid: NDArray[np.bool_]
) -> NDArray[np.float32]:
    """``sum_k weights[k] * z[k]`` with ``z`` set to 0 where invalid (in place), ``(rows, cols)``."""
    z[~valid] = 0.0
    blended: NDArray[np.float32] = (weights * z).sum(axis=0)
    return blended


def blend_heights(
    z: NDArray[np.float32],
    valid: NDArray[np.bool_],
    edge_distance_m: NDArray[np.float32],
    taper: NDArray[np.float32],
) -> NDArray[np.float32]:
    """Heights blended with ``w_k = taper_k * edge_distance_k`` (see :mod:`.dem`).

    Where every weight vanishes but some submodel has data, the one with data farthest from its
    edge is used.

    Args:
        z: ``(k, rows, cols)`` heights, metres (set to 0 where invalid, in place).
        valid: ``(k, rows, cols)`` data masks.
        edge_distance_m: ``(k, rows, cols)`` distance to each submodel's data edge, metres.
        taper: ``(k, rows, cols)`` seam weights (:meth:`.seams.SeamMethod.weights`).

    Returns:
        ``(rows, cols)`` float32 heights (meaningful where any submodel has data).
    """
    return weighted_heights(height_weights(valid, edge_distance_m, taper), z, valid)
