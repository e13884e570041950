"""Which submodel owns a ground position (pure core: numpy and scipy only).

A ground position belongs to the submodel whose *core* camera is nearest to it in the plan CRS
(a Voronoi partition of the camera positions, grouped by submodel). The orthophoto seams, the DEM
blending and the point-cloud cropping all use this one rule, so the merged products agree on
who owns what. Restricting the owners to a subset (e.g. only the submodels that finished) gives
the partition among those.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray
from scipy.spatial import cKDTree


@dataclass(frozen=True)
class Ownership:
    """Nearest-core-camera ownership over a set of submodels.

    Args:
        x_m, y_m: camera positions in the plan CRS, metres, shape ``(n,)``.
        submodel_ids: the owning submodel id of each camera, length ``n``.
    """

    x_m: NDArray[np.float64]
    y_m: NDArray[np.float64]
    camera_submodel: tuple[str, ...]
    submodel_ids: tuple[str, ...] = field(init=False)
    _labels: NDArray[np.int32] = field(init=False, repr=False)
    _tree: cKDTree = field(init=False, repr=False)

    def __post_init__(self) -> None:
        """Sort the submodel ids, label each camera and build the k-d tree of positions.

        Raises:
            ValueError: no camera.
        """
        if len(self.x_m) == 0:
            raise ValueError("ownership needs at least one camera")
        ids = tuple(sorted(set(self.camera_submodel)))
        index = {sid: i for i, sid in enumerate(ids)}
        object.__setattr__(self, "submodel_ids", ids)
        object.__setattr__(
            self, "_labels", np.array([index[s] for s in self.camera_submodel], dtype=np.int32)
        )
        object.__setattr__(
            self, "_tree", cKDTree(np.column_stack([self.x_m, self.y_m]).astype(np.float64))
        )

    @classmethod
    def from_cameras(
        cls,
        cameras: Iterable[tuple[float, float, str]],
        only: Sequence[str] | None = None,
    ) -> Ownership:
        """Build from ``(x_m, y_m, submodel_id)`` triples, optionally keeping only some owners."""
        keep = set(only) if only is not None else None
        rows = [(x, y, s) for x, y, s in cameras if keep is None or s in keep]
        if not rows:
            raise ValueError("no camera belongs to the requested submodels")
        x = np.array([r[0] for r in rows], dtype=np.float64)
        y = np.array([r[1] for r in rows], dtype=np.float64)
        return cls(x, y, tuple(r[2] for r in rows))

    def label_of_points(
        self, x: NDArray[np.floating], y: NDArray[np.floating]
    ) -> NDArray[np.int32]:
        """Index into :attr:`submodel_ids` of the owner of each point (same shape as ``x``)."""
        xy = np.column_stack([np.ravel(x), np.ravel(y)])
        _, nearest = self._tree.query(xy, k=1)
        return self._labels[nearest].reshape(np.shape(x))

    def owner_of_points(self, x: NDArray[np.floating], y: NDArray[np.floating]) -> NDArray[np.str_]:
        """Owner submodel id of each point."""
        return np.asarray(self.submodel_ids)[self.label_of_points(x, y)]

    def label_grid(self, transform: Sequence[float], height: int, width: int) -> NDArray[np.int32]:
        """Owner label of each pixel centre of a north-up grid.

        Args:
            transform: affine ``(a, b, c, d, e, f)`` as in rasterio (``x = a*col + b*row + c``).
            height, width: grid shape in pixels.

        Returns:
            ``(height, width)`` int32 array of indices into :attr:`submodel_ids`.
        """
        a, b, c, d, e, f = (float(v) for v in tuple(transform)[:6])
        cols = np.arange(width, dtype=np.float64) + 0.5
        rows = np.arange(height, dtype=np.float64) + 0.5
        cc, rr = np.meshgrid(cols, rows)
        x = a * cc + b * rr + c
        y = d * cc + e * rr + f
        return self.label_of_points(x, y)
