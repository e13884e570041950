"""The raster merges' per-pixel interpolations, compiled (numba): one pass where numpy needs
several (pure: numpy and numba, no files).

Two bilinear interpolations held about a third of the DEM merge's blending CPU (RESULTS.md,
h39d): the seam distances of :class:`.seams.SeamField` (a lattice of exact distances, every
``lattice_step_px``-th pixel, interpolated to each pixel of a strip; six float64 passes per
submodel, two of them gathers) and the edge distances of
:meth:`.edge_distances.EdgeDistance.sample` (a decimated distance transform interpolated to
each pixel; eight float64 passes). Each kernel computes, per pixel, the same float64 operations
in the same order as those numpy passes and rounds to float32 once, as they do, so the merged
pixels are the same bit for bit (``tests/merge/test_raster_kernels.py`` holds the numpy rules
as the reference). Compiled on first use and cached beside this module (``cache=True``);
``nogil``, so the block threads run them at once.
"""

from __future__ import annotations

from typing import Any

import numba
import numpy as np
from numpy.typing import NDArray

_jit = numba.njit(cache=True, nogil=True)


def _seam_rows(
    rows_k: Any, rows_min: Any, col_cell: Any, col_frac: Any, out: Any
) -> None:  # pragma: no cover - compiled
    for i in range(out.shape[0]):
        for j in range(out.shape[1]):
            c, f = col_cell[j], col_frac[j]
            g = 1.0 - f
            d_k = g * rows_k[i, c] + f * rows_k[i, c + 1]
            d_min = g * rows_min[i, c] + f * rows_min[i, c + 1]
            out[i, j] = np.float32(0.5 * (d_k - d_min))


_seam_rows_jit = _jit(_seam_rows)


def seam_columns(
    rows_k: NDArray[np.float64],
    rows_min: NDArray[np.float64],
    col_cell: NDArray[np.intp],
    col_frac: NDArray[np.float64],
    out: NDArray[np.float32],
) -> None:
    """``out = float32(0.5 * (interp(rows_k) - interp(rows_min)))``, the interpolation along
    the columns of :meth:`.seams.SeamField.seam_distance` (``(1 - f) * a[:, c] + f * a[:, c +
    1]`` for each output column's lattice cell ``c`` and fraction ``f``).

    Args:
        rows_k: ``(rows, lattice_cols)`` the submodel's camera distances, already interpolated
            along the rows, metres.
        rows_min: the same of the nearest camera of any submodel, metres.
        col_cell: ``(cols,)`` each output column's lattice column (from 0).
        col_frac: ``(cols,)`` its fraction towards the next lattice column.
        out: ``(rows, cols)`` float32, written (the seam distance ``e_k``, metres).
    """
    _seam_rows_jit(rows_k, rows_min, col_cell, col_frac, out)


def _bilinear(
    sub: Any, r0: Any, c0: Any, wr1: Any, wc1: Any, out: Any
) -> None:  # pragma: no cover - compiled
    for i in range(out.shape[0]):
        top, bottom = r0[i], r0[i] + 1
        a1 = wr1[i]
        a0 = 1.0 - a1
        for j in range(out.shape[1]):
            c = c0[j]
            b1 = wc1[j]
            b0 = 1.0 - b1
            v = np.float64(sub[top, c]) * a0 * b0
            v += np.float64(sub[top, c + 1]) * a0 * b1
            v += np.float64(sub[bottom, c]) * a1 * b0
            v += np.float64(sub[bottom, c + 1]) * a1 * b1
            out[i, j] = np.float32(v)


_bilinear_jit = _jit(_bilinear)


def bilinear_sample(
    values: NDArray[np.float32],
    row_cell: NDArray[np.intp],
    col_cell: NDArray[np.intp],
    row_frac: NDArray[np.float64],
    col_frac: NDArray[np.float64],
) -> NDArray[np.float32]:
    """Bilinear samples of a float32 grid with the arithmetic of
    ``scipy.ndimage.map_coordinates(order=1)`` (the four corners' ``value * w_row * w_col``
    summed in float64 in the same order, rounded to float32 once), on separable rows and
    columns.

    Args:
        values: ``(rows, cols)`` float32 grid.
        row_cell, col_cell: each sample row's and column's upper-left cell in ``values``
            (``cell + 1`` must be inside it).
        row_frac, col_frac: their fractions towards the next cell.

    Returns:
        ``(len(row_cell), len(col_cell))`` float32.
    """
    out = np.empty((len(row_cell), len(col_cell)), dtype=np.float32)
    _bilinear_jit(values, row_cell, col_cell, row_frac, col_frac, out)
    return out


