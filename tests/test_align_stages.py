"""Corrections that never make a seam worse (issue 31, item 4): each alignment stage is applied
only when the seams measured on the products it corrects are no worse; a correction beyond
plausible is refused even with ``accept_alignment``; a tilt the rasters cannot carry is refused.

The products are synthetic (``seam_products.py``): two submodels of one textured ground that
agree exactly, while their cameras (``align_blocks.py``) say the second is off."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from align_blocks import make_block
from prefect_odm.tasks.align import build_alignment
from seam_products import block_products

from prefect_odm.align import (
    AlignmentError,
    AlignmentOptions,
    RasterCorrection,
    Similarity,
    align_submodels,
)
from prefect_odm.align.stage_records import DsmSeam, OrthoSeam, OverlapSeam
from prefect_odm.align.stages import lean_refusals, refusals, seam_m, worsened
from prefect_odm.models import MergeOptions

PAIR = "submodel-000|submodel-001"


def _wrong_cameras(tmp_path: Path, error: Similarity):  # type: ignore[no-untyped-def]
    """Two submodels whose products agree, the second's cameras seen through ``error^-1``: the
    camera step corrects the second by ``error``, which moves its right products off."""
    block = make_block(2, 1)
    tables = block.tables({"submodel-001": error}, noise_m=0.01)
    products, shots, _ = block_products(block, tables, tmp_path)
    gps = {n: tuple(float(v) for v in x) for n, x in block.truth.items()}
    return products, shots, gps


def _moved_m(fix: RasterCorrection, at: np.ndarray) -> tuple[float, float]:
    """How far a raster correction moves the point ``at`` (east, north), metres."""
    (a, b, c), (d, e, f) = fix.affine
    x, y = float(at[0]), float(at[1])
    return (a * x + b * y + c - x, d * x + e * y + f - y)


def _shift(block_centre: np.ndarray, east_m: float) -> Similarity:
    return Similarity(translation=(east_m, 0.0, 0.0), centre=tuple(block_centre))  # type: ignore[arg-type]


def test_a_camera_stage_that_worsens_the_seam_is_dropped(tmp_path: Path) -> None:
    centre = make_block(2, 1).centroid("submodel-001")
    products, shots, gps = _wrong_cameras(tmp_path, _shift(centre, 3.0))
    # Unchecked, the camera step is applied: it moves the second submodel's products 3 m east
    # (the refinement then has to take them back, splitting the 3 m between the two)
    unchecked = MergeOptions(alignment=AlignmentOptions(check_stages=False))
    blind = build_alignment(products, shots, unchecked, gps, 32615)
    assert blind is not None and blind.applies("cameras") and blind.stage("cameras") is not None
    fix = blind.result.transform("submodel-001").raster_correction(0.0)
    assert _moved_m(fix, centre) == pytest.approx((3.0, 0.0), abs=0.05)
    report = build_alignment(products, shots, MergeOptions(), gps, 32615)
    assert report is not None
    none, cameras = report.stage("none"), report.stage("cameras")
    assert none is not None and cameras is not None
    (raw,) = none.seams
    assert raw.orthophoto is not None and raw.orthophoto.median_m < 0.05
    assert raw.orthophoto.matches > 100 and raw.dsm is not None and raw.dsm.p90_m < 0.05
    # The solver claims the shared cameras agree to centimetres; the products say 3 m.
    assert cameras.solver_rms_m[PAIR] < 0.05
    (moved,) = cameras.seams
    assert moved.orthophoto is not None and moved.orthophoto.median_m == pytest.approx(3.0, abs=0.1)
    assert not cameras.applied and not cameras.refused
    assert any("seam 3." in why and "orthophoto 3.0" in why for why in cameras.reasons), cameras
    # The camera step with its refinement (which takes the 3 m back) and the refinement alone
    # are both tried against the products as they are; the one with the smaller seams applies:
    # the refinement alone, which moves nothing much.
    tried = {s.solved_on: s for s in report.stages if s.stage == "refined"}
    assert tried.keys() == {"cameras", "none"} and not tried["cameras"].applied
    assert tried["cameras"].reasons[0].startswith("the refinement alone leaves smaller seams")
    refined = report.stage("refined")
    assert refined is tried["none"] and refined.applied
    fixes = report.raster_corrections()
    assert all(np.hypot(*_moved_m(f, centre)) < 0.1 for f in fixes.values())
    final = report.final_stage()
    assert final is not None and final.stage == "refined"
    assert final.seams[0].orthophoto is not None and final.seams[0].orthophoto.median_m < 0.05
    assert report.failures == []


def test_a_correction_beyond_plausible_is_refused_even_when_accepted(tmp_path: Path) -> None:
    centre = make_block(2, 1).centroid("submodel-001")
    turn = Similarity.from_parameters(np.radians([0.0, 0.0, 15.0]), 0.0, np.zeros(3), centre)
    products, shots, gps = _wrong_cameras(tmp_path, turn)
    with pytest.raises(
        AlignmentError, match="rotation deg beyond plausible 15 > plausible_rotation_deg"
    ):
        build_alignment(products, shots, MergeOptions(), gps, 32615)
    report = build_alignment(products, shots, MergeOptions(accept_alignment=True), gps, 32615)
    assert report is not None and report.accepted
    cameras = report.stage("cameras")
    assert cameras is not None and cameras.refused and not cameras.applied
    refused = [f for f in report.failures if f.figure == "plausible_rotation_deg"]
    assert [f.subject for f in refused] == ["submodel-001"]
    assert "refused, not applied (even with accept_alignment)" in refused[0].message
    assert refused[0].value == pytest.approx(15.0, abs=0.1)
    # nothing turns: the stage is not applied, to any product
    for fix in report.raster_corrections().values():
        assert abs(fix.affine[0][1]) < 1e-3


def _seam(ortho_m: float | None, dsm_p90_m: float | None) -> OverlapSeam:
    return OverlapSeam(
        overlap="a|b", first="a", second="b",
        orthophoto=None if ortho_m is None else OrthoSeam(matches=50, shift_m=(ortho_m, 0.0),
                                                          median_m=ortho_m),
        dsm=None if dsm_p90_m is None else DsmSeam(samples=100, median_m=0.0, p90_m=dsm_p90_m),
    )  # fmt: skip


def test_worse_means_an_overlaps_seam_grows_beyond_the_tolerance() -> None:
    # the seam is hypot(orthophoto median displacement, DSM p90 |dz|): 0.5 m before
    assert seam_m(_seam(0.30, 0.40)) == pytest.approx(0.5)
    assert worsened([_seam(0.30, 0.40)], [_seam(0.50, 0.10)], 0.05) == []
    (why,) = worsened([_seam(0.30, 0.40)], [_seam(0.30, 0.48)], 0.05)
    assert why.startswith("a|b: seam 0.566 m (orthophoto 0.300 m, DSM p90 0.480 m) against 0.500 m")
    (why,) = worsened([_seam(0.20, None)], [_seam(0.26, None)], 0.05)
    assert why.startswith("a|b: seam 0.260 m (orthophoto 0.260 m, DSM -) against 0.200 m")
    (why,) = worsened([_seam(0.20, None)], [], 0.05)
    assert "not measurable after" in why
    assert worsened([_seam(None, None)], [_seam(5.0, 5.0)], 0.05) == []


def test_a_tilt_is_refused_where_its_lean_exceeds_what_a_raster_carries() -> None:
    block = make_block(2, 1)
    centre = block.centroid("submodel-001")
    options = AlignmentOptions()
    for tilt_deg, relief_m, refused in ((1.0, 10.0, False), (4.0, 10.0, True), (4.0, 2.0, False)):
        error = Similarity.from_parameters(np.radians([tilt_deg, 0, 0]), 0.0, np.zeros(3), centre)
        result = align_submodels(block.tables({"submodel-001": error}))
        relief = {"submodel-000": relief_m, "submodel-001": relief_m}
        found = lean_refusals(result, relief, options)
        # the gauge splits the tilt between the two: each leans about half of it
        expected = np.sin(np.radians(tilt_deg / 2)) * relief_m
        assert bool(found) == refused, (tilt_deg, relief_m, [f.message for f in found])
        for f in found:
            assert f.figure == "max_raster_lean_m" and f.value == pytest.approx(expected, rel=0.1)
    assert refusals(align_submodels(block.tables()), options) == []
