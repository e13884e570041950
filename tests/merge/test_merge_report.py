"""The run report shows the seam figures of a real orthophoto merge (before and after balancing)."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest
from prefect_odm.tasks.report import report_markdown

from prefect_odm.errors import InputError
from prefect_odm.grid import Grid
from prefect_odm.merge import MergeReports, merge_orthophotos, seam_method
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
    # a reused merge renders the stored merge.json (its JSON data) the same way
    assert report_markdown(manifest, plan, reports.json_dict()) == markdown
    assert MergeReports.model_validate(reports.json_dict()) == reports


def test_unknown_seam_method_is_a_clear_error() -> None:
    own = Ownership.from_cameras(CAMERAS)
    grid = Grid(0.0, 10.0, 1.0, 10, 10)
    assert seam_method("ownership", own, grid).seam_distance is not None
    with pytest.raises(InputError, match="unknown seam method 'graph-cut'.*least-cost, ownership"):
        seam_method("graph-cut", own, grid)
