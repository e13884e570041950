"""The ``reconstruct`` flow: scan -> plan -> process submodels -> merge -> manifest and report."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any, Literal

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_progress_artifact, update_progress_artifact
from prefect.cache_policies import NO_CACHE
from prefect.futures import as_completed
from prefect.task_runners import ThreadPoolTaskRunner
from prefect_odm.flows.deployment import (
    configured_submodel_deployment,
    result_of,
    start_submodel_run,
    wait_for_runs,
    work_queue_for,
)
from prefect_odm.flows.process_submodel import process_submodel, sharing_cluster
from prefect_odm.tasks.merge import merge_all
from prefect_odm.tasks.report import publish_plan, publish_report
from prefect_odm.tasks.survey import plan_submodels, scan_survey
from pydantic import Field

from prefect_odm import __version__, progress, storage
from prefect_odm.cluster import (
    EMBEDDED_ENGINE_IDENTITY,
    Cluster,
    connect_nodes,
    embedded_engine,
    embedded_memory_gib,
    load_pool_block,
)
from prefect_odm.errors import IncompleteRunError, InputError, MergeError, SubmodelFailedError
from prefect_odm.fingerprints import merge_fingerprint
from prefect_odm.layout import OutputLayout, join
from prefect_odm.models import (
    Manifest,
    MergeOptions,
    ProcessingOptions,
    SplitPlan,
    SubmodelResult,
    Survey,
)
from prefect_odm.ownership import Ownership
from prefect_odm.settings import DEFAULT_SPLIT, DEFAULT_SPLIT_OVERLAP_M
from prefect_odm.submodels import load_stored_result

MIN_SURVEY_IMAGES = 3
"""Fewer usable images than this cannot be reconstructed (structure from motion needs overlap)."""


@task(name="run_submodel", cache_policy=NO_CACHE, task_run_name="run-{submodel_id}")
def run_submodel(
    plan_url: str, submodel_id: str, output: str, nodes: list[str], force: bool
) -> SubmodelResult:
    """Run the ``process_submodel`` subflow; a failed submodel comes back as a failed result."""
    try:
        return process_submodel(plan_url, submodel_id, output, nodes=nodes, force=force)
    except SubmodelFailedError as exc:
        return exc.result  # type: ignore[return-value]


def _failure_text(result: SubmodelResult) -> str:
    """The error and the node's last output lines, one string (for the error and the manifest)."""
    text = result.error or "failed"
    if result.last_output:
        text += "\n    " + "\n    ".join(result.last_output[-5:])
    return text


def _stored_merge_reports(layout: OutputLayout) -> dict[str, Any]:
    """The merge reports a previous run stored beside the products (empty when missing)."""
    try:
        reports = storage.read_json(join(layout.report_dir, "merge.json"))
    except (FileNotFoundError, OSError, ValueError):
        return {}
    return reports if isinstance(reports, dict) else {}


def _stored_manifest(layout: OutputLayout, merge_fp: str) -> Manifest | None:
    try:
        if not storage.exists(layout.manifest):
            return None
        manifest = Manifest.model_validate(storage.read_json(layout.manifest))
    except (ValueError, OSError):
        return None
    if manifest.merge_fingerprint != merge_fp:
        return None
    if not all(storage.exists(u) for u in manifest.products.values()):
        return None
    return manifest


