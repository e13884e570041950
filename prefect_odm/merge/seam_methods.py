"""The seam methods of a merge, by name (``MergeOptions.seam_method``): ownership seams
(:class:`.seams.OwnershipSeams`) and least-cost seamlines (:class:`.seamlines.LeastCostSeams`).
The one home of the registry, so neither module imports the other's methods."""

from __future__ import annotations

from collections.abc import Callable

from prefect_odm.errors import InputError
from prefect_odm.grid import Grid
from prefect_odm.merge.seamlines import LeastCostSeams, OwnerLabels
from prefect_odm.merge.seams import OwnershipSeams, SeamMethod
from prefect_odm.ownership import Ownership

SEAM_METHODS: dict[str, Callable[[Ownership, Grid, int, bool], SeamMethod]] = {
    "ownership": OwnershipSeams,
}
"""Seam methods made from the ownership alone, by name (``MergeOptions.seam_method``):
``(ownership, grid, lattice_step_px, compiled)`` -> :class:`SeamMethod`."""

LABEL_SEAM_METHODS = ("least-cost",)
"""Seam methods that follow an owner-label grid (:class:`.seamlines.OwnerLabels`, computed once
per merge by :func:`.seamline_rasters.seamlines_of`): ``least-cost`` =
:class:`.seamlines.LeastCostSeams`."""


def seam_method(
    name: str,
    ownership: Ownership,
    grid: Grid,
    *,
    lattice_step_px: int = 8,
    seamlines: OwnerLabels | None = None,
    compiled: bool = False,
) -> SeamMethod:
    """The seam method called ``name`` for one ownership and output grid.

    Args:
        name: a key of :data:`SEAM_METHODS` or one of :data:`LABEL_SEAM_METHODS`
            (``MergeOptions.seam_method``).
        ownership: the ownership rule, in the grid's CRS.
        grid: the output grid.
        lattice_step_px: step of the exact seam-distance lattice, pixels (>= 1).
        seamlines: the merge's owner-label grid (required by :data:`LABEL_SEAM_METHODS`).
        compiled: the seam distances interpolated by a compiled kernel (the same values; see
            :class:`.seams.SeamField`).

    Raises:
        InputError: no seam method has that name (the message lists the known ones), or a
            label seam method without ``seamlines``.
    """
    if name in LABEL_SEAM_METHODS:
        if seamlines is None:
            raise InputError(f"seam method {name!r} needs the merge's seamlines (owner labels)")
        return LeastCostSeams(seamlines, ownership, grid, lattice_step_px, compiled=compiled)
    make = SEAM_METHODS.get(name)
    if make is None:
        known = ", ".join(sorted([*SEAM_METHODS, *LABEL_SEAM_METHODS]))
        raise InputError(f"unknown seam method {name!r} (known: {known})")
    return make(ownership, grid, lattice_step_px, compiled)
