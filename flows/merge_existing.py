"""The ``merge_existing`` flow: merge OpenDroneMap outputs produced elsewhere.

For surveys flown and processed as separate tasks (per-task orthophotos stitched by hand today):
OpenDroneMap project folders, extracted ``all.zip`` contents or ``all.zip`` files, local or in
object storage, are merged into one orthophoto, DSM/DTM and point cloud with the same merge the
``reconstruct`` flow uses.
"""

from __future__ import annotations

import json
import tempfile
from datetime import UTC, datetime
from pathlib import Path

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect_odm.tasks.merge import merge_all

from prefect_odm import __version__, storage
from prefect_odm.errors import InputError
from prefect_odm.fingerprints import fingerprint
from prefect_odm.layout import OutputLayout, join
from prefect_odm.models import Manifest, SplitPlan, SubmodelResult
from prefect_odm.ownership import Ownership


def _shot_names(location: str) -> set[str]:
    """Image names in ``odm_report/shots.geojson`` of an ODM output folder (empty if absent)."""
    for folder in ("odm_report", "report"):  # ODM's layout; a prefect-odm submodel folder
        try:
            shots = json.loads(storage.read_bytes(join(location, folder, "shots.geojson")))
            break
        except (FileNotFoundError, OSError, ValueError):
            continue
    else:
        return set()
    return {str(f.get("properties", {}).get("filename", "")) for f in shots.get("features", [])} - {
        ""
    }


@task(name="find_existing_outputs", cache_policy=NO_CACHE)
def find_outputs(inputs: list[str], work: Path) -> dict[str, tuple[str, dict[str, str]]]:
    """Output id -> (location, product -> URL) for every ODM output found at ``inputs``."""
    from prefect_odm.merge import find_existing_outputs

    return {o.submodel_id: (o.location, o.products) for o in find_existing_outputs(inputs, work)}


def _match_plan(found: dict[str, tuple[str, dict[str, str]]], plan: SplitPlan) -> dict[str, str]:
    """Found output id -> plan submodel id: same id, else the submodel sharing most image names."""
    ids = {sm.id for sm in plan.submodels}
    out: dict[str, str] = {}
    for oid, (location, _) in sorted(found.items()):
        named = [sid for sid in ids if oid == sid or oid.startswith(f"{sid}-")]
        if len(named) == 1:  # e.g. a prefect-odm folder "submodel-003-<fingerprint>"
            out[oid] = named[0]
            continue
        names = _shot_names(location)
        best = max(plan.submodels, key=lambda sm: (len(names & set(sm.image_names)), sm.id))
        if not names & set(best.image_names):
            raise InputError(f"{location}: no image of it is in any submodel of the plan")
        out[oid] = best.id
    if len(set(out.values())) != len(out):
        raise InputError("two inputs match the same submodel of the plan")
    return out


@flow(name="merge_existing", flow_run_name="merge-existing")
def merge_existing(inputs: list[str], output: str, plan: str | None = None) -> Manifest:
    """Merge OpenDroneMap outputs made elsewhere into one orthophoto, DSM/DTM and point cloud.

    Args:
        inputs: ODM project folders, extracted ``all.zip`` contents, ``all.zip`` files, or folders
            holding any of those one level down (local paths or fsspec URLs).
        output: output root; products go to ``{output}/{inputs fingerprint[:16]}/merged/``.
        plan: optional ``plan.json`` of a prefect-odm run that made these outputs: its ownership
            rule (nearest core camera) is used, so the result equals that run's own merge.
            Without it, each input owns the ground nearest the centroid of its orthophoto.

    Returns:
        The manifest, written last next to the merged products.

    Raises:
        InputError: a location does not exist or holds no ODM product.
        MergeError: the merged result is empty or does not cover what the inputs cover.
    """
    logger = get_run_logger()
    with tempfile.TemporaryDirectory(prefix="prefect-odm-existing-") as tmp:
        found = find_outputs(inputs, Path(tmp))
        logger.info("found %d outputs: %s", len(found), ", ".join(sorted(found)))
        ownership: Ownership | None = None
        crs_epsg: int | None = None
        products = {oid: prods for oid, (_, prods) in found.items()}
        plan_fp = ""
        if plan is not None:
            split_plan = SplitPlan.model_validate(storage.read_json(plan))
            mapping = _match_plan(found, split_plan)
            products = {mapping[oid]: prods for oid, (_, prods) in found.items()}
            ownership = Ownership.from_cameras(
                ((c.x_m, c.y_m, c.submodel_id) for c in split_plan.cameras), only=sorted(products)
            )
            crs_epsg = split_plan.crs_epsg
            plan_fp = split_plan.fingerprint
        identity = fingerprint(
            {
                "kind": "merge-existing",
                "inputs": sorted(found),
                "locations": sorted(loc for loc, _ in found.values()),
                "plan": plan_fp,
            }
        )
        layout = OutputLayout(output, identity)
        stored, reports = merge_all(
            products,
            layout.merged_product,
            ownership=ownership,
            crs_epsg=crs_epsg,
            planned_footprint=None,
        )
    with_crs = reports["orthophoto"].get("crs_epsg") or crs_epsg or 0
    manifest = Manifest(
        version=__version__,
        created=datetime.now(UTC),
        source=", ".join(inputs),
        survey_fingerprint=identity,
        plan_fingerprint=plan_fp,
        merge_fingerprint=identity,
        crs_epsg=int(with_crs),
        products=stored,
        submodels=[
            SubmodelResult(submodel_id=sid, fingerprint="", status="reused", products=prods)
            for sid, prods in sorted(products.items())
        ],
        coverage={
            k: float(v) for k, v in reports["coverage"].items() if isinstance(v, int | float)
        },
    )
    storage.write_json_atomic(join(layout.report_dir, "merge.json"), reports)
    storage.write_json_atomic(layout.manifest, manifest.model_dump(mode="json"))
    return manifest
