"""The ``reconstruct`` flow: scan -> plan -> process submodels -> merge -> manifest and report.

The flow is a sequence of Prefect tasks; what is reused and what counts as failed is run policy
(:mod:`prefect_odm.run_policy`). Its parameters' defaults, the stage timer and the merge's
follow-up command live in :mod:`prefect_odm.flows.reconstruct_support`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, cast

from prefect import flow, get_run_logger
from prefect.futures import PrefectFuture
from prefect.task_runners import TaskRunner, ThreadPoolTaskRunner
from prefect_odm.flows.reconstruct_clusters import (
    dead_lettered,
    open_session,
    planning_memory,
    process_routed,
    routing_from,
    with_area_rule,
)
from prefect_odm.flows.reconstruct_inline import run_inline
from prefect_odm.flows.reconstruct_support import (
    NODES_FIELD,
    PRIORITY_FIELD,
    SPLIT_FIELD,
    SUBMODEL_DEPLOYMENT_FIELD,
    SplitParameter,
    StageTimer,
    first_run_name,
    merge_command,
    planned_footprint,
    rerun_advice,
)
from prefect_odm.tasks.align import align_submodels
from prefect_odm.tasks.artifacts import (
    LiveSubmodelTable,
    rename_this_run,
    reuse_stored,
)
from prefect_odm.tasks.calibration import PlanRequest, with_shared_calibration
from prefect_odm.tasks.deployment import (
    SubmodelChildren,
    show_child_history,
)
from prefect_odm.tasks.merge import MergedProducts, merge_products, refuse_misplaced_products
from prefect_odm.tasks.report import publish_plan, publish_report, stored_merge_reports
from prefect_odm.tasks.routing import ClusterSession
from prefect_odm.tasks.survey import plan_submodels, scan_survey
from pydantic import Field

from prefect_odm import progress, storage
from prefect_odm.align.report import AlignmentError
from prefect_odm.clusters.records import RoutingOptions, RoutingSummary
from prefect_odm.errors import IncompleteRunError, MergeError, PlanningError
from prefect_odm.fingerprints import merge_fingerprint
from prefect_odm.layout import OutputLayout
from prefect_odm.merge.reports import MergeReports
from prefect_odm.models import (
    Manifest,
    MergeOptions,
    NodeHealthRecord,
    ProcessingOptions,
    SplitPlan,
    SubmodelResult,
    Survey,
)
from prefect_odm.nodes.capacity import memory_for_auto_split
from prefect_odm.nodes.cluster import (
    EMBEDDED_ENGINE_IDENTITY,
    Cluster,
    check_embedded_options,
    connect_nodes,
    embedded_engine,
    embedded_memory_gib,
)
from prefect_odm.nodes.refs import (
    refuse_credentials,
    survey_run_name,
)
from prefect_odm.ownership import Ownership
from prefect_odm.plan.checks import plan_gps_refusal
from prefect_odm.progress import SubmodelBoard
from prefect_odm.publish.stac import write_stac
from prefect_odm.run_policy import (
    asked_products,
    check_survey_size,
    configured_submodel_deployment,
    failed_submodels,
    mergeable,
    reused_and_pending,
    run_manifest,
    stored_manifest,
    work_queue_for,
)
from prefect_odm.survey.scan import check_output_outside_images


@flow(
    name="reconstruct",
    flow_run_name=first_run_name,
    # Prefect's own flows cast their task runner the same way: the decorator's type names the
    # base future type, which ThreadPoolTaskRunner's concurrent futures specialise.
    task_runner=cast(TaskRunner[PrefectFuture[Any]], ThreadPoolTaskRunner(max_workers=4)),
)
def reconstruct(
    images: str,
    output: str,
    nodes: list[str] | None = NODES_FIELD,
    split: SplitParameter = SPLIT_FIELD,
    split_overlap_m: float | None = Field(None, ge=0),
    options: ProcessingOptions | None = None,
    allow_partial: bool = False,
    force: bool = False,
    node_pool: str | None = None,
    submodel_deployment: str | None = SUBMODEL_DEPLOYMENT_FIELD,
    priority: Literal["normal", "urgent"] = PRIORITY_FIELD,
    merge_options: MergeOptions | None = None,
    routing: RoutingOptions | None = None,
) -> Manifest:
    """Reconstruct a drone survey into one orthophoto, DSM and point cloud.

    Args:
        images: folder (searched recursively) or fsspec URL prefix of geotagged images.
        output: output root (local path or fsspec URL); products go to
            ``{output}/{survey fingerprint[:16]}/merged/``.
        nodes: NodeODM node URLs without credentials; none starts the built-in engine on a
            loopback port. Tokens come from a ``NodeODMPool`` block or
            ``PREFECT_ODM_NODE_TOKEN(S)``, never from a parameter.
        split: target images per submodel (core images), or "auto" from node memory.
        split_overlap_m: overlap between neighbouring submodels, metres; None: the default
            (``DEFAULT_SPLIT_OVERLAP_M``), widened by the plan until the alignment can tie
            every pair of neighbours. When set, a split whose submodels could not be aligned
            is refused at the plan (``PlanningError``), before anything is uploaded.
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
        merge_options: alignment gates, ``accept_alignment``, merge settings (None: defaults).
        routing: route submodels among a cluster directory's clusters (manifest ``routing``).

    Returns:
        The manifest (also written to ``manifest.json`` next to the products, last).

    Raises:
        InputError: the images location is missing, empty, or has no geotagged image; a node
            URL carries a credential.
        RoutingError: no cluster of the directory may take the survey.
        IncompleteRunError: some submodels failed and ``allow_partial`` is off (after the
            others finished, so a rerun reuses them); one in the dead-letter queue does not count.
        MergeError: the merged result is empty or does not cover what the submodels cover.
    """
    refuse_credentials(nodes)
    check_output_outside_images(images, output)
    timer = StageTimer()
    with timer.stage("scan"):
        survey = _scan(images)
    session = _clusters(routing, options, submodel_deployment)
    nodes, cluster = (None, None) if session else _connect(nodes, node_pool, options)
    with timer.stage("plan"):
        asked = (split, split_overlap_m, options, merge_options)
        plan, layout = _plan(survey, output, asked, cluster, session)
    with timer.stage("process"):
        table = LiveSubmodelTable(SubmodelBoard([s.id for s in plan.submodels]), key=_key(plan))
        mode = (force, submodel_deployment, priority)
        where = _Nodes(nodes, cluster, node_pool, session, survey)
        results, health = _process(plan, layout, where, table, *mode)
    failed = failed_submodels(results)
    blocking = {k: v for k, v in failed.items() if k not in dead_lettered(session)}
    if blocking and not allow_partial:
        raise IncompleteRunError(blocking)
    with timer.stage("merge"):
        merge_fp, products, reports = _merge_or_reuse(plan, results, layout, force, merge_options)
    return _finish(
        images, survey, plan, layout, results, failed, table, timer,
        merge=(merge_fp, products, reports), node_health=health,
        routing=session.summary if session else None,
    )  # fmt: skip


def _finish(
    images: str,
    survey: Survey,
    plan: SplitPlan,
    layout: OutputLayout,
    results: dict[str, SubmodelResult],
    failed: dict[str, str],
    table: LiveSubmodelTable,
    timer: StageTimer,
    *,
    merge: tuple[str, dict[str, str], MergeReports],
    node_health: list[NodeHealthRecord],
    routing: RoutingSummary | None = None,
) -> Manifest:
    """The run's manifest, with its report, STAC catalogue and ``manifest.json`` written (last)."""
    merge_fp, products, reports = merge
    manifest = run_manifest(
        source=images,
        survey=survey,
        plan=plan,
        merge_fingerprint=merge_fp,
        products=products,
        results=results,
        failed=failed,
        coverage=reports.coverage_figures(),
        alignment=reports.alignment,
        timings_seconds=timer.finish(),
        node_health=node_health,
        routing=routing,
    )
    table.publish(now=True)
    publish_report(manifest, plan, survey, layout, reports, table.board.table())
    write_stac(layout.survey_dir, manifest)  # stac/collection.json, for a STAC portal
    storage.write_json_atomic(layout.manifest, manifest.model_dump(mode="json"))
    progress.emit(progress.StageEvent(name="done"))
    return manifest


