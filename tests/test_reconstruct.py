"""End to end: the reconstruct flow on real images, through the built-in engine over HTTP and a
real Prefect API; and the command line's behaviour on bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from uuid import uuid4

import laspy
import numpy as np
import pytest
import rasterio
from shapely.geometry import MultiPoint

from prefect_odm.models import ProcessingOptions

pytestmark = pytest.mark.integration


def _median_dsm_difference_m(dsm_path: Path, reference_laz: Path) -> tuple[float, int]:
    """Median |DSM - reference| over cells where both have data (reference: mean z per cell)."""
    las = laspy.read(reference_laz)
    with rasterio.open(dsm_path) as ds:
        dsm = ds.read(1, masked=True)
        rows, cols = rasterio.transform.rowcol(ds.transform, np.asarray(las.x), np.asarray(las.y))
        rows, cols = np.asarray(rows), np.asarray(cols)
        inside = (rows >= 0) & (rows < ds.height) & (cols >= 0) & (cols < ds.width)
        flat = rows[inside] * ds.width + cols[inside]
        z = np.asarray(las.z)[inside]
        sums = np.bincount(flat, weights=z, minlength=ds.width * ds.height)
        counts = np.bincount(flat, minlength=ds.width * ds.height)
    ref = np.full(dsm.shape, np.nan)
    has = counts > 0
    ref.ravel()[has] = sums[has] / counts[has]
    both = ~np.ma.getmaskarray(dsm) & np.isfinite(ref)
    diff = np.abs(dsm.data[both] - ref[both])
    return float(np.median(diff)), int(both.sum())


def _covered_fraction_of_camera_hull(ortho: Path, manifest: dict, plan: dict) -> float:
    hull = MultiPoint([(c["x_m"], c["y_m"]) for c in plan["cameras"]]).convex_hull
    with rasterio.open(ortho) as ds:
        step = max(1, int(0.25 / ds.res[0]))  # sample on a ~25 cm lattice
        alpha = ds.read(4)[::step, ::step]
        rows, cols = np.mgrid[0 : ds.height : step, 0 : ds.width : step]
        xs, ys = rasterio.transform.xy(ds.transform, rows.ravel(), cols.ravel())
    from shapely import contains_xy

    inside = contains_xy(hull, np.asarray(xs), np.asarray(ys))
    return float((alpha.ravel()[inside] > 0).mean())


@pytest.fixture(scope="module")
def brighton_run(prefect_api, brighton_images, tmp_path_factory):
    """One SfM reconstruction of brighton in 2+ submodels, shared by the checks below."""
    os.environ["PREFECT_ODM_HOME"] = str(tmp_path_factory.mktemp("odm-home"))
    from prefect_odm.flows import reconstruct

    out = tmp_path_factory.mktemp("brighton-out")
    manifest = reconstruct(
        images=str(brighton_images), output=str(out), split=10, split_overlap_m=20
    )
    return out, manifest


def test_brighton_products_open_with_crs_and_cover_the_survey(brighton_run, data_dir):
    out, manifest = brighton_run
    assert len(manifest.submodels) >= 2
    assert all(r.status == "completed" for r in manifest.submodels)
    assert manifest.crs_epsg == 32615
    for product in ("orthophoto", "dsm"):
        with rasterio.open(manifest.products[product]) as ds:
            assert ds.crs.to_epsg() == 32615
    with laspy.open(manifest.products["point_cloud"]) as reader:
        assert reader.header.parse_crs().to_epsg() == 32615
        assert reader.header.point_count > 1000
    survey_dir = Path(manifest.products["orthophoto"]).parents[1]
    plan = json.loads((survey_dir / "plan" / "plan.json").read_text())
    assert (
        _covered_fraction_of_camera_hull(
            Path(manifest.products["orthophoto"]), manifest.model_dump(), plan
        )
        >= 0.95
    )
    assert (survey_dir / "manifest.json").exists() and (
        survey_dir / "report" / "report.md"
    ).exists()


def test_brighton_dsm_agrees_with_opendronemap(brighton_run, data_dir):
    _, manifest = brighton_run
    median, cells = _median_dsm_difference_m(
        Path(manifest.products["dsm"]), data_dir / "brighton_beach_1600" / "reference" / "model.laz"
    )
    assert cells > 1000
    assert median <= 3.0, f"median |DSM - ODM| = {median:.2f} m"


def test_second_identical_run_reuses_every_submodel(brighton_run, brighton_images):
    from prefect_odm.flows import reconstruct

    out, first = brighton_run
    second = reconstruct(images=str(brighton_images), output=str(out), split=10, split_overlap_m=20)
    assert [r.status for r in second.submodels] == ["reused"] * len(first.submodels)
    assert second.merge_fingerprint == first.merge_fingerprint
    assert second.products == first.products


def test_changed_option_processes_again_and_renamed_inputs_change_nothing(
    prefect_api, brighton_images, tmp_path, odm_home, monkeypatch
):
    from prefect_odm.flows import reconstruct

    out = tmp_path / "out"
    fast = ProcessingOptions(pipeline="direct")
    from prefect import tags

    run_tag = f"renamed-inputs-{uuid4().hex}"  # this run's artifacts, whatever else runs
    with tags(run_tag):
        a = reconstruct(
            images=str(brighton_images), output=str(out), split=10, split_overlap_m=20, options=fast
        )
    assert {r.status for r in a.submodels} == {"completed"}
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        ArtifactFilter,
        ArtifactFilterFlowRunId,
        FlowRunFilter,
        FlowRunFilterTags,
    )

    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(  # the flow's and its submodels' subflows
            flow_run_filter=FlowRunFilter(tags=FlowRunFilterTags(all_=[run_tag]))
        )
        assert len(runs) == 1 + len(a.submodels)
        artifacts = client.read_artifacts(
            artifact_filter=ArtifactFilter(
                flow_run_id=ArtifactFilterFlowRunId(any_=[r.id for r in runs])
            )
        )
    progress = [x for x in artifacts if x.type == "progress"]
    assert any((x.key or "").startswith("submodels-done-") and x.data == 100.0 for x in progress)
    assert any(str(x.description).startswith("submodel-000:") for x in progress)
    tables = [x for x in artifacts if x.type == "table" and (x.key or "").startswith("submodels-")]
    assert len(tables) == 1  # this run's live submodel table
    # Inline, each submodel had one flow run (one try of its run_submodel task).
    rows = json.loads(str(tables[0].data))
    assert sorted(r["submodel"] for r in rows) == sorted(r.submodel_id for r in a.submodels)
    assert [r["runs"] for r in rows] == [1] * len(rows)
    # Renamed copies (links), listed in another order: same survey, same plan, everything reused.
    renamed = tmp_path / "renamed"
    renamed.mkdir()
    for i, src in enumerate(sorted(brighton_images.glob("*.JPG"), reverse=True)):
        (renamed / f"IMG_{i:04d}.jpg").symlink_to(src)
    b = reconstruct(
        images=str(renamed), output=str(out), split=10, split_overlap_m=20, options=fast
    )
    assert b.survey_fingerprint == a.survey_fingerprint and b.plan_fingerprint == a.plan_fingerprint
    assert {r.status for r in b.submodels} == {"reused"}
    c = reconstruct(
        images=str(brighton_images),
        output=str(out),
        split=10,
        split_overlap_m=20,
        options=ProcessingOptions(pipeline="direct", orthophoto_resolution_cm=10),
    )
    assert {r.status for r in c.submodels} == {"completed"}
    with rasterio.open(c.products["orthophoto"]) as ds:
        assert ds.res[0] == pytest.approx(0.10, rel=0.01)
    # A merge stopped half-way (here: failing as it starts writing) leaves no manifest describing
    # the products it was replacing; the earlier products stay until a merge replaces them.
    import importlib

    reconstruct_module = importlib.import_module("prefect_odm.flows.reconstruct")

    manifest_file = next(out.glob("*/manifest.json"))

    def stopped(*args, **kwargs):
        assert not manifest_file.exists()  # retired before the first product is written
        raise KeyboardInterrupt

    monkeypatch.setattr(reconstruct_module, "merge_products", stopped)
    with pytest.raises(KeyboardInterrupt):
        reconstruct(
            images=str(brighton_images),
            output=str(out),
            split=10,
            split_overlap_m=20,
            options=ProcessingOptions(pipeline="direct", orthophoto_resolution_cm=20),
        )
    assert not manifest_file.exists() and Path(c.products["orthophoto"]).exists()


def _cli(args: list[str], api_url: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PREFECT_API_URL=api_url, PREFECT_ODM_HOME=str(tmp_path / "home"))
    return subprocess.run(
        [sys.executable, "-m", "prefect_odm.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


@pytest.mark.parametrize("kind", ["missing", "empty", "no_gps"])
def test_cli_bad_input_one_line_nonzero_nothing_written(
    kind, prefect_api, brighton_images, tmp_path
):
    from PIL import Image

    images = tmp_path / "images"
    if kind == "empty":
        images.mkdir()
        (images / "notes.txt").write_text("no images here")
    elif kind == "no_gps":
        images.mkdir()
        for src in sorted(brighton_images.glob("*.JPG"))[:3]:
            Image.open(src).save(images / src.name, "JPEG")  # re-encoded without EXIF
    out = tmp_path / "out"
    proc = _cli(["reconstruct", str(images), "--output", str(out)], prefect_api, tmp_path)
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("prefect-odm: error:") and str(images) in lines[0]
    assert not out.exists()


def test_cli_repeat_with_nothing_changed_runs_nothing(brighton_images, tmp_path):
    """On the embedded API, an identical repeat of the command is answered from the last run's
    record without starting Prefect; the same images under another path run the flow, which
    reuses everything by fingerprint."""
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env.update(PREFECT_ODM_HOME=str(tmp_path / "home"), PREFECT_HOME=str(tmp_path / "prefect-home"))
    out = tmp_path / "out"
    cmd = [
        sys.executable,
        "-m",
        "prefect_odm.cli",
        "reconstruct",
        str(brighton_images),
        "--output",
        str(out),
        "--split",
        "10",
        "--split-overlap-m",
        "20",
        "--pipeline",
        "direct",
    ]
    first = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert first.returncode == 0, first.stderr
    manifest = next(out.glob("*/manifest.json"))
    written = manifest.stat().st_mtime_ns
    second = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert second.returncode == 0, second.stderr
    assert "nothing changed since the last run" in second.stdout
    assert second.stdout.count(": reused") == first.stdout.count(": completed") >= 2
    assert manifest.stat().st_mtime_ns == written
    moved = tmp_path / "moved"
    moved.mkdir()
    for src in sorted(brighton_images.glob("*.JPG")):
        (moved / src.name).symlink_to(src)
    third = subprocess.run(
        [*cmd[:4], str(moved), *cmd[5:]], capture_output=True, text=True, env=env, timeout=600
    )
    assert third.returncode == 0, third.stderr
    assert "nothing changed" not in third.stdout
    assert third.stdout.count(": reused") >= 2 and ": completed" not in third.stdout


def test_brighton_report_shows_the_seam_figures(brighton_run):
    _, manifest = brighton_run
    report_md = Path(manifest.products["orthophoto"]).parents[1] / "report" / "report.md"
    text = report_md.read_text()
    assert "Mean absolute colour difference across seams: " in text
    assert " DN before colour balancing, " in text and " DN after." in text
