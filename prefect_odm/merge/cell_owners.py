"""Which submodel owns each point: a lookup table where the owner is certain, exact k-d tree
queries near seams (numpy and scipy; the point-cloud merge's cropping)."""

from __future__ import annotations

import math
from typing import Any

import numba
import numpy as np
from numpy.typing import NDArray
from scipy.spatial import cKDTree

from prefect_odm.ownership import Ownership


class CellOwners:
    """:meth:`Ownership.label_of_points` sped up by a grid of cells whose owner is certain.

    A cell of half-diagonal ``r`` centred at ``p`` belongs wholly to the owner ``L`` of ``p``
    when the nearest camera of any other submodel is more than ``2 r`` farther from ``p`` than
    ``p``'s nearest camera (triangle inequality). Points in such cells take ``L`` from a table;
    the others (near seams, or outside the grid) are queried exactly in the k-d tree. Same rule,
    same tree, hence the same labels as :meth:`Ownership.label_of_points`.

    Args:
        ownership: the ownership rule.
        bounds: ``(xmin, ymin, xmax, ymax)`` the points are expected in, CRS units.
        max_cells: number of cells of the table (memory about 20 bytes per cell at build).
    """

    def __init__(
        self,
        ownership: Ownership,
        bounds: tuple[float, float, float, float],
        max_cells: int = 262_144,
    ) -> None:
        """Build the cell table from the cameras (the k-d tree stays for the cells near seams)."""
        index = {sid: n for n, sid in enumerate(ownership.submodel_ids)}
        self._labels = np.array([index[s] for s in ownership.camera_submodel], dtype=np.int32)
        self._tree = cKDTree(np.column_stack([ownership.x_m, ownership.y_m]).astype(np.float64))
        xmin, ymin, xmax, ymax = (float(v) for v in bounds)
        width = max(xmax - xmin, 1e-6)
        height = max(ymax - ymin, 1e-6)
        cell = max(math.sqrt(width * height / max_cells), 1e-3)
        self._x0, self._y0, self._cell = xmin, ymin, cell
        self._nx = int(math.ceil(width / cell)) + 1
        self._ny = int(math.ceil(height / cell)) + 1
        cx = xmin + (np.arange(self._nx) + 0.5) * cell
        cy = ymin + (np.arange(self._ny) + 0.5) * cell
        gx, gy = np.meshgrid(cx, cy)
        k = min(8, len(self._labels))
        dist, idx = self._tree.query(np.column_stack([gx.ravel(), gy.ravel()]), k=k)
        dist = np.asarray(dist, dtype=np.float64).reshape(-1, k)
        idx = np.asarray(idx).reshape(-1, k)
        labs = self._labels[idx]
        first = labs[:, 0]
        other = labs != first[:, None]
        d_other = np.where(other, dist, np.inf).min(axis=1)
        if k < len(self._labels):  # another submodel may lie beyond the k nearest
            d_other = np.minimum(d_other, np.where(other.any(axis=1), np.inf, dist[:, -1]))
        margin = 2.0 * (cell * math.sqrt(0.5)) * (1.0 + 1e-9) + 1e-9
        self._table = np.where(d_other - dist[:, 0] > margin, first, -1).astype(np.int32)

    def label_of_points(self, x: NDArray[np.float64], y: NDArray[np.float64]) -> NDArray[np.int32]:
        """Owner index (into ``ownership.submodel_ids``) of each point, shape of ``x``."""
        fx = np.floor((x - self._x0) / self._cell)
        fy = np.floor((y - self._y0) / self._cell)
        inside = (fx >= 0) & (fx < self._nx) & (fy >= 0) & (fy < self._ny)
        flat = np.where(inside, fy * self._nx + fx, 0).astype(np.int64)
        labels = self._table[flat]
        labels[~inside] = -1
        unsure = labels < 0
        if unsure.any():
            _, nearest = self._tree.query(np.column_stack([x[unsure], y[unsure]]), k=1)
            labels[unsure] = self._labels[nearest]
        return labels

    def label_of_integers(
        self,
        xy: tuple[NDArray[np.int32], NDArray[np.int32]],
        scales: NDArray[np.float64],
        offsets: NDArray[np.float64],
    ) -> NDArray[np.int32]:
        """:meth:`label_of_points` of points given by their integer LAS ``X, Y`` ``(n,)`` each,
        ``scales`` and ``offsets`` (laspy's scaling, in one compiled pass: no float arrays but
        those of the points near seams)."""
        grid = (self._x0, self._y0, self._cell, self._nx, self._ny)
        labels = table_labels(xy, scales, offsets, grid, self._table)
        unsure = np.flatnonzero(labels < 0)
        if unsure.size:
            x = xy[0][unsure] * scales[0] + offsets[0]
            y = xy[1][unsure] * scales[1] + offsets[1]
            _, nearest = self._tree.query(np.column_stack([x, y]), k=1)
            labels[unsure] = self._labels[nearest]
        return labels


def _table_labels(x: Any, y: Any, scales: Any, offsets: Any, table_grid: Any, table: Any) -> Any:
    x0, y0, cell, nx, ny = table_grid[0], table_grid[1], table_grid[2], table_grid[3], table_grid[4]
    labels = np.empty(x.size, dtype=np.int32)
    for i in range(x.size):
        fx = np.floor(((np.float64(x[i]) * scales[0] + offsets[0]) - x0) / cell)
        fy = np.floor(((np.float64(y[i]) * scales[1] + offsets[1]) - y0) / cell)
        if fx >= 0 and fx < nx and fy >= 0 and fy < ny:
            labels[i] = table[np.int64(fy * nx + fx)]
        else:
            labels[i] = -1
    return labels


_table_labels_jit = numba.njit(cache=True, nogil=True)(_table_labels)


def table_labels(
    xy: tuple[NDArray[np.int32], NDArray[np.int32]],
    scales: NDArray[np.float64],
    offsets: NDArray[np.float64],
    table_grid: tuple[float, float, float, int, int],
    table: NDArray[np.int32],
) -> NDArray[np.int32]:
    """The owners ``(n,)`` in ``table`` of points given by their integer ``X, Y`` ``(n,)`` each
    (any stride) and their ``scales`` and ``offsets`` (``(3,)`` or more; the floats of laspy's
    scaling), -1 where the table has none or the point is outside it.

    Args:
        xy: the integer coordinates.
        scales: the chunk's scales; offsets: its offsets (CRS units).
        table_grid: ``(x0, y0, cell, nx, ny)``: the table's lower corner and cell (CRS units)
            and its columns and rows; ``table`` is ``(ny * nx,)``, row by row, -1: not sure.
    """
    labels: NDArray[np.int32] = _table_labels_jit(
        xy[0],
        xy[1],
        np.asarray(scales, dtype=np.float64),
        np.asarray(offsets, dtype=np.float64),
        np.asarray(table_grid, dtype=np.float64),
        table,
    )
    return labels
