"""The ``merge_existing`` flow: merge OpenDroneMap outputs produced elsewhere.

For surveys flown and processed as separate tasks (per-task orthophotos stitched by hand today):
OpenDroneMap project folders, extracted ``all.zip`` contents or ``all.zip`` files, local or in
object storage, are merged into one orthophoto, DSM/DTM and point cloud with the same merge the
``reconstruct`` flow uses. Each product is merged from the inputs that have it.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from prefect import flow, get_run_logger
from prefect_odm.tasks.align import align_submodels
from prefect_odm.tasks.merge import collect_existing_outputs, merge_products
from prefect_odm.tasks.report import publish_existing_merge

from prefect_odm.layout import OutputLayout
from prefect_odm.merge.existing import plan_existing_merge, shots_url
from prefect_odm.merge.existing_checks import check_existing_merge
from prefect_odm.models import Manifest, MergeOptions


@flow(name="merge_existing", flow_run_name="merge-existing")
def merge_existing(
    inputs: list[str],
    output: str,
    plan: str | None = None,
    options: MergeOptions | None = None,
) -> Manifest:
    """Merge OpenDroneMap outputs made elsewhere into one orthophoto, DSM/DTM and point cloud.

    Args:
        inputs: ODM project folders, extracted ``all.zip`` contents, ``all.zip`` files, or folders
            holding any of those one level down (local paths or fsspec URLs).
        output: output root; products go to ``{output}/{inputs fingerprint[:16]}/merged/``.
        plan: optional ``plan.json`` of a prefect-odm run that made these outputs: its ownership
            rule (nearest core camera) is used, so the result equals that run's own merge.
            Without it, each input owns the ground nearest the centroid of its orthophoto.
        options: how the products are aligned and merged (gate thresholds, ``accept_alignment``,
            seam method, feathering, balancing); None for the defaults. The outputs are aligned
            to each other first: from the cameras they share (their ``shots.geojson``) when
            every output has them, else from their DSMs and orthophotos in the overlaps.

    Returns:
        The manifest, written last next to the merged products.

    Raises:
        InputError: a location does not exist or holds no ODM product.
        MisplacedProductError: with ``plan``, an output's products do not lie where its
            submodel's images are (one line; nothing extracted, read or written). This and the
            refusals above are made first, from listings, ``shots.geojson`` and product headers
            (:func:`~prefect_odm.merge.existing_checks.check_existing_merge`).
        MergeError: the merged result is empty or does not cover what the inputs cover.
        AlignmentError: an alignment quality gate failed (naming the output and the figure)
            and ``options.accept_alignment`` is off.
    """
    logger = get_run_logger()
    # every refusal the inputs allow, before an archive is extracted or a product aligned
    check_existing_merge(inputs, plan)
    with tempfile.TemporaryDirectory(prefix="prefect-odm-existing-") as tmp:
        found = collect_existing_outputs(inputs, Path(tmp))
        logger.info("found %d outputs: %s", len(found), ", ".join(o.submodel_id for o in found))
        request = plan_existing_merge(found, plan, options)
        layout = OutputLayout(output, request.identity)
        opts = options or MergeOptions()
        alignment = align_submodels(
            request.products,
            {request.submodel_of(o.submodel_id): shots_url(o.location) for o in found},
            opts,
            gps=request.gps or None,
            crs_epsg=request.crs_epsg,
        )
        merged = merge_products(
            request.products,
            layout.merged_product,
            ownership=request.ownership,
            crs_epsg=request.crs_epsg,
            planned_footprint=None,
            options=opts,
            alignment=alignment,
            check_locations=False,
        )
    return publish_existing_merge(inputs, request, merged, layout)
