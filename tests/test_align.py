"""Alignment between submodels: known transforms recovered on real and synthetic blocks."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from align_blocks import Block, make_block, perturbation
from align_perturb import products_of, submodel_folders
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.spatial.transform import Rotation

from prefect_odm.align import (
    AlignmentError,
    AlignmentOptions,
    AlignmentResult,
    CameraTable,
    DemOverlap,
    Similarity,
    align_heights,
    align_submodels,
    check_alignment,
    raise_for_failures,
    read_shots_geojson,
    shared_cameras,
    umeyama,
)

TOL_M, TOL_DEG = 0.1, 0.05


def perturbed(table: CameraTable, p: Similarity) -> CameraTable:
    rot = p.apply_world_to_camera(table.rotations) if table.rotations is not None else None
    return CameraTable(table.submodel_id, table.names, p.apply(table.centres), rot, table.epsg)


def relative(result: AlignmentResult, a: str, b: str) -> Similarity:
    """``T_a^-1 o T_b``: where the solve puts ``b`` in ``a``'s frame."""
    return result.transform(b).similarity().then(result.transform(a).similarity().inverse())


def assert_same(s1: Similarity, s2: Similarity, points: np.ndarray, tol_m: float = TOL_M) -> None:
    """Two transforms agree within ``tol_m`` on ``points`` and within TOL_DEG in rotation."""
    gap = np.linalg.norm(s1.apply(points) - s2.apply(points), axis=1).max()
    turn = np.degrees(
        np.linalg.norm(Rotation.from_matrix(s1.rotation_matrix @ s2.rotation_matrix.T).as_rotvec())
    )
    assert gap < tol_m, f"positions differ by {gap:.3f} m"
    assert turn < TOL_DEG, f"rotations differ by {turn:.4f} deg"


def footprint(points: np.ndarray, depth_m: float = 100.0) -> np.ndarray:
    """The cameras and the ground ``depth_m`` below them: where a transform error would show."""
    return np.concatenate([points, points - [0.0, 0.0, depth_m]])


@pytest.fixture(scope="module")
def brighton(brighton_split) -> tuple[list[CameraTable], dict[str, tuple[float, float, float]]]:
    """The real cameras of brighton's two submodels (the engine's ``report/shots.geojson`` of
    a ``--split 10 --split-overlap-m 20`` run) and their GPS positions in the plan's CRS."""
    _, survey_dir, plan = brighton_split
    _, shots = products_of(submodel_folders(survey_dir))
    tables = [read_shots_geojson(sid, Path(shots[sid]).read_text()) for sid in sorted(shots)]
    gps = {c.name: (c.x_m, c.y_m, c.z_m) for c in plan.cameras}
    return tables, gps


# --- reading shots.geojson ---------------------------------------------------------------------


def test_read_engine_shots_matrix_rotations(brighton) -> None:
    tables, _ = brighton
    t0 = tables[0]
    assert len(t0.names) == 12 and t0.epsg == 32615 and t0.rotations is not None
    assert np.allclose(t0.rotations @ t0.rotations.transpose(0, 2, 1), np.eye(3), atol=1e-9)
    assert 5.18e6 < t0.centres[:, 1].min() < t0.centres[:, 1].max() < 5.19e6
    pairs = shared_cameras(tables)
    assert len(pairs) == 1 and len(pairs[0].names) == 6
    assert pairs[0].rms_m() < 0.2  # the issue: brighton's 6 shared cameras agree within 0.13 m


def test_read_odm_axis_angle_rotations() -> None:
    """ODM (opendm/shots.py) writes OpenSfM's rotation vector: the same as the matrix."""
    rotvec = [0.1, -0.2, 2.9]
    feature = {"properties": {"filename": "a.jpg", "translation": [1, 2, 3], "rotation": rotvec}}
    odm = read_shots_geojson("s", {"type": "FeatureCollection", "features": [feature]})
    matrix = Rotation.from_rotvec(rotvec).as_matrix().ravel().tolist()
    feature9 = {"properties": {"filename": "a.jpg", "translation": [1, 2, 3], "rotation": matrix}}
    ours = read_shots_geojson(
        "s", json.dumps({"type": "FeatureCollection", "features": [feature9]})
    )
    assert odm.rotations is not None and ours.rotations is not None
    assert np.allclose(odm.rotations, ours.rotations)
    with pytest.raises(ValueError, match="3 \\(axis-angle\\) or 9"):
        bad = {"properties": {"filename": "a", "translation": [1, 2, 3], "rotation": [1, 2]}}
        read_shots_geojson("s", {"type": "FeatureCollection", "features": [bad]})


