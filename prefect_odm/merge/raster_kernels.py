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