def _clusters(
    routing: RoutingOptions | None, options: ProcessingOptions | None, deployment: str | None
) -> ClusterSession | None:
    """The clusters the run routes among (the parameter, else
    ``PREFECT_ODM_CLUSTER_DIRECTORY``), read now; ``None`` without a directory."""
    routed = routing_from(routing)
    if routed is None:
        return None
    workers = configured_submodel_deployment(deployment) is not None
    return open_session(routed, options, workers)


def _scan(images: str) -> Survey:
    """Scan the images, refuse a survey too small, and name the run after the survey."""
    progress.emit(progress.StageEvent(name="scan"))
    survey: Survey = scan_survey(images)
    _check_survey(survey, images)
    rename_this_run(survey_run_name(images, survey.fingerprint))
    return survey


def _key(plan: SplitPlan) -> str:
    """The live submodel table's artifact key (one per survey)."""
    return f"submodels-{plan.survey_fingerprint[:12]}"


def _check_survey(survey: Survey, images: str) -> None:
    """Refuse a survey too small to reconstruct; log what the scan found."""
    check_survey_size(survey, images)
    get_run_logger().info(
        "scanned %d images (%d rejected) in EPSG:%d",
        len(survey.images),
        len(survey.rejected),
        survey.crs_epsg,
    )