# --- similarity maths --------------------------------------------------------------------------


def test_umeyama_recovers_a_known_similarity_and_rejects_collinear() -> None:
    rng = np.random.default_rng(3)
    src = rng.uniform(-50, 50, (20, 3)) + [500_000, 4_000_000, 200]
    truth = perturbation(src.mean(axis=0), tilt_deg=3.0, scale=0.98)
    fit = umeyama(src, truth.apply(src))
    assert_same(fit, truth, src, tol_m=1e-6)
    line = np.outer(np.arange(5.0), [1.0, 2.0, 0.5])
    with pytest.raises(ValueError, match="collinear"):
        umeyama(line, line)


def test_inverse_composition_and_recentring() -> None:
    s = perturbation(np.array([1000.0, 2000.0, 100.0]))
    pts = np.random.default_rng(0).uniform(0, 3000, (10, 3))
    assert np.allclose(s.then(s.inverse()).apply(pts), pts, atol=1e-8)
    assert np.allclose(s.recentred([0, 0, 0]).apply(pts), s.apply(pts), atol=1e-8)


def test_raster_correction_matches_the_point_transform() -> None:
    """Horizontal similarity plus height: affine and plane reproduce the 3-D transform exactly."""
    centre = np.array([500_100.0, 4_000_100.0, 50.0])
    s = Similarity.from_parameters(
        [0.0, 0.0, np.radians(0.7)], np.log(1.001), [2.0, -1.0, 1.5], centre
    )
    corr = s.raster_correction(reference_height_m=50.0)
    assert corr.lean_m_per_m == (0.0, 0.0)
    rng = np.random.default_rng(1)
    pts = centre + rng.uniform(-100, 100, (50, 3))
    moved = s.apply(pts)
    (a, b, c), (d, e, f) = corr.affine
    assert np.allclose(a * pts[:, 0] + b * pts[:, 1] + c, moved[:, 0], atol=1e-6)
    assert np.allclose(d * pts[:, 0] + e * pts[:, 1] + f, moved[:, 1], atol=1e-6)
    assert np.allclose(
        corr.corrected_heights(pts[:, 0], pts[:, 1], pts[:, 2]), moved[:, 2], atol=1e-6
    )
    # The geotransform: pixel (col, row) of the source lands where the point transform puts it.
    gt = (0.05, 0.0, 500_000.0, 0.0, -0.05, 4_000_200.0)
    new = corr.corrected_geotransform(gt)
    col, row = 1234.0, 567.0
    x, y = gt[0] * col + gt[1] * row + gt[2], gt[3] * col + gt[4] * row + gt[5]
    want = s.apply([[x, y, 50.0]])[0]
    assert np.allclose(
        [new[0] * col + new[1] * row + new[2], new[3] * col + new[4] * row + new[5]], want[:2]
    )
    (ia, ib, ic), (id_, ie, if_) = corr.inverse_affine()
    assert np.allclose(
        [ia * want[0] + ib * want[1] + ic, id_ * want[0] + ie * want[1] + if_], [x, y]
    )
    tilted = perturbation(centre).raster_correction(50.0)
    assert np.hypot(*tilted.lean_m_per_m) == pytest.approx(
        np.sin(np.radians(1.0)) * 1.002, rel=1e-6
    )


# --- the joint solve on the real brighton cameras ---------------------------------------------


