"""The alignment between submodels wired into a real run: brighton in two submodels (built-in
engine, structure from motion, a real Prefect API), then one submodel's products and cameras
moved by the issue's known transform and aligned and merged again."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import rasterio
from prefect_odm.tasks.align import build_alignment

from prefect_odm.align import AlignmentError, AlignmentOptions, read_shots_geojson
from prefect_odm.merge import merge_dems
from prefect_odm.merge.alignment_figures import stage_label
from prefect_odm.merge.overlaps import dem_overlaps, ortho_shifts
from prefect_odm.models import MergeOptions, SplitPlan
from prefect_odm.ownership import Ownership

sys.path.insert(0, str(Path(__file__).parent))
from align_perturb import (  # noqa: E402
    known_error,
    moved_copy,
    products_of,
    recovery,
    submodel_folders,
)

pytestmark = pytest.mark.integration


def _gps(plan: SplitPlan) -> dict[str, tuple[float, float, float]]:
    return {c.name: (c.x_m, c.y_m, c.z_m) for c in plan.cameras if c.z_m is not None}


def test_run_records_its_alignment_in_the_manifest_and_report(brighton_split) -> None:
    manifest, survey_dir, _ = brighton_split
    a = manifest.alignment
    assert a is not None and a.result.method == "cameras" and a.refinement is not None
    assert a.failures == [] and not a.accepted
    assert [t.submodel_id for t in a.result.transforms] == [
        r.submodel_id for r in manifest.submodels
    ]
    assert a.result.camera_gps and a.result.overlaps
    ov = a.refinement.overlaps[0]
    print(f"brighton overlap DSM rms {ov.rms_before_m:.3f} -> {ov.rms_after_m:.3f} m")
    assert ov.rms_after_m < ov.rms_before_m
    report = (survey_dir / "report" / "report.md").read_text()
    assert "## Alignment between submodels" in report
    _check_report_shows_the_merged_figures(a, survey_dir, report)
    # the node's camera models are kept with each submodel; about 10 images a submodel keep the
    # simple camera (one radial term, the principal point at the centre)
    for folder in submodel_folders(survey_dir).values():
        (camera,) = json.loads((folder / "report" / "cameras.json").read_text()).values()
        assert camera["k2"] == camera["c_x"] == camera["c_y"] == 0.0 and camera["k1"] != 0.0


def _check_report_shows_the_merged_figures(alignment, survey_dir: Path, report: str) -> None:  # type: ignore[no-untyped-def]
    """The applied stage's DSM seams are those the DSM merge measured (``merge.json``), in the
    manifest and in ``report.md``, row for row."""
    final = alignment.final_stage()
    assert final is not None and final.seams, alignment.stages
    merged = json.loads((survey_dir / "report" / "merge.json").read_text())["dsm"]["overlap_seams"]
    assert merged and {s.overlap: s.dsm.model_dump() for s in final.seams if s.dsm} == merged
    for stage in alignment.stages:
        print(f"brighton {stage.stage} (applied {stage.applied}): "
              + "; ".join(f"{s.overlap} {s.orthophoto} {s.dsm}" for s in stage.seams))  # fmt: skip

    def dsm_cells(label: str) -> list[list[str]]:
        rows = [line.split("|")[1:-1] for line in report.splitlines() if line.startswith("| ")]
        return [[c.strip() for c in r[-3:]] for r in rows if r[0].strip() == label]

    shown = dsm_cells("merged DSM (merge.json)")
    assert len(shown) == len(merged) and shown == dsm_cells(stage_label(final))
    for cells, (_, seam) in zip(shown, sorted(merged.items()), strict=True):
        assert cells == [f"{seam['median_m']:+.3f}", f"{seam['p90_m']:.3f}", str(seam["samples"])]


def test_known_transform_is_recovered_and_the_seam_closes(brighton_split, tmp_path) -> None:
    manifest, survey_dir, plan = brighton_split
    folders = submodel_folders(survey_dir)
    products, shots = products_of(folders)
    before = build_alignment(products, shots, MergeOptions(), _gps(plan), plan.crs_epsg)
    assert before is not None
    moved_id = sorted(folders)[1]
    cams = read_shots_geojson(moved_id, Path(shots[moved_id]).read_text())
    error = known_error(cams.centres.mean(axis=0))
    moved = dict(folders)
    ground = before.ground_heights_m[moved_id]
    moved[moved_id] = moved_copy(folders[moved_id], tmp_path / moved_id, error, ground)
    moved_products, moved_shots = products_of(moved)
    after = build_alignment(moved_products, moved_shots, MergeOptions(), _gps(plan), plan.crs_epsg)
    assert after is not None and after.failures == []
    position_m, rotation_deg = recovery(before, after, moved_id, error, shots[moved_id])
    print(f"known transform recovered within {position_m:.4f} m and {rotation_deg:.4f} deg")
    assert position_m < 0.1 and rotation_deg < 0.05

    dsms = {sid: Path(p["dsm"]) for sid, p in moved_products.items()}
    raw = [float(np.median(o.dz)) for o in dem_overlaps(dsms)]
    fixed = [
        float(np.median(o.dz)) for o in dem_overlaps(dsms, corrections=after.raster_corrections())
    ]
    orthos = {sid: Path(p["orthophoto"]) for sid, p in moved_products.items()}
    raw_shift = ortho_shifts(orthos, tile_m=20)
    shift = ortho_shifts(orthos, corrections=after.raster_corrections(), tile_m=20)
    print(f"seam step {raw} -> {fixed} m; orthophoto shift {raw_shift} -> {shift}")
    assert abs(raw[0]) > 1.0 and abs(fixed[0]) < 0.1
    # The orthophoto seam closes from the known 3 m to issue 11's 0.3 m. Tighter is not a
    # measure of the recovery: the two submodels' orthophotos differ by their own
    # misregistration (each projects onto its own surface), up to 0.2 m across the overlap, so
    # the median over its 8-9 tiles moves by 0.05-0.1 m with the tiles the moved copy keeps
    # (the recovery itself is checked on the cameras above).
    assert all(s.magnitude_m > 2.0 for s in raw_shift.values()), raw_shift
    assert shift.keys() == raw_shift.keys()
    assert all(s.magnitude_m < 0.3 for s in shift.values()), shift

    own = Ownership.from_cameras((c.x_m, c.y_m, c.submodel_id) for c in plan.cameras)
    merge_dems(dsms, tmp_path / "dsm.tif", ownership=own, alignment=after, crs_epsg=plan.crs_epsg)
    with rasterio.open(tmp_path / "dsm.tif") as new, rasterio.open(manifest.products["dsm"]) as old:
        a, b = _common(new, old)
    both = ~(np.ma.getmaskarray(a) | np.ma.getmaskarray(b))
    diff = np.abs(a.data[both] - b.data[both])
    print(f"re-merged DSM against the run's: median |dz| {np.median(diff):.3f} m")
    assert np.median(diff) < 0.1


def _common(new, old) -> tuple[np.ma.MaskedArray, np.ma.MaskedArray]:  # type: ignore[no-untyped-def]
    """The two DSMs on the run's grid: the re-merged one resampled (bilinear) onto it (the merge
    takes its cell from the inputs, and the moved copy's 0.2 % scale changes that cell)."""
    from rasterio.warp import Resampling, reproject

    b = old.read(1, masked=True)
    out = np.full(b.shape, np.nan, dtype=np.float32)
    reproject(
        new.read(1, masked=True).filled(np.nan).astype(np.float32),
        out,
        src_transform=new.transform,
        src_crs=new.crs,
        src_nodata=np.nan,
        dst_transform=old.transform,
        dst_crs=old.crs,
        dst_nodata=np.nan,
        resampling=Resampling.bilinear,
    )
    return np.ma.masked_invalid(out), b


def test_a_failed_gate_names_the_submodel_and_accepting_it_is_recorded(brighton_split) -> None:
    _, survey_dir, plan = brighton_split
    products, shots = products_of(submodel_folders(survey_dir))
    strict = AlignmentOptions(max_correction_m=1e-4)
    with pytest.raises(AlignmentError, match=r"submodel-00\d: correction m .* max_correction_m"):
        build_alignment(products, shots, MergeOptions(alignment=strict), _gps(plan))
    options = MergeOptions(alignment=strict, accept_alignment=True)
    accepted = build_alignment(products, shots, options, _gps(plan))
    assert accepted is not None and accepted.accepted
    assert {f.figure for f in accepted.failures} == {"max_correction_m"}
