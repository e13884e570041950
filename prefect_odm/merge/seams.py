"""Seams, feathering, colour balancing and vertical offsets (pure core: numpy and scipy).

Seams follow the ownership rule of :mod:`prefect_odm.ownership` (nearest core camera). For each
submodel ``k`` and ground position ``p`` let ``d_k(p)`` be the distance from ``p`` to the nearest
core camera of ``k`` and ``d(p) = min_k d_k(p)``. The *seam distance*

    ``e_k(p) = (d_k(p) - d(p)) / 2``   (metres)

is zero for the owner of ``p``, zero for ``k`` on the seam between ``k`` and the owner, and grows
by one metre per metre walked into the owner's cell along the line joining the two cameras (it
is the exact distance to the bisector there and a lower bound elsewhere). Feathering gives
submodel ``k`` the weight ``max(0, 1 - 2 e_k / feather_m)``: the owner weighs 1, a neighbour
fades linearly to 0 within ``feather_m / 2`` of the seam, so blending happens only in a band
``feather_m`` wide around each seam. Where no submodel with data has a weight (the owner has a
hole far from any seam), the submodel with data and the smallest ``e_k`` is taken, so there is no
hole wherever any submodel has data.

``d_k`` is evaluated exactly on a lattice of every ``lattice_step_px``-th pixel centre anchored at
the grid origin and interpolated bilinearly in between. The lattice and the per-pixel arithmetic
do not depend on the block layout, so any block size or worker count gives identical pixels.

Colour balancing and vertical offsets are in :mod:`.balance`. How seams are placed is a
:class:`SeamMethod` chosen by name (:func:`seam_method`, from ``MergeOptions.seam_method``);
``ownership`` (:class:`OwnershipSeams`) is the one above; ``least-cost``
(:class:`.seamlines.LeastCostSeams`) moves each seam onto the least-cost cut through the overlap
and follows the resulting owner-label grid.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar, Protocol

import numpy as np
from numpy.typing import NDArray
from scipy.spatial import cKDTree

from prefect_odm.grid import Block, Grid
from prefect_odm.ownership import Ownership


@dataclass(frozen=True)
class SeamField:
    """Seam distances ``e_k`` of every submodel of an :class:`Ownership` over a grid.

    Args:
        ownership: the ownership rule (its cameras in the grid's CRS, metres).
        grid: the output grid.
        lattice_step_px: distance between exact evaluations, pixels (>= 1).
        compiled: interpolate in one compiled pass (:func:`.raster_kernels.seam_columns`, the
            same bits; numba's first use costs a process about 0.75 s and 108 MiB) instead of
            numpy's passes.
    """

    ownership: Ownership
    grid: Grid
    lattice_step_px: int = 8
    compiled: bool = False
    _trees: dict[str, cKDTree] = field(init=False, repr=False)
    _all: cKDTree = field(init=False, repr=False)

    def __post_init__(self) -> None:
        """Build one k-d tree of camera positions per submodel, and one of all.

        Raises:
            ValueError: ``lattice_step_px`` is below 1.
        """
        if self.lattice_step_px < 1:
            raise ValueError("lattice_step_px must be >= 1")
        xy = np.column_stack([self.ownership.x_m, self.ownership.y_m]).astype(np.float64)
        owners = np.asarray(self.ownership.camera_submodel)
        trees = {sid: cKDTree(xy[owners == sid]) for sid in self.ownership.submodel_ids}
        object.__setattr__(self, "_trees", trees)
        object.__setattr__(self, "_all", cKDTree(xy))

    def seam_distance(self, block: Block, submodel_ids: Sequence[str]) -> NDArray[np.float32]:
        """``e_k`` for each requested submodel over one block.

        Args:
            block: the window of :attr:`grid`.
            submodel_ids: submodels to evaluate; each must be an owner in the ownership.

        Returns:
            ``(len(submodel_ids), block.height, block.width)`` float32, metres.

        Raises:
            KeyError: a submodel id the ownership does not know.
        """
        s = self.lattice_step_px
        res = self.grid.resolution_m
        i0 = block.row_off // s
        i1 = (block.row_off + block.height - 1) // s + 1
        j0 = block.col_off // s
        j1 = (block.col_off + block.width - 1) // s + 1
        lat_rows = np.arange(i0, i1 + 1, dtype=np.float64) * s
        lat_cols = np.arange(j0, j1 + 1, dtype=np.float64) * s
        ly = self.grid.top - (lat_rows + 0.5) * res
        lx = self.grid.left + (lat_cols + 0.5) * res
        gx, gy = np.meshgrid(lx, ly)
        pts = np.column_stack([gx.ravel(), gy.ravel()])
        d_min = np.asarray(self._all.query(pts, k=1)[0], dtype=np.float64)
        rows = np.arange(block.row_off, block.row_off + block.height)
        cols = np.arange(block.col_off, block.col_off + block.width)
        ri = rows // s - i0
        rf = ((rows % s) / s).astype(np.float64)[:, None]
        ci = cols // s - j0
        cf = ((cols % s) / s).astype(np.float64)[None, :]

        def along_rows(values: NDArray[np.float64]) -> NDArray[np.float64]:
            lat = values.reshape(gx.shape)
            tmp: NDArray[np.float64] = (1.0 - rf) * lat[ri, :] + rf * lat[ri + 1, :]
            return tmp

        def interp(values: NDArray[np.float64]) -> NDArray[np.float64]:
            tmp = along_rows(values)
            val: NDArray[np.float64] = (1.0 - cf) * tmp[:, ci] + cf * tmp[:, ci + 1]
            return val

        out = np.empty((len(submodel_ids), block.height, block.width), dtype=np.float32)
        if self.compiled:
            from prefect_odm.merge.raster_kernels import seam_columns

            base = along_rows(d_min)
            for n, sid in enumerate(submodel_ids):
                d_k = np.asarray(self._trees[sid].query(pts, k=1)[0], dtype=np.float64)
                # float32(0.5 * (interp(d_k) - interp(d_min))) in one pass over the columns
                seam_columns(along_rows(d_k), base, ci, cf[0], out[n])
            return out
        base = interp(d_min)
        for n, sid in enumerate(submodel_ids):
            d_k = np.asarray(self._trees[sid].query(pts, k=1)[0], dtype=np.float64)
            out[n] = (0.5 * (interp(d_k) - base)).astype(np.float32)
        return out


def blend_weights(
    seam_distance_m: NDArray[np.float32], valid: NDArray[np.bool_], feather_m: float
) -> NDArray[np.float32]:
    """Normalised blending weights from seam distances and data masks.

    Args:
        seam_distance_m: ``(k, rows, cols)`` ``e_k`` in metres (see module docstring).
        valid: ``(k, rows, cols)`` True where submodel ``k`` has data.
        feather_m: width of the blending band around each seam, metres (0: hard seam).

    Returns:
        ``(k, rows, cols)`` float32 weights summing to 1 wherever any submodel is valid and to 0
        elsewhere. Ties go to the first submodel (callers pass submodels in sorted id order).
    """
    e = seam_distance_m
    if feather_m > 1e-6:
        w = np.clip(1.0 - (2.0 / feather_m) * e, 0.0, 1.0).astype(np.float32)
        w *= valid
        total = w.sum(axis=0)
    else:
        w = np.zeros(e.shape, dtype=np.float32)
        total = np.zeros(e.shape[1:], dtype=np.float32)
    missing = (total <= 0) & valid.any(axis=0)
    if missing.any():
        masked = np.where(valid, e, np.float32(np.inf))
        pick = np.argmin(masked, axis=0)
        for k in range(e.shape[0]):
            sel = missing & (pick == k)
            w[k][sel] = 1.0
        total = w.sum(axis=0)
    np.divide(w, total, out=w, where=total > 0)
    weights: NDArray[np.float32] = w
    return weights


def ownership_from_centres(centres: Mapping[str, tuple[float, float]]) -> Ownership:
    """An ownership for inputs without a split plan: one pseudo-camera per input.

    Each input is represented by the centre of its own data footprint (the centroid of its valid
    pixels, or of its points' bounding box), so the seams are the perpendicular bisectors of the
    centres (a Voronoi partition), which for inputs of similar size run through the middle of
    their overlaps.

    Raises:
        ValueError: no centres.
    """
    if not centres:
        raise ValueError("no input to derive an ownership from")
    ids = sorted(centres)
    return Ownership.from_cameras([(centres[s][0], centres[s][1], s) for s in ids])


class SeamMethod(Protocol):
    """Where the seams between submodels run and how submodels are weighted across them.

    A seam method is made for one ownership and one output grid (see :data:`SEAM_METHODS`); the
    merges ask it, block by block, for the seam distances and then for the blending weights. It
    must give the same values for a pixel whatever the block layout, so any ``block_size`` and
    worker count give identical products.
    """

    def seam_distance(self, block: Block, submodel_ids: Sequence[str]) -> NDArray[np.float32]:
        """``(len(submodel_ids), rows, cols)`` float32 distance from each pixel to the seam of
        each submodel, metres: 0 for the owner and on a seam, growing into the owner's cell.

        Raises:
            KeyError: a submodel the method does not know.
        """
        ...

    def weights(
        self, seam_distance_m: NDArray[np.float32], valid: NDArray[np.bool_], feather_m: float
    ) -> NDArray[np.float32]:
        """``(k, rows, cols)`` float32 weights from :meth:`seam_distance` and the data masks,
        summing to 1 wherever any submodel has data and to 0 elsewhere."""
        ...

    def colour_offsets(
        self, block: Block, submodel_ids: Sequence[str]
    ) -> NDArray[np.float32] | None:
        """``(len(submodel_ids), 3, rows, cols)`` float32 colour offsets (DN) added to each
        submodel after its gain and offset, or None for none."""
        ...


@dataclass(frozen=True)
class OwnershipSeams:
    """Seams on the ownership boundaries (nearest core camera), feathered linearly.

    Seam distances are those of :class:`SeamField`; weights are :func:`blend_weights`.

    Args:
        ownership: the ownership rule, in the grid's CRS.
        grid: the output grid.
        lattice_step_px: step of the exact seam-distance lattice, pixels.
        compiled: see :class:`SeamField`.
    """

    ownership: Ownership
    grid: Grid
    lattice_step_px: int = 8
    compiled: bool = False
    _field: SeamField = field(init=False, repr=False)
    linear_feather: ClassVar[bool] = True
    """Its :meth:`weights` are :func:`blend_weights` (the DEM merge then blends in one compiled
    pass, :func:`.raster_kernels.blend_heights`)."""

    def __post_init__(self) -> None:
        """Build the :class:`SeamField` the distances come from."""
        object.__setattr__(
            self,
            "_field",
            SeamField(self.ownership, self.grid, self.lattice_step_px, self.compiled),
        )

    def seam_distance(self, block: Block, submodel_ids: Sequence[str]) -> NDArray[np.float32]:
        """See :meth:`SeamField.seam_distance`."""
        return self._field.seam_distance(block, submodel_ids)

    def weights(
        self, seam_distance_m: NDArray[np.float32], valid: NDArray[np.bool_], feather_m: float
    ) -> NDArray[np.float32]:
        """See :func:`blend_weights`."""
        return blend_weights(seam_distance_m, valid, feather_m)

    def colour_offsets(
        self, block: Block, submodel_ids: Sequence[str]
    ) -> NDArray[np.float32] | None:
        """None: ownership seams correct colours by gain and offset only."""
        return None