def _blend_strip(  # noqa: C901 - one loop nest: per-pixel helper calls cost 3-4x here
    z: Any, valid: Any, edt: Any, e: Any, flags: Any, scale: Any, dem: Any, measured: Any
) -> int:  # pragma: no cover - compiled
    k, rows, cols = z.shape
    zero, one, floor = np.float32(0.0), np.float32(1.0), np.float32(1e-6)
    w = np.empty(k, dtype=np.float32)
    pixels = 0
    for i in range(rows):
        for j in range(cols):
            present = False
            for n in range(k):
                present = present or valid[n, i, j]
            if not present:
                continue
            pixels += 1
            # the seam weights (.seams.blend_weights)
            total = zero
            for n in range(k):
                t = zero
                if scale > 0 and valid[n, i, j]:
                    t = min(max(one - scale * e[n, i, j], zero), one)
                w[n] = t
                total = t if n == 0 else total + t
            if total <= 0:  # no weight but data: the valid submodel of the smallest e (first)
                pick, best = 0, np.float32(np.inf)
                for n in range(k):
                    v = e[n, i, j] if valid[n, i, j] else np.float32(np.inf)
                    if n == 0 or v < best:
                        pick, best = n, v
                w[pick], total = one, one
            if total > 0:
                for n in range(k):
                    w[n] = w[n] / total
            # times the edge distances (.blend.height_weights)
            total = zero
            for n in range(k):
                w[n] = w[n] * max(edt[n, i, j], floor)
                total = w[n] if n == 0 else total + w[n]
            if total <= 0:
                for n in range(k):
                    w[n] = max(edt[n, i, j], floor) if valid[n, i, j] else zero
                    total = w[n] if n == 0 else total + w[n]
            if total > 0:
                for n in range(k):
                    w[n] = w[n] / total
            # the weighted sums (.blend.weighted_heights), 0 where a submodel has no data
            height = flag = zero
            for n in range(k):
                zn = z[n, i, j] if valid[n, i, j] else zero
                fn = flags[n, i, j] if valid[n, i, j] else zero
                height = w[n] * zn if n == 0 else height + w[n] * zn
                flag = w[n] * fn if n == 0 else flag + w[n] * fn
            dem[i, j] = height
            if measured.shape[0]:
                measured[i, j] = one if flag >= 0.5 else zero
    return pixels


_blend_strip_jit = _jit(_blend_strip)


def blend_heights(
    z: NDArray[np.float32],
    valid: NDArray[np.bool_],
    edge_distance_m: NDArray[np.float32],
    seam_distance_m: NDArray[np.float32],
    flags: NDArray[np.float32] | None,
    feather_m: float,
    dem: NDArray[np.float32],
    measured: NDArray[np.float32] | None,
) -> int:
    """Heights (and measured flags) of one strip blended as the DEM merge's numpy passes blend
    them, in one pass per pixel: the linear feathering of :func:`.seams.blend_weights` times
    the edge distances (:func:`.blend.height_weights`), the weighted sums of
    :func:`.blend.weighted_heights` (the same float32 operations in the same order, so the
    same bits).

    Args:
        z: ``(k, rows, cols)`` heights, metres (any value where not valid).
        valid: ``(k, rows, cols)`` data masks.
        edge_distance_m: ``(k, rows, cols)`` distance to each source's data edge, metres.
        seam_distance_m: ``(k, rows, cols)`` seam distances ``e_k``, metres.
        flags: ``(k, rows, cols)`` measured flags, or None.
        feather_m: width of the blending band around the seams, metres (0: hard seams).
        dem: ``(rows, cols)`` written where any source is valid.
        measured: ``(rows, cols)`` written there (1 measured, 0 not) when ``flags`` is given.

    Returns:
        The pixels written (where any source is valid).
    """
    scale = np.float32(2.0 / feather_m) if feather_m > 1e-6 else np.float32(0.0)
    if flags is None or measured is None:
        flags = np.zeros((1, 1, 1), dtype=np.float32)
        measured = np.zeros((0, 0), dtype=np.float32)
        flags = np.broadcast_to(flags, z.shape)
    return int(
        _blend_strip_jit(z, valid, edge_distance_m, seam_distance_m, flags, scale, dem, measured)
    )
