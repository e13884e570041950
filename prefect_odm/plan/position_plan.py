"""A split of raw positions, and the merge of parts that process the same positions (pure core).

:class:`PositionPlan` is what :func:`prefect_odm.plan.planning.plan_from_positions` returns;
:func:`merge_duplicate_parts` makes one part of every group of parts with identical image sets
(issue 13).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import shapely
from numpy.typing import NDArray
from shapely.geometry.base import BaseGeometry

from prefect_odm.plan.checks import (
    find_duplicate_submodels,
    kept_submodel_of,
    overlap_warning,
)


@dataclass(frozen=True)
class PositionPlan:
    """A split of raw positions (indices refer to the input arrays, coordinates are absolute).

    Attributes:
        labels: ``(n,)`` core part of each input position, parts numbered in spatial order.
        members: per part, sorted input indices of everything it processes (core + overlap).
        core_areas: per part, its core area in the input CRS (None when not computed).
        clip: the buffered camera hull the core areas are clipped to.
    """

    labels: NDArray[np.int32]
    members: list[NDArray[np.intp]]
    core_areas: list[BaseGeometry] | None
    clip: BaseGeometry | None

    @property
    def k(self) -> int:
        """Number of parts."""
        return len(self.members)

    def core_counts(self) -> NDArray[np.int64]:
        """Core positions per part, shape ``(k,)``."""
        return np.bincount(self.labels, minlength=self.k)

    def overlap_counts(self) -> NDArray[np.int64]:
        """Overlap positions per part (processed, not owned), shape ``(k,)``."""
        return np.array([len(m) for m in self.members]) - self.core_counts()


@dataclass(frozen=True)
class _Part:
    """A part of a position plan as :mod:`prefect_odm.plan.checks` reads it."""

    id: str
    image_names: tuple[str, ...]


def merge_duplicate_parts(
    pplan: PositionPlan, split_overlap_m: float
) -> tuple[PositionPlan, list[str]]:
    """``pplan`` with every group of parts that process the same positions made one part, and
    the warnings about the overlap.

    With a split overlap wider than the parts, several parts can hold exactly the same images
    (brighton, 18 images, ``--split 6``, 50 m: three parts of all 18, issue 13). The first part
    of each group is kept (:func:`~prefect_odm.plan.checks.kept_submodel_of`); it takes the
    others' core positions (labels) and core areas, so ownership still covers every camera, and
    the later parts are renumbered in order. A plan without such groups is returned as it is.

    Returns:
        The plan, and the warnings: each image processed more than
        :data:`~prefect_odm.plan.checks.MAX_DUPLICATION_FACTOR` times (measured on the parts
        kept, so it agrees with the plan's table), and how many parts were merged; the planner
        logs those of the plan it keeps.
    """
    parts = [_Part(str(p), tuple(map(str, m.tolist()))) for p, m in enumerate(pplan.members)]
    duplication = find_duplicate_submodels(parts)
    kept_of = {int(d): int(k) for d, k in kept_submodel_of(duplication).items()}
    kept = find_duplicate_submodels([part for p, part in enumerate(parts) if p not in kept_of])
    warning = overlap_warning(kept, split_overlap_m)
    warnings = [] if warning is None else [warning]
    if kept_of:
        warnings.append(
            f"{len(kept_of)} submodel(s) held the same images as another one and were merged "
            f"into it ({pplan.k} planned, {pplan.k - len(kept_of)} kept)"
        )
    if not kept_of:
        return pplan, warnings
    survivors = [p for p in range(pplan.k) if p not in kept_of]
    new_index = {old: new for new, old in enumerate(survivors)}
    relabel = np.array([new_index[kept_of.get(p, p)] for p in range(pplan.k)], dtype=np.int32)
    areas = None
    if pplan.core_areas is not None:
        grouped: list[list[BaseGeometry]] = [[] for _ in survivors]
        for p, area in enumerate(pplan.core_areas):
            grouped[relabel[p]].append(area)
        areas = [g[0] if len(g) == 1 else shapely.union_all(g) for g in grouped]
    merged = PositionPlan(
        labels=relabel[pplan.labels],
        members=[pplan.members[p] for p in survivors],
        core_areas=areas,
        clip=pplan.clip,
    )
    return merged, warnings
