"""Colour corrections between submodels' orthophotos: one gain and offset per submodel and band,
solved over every overlap. The one home of the rule the orthophoto merge and the seamlines share."""

from __future__ import annotations

from prefect_odm.merge.balance import GainOffset, overlap_stats, solve_gain_offset
from prefect_odm.merge.overlap_sampling import overlap_samples
from prefect_odm.merge.sources import GridPlan


def colour_corrections(plan: GridPlan, balance: bool) -> dict[str, GainOffset]:
    """Gain and offset per submodel: solved over every overlap (:func:`.balance.solve_gain_offset`
    on statistics sampled at a decimated resolution), or identities without ``balance`` or with
    a single input.

    Args:
        plan: the merge's grid plan over the orthophotos (3 colour bands).
        balance: solve the corrections (``MergeOptions.colour_balance``); False gives identities.

    Returns:
        Submodel id -> its gain and offset per band.
    """
    ids = plan.submodel_ids
    if not balance or len(ids) < 2:
        return {sid: GainOffset.identity(3) for sid in ids}
    stats = [
        overlap_stats(a.submodel_id, b.submodel_id, va, vb)
        for a, b, va, vb in overlap_samples(plan)
    ]
    return solve_gain_offset(ids, stats, bands=3)