def test_brighton_known_transform_recovered(brighton) -> None:
    """3 m shift, 1.5 m height, 1 deg tilt, 0.2 % scale on submodel-001's real cameras."""
    tables, gps = brighton
    p = perturbation(tables[1].centres.mean(axis=0))
    moved = [tables[0], perturbed(tables[1], p)]
    pts = footprint(tables[1].centres)
    for g in (None, gps):
        before, after = align_submodels(tables, gps=g), align_submodels(moved, gps=g)
        # Same relative placement as without the perturbation, once the perturbation is undone.
        want = relative(before, "submodel-000", "submodel-001")
        assert_same(p.then(relative(after, "submodel-000", "submodel-001")), want, pts)
        assert after.overlaps[0].rms_before_m > 2.5
        assert after.overlaps[0].rms_after_m == pytest.approx(
            before.overlaps[0].rms_after_m, abs=0.01
        )
    # With the GPS gauge the perturbed submodel is the one that moves back.
    before, after = align_submodels(tables, gps=gps), align_submodels(moved, gps=gps)
    assert after.gauge == "gps"
    t1 = after.transform("submodel-001").similarity()
    assert_same(p.then(t1), before.transform("submodel-001").similarity(), pts)
    assert_same(
        after.transform("submodel-000").similarity(),
        before.transform("submodel-000").similarity(),
        footprint(tables[0].centres),
    )
    gps1 = {g.submodel_id: g for g in after.camera_gps}["submodel-001"]
    assert gps1.rms_before_m > 2.5 and gps1.rms_after_m < 1.0


def test_brighton_untouched_stays_near_identity(brighton) -> None:
    tables, gps = brighton
    for g in (None, gps):
        result = align_submodels(tables, gps=g)
        assert max(t.max_correction_m for t in result.transforms) < 0.5
        # near identity: held at the survey's shared calibration the two 12-image blocks turn
        # 0.54-0.55 deg about each other on their shared cameras (0.24 m of correction), well
        # inside the 2 deg gate; the refinement then takes the tilt out of the products
        assert max(t.rotation_deg for t in result.transforms) < 1.0
        assert check_alignment(result, AlignmentOptions()) == []


# --- synthetic blocks --------------------------------------------------------------------------


@pytest.fixture(scope="module", params=[(5, 1), (3, 3)], ids=["chain5", "grid3x3"])
def block(request) -> Block:
    return make_block(*request.param)


def test_identity_when_nothing_applied(block: Block) -> None:
    result = align_submodels(block.tables())
    assert max(t.max_correction_m for t in result.transforms) < 1e-6
    assert max(o.rms_after_m for o in result.overlaps) < 1e-6
    assert result.rejected == []


def test_known_transform_recovered_in_blocks(block: Block) -> None:
    target = "submodel-002"
    p = perturbation(block.centroid(target))
    result = align_submodels(block.tables({target: p}, noise_m=0.02))
    assert len(result.transforms) >= 4 and len(result.overlaps) >= 4
    pts = footprint(np.stack([block.truth[n] for n in block.members[target]]))
    for other in block.members:
        if other != target:
            assert_same(relative(result, other, target), p, pts)
    assert max(o.rms_after_m for o in result.overlaps) < 0.1


def test_gauge_keeps_the_block_mean(block: Block) -> None:
    rng = np.random.default_rng(7)
    errors = {
        sid: Similarity.from_parameters(
            rng.normal(0, np.radians(0.3), 3),
            rng.normal(0, 0.002),
            rng.normal(0, 1.0, 3),
            block.centroid(sid),
        )
        for sid in block.members
    }
    tables = block.tables(errors, noise_m=0.02)
    result = align_submodels(tables)
    before = np.concatenate([t.centres for t in tables])
    after = np.concatenate(
        [result.transform(t.submodel_id).apply_points(t.centres) for t in tables]
    )
    assert np.allclose(after.mean(axis=0), before.mean(axis=0), atol=1e-6)
    weights = [len(t.names) for t in tables]
    rots = Rotation.from_matrix(
        np.stack([result.transform(t.submodel_id).similarity().rotation_matrix for t in tables])
    )
    assert np.degrees(np.linalg.norm(rots.mean(weights=weights).as_rotvec())) < 1e-6
    assert (
        abs(
            np.average(
                [np.log(result.transform(t.submodel_id).scale) for t in tables], weights=weights
            )
        )
        < 1e-9
    )
    # And the block is consistent: every pair of corrected submodels agrees with the truth.
    for sid in block.members:
        pts = footprint(np.stack([block.truth[n] for n in block.members[sid]]))
        want = errors[sid].then(errors["submodel-000"].inverse())
        assert_same(relative(result, "submodel-000", sid), want, pts)


