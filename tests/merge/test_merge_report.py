"""The run report shows the seam figures of a real orthophoto merge (before and after balancing)."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest
from prefect_odm.tasks.report import report_markdown, stored_merge_reports
from pydantic import ValidationError

from prefect_odm import storage
from prefect_odm.errors import InputError
from prefect_odm.grid import Grid
from prefect_odm.layout import OutputLayout
from prefect_odm.merge import MergeReports, merge_orthophotos, seam_method
from prefect_odm.merge.reports import CoverageReport, SubmodelCoverage
from prefect_odm.models import Manifest, ProcessingOptions, SplitPlan, Submodel, SubmodelResult
from prefect_odm.ownership import Ownership

from .conftest import CAMERAS, EPSG, TILES

SEAM_LINE = re.compile(
    r"Mean absolute colour difference across seams: ([\d.]+) DN before colour balancing, "
    r"([\d.]+) DN after\."
)


def _plan_and_manifest() -> tuple[SplitPlan, Manifest]:
    submodels = [
        Submodel(
            id=sid,
            image_names=[f"{sid}.jpg"],
            core_image_names=[f"{sid}.jpg"],
            overlap_image_count=0,
            core_area={},
            footprint={},
            area_m2=1.0,
            estimated_memory_gib=1.0,
            fingerprint=f"fp-{sid}",
        )
        for sid in TILES
    ]
    plan = SplitPlan(
        survey_fingerprint="0" * 64,
        crs_epsg=EPSG,
        split=10,
        split_overlap_m=20.0,
        min_submodel_images=1,
        options=ProcessingOptions(),
        engine_identity="test",
        submodels=submodels,
        cameras=[],
        fingerprint="plan",
    )
    manifest = Manifest(
        version="test",
        created=datetime.now(UTC),
        source="synthetic tiles",
        survey_fingerprint="0" * 64,
        plan_fingerprint="plan",
        merge_fingerprint="merge",
        crs_epsg=EPSG,
        products={},
        submodels=[
            SubmodelResult(submodel_id=sid, fingerprint=f"fp-{sid}", status="completed")
            for sid in TILES
        ],
    )
    return plan, manifest


def test_report_md_shows_the_seam_figures_before_and_after_balancing(
    ortho_tiles: Callable, tmp_path: Path
) -> None:
    tiles, _ = ortho_tiles(brighten={"b": 20})
    ortho = merge_orthophotos(tiles, tmp_path / "o.tif", ownership=Ownership.from_cameras(CAMERAS))
    reports = MergeReports(orthophoto=ortho)
    plan, manifest = _plan_and_manifest()
    markdown = report_markdown(manifest, plan, reports)
    found = SEAM_LINE.search(markdown)
    assert found, markdown
    before, after = float(found.group(1)), float(found.group(2))
    assert before == pytest.approx(ortho.seam_mean_abs_diff_before, abs=0.005)
    assert after == pytest.approx(ortho.seam_mean_abs_diff_after, abs=0.005)
    assert before > 10 and after < 3
    for seam in ortho.seams:  # one table row per seam
        assert f"| {seam.a} / {seam.b} | {seam.pixels} |" in markdown
    # a reused merge renders the stored merge.json (its JSON data, read back) the same way
    assert MergeReports.model_validate(reports.json_dict()) == reports
    stored = MergeReports.model_validate(reports.json_dict())
    assert report_markdown(manifest, plan, stored) == markdown


def test_unknown_seam_method_is_a_clear_error() -> None:
    own = Ownership.from_cameras(CAMERAS)
    grid = Grid(0.0, 10.0, 1.0, 10, 10)
    assert seam_method("ownership", own, grid).seam_distance is not None
    with pytest.raises(InputError, match="unknown seam method 'graph-cut'.*least-cost, ownership"):
        seam_method("graph-cut", own, grid)


def _coverage() -> CoverageReport:
    return CoverageReport(
        merged_area_m2=1200.0,
        union_area_m2=1210.5,
        coverage_of_union=0.9913,
        planned_area_m2=None,
        coverage_of_planned=None,
        per_submodel=(SubmodelCoverage(submodel_id="a", covered_area_m2=600.0,
                                       covered_by_merged_fraction=1.0),),
        cell_size_m=1.0,
        elapsed_seconds=0.25,
    )  # fmt: skip


def test_stored_merge_json_reads_back_once_as_the_typed_reports(
    ortho_tiles: Callable, tmp_path: Path
) -> None:
    tiles, _ = ortho_tiles()
    ortho = merge_orthophotos(tiles, tmp_path / "o.tif", ownership=Ownership.from_cameras(CAMERAS))
    reports = MergeReports.of_products({"orthophoto": ortho}, coverage=_coverage())
    layout = OutputLayout(str(tmp_path / "out"), "f" * 64)
    assert stored_merge_reports(layout) is None  # no merge.json: the merge is not reused
    storage.write_json_atomic(layout.merge_report, reports.json_dict())
    stored = stored_merge_reports(layout)
    assert stored == reports
    assert stored is not None and stored.json_dict() == reports.json_dict()  # same merge.json
    # the manifest's coverage: the numeric figures, as when it was read from the JSON data
    data = reports.json_dict()["coverage"]
    assert reports.coverage_figures() == {
        k: float(v) for k, v in data.items() if isinstance(v, int | float)
    }
    assert MergeReports().coverage_figures() == {}
    # an older merge.json: without fields added since (defaults), with a key no longer written
    older = reports.json_dict()
    del older["orthophoto"]["phase_seconds"]
    older["orthophoto"]["blend"] = "feather"
    storage.write_json_atomic(layout.merge_report, older)
    old = stored_merge_reports(layout)
    assert old is not None and old.orthophoto is not None and old.orthophoto.phase_seconds == {}
    # not a merge report: not reused (the merge is made again), never a half-read report
    storage.write_json_atomic(layout.merge_report, {"orthophoto": {"path": "o.tif"}})
    assert stored_merge_reports(layout) is None


def test_a_report_of_another_product_kind_is_refused() -> None:
    with pytest.raises(ValidationError):
        MergeReports.of_products({"orthophoto": _coverage()})  # type: ignore[dict-item]