def _connect(
    nodes: list[str] | None, node_pool: str | None, options: ProcessingOptions | None
) -> tuple[list[str] | None, Cluster | None]:
    """The node URLs and their cluster (the pool block's when one is named), the options
    checked against them before the plan is written (a bad option leaves nothing behind);
    ``(None, None)`` when the built-in engine is to be started for the processing."""
    settings = None
    if node_pool:
        from prefect_odm.blocks import load_pool_block

        nodes, settings = load_pool_block(node_pool)
    cluster = connect_nodes(nodes, settings=settings) if nodes else None
    asked = (options or ProcessingOptions()).to_nodeodm()
    if cluster is not None:
        cluster.check_options(asked)
    else:
        check_embedded_options(asked)
    return nodes, cluster


def _plan(
    survey: Survey,
    output: str,
    asked: tuple[
        int | Literal["auto"], float | None, ProcessingOptions | None, MergeOptions | None
    ],
    cluster: Cluster | None,
    session: ClusterSession | None = None,
) -> tuple[SplitPlan, OutputLayout]:
    """Plan the submodels for the nodes' memory and publish the plan beside the outputs.

    ``asked`` is ``(split, split_overlap_m, options, merge_options)``. Routed among clusters
    (``session``), the plan is made for the preferred cluster's engine and the largest node of
    the clusters running it, and the area rule may split it further. A split whose submodels
    the merge could not align raises ``PlanningError`` before the plan is published.
    """
    split, split_overlap_m, options, merge_options = asked
    if session is not None:
        identity, memory = planning_memory(session)
    else:
        identity = cluster.engine_identity if cluster else EMBEDDED_ENGINE_IDENTITY
        memory = _node_memory(cluster, split)
    progress.emit(progress.StageEvent(name="plan"))
    options = options or ProcessingOptions()

    def make(split: int | Literal["auto"]) -> SplitPlan:
        made: SplitPlan = plan_submodels(
            survey, split, split_overlap_m, options, identity, memory, merge_options
        )
        return made

    plan = make(split)
    if session is not None:
        plan = with_area_rule(plan, survey, session, make)
    layout = OutputLayout(output, survey.fingerprint)
    publish_plan(plan, survey, layout)
    refusal = plan_gps_refusal(plan, survey)
    if refusal is not None:
        raise PlanningError(f"{survey.source}: {refusal}")
    asked_plan = PlanRequest(split, split_overlap_m, identity, tuple(memory), merge_options)
    plan = with_shared_calibration(plan, survey, layout, cluster, asked_plan)
    progress.emit(progress.PlanEvent(submodels=tuple(s.id for s in plan.submodels)))
    get_run_logger().info("planned %d submodels", len(plan.submodels))
    for warning in plan.warnings:
        get_run_logger().warning("plan: %s", warning)
    return plan, layout


def _node_memory(cluster: Cluster | None, split: int | Literal["auto"]) -> list[float]:
    """The nodes' memory the plan is made for (the built-in engine's without nodes)."""
    if cluster is None:
        return [embedded_memory_gib()]
    if split == "auto":
        return memory_for_auto_split(cluster.memory_by_node)
    return cluster.node_memory_gib


@dataclass(frozen=True)
class _Nodes:
    """The nodes of a run: URLs without credentials, their cluster (``None``: the built-in
    engine), and the pool block they came from (children load it themselves); or the
    clusters of a cluster directory (``session``) and the survey the run routes among them."""

    urls: list[str] | None
    cluster: Cluster | None
    pool_block: str | None
    session: ClusterSession | None = None
    survey: Survey | None = None