def test_outlier_camera_rejected_and_reported(block: Block) -> None:
    target = "submodel-001"
    p = perturbation(block.centroid(target))
    tables = block.tables({target: p}, noise_m=0.02)
    pair = next(c for c in shared_cameras(tables) if target in (c.first, c.second))
    bad_image = pair.names[len(pair.names) // 2]
    t = next(t for t in tables if t.submodel_id == target)
    row = t.index()[bad_image]
    t.centres[row] += [3.0, -4.0, 0.0]
    result = align_submodels(tables)
    assert [(o.image, o.overlap) for o in result.rejected if o.image == bad_image]
    # the camera was moved 5 m: its residual, in metres of the plan CRS, says so
    assert all(4.0 < o.residual_m < 6.0 for o in result.rejected if o.image == bad_image)
    assert len(result.rejected) <= 2  # the bad camera in each overlap it is shared in, no more
    ov = next(o for o in result.overlaps if o.overlap == result.rejected[0].overlap)
    assert ov.n_used == ov.n_shared - len(ov.outliers) and ov.outliers
    pts = footprint(np.stack([block.truth[n] for n in block.members[target]]))
    assert_same(relative(result, "submodel-000", target), p, pts)


def test_gate_failure_names_the_submodel() -> None:
    block = make_block(4, 1)
    target = "submodel-002"
    p = Similarity.from_parameters([0, 0, 0], 0.0, [9.0, 0.0, 0.0], block.centroid(target))
    tables = block.tables({target: p.inverse()})
    gps = {n: tuple(x) for n, x in block.truth.items()}
    result = align_submodels(tables, gps=gps)
    failures = check_alignment(result, AlignmentOptions())
    assert [(f.subject, f.figure) for f in failures] == [(target, "max_correction_m")]
    assert failures[0].value == pytest.approx(9.0, abs=0.05) and failures[0].threshold == 5.0
    with pytest.raises(AlignmentError, match=target) as err:
        raise_for_failures(failures)
    assert err.value.failures == failures
    raise_for_failures(failures, accept=True)  # the operator's option: no raise
    # A bent submodel (no similarity fits it) fails on its overlaps' rms.
    bent = block.tables()
    bent[1].centres[:, 2] += 0.002 * (bent[1].centres[:, 0] - bent[1].centres[:, 0].mean()) ** 2
    names = {
        f.subject
        for f in check_alignment(align_submodels(bent), AlignmentOptions(outlier_min_m=50))
    }
    assert {"submodel-000|submodel-001", "submodel-001|submodel-002"} <= names


bounds = st.tuples(
    st.floats(-5, 5), st.floats(-5, 5), st.floats(-3, 3),  # shift, m
    st.floats(-2, 2), st.floats(-2, 2), st.floats(-2, 2),  # rotation vector, degrees
    st.floats(-0.02, 0.02),  # scale change
)  # fmt: skip
CHAIN = make_block(4, 1)


@settings(max_examples=15, deadline=None)
@given(bounds)
def test_any_similarity_within_bounds_is_recovered(v: tuple[float, ...]) -> None:
    target = "submodel-001"
    p = Similarity.from_parameters(
        np.radians(v[3:6]), np.log1p(v[6]), v[:3], CHAIN.centroid(target)
    )
    result = align_submodels(CHAIN.tables({target: p}))
    pts = footprint(np.stack([CHAIN.truth[n] for n in CHAIN.members[target]]))
    assert_same(relative(result, "submodel-000", target), p, pts, tol_m=0.01)


# --- height and tilt from DSM differences -----------------------------------------------------


def _own_centre_gauge(planes: np.ndarray, centres: np.ndarray, weights: np.ndarray) -> None:
    """Subtract (in place) from the planes ``(p0, px, py)`` the one plane that leaves their
    ``weights``-weighted mean tilt and mean height at their own ``centres`` zero."""
    planes[:, 1:] -= np.average(planes[:, 1:], axis=0, weights=weights)
    at_centre = planes[:, 0] + (planes[:, 1:] * centres).sum(axis=1)
    planes[:, 0] -= np.average(at_centre, weights=weights)


def test_height_tilt_from_dsm_differences_keeps_the_slope() -> None:
    """A 2 x 3 grid on a 1-in-10 slope, each submodel's DSM off by its own plane."""
    rng = np.random.default_rng(5)
    ids = [f"submodel-{i:03d}" for i in range(6)]
    centres = np.array([[200.0 * (i % 3), 200.0 * (i // 3)] for i in range(6)])
    near = [
        (i, j)
        for i in range(6)
        for j in range(i + 1, 6)
        if np.linalg.norm(centres[i] - centres[j]) < 201
    ]
    degree = np.bincount(np.ravel(near), minlength=6)
    # Each DSM's error plane e0 + ex*x + ey*y; the truth obeys the gauge (sample-weighted mean
    # tilt 0, sample-weighted mean height at the submodels' own centres 0).
    errs = np.stack(
        [rng.normal(0, 1.5, 6), rng.normal(0, 0.005, 6), rng.normal(0, 0.005, 6)], axis=1
    )
    errs[:, 0] -= errs[:, 1] * centres[:, 0] + errs[:, 2] * centres[:, 1]
    _own_centre_gauge(errs, centres, degree)

    def err_at(i: int, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        return errs[i, 0] + errs[i, 1] * x + errs[i, 2] * y

    overlaps = []
    for i, j in near:
        mid = (centres[i] + centres[j]) / 2
        x, y = mid[0] + rng.uniform(-30, 30, 400), mid[1] + rng.uniform(-30, 30, 400)
        ground = 1000.0 + 0.1 * x  # the slope, the same in both submodels
        dz = (ground + err_at(j, x, y)) - (ground + err_at(i, x, y)) + rng.normal(0, 0.02, 400)
        dz[:10] += 25.0  # a tree in one DSM only: outliers for the robust loss
        overlaps.append(DemOverlap(ids[i], ids[j], x, y, dz))
    result = align_heights(ids, centres, overlaps)
    assert result.method == "dem" and len(result.overlaps) == 7
    for i, sid in enumerate(ids):
        t = result.transform(sid)
        xs = centres[i, 0] + np.array([-100.0, 100.0])
        ys = centres[i, 1] + np.array([-100.0, 100.0])
        pts = np.stack([xs, ys, 1000.0 + 0.1 * xs + err_at(i, xs, ys)], axis=1)
        fixed = t.apply_points(pts)
        assert np.allclose(fixed[:, 2], 1000.0 + 0.1 * xs, atol=0.05)  # relief kept, error gone
        rc = t.raster_correction(1000.0)
        assert np.allclose(rc.corrected_heights(pts[:, 0], pts[:, 1], pts[:, 2]), fixed[:, 2])
    assert max(o.rms_after_m for o in result.overlaps) < 0.05  # over the samples kept
    assert all(o.n_used == o.n_shared - 10 for o in result.overlaps)  # the trees rejected
    assert check_alignment(result, AlignmentOptions(max_overlap_rms_m=5.0)) == []


def test_height_alignment_takes_out_each_submodels_bowl() -> None:
    """A 2 x 3 grid on a slope, each DSM off by its own plane and bowl (doming). With bowls
    the alignment recovers them (the block's mean bowl is its gauge); without, it cannot."""
    rng = np.random.default_rng(7)
    ids = [f"submodel-{i:03d}" for i in range(6)]
    centres = np.array([[200.0 * (i % 3), 200.0 * (i // 3)] for i in range(6)])
    near = [
        (i, j)
        for i in range(6)
        for j in range(i + 1, 6)
        if np.linalg.norm(centres[i] - centres[j]) < 201
    ]
    weights = 400.0 * np.bincount(np.ravel(near), minlength=6)
    planes = np.stack(
        [rng.normal(0, 1.0, 6), rng.normal(0, 0.003, 6), rng.normal(0, 0.003, 6)], axis=1
    )
    bowls = rng.normal(0, 5e-5, 6)  # 0.5 m at 100 m from the centre
    # the truth in the solver's gauge: mean bowl 0 (moved into the planes), then mean tilt and
    # mean height at the submodels' own centres 0
    mean_bowl = np.average(bowls, weights=weights)
    bowls -= mean_bowl
    planes += mean_bowl * np.stack(
        [(centres**2).sum(axis=1), -2 * centres[:, 0], -2 * centres[:, 1]], axis=1
    )
    _own_centre_gauge(planes, centres, weights)

    def err_at(i: int, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        r2 = (x - centres[i, 0]) ** 2 + (y - centres[i, 1]) ** 2
        return planes[i, 0] + planes[i, 1] * x + planes[i, 2] * y + bowls[i] * r2

    overlaps = []
    for i, j in near:
        mid = (centres[i] + centres[j]) / 2
        x, y = mid[0] + rng.uniform(-40, 40, 400), mid[1] + rng.uniform(-40, 40, 400)
        dz = err_at(j, x, y) - err_at(i, x, y) + rng.normal(0, 0.02, 400)
        dz[:10] += 25.0  # a tree in one DSM only
        overlaps.append(DemOverlap(ids[i], ids[j], x, y, dz))
    plain = align_heights(ids, centres, overlaps, AlignmentOptions(refine_bowl=False))
    result = align_heights(ids, centres, overlaps)  # bowls by default
    assert max(o.rms_after_m for o in result.overlaps) < 0.05
    assert max(o.rms_after_m for o in plain.overlaps) > 0.15  # a plane cannot take a bowl out
    for i, sid in enumerate(ids):
        t = result.transform(sid)
        assert t.height_bowl is not None and abs(t.height_bowl[0] + bowls[i]) < 3e-6
        xs = centres[i, 0] + np.array([-100.0, 0.0, 100.0])
        ys = centres[i, 1] + np.array([-100.0, 50.0, 100.0])
        ground = 1000.0 + 0.1 * xs
        pts = np.stack([xs, ys, ground + err_at(i, xs, ys)], axis=1)
        fixed = t.apply_points(pts)
        assert np.allclose(fixed[:, 2], ground, atol=0.05)
        rc = t.raster_correction(1000.0)
        assert np.allclose(rc.corrected_heights(pts[:, 0], pts[:, 1], pts[:, 2]), fixed[:, 2])
        # after a similarity's raster correction (a turn and a shift), as the merge composes them
        first = Similarity.from_parameters(
            np.radians([0.0, 0.0, 0.5]), 0.0, np.array([2.0, -1.0, 0.0]), [*centres[i], 1000.0]
        ).raster_correction(1000.0)
        both = first.then(rc)
        moved = first.corrected_heights(pts[:, 0], pts[:, 1], pts[:, 2])
        (a, b, c), (d, e, f) = first.affine
        mx, my = a * pts[:, 0] + b * pts[:, 1] + c, d * pts[:, 0] + e * pts[:, 1] + f
        assert np.allclose(both.corrected_heights(pts[:, 0], pts[:, 1], pts[:, 2]),
                           rc.corrected_heights(mx, my, moved), atol=1e-6)  # fmt: skip


def test_align_and_gps_quality_are_pure_core() -> None:
    code = (
        "import sys\n"
        "import prefect_odm.align, prefect_odm.survey.gps_quality\n"
        "bad = [m for m in ('prefect', 'pyodm', 'rasterio', 'laspy', 'pycolmap') if m in sys.modules]\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_the_package_exports_every_lazy_name_once_and_each_resolves() -> None:
    """``prefect_odm.align`` lists its names three times (type-checking imports, the module of
    each for PEP 562, ``__all__``): the lists agree and each name comes from its module."""
    import ast
    import importlib

    import prefect_odm.align as align

    source = Path(align.__file__).read_text()
    typed = {
        alias.name
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("prefect_odm.align.")
        for alias in node.names
    }
    assert sorted(align._MODULE_OF) == sorted(align.__all__) == sorted(typed)
    for name, module in align._MODULE_OF.items():
        assert getattr(align, name) is getattr(importlib.import_module(module), name)


def test_height_tilt_with_no_measured_overlap_cell_moves_nothing() -> None:
    """Plane DSMs (the direct pipeline without heights above ground) have no measured cell, so
    every overlap holds no sample: nothing is solved and every transform is the identity (this
    raised a zip() length error in brighton's direct --split 10 run)."""
    ids = ["submodel-000", "submodel-001"]
    centres = np.array([[0.0, 0.0], [100.0, 0.0]])
    empty = np.zeros(0)
    result = align_heights(ids, centres, [DemOverlap(ids[0], ids[1], empty, empty, empty)])
    assert result.method == "dem" and result.overlaps == []
    for sid in ids:
        pts = np.array([[10.0, 20.0, 158.5]])
        assert np.allclose(result.transform(sid).apply_points(pts), pts)