@flow(
    name="reconstruct",
    flow_run_name="reconstruct-{images}",
    task_runner=ThreadPoolTaskRunner(max_workers=4),
)
def reconstruct(
    images: str,
    output: str,
    nodes: list[str] | None = None,
    split: int | Literal["auto"] = DEFAULT_SPLIT,
    split_overlap_m: float = Field(DEFAULT_SPLIT_OVERLAP_M, ge=0),
    options: ProcessingOptions | None = None,
    allow_partial: bool = False,
    force: bool = False,
    node_pool: str | None = None,
    submodel_deployment: str | None = Field(
        None,
        description=(
            "Run each submodel as a run of this deployment ('flow/deployment', e.g. "
            "'process_submodel/process-submodel') on workers; none: inline subflows, unless "
            "PREFECT_ODM_SUBMODEL_DEPLOYMENT names one ('inline' forces inline)."
        ),
    ),
    priority: Literal["normal", "urgent"] = Field(
        "normal",
        description="'urgent' sends the submodel runs to the urgent work queue; never part of a fingerprint.",
    ),
) -> Manifest:
    """Reconstruct a drone survey into one orthophoto, DSM and point cloud.

    Args:
        images: folder (searched recursively) or fsspec URL prefix of geotagged images.
        output: output root (local path or fsspec URL); products go to
            ``{output}/{survey fingerprint[:16]}/merged/``.
        nodes: NodeODM node URLs; none starts the built-in engine on a loopback port.
        split: target images per submodel (core images), or "auto" from node memory.
        split_overlap_m: overlap between neighbouring submodels, metres.
        options: processing options sent to every node (ODM names).
        allow_partial: merge what finished and list failed submodels, instead of failing.
        force: process every submodel again even when stored results exist.
        node_pool: name of a saved ``NodeODMPool`` block (nodes, tokens, memory, task slots)
            to use instead of ``nodes``.
        submodel_deployment: run each pending submodel as a run of this deployment (started from
            a Prefect task with the idempotency key ``{this run id}-{submodel id}``, so each can
            be retried from the UI and a retried parent finds its children again); ``None``:
            inline subflows, unless ``PREFECT_ODM_SUBMODEL_DEPLOYMENT`` is set.
        priority: ``"urgent"`` puts the submodel runs (deployment mode) on the urgent work queue,
            taken before the default queue's backlog. Not part of any fingerprint.

    Returns:
        The manifest (also written to ``manifest.json`` next to the products, last).

    Raises:
        InputError: the images location is missing, empty, or has no geotagged image.
        IncompleteRunError: some submodels failed and ``allow_partial`` is off (after the
            others finished, so a rerun reuses them).
        MergeError: the merged result is empty or does not cover what the submodels cover.
    """
    logger = get_run_logger()
    options = options or ProcessingOptions()
    timings: dict[str, float] = {}
    t0 = time.monotonic()

    progress.emit("stage", name="scan")
    survey: Survey = scan_survey(images)
    timings["scan"] = time.monotonic() - t0
    if len(survey.images) < MIN_SURVEY_IMAGES:
        raise InputError(
            f"{images}: {len(survey.images)} usable image(s); a reconstruction needs at least "
            f"{MIN_SURVEY_IMAGES} overlapping geotagged images"
        )
    logger.info(
        "scanned %d images (%d rejected) in EPSG:%d",
        len(survey.images),
        len(survey.rejected),
        survey.crs_epsg,
    )

    settings = None
    if node_pool:
        nodes, settings = load_pool_block(node_pool)
    cluster: Cluster | None = connect_nodes(nodes, settings=settings) if nodes else None
    identity = cluster.engine_identity if cluster else EMBEDDED_ENGINE_IDENTITY
    memory = cluster.node_memory_gib if cluster else [embedded_memory_gib()]

    t = time.monotonic()
    progress.emit("stage", name="plan")
    plan: SplitPlan = plan_submodels(survey, split, split_overlap_m, options, identity, memory)
    layout = OutputLayout(output, survey.fingerprint)
    publish_plan(plan, survey, layout)
    timings["plan"] = time.monotonic() - t
    progress.emit("plan", submodels=[s.id for s in plan.submodels])
    logger.info("planned %d submodels", len(plan.submodels))

    t = time.monotonic()
    results: dict[str, SubmodelResult] = {}
    pending: list[str] = []
    for sm in plan.submodels:
        stored = None if force else load_stored_result(layout, sm)
        if stored is not None:
            results[sm.id] = stored.model_copy(update={"status": "reused"})
            progress.emit("submodel", id=sm.id, state="reused", fraction=1.0)
            logger.info("%s: reused (fingerprint %s)", sm.id, sm.fingerprint[:12])
        else:
            pending.append(sm.id)
    if pending:
        progress.emit("stage", name="process")
        results.update(
            _process(pending, plan, layout, nodes, cluster, force, submodel_deployment, priority)
        )
    timings["process"] = time.monotonic() - t

    failed = {sid: _failure_text(r) for sid, r in results.items() if r.status == "failed"}
    if failed and not allow_partial:
        raise IncompleteRunError(failed)
    merged = sorted(
        (r for r in results.values() if r.status != "failed"), key=lambda r: r.submodel_id
    )
    if not merged:
        raise MergeError("no submodel finished: nothing to merge")

    t = time.monotonic()
    merge_fp = merge_fingerprint(
        [(r.submodel_id, r.fingerprint) for r in merged], plan.fingerprint, MergeOptions()
    )
    stored_manifest = None if force else _stored_manifest(layout, merge_fp)
    if stored_manifest is not None:
        # Same inputs to the merge: its products stand; the manifest and report describe this run.
        logger.info("merge reused (fingerprint %s)", merge_fp[:12])
        progress.emit("stage", name="merge reused")
        products = stored_manifest.products
        merge_reports = _stored_merge_reports(layout)
    else:
        progress.emit("stage", name="merge")
        products, merge_reports = _merge(plan, merged, layout)
    timings["merge"] = time.monotonic() - t
    timings["total"] = time.monotonic() - t0

    manifest = Manifest(
        version=__version__,
        created=datetime.now(UTC),
        source=images,
        survey_fingerprint=survey.fingerprint,
        plan_fingerprint=plan.fingerprint,
        merge_fingerprint=merge_fp,
        crs_epsg=plan.crs_epsg,
        products=products,
        submodels=[results[s.id] for s in plan.submodels],
        failed_submodels=failed,
        rejected_images=survey.rejected,
        coverage={
            k: float(v)
            for k, v in merge_reports.get("coverage", {}).items()
            if isinstance(v, int | float)
        },
        timings_seconds={k: round(v, 3) for k, v in timings.items()},
    )
    publish_report(manifest, plan, survey, layout, merge_reports)
    storage.write_json_atomic(layout.manifest, manifest.model_dump(mode="json"))
    progress.emit("stage", name="done")
    return manifest


