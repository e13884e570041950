"""Prefect tasks that store the plan and the report next to the outputs and publish them as artifacts."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from prefect import task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE

from prefect_odm import storage
from prefect_odm.layout import OutputLayout, join
from prefect_odm.models import Manifest, SplitPlan, Survey


def _key(prefix: str, fingerprint: str) -> str:
    return f"{prefix}-{fingerprint[:12]}".lower()


@task(name="publish_plan", cache_policy=NO_CACHE)
def publish_plan(plan: SplitPlan, survey: Survey, layout: OutputLayout) -> None:
    """Write plan.json, survey.json, plan.geojson and plan.png; publish the plan table."""
    from prefect_odm.planviz import plan_markdown, plan_rows

    _write_plan_files(plan, survey, layout, picture=not _plan_stored(plan, layout))
    create_table_artifact(
        key=_key("plan", survey.fingerprint), table=plan_rows(plan), description="Split plan"
    )
    create_markdown_artifact(
        key=_key("plan-report", survey.fingerprint),
        markdown=plan_markdown(plan, survey),
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


def _write_plan_files(
    plan: SplitPlan, survey: Survey, layout: OutputLayout, *, picture: bool
) -> None:
    """survey.json and plan.json always (image locations may have moved, the plan identity
    does not see names); the GeoJSON and PNG only when the plan changed."""
    from prefect_odm.planviz import plan_geojson, plan_png

    storage.write_json_atomic(layout.survey_json, survey.model_dump(mode="json"))
    if picture:
        storage.write_json_atomic(layout.plan_geojson, plan_geojson(plan))
        with tempfile.TemporaryDirectory() as tmp:
            png = Path(tmp) / "plan.png"
            plan_png(plan, png)
            storage.put_file(png, layout.plan_png)
    # plan.json last: process_submodel runs read it, and survey.json beside it.
    storage.write_json_atomic(layout.plan_json, plan.model_dump(mode="json"))


def report_markdown(manifest: Manifest, plan: SplitPlan, merge_reports: dict[str, Any]) -> str:
    """The run report as markdown: products, submodels, coverage, rejected images, timings."""
    lines = [
        f"# Reconstruction of `{manifest.source}`",
        "",
        f"Survey `{manifest.survey_fingerprint[:16]}`, EPSG:{manifest.crs_epsg}, "
        f"{len(plan.submodels)} submodels, prefect-odm {manifest.version}.",
        "",
        "## Products",
        "",
    ]
    lines += [f"- {name}: `{url}`" for name, url in sorted(manifest.products.items())]
    lines += [
        "",
        "## Submodels",
        "",
        "| submodel | images | state | node | attempts | seconds | est. GiB |",
        "|---|---|---|---|---|---|---|",
    ]
    by_id = {s.id: s for s in plan.submodels}
    for r in manifest.submodels:
        sm = by_id[r.submodel_id]
        lines.append(
            f"| {r.submodel_id} | {len(sm.image_names)} | {r.status} | {r.node_url or '-'} | {r.attempts} "
            f"| {r.duration_seconds:.1f} | {sm.estimated_memory_gib:.1f} |"
        )
    if manifest.failed_submodels:
        lines += ["", "## Failed submodels (gaps in the products)", ""]
        lines += [f"- {sid}: {why}" for sid, why in sorted(manifest.failed_submodels.items())]
    if manifest.coverage:
        lines += ["", "## Coverage", ""]
        lines += [f"- {k}: {v:.4g}" for k, v in sorted(manifest.coverage.items())]
    seams = merge_reports.get("orthophoto", {})
    if isinstance(seams, dict) and "seam_mean_abs_diff" in seams:
        lines += [
            "",
            f"Mean absolute colour difference across seams: {seams['seam_mean_abs_diff']}",
        ]
    if manifest.rejected_images:
        lines += ["", "## Rejected images", ""]
        lines += [f"- `{r.name}`: {r.reason} {r.detail}".rstrip() for r in manifest.rejected_images]
    lines += ["", "## Timings (seconds)", ""]
    lines += [f"- {k}: {v:.1f}" for k, v in manifest.timings_seconds.items()]
    lines += ["", "![plan](../plan/plan.png)", ""]
    return "\n".join(lines)


@task(name="publish_report", cache_policy=NO_CACHE)
def publish_report(
    manifest: Manifest,
    plan: SplitPlan,
    survey: Survey,
    layout: OutputLayout,
    merge_reports: dict[str, Any],
) -> None:
    """Write report/report.md and merge.json beside the products; publish them as artifacts."""
    markdown = report_markdown(manifest, plan, merge_reports)
    storage.write_bytes_atomic(join(layout.report_dir, "report.md"), markdown.encode())
    storage.write_json_atomic(join(layout.report_dir, "merge.json"), merge_reports)
    create_markdown_artifact(
        key=_key("report", survey.fingerprint), markdown=markdown, description="Run report"
    )
    create_table_artifact(
        key=_key("submodels", survey.fingerprint),
        table=[
            {
                "submodel": r.submodel_id,
                "state": r.status,
                "node": r.node_url or "",
                "attempts": r.attempts,
                "seconds": r.duration_seconds,
                "error": r.error or "",
            }
            for r in manifest.submodels
        ],
        description="Submodels",
    )
