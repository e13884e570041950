"""The seams the alignment's stage checks measure (``merge.overlaps_seams``), on synthetic
products of one textured ground (``seam_products.py``): the orthophoto displacement sees tens
of metres where 20 m phase-correlation tiles cannot, moving the matches by a correction gives
what matching the corrected orthophotos gives, and the DSM figures are the DEM merge's own."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import rasterio
from align_blocks import ORIGIN
from seam_products import Ground, move_products, write_products

from prefect_odm.align import RasterCorrection, Similarity
from prefect_odm.merge import merge_dems
from prefect_odm.merge.overlaps import ortho_shifts
from prefect_odm.merge.overlaps_matches import orthophoto_matches
from prefect_odm.merge.overlaps_seams import SeamMeter, dsm_seams
from prefect_odm.ownership import Ownership

X0, Y0 = float(ORIGIN[0]), float(ORIGIN[1])


def _pair(tmp_path: Path) -> dict[str, dict[str, str]]:
    """Two submodels 140 m wide overlapping 60 m, products that agree exactly."""
    ground = Ground((X0 - 60, Y0 - 20, X0 + 300, Y0 + 140))
    return {
        "submodel-000": write_products(ground, (X0, Y0, X0 + 140, Y0 + 120), tmp_path / "a"),
        "submodel-001": write_products(ground, (X0 + 80, Y0, X0 + 220, Y0 + 120), tmp_path / "b"),
    }


def _correction(turn_deg: float, shift_m: tuple[float, float, float]) -> RasterCorrection:
    centre = np.array([X0 + 150, Y0 + 60, 0.0])
    sim = Similarity.from_parameters(np.radians([0, 0, turn_deg]), 0.0, np.array(shift_m), centre)
    return sim.raster_correction(0.0)


def _paths(products: dict[str, dict[str, str]], name: str) -> dict[str, Path]:
    return {sid: Path(p[name]) for sid, p in products.items()}


def test_the_orthophoto_displacement_sees_tens_of_metres(tmp_path: Path) -> None:
    products = _pair(tmp_path)
    move_products(products["submodel-001"], _correction(0.0, (24.0, -7.0, 0.0)))
    orthos = _paths(products, "orthophoto")
    (seam,) = SeamMeter({}, orthos, 32615).measure()
    assert seam.orthophoto is not None and seam.orthophoto.matches > 200
    assert seam.orthophoto.shift_m == pytest.approx((24.0, -7.0), abs=0.02)
    assert seam.orthophoto.median_m == pytest.approx(np.hypot(24.0, 7.0), abs=0.02)
    # 20 m tiles see at most 5 m: no tile finds the 25 m, or a wrong peak does
    found = ortho_shifts(orthos, tile_m=20.0)
    assert all(abs(s.dx_m - 24.0) > 1.0 for s in found.values()), found


def test_moving_the_matches_is_matching_the_corrected_orthophotos(tmp_path: Path) -> None:
    products = _pair(tmp_path)
    orthos = _paths(products, "orthophoto")
    fix = _correction(0.4, (2.5, 1.2, 0.0))
    (predicted,) = SeamMeter({}, orthos, 32615).measure({"submodel-001": fix})
    # the corrected orthophoto, written as the merge places it (its corrected geotransform)
    moved = tmp_path / "moved.tif"
    shutil.copy(orthos["submodel-001"], moved)
    move_products({"orthophoto": str(moved), "dsm": products["submodel-001"]["dsm"]}, fix)
    (rematched,) = SeamMeter({}, {"submodel-000": orthos["submodel-000"], "submodel-001": moved},
                             32615).measure()  # fmt: skip
    assert predicted.orthophoto is not None and rematched.orthophoto is not None
    print(f"moved matches {predicted.orthophoto}, matches of the moved orthophoto "
          f"{rematched.orthophoto}")  # fmt: skip
    assert predicted.orthophoto.shift_m == pytest.approx(rematched.orthophoto.shift_m, abs=0.02)
    assert predicted.orthophoto.median_m == pytest.approx(rematched.orthophoto.median_m, abs=0.02)
    assert predicted.orthophoto.median_m > 2.0


def test_the_dsm_seam_is_the_dem_merges_own_figure(tmp_path: Path) -> None:
    from prefect_odm.align import AlignmentReport, AlignmentResult, SubmodelTransform

    products = _pair(tmp_path)
    dsms = _paths(products, "dsm")
    # the second submodel's DSM 0.8 m high and 1.5 m east; the correction takes back 0.6 m
    move_products(products["submodel-001"],
                  RasterCorrection(((1.0, 0.0, 1.5), (0.0, 1.0, 0.0)), (0.0, 0.0), 0.0, 1.0,
                                   (0.8, 0.0, 0.0)))  # fmt: skip
    step = SubmodelTransform(
        submodel_id="submodel-001", kind="height_tilt", rotation=(1, 0, 0, 0, 1, 0, 0, 0, 1),
        translation_m=(-1.0, 0.0, -0.6), centre_m=(X0 + 150, Y0 + 60, 0.0),
        height_plane=(-0.6, 0.0, 0.0), rotation_deg=0.0, tilt_deg=0.0, scale_change=0.0,
        max_correction_m=1.2, n_samples=100,
    )  # fmt: skip
    still = step.model_copy(update={"submodel_id": "submodel-000", "translation_m": (0, 0, 0),
                                    "height_plane": (0, 0, 0), "max_correction_m": 0.0})  # fmt: skip
    result = AlignmentResult(method="dem", gauge="mean", transforms=[still, step], overlaps=[],
                             submodels=[], solve_seconds=0.0, iterations=1)  # fmt: skip
    report = AlignmentReport(result=result)
    fixes = report.raster_corrections()
    measured = dsm_seams(dsms, fixes, crs_epsg=32615)
    own = Ownership.from_cameras([(X0 + 70, Y0 + 60, "submodel-000"),
                                  (X0 + 150, Y0 + 60, "submodel-001")])  # fmt: skip
    merged = merge_dems(dsms, tmp_path / "dsm.tif", ownership=own, alignment=report,
                        crs_epsg=32615)  # fmt: skip
    assert merged.overlap_seams == measured
    seam = measured["submodel-000|submodel-001"]
    # against the ground itself: 0.2 m high and 0.5 m east on a 1 in 10 slope is 0.15 m
    assert seam.median_m == pytest.approx(0.2 - 0.05, abs=0.03)
    _check_by_hand(dsms, fixes["submodel-001"], seam.median_m)


def _check_by_hand(dsms: dict[str, Path], fix: RasterCorrection, median_m: float) -> None:
    """The same median from the two GeoTIFFs read with numpy, the correction applied by hand."""
    with rasterio.open(dsms["submodel-000"]) as a, rasterio.open(dsms["submodel-001"]) as b:
        za, zb, ta, tb = a.read(1), b.read(1), a.transform, b.transform
    (p, _, c), (_, e, f) = fix.inverse_affine()
    xs = np.arange(X0 + 90.25, X0 + 130, 0.5)
    ys = np.arange(Y0 + 10.25, Y0 + 110, 0.5)
    gx, gy = np.meshgrid(xs, ys)
    ra, ca = ((gy - ta.f) / ta.e).astype(int), ((gx - ta.c) / ta.a).astype(int)
    sx, sy = p * gx + c, e * gy + f
    rb, cb = ((sy - tb.f) / tb.e).astype(int), ((sx - tb.c) / tb.a).astype(int)
    dz = fix.corrected_heights(sx, sy, zb[rb, cb]) - za[ra, ca]
    assert float(np.median(dz)) == pytest.approx(median_m, abs=0.02)


def test_matches_need_neighbours(tmp_path: Path) -> None:
    products = _pair(tmp_path)
    assert orthophoto_matches({"submodel-000": Path(products["submodel-000"]["orthophoto"])}) == []


def test_products_far_apart_are_aligned_from_the_matches(tmp_path: Path) -> None:
    from prefect_odm.tasks.align import build_alignment

    from prefect_odm.align import AlignmentOptions
    from prefect_odm.models import MergeOptions

    products = _pair(tmp_path)
    far = RasterCorrection(((1.0, 0.0, 12.0), (0.0, 1.0, -4.0)), (0.0, 0.0), 0.0, 1.0,
                           (0.7, 0.0, 0.0))  # fmt: skip
    move_products(products["submodel-001"], far)
    shots: dict[str, str | None] = {sid: None for sid in products}
    # 12.6 m is beyond the 5 m correction gate (each submodel moves half): accepted here
    report = build_alignment(products, shots, MergeOptions(accept_alignment=True), None, 32615)
    assert report is not None and report.result.method == "dem"
    none, applied = report.stage("none"), report.final_stage()
    assert none is not None and applied is not None and applied.stage == "products"
    (before,), (after,) = none.seams, applied.seams
    assert before.orthophoto is not None and before.orthophoto.median_m > 12.0
    assert after.orthophoto is not None and after.orthophoto.median_m < 0.1, after
    assert after.dsm is not None and abs(after.dsm.median_m) < 0.05, after
    assert {f.figure for f in report.failures} == {"max_correction_m"}
    # from the 20 m tiles alone (no matches), the 12.6 m stays
    tiles_only = MergeOptions(accept_alignment=True, alignment=AlignmentOptions(check_stages=False))
    blind = build_alignment(products, shots, tiles_only, None, 32615)
    assert blind is not None
    (seam,) = SeamMeter({}, _paths(products, "orthophoto"), 32615).measure(
        blind.raster_corrections()
    )
    assert seam.orthophoto is not None and seam.orthophoto.median_m > 5.0, seam