def _process(
    pending: list[str],
    plan: SplitPlan,
    layout: OutputLayout,
    nodes: list[str] | None,
    cluster: Cluster | None,
    force: bool,
    submodel_deployment: str | None = None,
    priority: str = "normal",
) -> dict[str, SubmodelResult]:
    """Run the pending submodels: as deployment runs when a submodel deployment is configured,
    else as concurrent inline subflows sharing one placement pool."""
    plan_url = layout.plan_json
    # Deployment mode (issue 7, flows/deployment.py): keep this branch when editing _process.
    deployment = configured_submodel_deployment(submodel_deployment)
    if deployment is not None:
        return _process_as_deployments(deployment, pending, plan, layout, nodes, force, priority)

    def run_all(active: Cluster, urls: list[str]) -> dict[str, SubmodelResult]:
        with sharing_cluster(active):
            futures = [
                run_submodel.submit(plan_url, sid, layout.root, urls, force) for sid in pending
            ]
            artifact_id = create_progress_artifact(
                progress=0.0,
                key=f"submodels-done-{plan.survey_fingerprint[:12]}",
                description=f"Submodels finished of {len(pending)} to process",
            )
            by_future = dict(zip(futures, pending, strict=True))
            try:
                results: dict[str, SubmodelResult] = {}
                for future in as_completed(futures):
                    results[by_future[future]] = future.result()
                    update_progress_artifact(
                        artifact_id, progress=100.0 * len(results) / len(pending)
                    )
                return results
            except BaseException:
                # Cancelled or interrupted: every runner cancels its remote task and returns
                # its slots before the run ends.
                active.cancelled.set()
                for f in futures:
                    f.wait(timeout=60)
                raise

    if cluster is not None:
        assert nodes is not None
        return run_all(cluster, list(nodes))
    with embedded_engine(plan.options.pipeline) as engine:
        return run_all(engine, list(engine.clients))


def _process_as_deployments(
    deployment: str,
    pending: list[str],
    plan: SplitPlan,
    layout: OutputLayout,
    nodes: list[str] | None,
    force: bool,
    priority: str,
) -> dict[str, SubmodelResult]:
    """One deployment run per pending submodel (created from tasks, so each is linked to this
    run and can be retried from the UI), then wait for all of them (see flows/deployment.py)."""

    logger = get_run_logger()
    queue = work_queue_for(priority)
    node_urls = list(nodes) if nodes else None
    futures = [
        start_submodel_run.submit(
            deployment, layout.plan_json, sid, layout.root, node_urls, force, queue
        )
        for sid in pending
    ]
    run_ids = {sid: f.result() for sid, f in zip(pending, futures, strict=True)}
    artifact_id = create_progress_artifact(
        progress=0.0, description=f"submodel runs finished ({len(pending)} started)"
    )
    finished: list[str] = []

    def on_final(sid: str, run: Any) -> None:
        finished.append(sid)
        logger.info("%s: deployment run %s ended %s", sid, run.name, run.state.name)
        progress.emit("submodel", id=sid, state=run.state.name.lower(), fraction=1.0)
        if artifact_id is not None:
            update_progress_artifact(artifact_id, progress=100.0 * len(finished) / len(pending))

    runs = wait_for_runs(run_ids, on_final=on_final)
    return {sid: result_of(runs[sid], plan, sid, layout.root) for sid in pending}


def _merge(
    plan: SplitPlan, merged: list[SubmodelResult], layout: OutputLayout
) -> tuple[dict[str, str], dict[str, Any]]:
    """Merge every product the finished submodels have; store them under ``layout.merged_dir``."""
    ids = [r.submodel_id for r in merged]
    ownership = Ownership.from_cameras(
        ((c.x_m, c.y_m, c.submodel_id) for c in plan.cameras), only=ids
    )
    return merge_all(
        {r.submodel_id: r.products for r in merged},
        layout.merged_product,
        ownership=ownership,
        crs_epsg=plan.crs_epsg,
        planned_footprint=_planned_footprint(plan),
    )


def _planned_footprint(plan: SplitPlan) -> dict[str, Any] | None:
    from shapely.geometry import mapping, shape
    from shapely.ops import unary_union

    shapes = [shape(s.footprint) for s in plan.submodels if s.footprint]
    return dict(mapping(unary_union(shapes))) if shapes else None
