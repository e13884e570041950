"""What the command line's no-change shortcut (:mod:`prefect_odm.cli.reconstruct`) checks of
the last run's outputs before it answers from them: every product whole, and the output's plan
the last run's own."""

from __future__ import annotations

from typing import TYPE_CHECKING

from prefect_odm import storage
from prefect_odm.layout import OutputLayout

if TYPE_CHECKING:
    from prefect_odm.models import Manifest


def _damage_since_last_run(manifest: Manifest) -> str | None:
    """The one line saying which product of the last run is missing or damaged (a submodel's
    first, as the run will process it again), or ``None`` when all are whole. One stat per file
    (a header open for records without sizes)."""
    from prefect_odm.product_files import damaged_products

    for result in manifest.submodels:
        damage = damaged_products(result.products, result.product_sizes)
        if damage is not None:
            return f"{result.submodel_id}: its products are {damage}; processing it again"
    damage = damaged_products(manifest.products, manifest.product_sizes)
    return None if damage is None else f"merged products are {damage}; merging again"


def _plan_since_last_run(output: str, manifest: Manifest) -> str | None:
    """The one line saying the output's ``plan/plan.json`` is not the last run's plan (a later
    run that was refused or stopped wrote its own: a ``merge --plan`` of it would describe a run
    that never finished), or ``None`` when it is."""
    plan_url = OutputLayout(output, manifest.survey_fingerprint).plan_json
    try:
        fingerprint = storage.read_json(plan_url).get("fingerprint")
    except (FileNotFoundError, OSError, ValueError, AttributeError):
        fingerprint = None
    if fingerprint == manifest.plan_fingerprint:
        return None
    return f"{plan_url} is not the last run's plan (a later run did not finish); planning again"
