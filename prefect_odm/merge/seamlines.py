"""Seamlines on least-cost paths through the overlaps: one owner-label grid (pure core).

The ownership rule (:mod:`prefect_odm.ownership`, nearest core camera) puts each seam on a
straight bisector, through whatever stands there. Here each seam is moved, within a corridor
around the bisector where both submodels have data, onto the cut of least total cost, where the
cost of a cell is

    ``colour_diff / colour_scale_dn + object_weight * min(object_height_m, 10)
    + slope_weight * min(|grad z|, 5) + base_cost * (1 + 2 * off_bisector_m / corridor_m)``

from the two submodels' colour difference (digital numbers: the mean over RGB of their absolute
difference at ``fine_factor`` pixels per cell side, averaged over the cell), the height of an
object above its local ground (the DSM minus its grey opening over ``object_size_m``) and the
DSM's slope; so seams leave buildings, trees and misregistered texture for the ground between
them (the last term keeps a seam on the bisector where nothing else differs). The cut between
submodels ``a`` and ``b`` is a minimum s-t cut on the corridor's 4-connected
cell graph (edge capacity: mean cost of its two cells), source tied to the cells bordering ``a``'s
own area outside the corridor and sink to those bordering ``b``'s, solved by
:func:`scipy.sparse.csgraph.maximum_flow` (Dinic); this is the seam of Kwatra et al., "Graphcut
Textures", SIGGRAPH 2003, on a coarse grid. Pairs are cut in sorted order; each relabels only the
cells that pair owns.

The result, an :class:`OwnerLabels` raster at a coarse cell size, is the one ownership that the
orthophoto, the DEMs and the point cloud can share. :class:`LeastCostSeams` turns it into seam
distances for any output grid (a :class:`.seams.SeamMethod`): the signed distance to each
submodel's labelled area, exact on the coarse cells (:func:`scipy.ndimage.distance_transform_edt`)
and interpolated bilinearly per output pixel, so any block layout gives identical pixels.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
from numpy.typing import NDArray
from scipy import ndimage
from scipy.sparse import coo_array, csr_array
from scipy.sparse.csgraph import breadth_first_order, maximum_flow

from prefect_odm.grid import Block, Grid
from prefect_odm.merge.balance import CoarseOffset, seam_colour_offsets
from prefect_odm.merge.seamline_cost import CoarseLayers, SeamlineCost, cell_cost
from prefect_odm.merge.seams import SeamField, blend_weights
from prefect_odm.ownership import Ownership

__all__ = [
    "CoarseLayers",
    "LabelOwners",
    "LeastCostSeams",
    "OwnerLabels",
    "SeamlineCost",
    "least_cost_labels",
    "min_cut",
    "ownership_labels",
    "sample_cells",
]

_BIG = 1 << 28
"""Capacity of the terminal links (never cut)."""
_CAPACITY_PER_COST = 100
"""Integer capacity of one unit of cell cost (maximum_flow takes integers)."""


@dataclass(frozen=True)
class OwnerLabels:
    """Owner of each cell of a coarse grid.

    Attributes:
        submodel_ids: the owners, sorted; ``labels`` index into them.
        grid: the coarse grid, in the merge's CRS.
        labels: ``(grid.height, grid.width)`` int16 index into ``submodel_ids``, -1 without data.
        colour_offsets: per submodel its additive colour offsets along the seams (or None), or
            None when colours are not corrected along seams.
    """

    submodel_ids: tuple[str, ...]
    grid: Grid
    labels: NDArray[np.int16]
    colour_offsets: tuple[CoarseOffset | None, ...] | None = None

    def label_of_points(
        self, x: NDArray[np.floating], y: NDArray[np.floating]
    ) -> NDArray[np.int16]:
        """Label of the cell under each point (-1 outside the grid or without an owner)."""
        res = self.grid.resolution_m
        col = np.floor((np.asarray(x) - self.grid.left) / res).astype(np.int64)
        row = np.floor((self.grid.top - np.asarray(y)) / res).astype(np.int64)
        inside = (row >= 0) & (row < self.grid.height) & (col >= 0) & (col < self.grid.width)
        out = np.full(np.shape(x), -1, dtype=np.int16)
        out[inside] = self.labels[row[inside], col[inside]]
        return out


def ownership_labels(
    ownership: Ownership, layers: CoarseLayers
) -> tuple[NDArray[np.int16], NDArray[np.float32]]:
    """Nearest-core-camera labels among the submodels with data, and their seam distances.

    Returns:
        ``(labels, e)``: ``(rows, cols)`` int16 (-1 where no submodel has data) and
        ``(k, rows, cols)`` float32 :class:`.seams.SeamField` distances, metres.
    """
    g = layers.grid
    ids = list(ownership.submodel_ids)
    e = SeamField(ownership, g, lattice_step_px=1).seam_distance(
        Block(0, 0, g.height, g.width), ids
    )
    valid = np.stack([layers.valid(sid) for sid in ids])
    masked = np.where(valid, e, np.float32(np.inf))
    labels = np.argmin(masked, axis=0).astype(np.int16)
    labels[~valid.any(axis=0)] = -1
    return labels, e


def _grid_edges(
    index: NDArray[np.int64], cost: NDArray[np.float32]
) -> tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.int64]]:
    """Both directions of every 4-neighbour edge between corridor cells (``index >= 0``)."""
    src: list[NDArray[np.int64]] = []
    dst: list[NDArray[np.int64]] = []
    cap: list[NDArray[np.int64]] = []
    for p, q, cp, cq in (
        (index[:, :-1], index[:, 1:], cost[:, :-1], cost[:, 1:]),
        (index[:-1, :], index[1:, :], cost[:-1, :], cost[1:, :]),
    ):
        both = (p >= 0) & (q >= 0)
        c = np.rint(_CAPACITY_PER_COST * 0.5 * (cp[both] + cq[both])).astype(np.int64) + 1
        src += [p[both], q[both]]
        dst += [q[both], p[both]]
        cap += [c, c]
    return np.concatenate(src), np.concatenate(dst), np.concatenate(cap)


def _touches(mask: NDArray[np.bool_]) -> NDArray[np.bool_]:
    """Cells 4-adjacent to ``mask``."""
    return np.asarray(
        ndimage.binary_dilation(mask, structure=ndimage.generate_binary_structure(2, 1))
    )


def min_cut(
    corridor: NDArray[np.bool_],
    side_a: NDArray[np.bool_],
    side_b: NDArray[np.bool_],
    cost: NDArray[np.float32],
) -> tuple[NDArray[np.bool_], NDArray[np.bool_]]:
    """The minimum cut of a corridor between the cells bordering two areas.

    Args:
        corridor: ``(rows, cols)`` cells the seam may run through.
        side_a, side_b: ``(rows, cols)`` the two areas outside the corridor (disjoint).
        cost: ``(rows, cols)`` cell costs (> 0).

    Returns:
        ``(to_a, to_b)``: corridor cells on ``a``'s side of the cut (those the residual graph
        reaches from ``a``) and on ``b``'s (the rest of every corridor part that borders either
        area; parts that border neither are in neither).
    """
    index = np.full(corridor.shape, -1, dtype=np.int64)
    n = int(corridor.sum())
    index[corridor] = np.arange(n)
    near_a = corridor & _touches(side_a)
    near_b = corridor & _touches(side_b) & ~near_a
    s, t = n, n + 1
    src, dst, cap = _grid_edges(index, cost)
    ia, ib = index[near_a], index[near_b]
    src = np.concatenate([src, np.full(ia.size, s), ib])
    dst = np.concatenate([dst, ia, np.full(ib.size, t)])
    cap = np.concatenate([cap, np.full(ia.size + ib.size, _BIG)])
    graph = csr_array(coo_array((cap.astype(np.int32), (src, dst)), shape=(n + 2, n + 2)))
    flow = maximum_flow(graph, s, t, method="dinic").flow
    residual = csr_array(graph - flow)
    residual.data = np.where(residual.data > 0, 1, 0).astype(np.int32)
    residual.eliminate_zeros()
    reach_a = breadth_first_order(residual, s, directed=True, return_predecessors=False)
    flat_a = np.zeros(n + 2, dtype=bool)
    flat_a[reach_a] = True
    parts, _ = ndimage.label(corridor)
    tied = np.isin(parts, np.unique(parts[near_a | near_b])) & corridor
    to_a = np.zeros(corridor.shape, dtype=bool)
    to_a[corridor] = flat_a[:n]
    to_b = tied & ~to_a
    return to_a, to_b


def _neighbour_pairs(labels: NDArray[np.int16]) -> list[tuple[int, int]]:
    """Label pairs ``(i < j)`` that touch (4-neighbours), sorted."""
    pairs: set[tuple[int, int]] = set()
    for p, q in ((labels[:, :-1], labels[:, 1:]), (labels[:-1, :], labels[1:, :])):
        diff = (p != q) & (p >= 0) & (q >= 0)
        for i, j in zip(p[diff].tolist(), q[diff].tolist(), strict=True):
            pairs.add((min(i, j), max(i, j)))
    return sorted(pairs)


def least_cost_labels(
    ownership: Ownership,
    layers: CoarseLayers,
    weights: SeamlineCost | None = None,
    *,
    seam_colour: bool = False,
) -> OwnerLabels:
    """The owner-label grid with every seam moved onto its least-cost cut.

    Args:
        ownership: the ownership rule (nearest core camera), in the layers' CRS.
        layers: colour and/or DSM of each submodel on one coarse grid.
        weights: the cost weights and the corridor width; None for the defaults.
        seam_colour: also compute the colour offsets along the final seams
            (:func:`.balance.seam_colour_offsets`).

    Returns:
        The :class:`OwnerLabels` (the ownership's labels where no seam moved).
    """
    w = weights or SeamlineCost()
    ids = list(ownership.submodel_ids)
    labels, e = ownership_labels(ownership, layers)
    original = labels.copy()
    valid = {sid: layers.valid(sid) for sid in ids}
    for i, j in _neighbour_pairs(original):
        a, b = ids[i], ids[j]
        in_ab = ((original == i) & (e[j] <= w.corridor_m)) | (
            (original == j) & (e[i] <= w.corridor_m)
        )
        corridor = in_ab & valid[a] & valid[b] & ((labels == i) | (labels == j))
        if not corridor.any():
            continue
        off_bisector = np.where(original == i, e[j], e[i]) / w.corridor_m
        cost = cell_cost(a, b, layers, w) + np.float32(2.0 * w.base_cost) * off_bisector
        to_a, to_b = min_cut(
            corridor, (original == i) & ~corridor, (original == j) & ~corridor, cost
        )
        labels[to_a] = i
        labels[to_b] = j
    offsets = None
    if seam_colour and layers.rgb:
        rgb = [layers.rgb.get(sid) for sid in ids]
        offsets = tuple(seam_colour_offsets(labels, rgb, layers.grid.resolution_m))
    return OwnerLabels(tuple(ids), layers.grid, labels, offsets)


@dataclass(frozen=True)
class _SignedDistance:
    """Signed distance (cells) to one submodel's area over a crop of the label grid, shifted
    so that it is 0 on the area's edge: ``> 0`` outside, ``< 0`` inside."""

    row_off: int
    col_off: int
    values: NDArray[np.float32]


def _signed_distance(labels: NDArray[np.int16], label: int, margin: int) -> _SignedDistance | None:
    inside = labels == label
    if not inside.any():
        return None
    rows, cols = np.nonzero(inside)
    r0, r1 = max(0, rows.min() - margin), min(labels.shape[0], rows.max() + margin + 1)
    c0, c1 = max(0, cols.min() - margin), min(labels.shape[1], cols.max() + margin + 1)
    sub = inside[r0:r1, c0:c1]
    s = ndimage.distance_transform_edt(~sub) - ndimage.distance_transform_edt(sub)
    shifted = s - 0.5 * np.sign(s)
    return _SignedDistance(int(r0), int(c0), shifted.astype(np.float32))


def sample_cells(
    values: NDArray[np.float32],
    row_off: int,
    col_off: int,
    cells: Grid,
    grid: Grid,
    block: Block,
) -> tuple[NDArray[np.float64], NDArray[np.bool_]]:
    """Bilinear interpolation of coarse-cell values at the pixel centres of a block.

    Args:
        values: ``(c, h, w)`` values at the centres of a crop of ``cells``.
        row_off, col_off: the crop's offset in ``cells``.
        cells: the coarse grid.
        grid: the output grid (same CRS).
        block: the window of ``grid``.

    Returns:
        ``(c, block.height, block.width)`` values (edge values held beyond the crop) and
        ``(block.height, block.width)`` True for pixels outside the crop.
    """
    rows = np.arange(block.row_off, block.row_off + block.height)
    cols = np.arange(block.col_off, block.col_off + block.width)
    v = (cells.top - (grid.top - (rows + 0.5) * grid.resolution_m)) / cells.resolution_m
    u = (grid.left + (cols + 0.5) * grid.resolution_m - cells.left) / cells.resolution_m
    v, u = v - 0.5 - row_off, u - 0.5 - col_off
    h, w = values.shape[1:]
    vi = np.clip(np.floor(v).astype(np.int64), 0, max(h - 2, 0))
    ui = np.clip(np.floor(u).astype(np.int64), 0, max(w - 2, 0))
    vf = np.clip(v - vi, 0.0, 1.0)[:, None]
    uf = np.clip(u - ui, 0.0, 1.0)[None, :]
    v1, u1 = np.minimum(vi + 1, h - 1), np.minimum(ui + 1, w - 1)
    val = values.astype(np.float64)
    top = (1 - uf) * val[:, vi][:, :, ui] + uf * val[:, vi][:, :, u1]
    bot = (1 - uf) * val[:, v1][:, :, ui] + uf * val[:, v1][:, :, u1]
    out = (1 - vf) * top + vf * bot
    outside = ((v < -0.5) | (v > h - 0.5))[:, None] | ((u < -0.5) | (u > w - 0.5))[None, :]
    return out, outside


@dataclass(frozen=True)
class LeastCostSeams:
    """A :class:`.seams.SeamMethod` whose seams are the edges of an :class:`OwnerLabels` grid.

    ``e_k`` is the distance from a pixel to submodel ``k``'s labelled area (0 inside it),
    interpolated bilinearly from the coarse cells; beyond ``margin_m`` of that area it is
    ``margin_m`` plus the ownership's own seam distance (so the fallback where an owner has no
    data still picks the nearest submodel). Weights are :func:`.seams.blend_weights`.

    Args:
        labels: the owner-label grid (same CRS as ``grid``).
        ownership: the ownership rule the labels were made from.
        grid: the output grid.
        lattice_step_px: step of the ownership's seam-distance lattice, pixels.
        margin_m: distance from each area up to which ``e_k`` is exact, metres.
    """

    labels: OwnerLabels
    ownership: Ownership
    grid: Grid
    lattice_step_px: int = 8
    margin_m: float = 30.0
    compiled: bool = False
    _field: SeamField = field(init=False, repr=False)
    _distance: dict[str, _SignedDistance | None] = field(init=False, repr=False)
    linear_feather: ClassVar[bool] = True
    """Its :meth:`weights` are :func:`.seams.blend_weights` (see
    :attr:`.seams.OwnershipSeams.linear_feather`)."""

    def __post_init__(self) -> None:
        """Build the seam field and each submodel's signed distance to its label's edge."""
        object.__setattr__(
            self,
            "_field",
            SeamField(self.ownership, self.grid, self.lattice_step_px, self.compiled),
        )
        margin = int(np.ceil(self.margin_m / self.labels.grid.resolution_m)) + 2
        lab = self.labels.labels
        dist = {
            sid: _signed_distance(lab, n, margin) for n, sid in enumerate(self.labels.submodel_ids)
        }
        object.__setattr__(self, "_distance", dist)

    def colour_offsets(
        self, block: Block, submodel_ids: Sequence[str]
    ) -> NDArray[np.float32] | None:
        """``(k, bands, rows, cols)`` additive colour offsets along the seams (DN), or None
        when the labels carry none (:func:`.balance.seam_colour_offsets`)."""
        offsets = self.labels.colour_offsets
        if offsets is None:
            return None
        index = {sid: n for n, sid in enumerate(self.labels.submodel_ids)}
        out = np.zeros((len(submodel_ids), 3, block.height, block.width), dtype=np.float32)
        for n, sid in enumerate(submodel_ids):
            off = offsets[index[sid]] if sid in index else None
            if off is not None:
                vals, outside = sample_cells(
                    off.values, off.row_off, off.col_off, self.labels.grid, self.grid, block
                )
                out[n] = np.where(outside, 0.0, vals)
        return out

    def seam_distance(self, block: Block, submodel_ids: Sequence[str]) -> NDArray[np.float32]:
        """See :meth:`.seams.SeamMethod.seam_distance`.

        Raises:
            KeyError: a submodel the ownership does not know.
        """
        base = self._field.seam_distance(block, submodel_ids)
        out = np.empty_like(base)
        for n, sid in enumerate(submodel_ids):
            d = self._distance.get(sid)
            if sid not in self.ownership.submodel_ids:
                raise KeyError(sid)
            far = self.margin_m + base[n].astype(np.float64)
            if d is None:
                e = far
            else:
                vals, outside = sample_cells(
                    d.values[None], d.row_off, d.col_off, self.labels.grid, self.grid, block
                )
                e = np.where(
                    outside, np.inf, np.maximum(vals[0], 0.0) * self.labels.grid.resolution_m
                )
            out[n] = np.where(e <= self.margin_m, e, far).astype(np.float32)
        return out

    def weights(
        self, seam_distance_m: NDArray[np.float32], valid: NDArray[np.bool_], feather_m: float
    ) -> NDArray[np.float32]:
        """See :func:`.seams.blend_weights`."""
        return blend_weights(seam_distance_m, valid, feather_m)


class LabelOwners:
    """Point-cloud ownership that follows an :class:`OwnerLabels` grid.

    A point takes the owner of the label cell under it; outside the grid, in cells without an
    owner, or in cells of a submodel the ownership does not know, the ownership rule (nearest
    core camera) decides. The same ``label_of_points`` as :class:`.pointcloud.CellOwners`.

    Args:
        labels: the merge's owner labels, in the point cloud's CRS.
        ownership: the ownership rule; labels index into its ``submodel_ids``.
    """

    def __init__(self, labels: OwnerLabels, ownership: Ownership) -> None:
        """Map the labels' submodel ids onto the ownership's (an id the ownership lacks owns
        nothing)."""
        index = {sid: n for n, sid in enumerate(ownership.submodel_ids)}
        mapped = [index.get(sid, -1) for sid in labels.submodel_ids]
        self._map = np.array([*mapped, -1], dtype=np.int32)  # label -1 -> the last entry
        self._labels = labels
        self._ownership = ownership

    def label_of_points(self, x: NDArray[np.float64], y: NDArray[np.float64]) -> NDArray[np.int32]:
        """Owner index (into ``ownership.submodel_ids``) of each point, shape of ``x``."""
        out = self._map[self._labels.label_of_points(x, y).astype(np.int64)]
        unsure = out < 0
        if unsure.any():
            out[unsure] = self._ownership.label_of_points(x[unsure], y[unsure])
        return out
