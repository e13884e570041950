"""Refuse a merge of outputs made elsewhere before any work: from listings, ``shots.geojson``
and product headers only.

Every refusal ``merge_existing`` can make from its inputs and ``--plan`` alone (a plan of another
run or survey, a submodel of the plan missing, two versions of one submodel, products lying far
from their submodel's planned footprint) is made here first, before Prefect starts (the command
line) and before an archive is extracted, an output aligned or a pixel read (the flow).
"""

from __future__ import annotations

from collections.abc import Sequence

from prefect_odm.merge.existing import (
    ExistingMerge,
    archived_product_urls,
    find_existing_outputs,
    plan_existing_merge,
)
from prefect_odm.merge.locations import check_product_locations


def check_existing_merge(locations: Sequence[str], plan_url: str | None) -> None:
    """Refuse, without extracting or decoding anything, a merge ``merge_existing`` would refuse
    from its inputs: what :func:`~prefect_odm.merge.existing.find_existing_outputs` and
    :func:`~prefect_odm.merge.existing.plan_existing_merge` refuse, then (with a plan) products
    whose headers put them far from their submodel's planned footprint. An ``all.zip``'s
    products are checked through fsspec's ``zip://MEMBER::ARCHIVE`` (the archive's central
    directory and each member's header bytes).

    Args:
        locations: the inputs (local paths or fsspec URLs), as ``merge_existing`` takes them.
        plan_url: ``--plan``'s ``plan.json``, or None.

    Raises:
        InputError: a missing location, a file that is no archive, an escaping member, no
            product; the plan is of another run, lacks an input's submodel or the inputs lack
            one of its submodels; without a plan, two versions of one submodel.
        MisplacedProductError: with a plan, a product lying far from its submodel's footprint
            (one line naming the submodel, the file, the distance and both CRSs).
        MergeError: a product whose header cannot be read (naming it).
    """
    found = find_existing_outputs(locations, None)
    request = plan_existing_merge(found, plan_url)
    if request.crs_epsg is None or not request.footprints:
        return
    products = {
        sid: archived_product_urls(request.locations.get(sid, ""), prods)
        for sid, prods in request.products.items()
    }
    check_product_locations(
        products,
        request.footprints,
        request.crs_epsg,
        lambda sid: leave_out_advice(sid, request, locations, plan_url),
    )


def leave_out_advice(
    sid: str, request: ExistingMerge, inputs: Sequence[str], plan_url: str | None
) -> str:
    """What to run when ``sid``'s products lie elsewhere: the same merge without its output
    (or with that submodel's own output in its place), ending the error line."""
    location = request.locations.get(sid, sid)
    others = [i for i in inputs if i.rstrip("/") != location.rstrip("/")]
    if len(others) == len(inputs):  # found inside a folder given as one input
        return (
            f"nothing was merged; give that submodel's own output in place of {location}, "
            "or leave it out of the inputs"
        )
    return (
        f"nothing was merged; give that submodel's own output in its place, or merge the others: "
        f"prefect-odm merge {' '.join(others)} --plan {plan_url} --output OUT"
    )
