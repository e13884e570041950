"""Prefect tasks that store the plan and the report next to the outputs and publish them as artifacts."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime

from prefect import task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE
from prefect_odm.tasks.artifacts import embedded_png
from prefect_odm.tasks.merge import MergedProducts

from prefect_odm import __version__, storage
from prefect_odm.layout import OutputLayout
from prefect_odm.merge.alignment_figures import ALIGNMENT_PNG, alignment_lines, alignment_png
from prefect_odm.merge.existing import ExistingMerge, archived_product_urls
from prefect_odm.merge.reports import MergeReports, OrthoMergeReport
from prefect_odm.models import Manifest, NodeHealthRecord, SplitPlan, SubmodelResult, Survey
from prefect_odm.plan.picture import write_plan_files
from prefect_odm.progress import TableRow
from prefect_odm.publish.summary import path_from_report, product_summary_lines, report_folder_of


def _key(prefix: str, fingerprint: str) -> str:
    return f"{prefix}-{fingerprint[:12]}".lower()


@task(name="publish_plan", cache_policy=NO_CACHE)
def publish_plan(plan: SplitPlan, survey: Survey, layout: OutputLayout) -> None:
    """Write plan.json, survey.json, plan.geojson and plan.png; publish the plan table."""
    from prefect_odm.plan.picture import plan_markdown, plan_rows

    write_plan_files(layout.plan_dir, plan, survey, pictures=not _plan_stored(plan, layout))
    create_table_artifact(
        key=_key("plan", survey.fingerprint), table=plan_rows(plan), description="Split plan"
    )
    create_markdown_artifact(
        key=_key("plan-report", survey.fingerprint),
        markdown=plan_markdown(plan, survey) + "\n\n" + embedded_png(layout.plan_png, "plan"),
        description="Split plan",
    )


def _plan_stored(plan: SplitPlan, layout: OutputLayout) -> bool:
    """True when this very plan (same fingerprint) and its pictures are already stored."""
    try:
        stored = storage.read_json(layout.plan_json)
    except (FileNotFoundError, OSError, ValueError):
        return False
    same_names = [c.get("name") for c in stored.get("cameras", [])] == [
        c.name for c in plan.cameras
    ]
    return bool(
        stored.get("fingerprint") == plan.fingerprint
        and same_names
        and storage.exists(layout.plan_png)
    )


def stored_merge_reports(layout: OutputLayout) -> MergeReports | None:
    """The merge reports a previous run stored beside its products (``report/merge.json``),
    validated: the one place a stored ``merge.json`` becomes :class:`MergeReports` again (keys
    it no longer knows are ignored, so older files read).

    Returns:
        The reports; ``None`` when the file is missing, unreadable or not a merge report (the
        stored merge cannot be described, so it is not reused).
    """
    try:
        return MergeReports.model_validate(storage.read_json(layout.merge_report))
    except (OSError, ValueError):  # pydantic's ValidationError and JSON errors are ValueErrors
        return None


def seam_lines(ortho: OrthoMergeReport) -> list[str]:
    """The report's seam section: the colour differences across seams before and after
    balancing, overall and per seam (mean absolute RGB difference in the seam band, DN)."""
    lines = [
        "",
        "## Seams",
        "",
        "Mean absolute colour difference across seams: "
        f"{ortho.seam_mean_abs_diff_before:.2f} DN before colour balancing, "
        f"{ortho.seam_mean_abs_diff_after:.2f} DN after.",
    ]
    if ortho.seams:
        lines += ["", "| seam | pixels | before (DN) | after (DN) |", "|---|---|---|---|"]
        lines += [
            f"| {s.a} / {s.b} | {s.pixels} | {s.mean_abs_diff_before:.2f} "
            f"| {s.mean_abs_diff_after:.2f} |"
            for s in ortho.seams
        ]
    return lines


def node_lines(records: Sequence[NodeHealthRecord]) -> list[str]:
    """The report's node table: each node's health and task record (empty without records)."""
    if not records:
        return []
    lines = [
        "",
        "## Nodes",
        "",
        "| node | health | completed | failed | failed fast | request failures | last error |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in records:
        error = (r.last_error or "-").replace("|", "/").replace("\n", " ")
        lines.append(
            f"| {r.url} | {r.health} | {r.tasks_completed} | {r.tasks_failed} "
            f"| {r.tasks_failed_fast} | {r.request_failures} | {error} |"
        )
    return lines


def submodel_lines(manifest: Manifest, plan: SplitPlan, rows: list[TableRow] | None) -> list[str]:
    """The report's submodel table: the live table's rows when given (state, node, runs,
    attempts, seconds, history of the tries), else the manifest's results."""
    lines = ["", "## Submodels", ""]
    by_id = {s.id: s for s in plan.submodels}
    if rows:
        lines += [
            "| submodel | images | state | node | runs | attempts | seconds | history |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for row in rows:
            images = len(by_id[row["submodel"]].image_names) if row["submodel"] in by_id else 0
            history = str(row["history"]).replace("|", "/")
            lines.append(
                f"| {row['submodel']} | {images} | {row['state']} | {row['node']} | {row['runs']} "
                f"| {row['attempts']} | {row['seconds']} | {history} |"
            )
        return lines
    lines += [
        "| submodel | images | state | node | attempts | seconds | est. GiB |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in manifest.submodels:
        sm = by_id[r.submodel_id]
        state = "cached" if r.status == "reused" else r.status
        lines.append(
            f"| {r.submodel_id} | {len(sm.image_names)} | {state} | {r.node_url or '-'} "
            f"| {r.attempts} | {r.duration_seconds:.1f} | {sm.estimated_memory_gib:.1f} |"
        )
    return lines


def product_path_lines(products: Mapping[str, str]) -> list[str]:
    """The "Products" list: each product's path relative to the report (the manifest keeps
    them as the command was given them, which read relative to wherever it ran)."""
    if not products:
        return []
    here = report_folder_of(products)
    return [f"- {name}: `{path_from_report(url, here)}`" for name, url in sorted(products.items())]


def report_markdown(
    manifest: Manifest,
    plan: SplitPlan,
    reports: MergeReports,
    submodel_rows: list[TableRow] | None = None,
) -> str:
    """The run report as markdown: products, submodels, coverage, seams, rejected images,
    timings (the pictures are added by :func:`publish_report`)."""
    lines = [
        f"# Reconstruction of `{manifest.source}`",
        "",
        f"Survey `{manifest.survey_fingerprint[:16]}`, EPSG:{manifest.crs_epsg}, "
        f"{len(plan.submodels)} submodels, prefect-odm {manifest.version}.",
        "",
        *product_summary_lines(manifest),  # how big, how sharp, how complete (issue 36)
        "## Products",
        "",
    ]
    lines += product_path_lines(manifest.products)
    lines += submodel_lines(manifest, plan, submodel_rows)
    if manifest.failed_submodels:
        lines += ["", "## Failed submodels (gaps in the products)", ""]
        lines += [f"- {sid}: {why}" for sid, why in sorted(manifest.failed_submodels.items())]
    lines += node_lines(manifest.node_health)
    if manifest.coverage:
        lines += ["", "## Coverage", ""]
        lines += [f"- {k}: {v:.4g}" for k, v in sorted(manifest.coverage.items())]
    if reports.orthophoto is not None:
        lines += seam_lines(reports.orthophoto)
    if manifest.rejected_images:
        lines += ["", "## Rejected images", ""]
        lines += [
            f"- `{r.name}`: {r.detail or r.reason} ({r.reason})" for r in manifest.rejected_images
        ]
    lines += alignment_lines(reports.alignment, reports.dsm)
    lines += ["", "## Timings (seconds)", ""]
    lines += [f"- {k}: {v:.1f}" for k, v in manifest.timings_seconds.items()]
    lines += ["", "![plan](../plan/plan.png)", ""]
    return "\n".join(lines)


def report_pictures(layout: OutputLayout) -> str:
    """The plan picture and every PNG of the report folder (coverage, alignment), embedded as
    ``data:`` URIs for the UI (the stored report.md links them relatively instead)."""
    from prefect_odm.layout import join

    pictures = [embedded_png(layout.plan_png, "plan")]
    try:
        fs, folder = storage.filesystem(join(layout.report_md.rsplit("/", 1)[0], "*.png"))
        found = sorted(fs.glob(folder))
    except (OSError, ValueError):
        found = []
    for item in found:
        name = item.rsplit("/", 1)[-1]
        pictures.append(f"### {name}\n\n" + embedded_png(fs.unstrip_protocol(item), name))
    return "\n\n".join(p for p in pictures if p)


@task(name="publish_report", cache_policy=NO_CACHE)
def publish_report(
    manifest: Manifest,
    plan: SplitPlan,
    survey: Survey,
    layout: OutputLayout,
    reports: MergeReports,
    submodel_rows: list[TableRow] | None = None,
) -> None:
    """Write report/report.md and merge.json beside the products; publish the report as a
    markdown artifact with its pictures embedded (the live submodel table is published by the
    flow).

    ``reports``: the merge's reports (this run's, or :func:`stored_merge_reports`).
    ``submodel_rows``: the live table's rows (runs and history of every submodel).
    """
    markdown = report_markdown(manifest, plan, reports, submodel_rows)
    storage.write_bytes_atomic(layout.report_md, markdown.encode())
    storage.write_json_atomic(layout.merge_report, reports.json_dict())
    if reports.alignment is not None:
        png = alignment_png(reports.alignment)
        storage.write_bytes_atomic(layout.report_file(ALIGNMENT_PNG), png)
    ui_markdown = markdown.replace("![plan](../plan/plan.png)", report_pictures(layout))
    create_markdown_artifact(
        key=_key("report", survey.fingerprint), markdown=ui_markdown, description="Run report"
    )


def _merged_crs_epsg(reports: MergeReports) -> int | None:
    """The EPSG code of the first merged product's CRS (registry order)."""
    for report in (reports.orthophoto, reports.dsm, reports.dtm, reports.point_cloud):
        if report is not None and report.crs_epsg is not None:
            return report.crs_epsg
    return None


@task(name="publish_existing_merge", cache_policy=NO_CACHE)
def publish_existing_merge(
    inputs: list[str], request: ExistingMerge, merged: MergedProducts, layout: OutputLayout
) -> Manifest:
    """Write merge.json, report.md (opening with the product summary, as a ``reconstruct``
    run's), the STAC catalogue (``stac/collection.json``) and, last, manifest.json of a merge of
    outputs made elsewhere.

    The manifest lists an ``all.zip`` input's products as its archive members
    (``zip://MEMBER::ARCHIVE``, :func:`~prefect_odm.merge.existing.archived_product_urls`): the
    merge read them from a working folder that is gone by now. The catalogue has the merged Item
    and one Item per input that is not an archive (a STAC asset is a file a client opens).

    Returns:
        The manifest (``crs_epsg`` that of the merged products, else the plan's, else 0).
    """
    from prefect_odm.publish.stac import write_stac

    reports = merged.reports
    manifest = Manifest(
        version=__version__,
        created=datetime.now(UTC),
        source=", ".join(inputs),
        survey_fingerprint=request.identity,
        plan_fingerprint=request.plan_fingerprint,
        merge_fingerprint=request.identity,
        crs_epsg=_merged_crs_epsg(reports) or request.crs_epsg or 0,
        products=merged.stored,
        submodels=[
            SubmodelResult(
                submodel_id=sid,
                fingerprint="",
                status="reused",
                products=archived_product_urls(
                    storage.absolute(request.locations.get(sid, "")),
                    {p: storage.absolute(url) for p, url in prods.items()},
                ),
            )
            for sid, prods in sorted(request.products.items())
        ],
        coverage=reports.coverage_figures(),
        alignment=reports.alignment,
    )
    storage.write_json_atomic(layout.merge_report, reports.json_dict())
    if reports.alignment is not None:
        png = alignment_png(reports.alignment)
        storage.write_bytes_atomic(layout.report_file(ALIGNMENT_PNG), png)
    markdown = existing_merge_markdown(manifest, reports)
    storage.write_bytes_atomic(layout.report_md, markdown.encode())
    kept = [r for r in manifest.submodels if not any(map(_in_archive, r.products.values()))]
    write_stac(layout.survey_dir, manifest.model_copy(update={"submodels": kept}))
    storage.write_json_atomic(layout.manifest, manifest.model_dump(mode="json"))
    return manifest


def _in_archive(url: str) -> bool:
    return url.startswith("zip://")


def existing_merge_markdown(manifest: Manifest, reports: MergeReports) -> str:
    """The report of a merge of outputs made elsewhere: inputs, products, coverage, seams and
    the alignment (its corrections, residuals, gates and picture, ``alignment.png``)."""
    plan = f", plan `{manifest.plan_fingerprint[:16]}`" if manifest.plan_fingerprint else ""
    lines = [
        "# Merge of existing outputs",
        "",
        f"Inputs: `{manifest.source}`{plan}, EPSG:{manifest.crs_epsg}, prefect-odm "
        f"{manifest.version}.",
        "",
        *product_summary_lines(manifest),  # how big, how sharp, how complete, as reconstruct's
        "## Products",
        "",
    ]
    lines += product_path_lines(manifest.products)
    lines += ["", "## Inputs merged", ""]
    lines += [f"- {r.submodel_id}" for r in manifest.submodels]
    if manifest.coverage:
        lines += ["", "## Coverage", ""]
        lines += [f"- {k}: {v:.4g}" for k, v in sorted(manifest.coverage.items())]
    if reports.orthophoto is not None:
        lines += seam_lines(reports.orthophoto)
    lines += alignment_lines(reports.alignment, reports.dsm)
    return "\n".join(lines) + "\n"