def _process(
    plan: SplitPlan,
    layout: OutputLayout,
    nodes: _Nodes,
    live: LiveSubmodelTable,
    force: bool,
    submodel_deployment: str | None,
    priority: str,
) -> tuple[dict[str, SubmodelResult], list[NodeHealthRecord]]:
    """Every submodel's result: stored ones reused (a ``Cached`` task run each), the pending
    ones run as deployment runs when a submodel deployment is configured, else as concurrent
    inline subflows sharing one placement pool; and each node's health record when they ran
    inline (empty otherwise). The live table follows every submodel."""
    logger = get_run_logger()
    results, pending = reused_and_pending(plan, layout, force=force)
    for sid, result in results.items():
        logger.info("%s: reused (fingerprint %s)", sid, result.fingerprint[:12])
        reuse_stored(sid, result.fingerprint)
        live.show_result(result, builtin=nodes.cluster is None)
    # Deployment mode (issue 7, tasks/deployment.py): keep this branch when editing _process.
    deployment = configured_submodel_deployment(submodel_deployment)
    if deployment is not None:
        show_child_history(live)  # a retried parent: its children's tries so far
    if not pending:
        return results, []
    progress.emit(progress.StageEvent(name="process"))
    if nodes.session is not None:
        assert nodes.survey is not None
        routed, health = process_routed(
            nodes.session, plan, layout, nodes.survey, pending, live,
            force=force, deployment=deployment,
        )  # fmt: skip
        results.update(routed)
        return results, health
    if deployment is not None:
        queue = work_queue_for(priority)
        children = SubmodelChildren(deployment, queue, nodes.urls, nodes.pool_block, force)
        results.update(children.run(pending, plan, layout, live))
        return results, []
    if nodes.cluster is not None:
        assert nodes.urls is not None
        results.update(
            run_inline(nodes.cluster, list(nodes.urls), pending, plan, layout, live, force)
        )
        return results, nodes.cluster.pool.health.report()
    with embedded_engine(plan.options.pipeline) as engine:
        urls = list(engine.clients)
        results.update(run_inline(engine, urls, pending, plan, layout, live, force, builtin=True))
        return results, engine.pool.health.report()


def _merge_or_reuse(
    plan: SplitPlan,
    results: dict[str, SubmodelResult],
    layout: OutputLayout,
    force: bool,
    merge_options: MergeOptions | None,
) -> tuple[str, dict[str, str], MergeReports]:
    """(merge fingerprint, product -> URL, merge reports): the stored merge when its inputs are
    the same and its ``merge.json`` reads back (the manifest and report still describe this
    run), else a new merge.

    Raises:
        MergeError: no submodel finished.
    """
    merged, options = mergeable(results.values()), merge_options or MergeOptions()
    if not merged:
        raise MergeError("no submodel finished: nothing to merge")
    merge_fp = merge_fingerprint(
        [(r.submodel_id, r.fingerprint) for r in merged], plan.fingerprint, options
    )
    stored = None if force else stored_manifest(layout, merge_fp)
    stored_reports = None if stored is None else stored_merge_reports(layout)
    if stored is not None and stored_reports is not None:
        get_run_logger().info("merge reused (fingerprint %s)", merge_fp[:12])
        reuse_stored("merge", merge_fp)
        progress.emit(progress.StageEvent(name="merge reused"))
        return merge_fp, stored.products, stored_reports
    progress.emit(progress.StageEvent(name="merge"))
    merged_products = _merge(plan, merged, layout, options)
    return merge_fp, merged_products.stored, merged_products.reports


def _merge(
    plan: SplitPlan, merged: list[SubmodelResult], layout: OutputLayout, options: MergeOptions
) -> MergedProducts:
    """Align the finished submodels, then merge every product they have; store the products
    under ``layout.merged_dir``.

    Raises:
        StorageError: ``merged/`` exists and no file can be made in it (before anything is
            read or removed: the earlier manifest stays).
    """
    # before minutes of alignment and merging: an unwritable merged/ (chattr +i) fails here,
    # with the earlier manifest and products still in place
    storage.check_folder_writable(layout.merged_dir)
    ids = [r.submodel_id for r in merged]
    ownership = Ownership.from_cameras(
        ((c.x_m, c.y_m, c.submodel_id) for c in plan.cameras), only=ids
    )
    asked = plan.options.to_nodeodm()
    products = {r.submodel_id: asked_products(r.products, asked) for r in merged}
    # before the alignment and the merge read anything: products of somewhere else (a node in
    # test mode returns canned ones) would make them build a grid spanning both places
    refuse_misplaced_products(
        products,
        {sm.id: sm.footprint for sm in plan.submodels if sm.id in products and sm.footprint},
        plan.crs_epsg,
        {r.submodel_id: rerun_advice(layout, r) for r in merged},
    )
    try:
        alignment = align_submodels(
            products,
            {r.submodel_id: layout.submodel_shots(r.submodel_id, r.fingerprint) for r in merged},
            options,
            gps={c.name: (c.x_m, c.y_m, c.z_m) for c in plan.cameras if c.z_m is not None},
            crs_epsg=plan.crs_epsg,
        )
    except AlignmentError as exc:
        raise AlignmentError(exc.failures, merge_command(layout, merged)) from exc
    # The products are about to be replaced: a manifest describing the earlier ones would lie
    # if this merge is stopped half-way ("no manifest" is what an unfinished run looks like).
    storage.remove_if_present(layout.manifest)
    return merge_products(
        products,
        layout.merged_product,
        ownership=ownership,
        crs_epsg=plan.crs_epsg,
        planned_footprint=planned_footprint(plan),
        options=options,
        alignment=alignment,
        check_locations=False,
    )
