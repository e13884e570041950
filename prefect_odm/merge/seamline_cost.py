"""The cost of a seamline through each coarse cell (pure core: numpy and scipy).

See :mod:`.seamlines` for the cost's terms and how the cut uses them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray
from scipy import ndimage

from prefect_odm.grid import Grid


@dataclass(frozen=True)
class SeamlineCost:
    """Weights of the cell cost (see the module docstring).

    Attributes:
        colour_scale_dn: colour difference counted as one unit of cost, DN.
        object_weight: cost per metre of object height above local ground.
        object_size_m: widest object (the grey opening's window), metres.
        slope_weight: cost per unit of DSM slope (m/m).
        base_cost: cost of every cell (keeps seams short where nothing differs).
        corridor_m: how far a seam may move from the ownership bisector, metres.
    """

    colour_scale_dn: float = 10.0
    object_weight: float = 1.0
    object_size_m: float = 20.0
    slope_weight: float = 0.5
    base_cost: float = 0.2
    corridor_m: float = 15.0


@dataclass(frozen=True)
class CoarseLayers:
    """What each submodel contributes to the seamline cost, on one coarse grid.

    Attributes:
        grid: the coarse grid (output CRS).
        rgb: submodel id -> ``(3, rows, cols)`` float32 colour, DN (NaN without data), or absent.
        dsm: submodel id -> ``(rows, cols)`` float32 heights, metres (NaN without data), or absent.
        fine: submodel id -> ``(3, rows * fine_factor, cols * fine_factor)`` uint8 colour at
            ``fine_factor`` pixels per cell side (for the texture difference), or absent.
        fine_factor: pixels of ``fine`` per cell side.
    """

    grid: Grid
    rgb: Mapping[str, NDArray[np.float32]]
    dsm: Mapping[str, NDArray[np.float32]]
    fine: Mapping[str, NDArray[np.uint8]] = field(default_factory=dict)
    fine_factor: int = 1

    def valid(self, sid: str) -> NDArray[np.bool_]:
        """Cells where ``sid`` has data (colour where given, else heights)."""
        if sid in self.rgb:
            return np.asarray(np.isfinite(self.rgb[sid]).all(axis=0))
        if sid in self.dsm:
            return np.asarray(np.isfinite(self.dsm[sid]))
        return np.zeros((self.grid.height, self.grid.width), dtype=bool)


def _object_height(z: NDArray[np.float32], size_cells: int) -> NDArray[np.float32]:
    """Height above local ground (z minus its grey opening), metres; 0 where z is NaN."""
    filled = np.where(np.isfinite(z), z, np.nanmin(z) if np.isfinite(z).any() else 0.0)
    ground = ndimage.grey_opening(filled, size=(size_cells, size_cells))
    h = np.where(np.isfinite(z), filled - ground, 0.0)
    return np.asarray(h, dtype=np.float32)


def _slope(z: NDArray[np.float32], cell_m: float) -> NDArray[np.float32]:
    """|grad z| (m/m); 0 where z or a neighbour is NaN."""
    gy, gx = np.gradient(z.astype(np.float64), cell_m)
    s = np.hypot(gx, gy)
    return np.asarray(np.where(np.isfinite(s), s, 0.0), dtype=np.float32)


def cell_cost(a: str, b: str, layers: CoarseLayers, weights: SeamlineCost) -> NDArray[np.float32]:
    """Cost of a seam between ``a`` and ``b`` through each cell (see the module docstring).

    Returns:
        ``(rows, cols)`` float32, >= ``weights.base_cost``; terms without data count 0.
    """
    g = layers.grid
    cost = np.full((g.height, g.width), weights.base_cost, dtype=np.float32)
    if a in layers.fine and b in layers.fine:
        f = layers.fine_factor
        pixel = np.abs(layers.fine[a].astype(np.float32) - layers.fine[b]).mean(axis=0)
        diff = pixel.reshape(g.height, f, g.width, f).mean(axis=(1, 3))
        diff = ndimage.uniform_filter(diff, size=3)
        cost += np.minimum(diff / weights.colour_scale_dn, 25.0).astype(np.float32)
    elif a in layers.rgb and b in layers.rgb:
        diff = np.abs(layers.rgb[a] - layers.rgb[b]).mean(axis=0)
        diff = ndimage.uniform_filter(np.nan_to_num(diff, nan=0.0), size=3)
        cost += np.minimum(diff / weights.colour_scale_dn, 25.0).astype(np.float32)
    size = max(3, int(round(weights.object_size_m / g.resolution_m)) | 1)
    for sid in (a, b):
        z = layers.dsm.get(sid)
        if z is None:
            continue
        cost += weights.object_weight * np.minimum(_object_height(z, size), 10.0)
        cost += weights.slope_weight * np.minimum(_slope(z, g.resolution_m), 5.0)
    return cost
