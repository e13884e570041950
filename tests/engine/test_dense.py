"""Dense matching, fusion, gap filling and the ground filter of the built-in engine.

Unit tests on small synthesized rasters and point sets (the true answer is known by
construction); the dense brighton run itself is checked in ``test_pipeline.py`` (it shares that
module's structure-from-motion run).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from prefect_odm.engine import dense, ground
from prefect_odm.engine.camera import CameraPose
from prefect_odm.engine.dense import PairPoints, select_pairs
from prefect_odm.engine.dense_fusion import fuse_pairs, sample_points
from prefect_odm.grid import Grid
from prefect_odm.plan.depthmaps import depthmap_scale

RES_M = 0.5


def _terrain(shape: tuple[int, int] = (160, 160)) -> np.ndarray:
    """A tilted plane (2 %) with a gentle 1 m hill: the ground, metres."""
    rows, cols = np.mgrid[0 : shape[0], 0 : shape[1]].astype(np.float64)
    hill = np.exp(-((rows - 100) ** 2 + (cols - 40) ** 2) / (2 * 25.0**2))
    return (100.0 + 0.02 * RES_M * cols + 1.0 * hill).astype(np.float32)


def _buildings(terrain: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The terrain with two boxes (6 m and 3 m high, 10 m and 7 m wide) and a 2 m car."""
    dsm = terrain.copy()
    objects = np.zeros(terrain.shape, dtype=bool)
    for (r, c), size, height in (((30, 30), 20, 6.0), ((100, 110), 14, 3.0), ((60, 120), 4, 2.0)):
        objects[r : r + size, c : c + size] = True
        dsm[r : r + size, c : c + size] += height
    return dsm, objects


def test_smrf_separates_objects_from_sloped_ground() -> None:
    terrain = _terrain()
    dsm, objects = _buildings(terrain)
    is_ground = ground.smrf_ground(dsm, RES_M)
    assert is_ground[~objects].mean() >= 0.97
    assert (~is_ground[objects]).mean() >= 0.95
    dtm = ground.dtm_from_ground(dsm, is_ground)
    assert np.abs(dtm - terrain).max() <= 0.3  # under the boxes too
    assert np.all(dtm <= dsm + 1e-6)


def test_smrf_window_bounds_the_objects_removed() -> None:
    """A box wider than ``smrf-window`` is terrain (a plateau), as in ODM."""
    terrain = _terrain()
    dsm, objects = _buildings(terrain)
    small_window = ground.smrf_ground(dsm, RES_M, window_m=4.0)
    assert small_window[30:50, 30:50].mean() > 0.5  # the 10 m box survives a 4 m window
    assert not small_window[60:64, 120:124].any()  # the 2 m car does not


def test_dtm_keeps_nodata_and_never_exceeds_dsm() -> None:
    dsm, _ = _buildings(_terrain())
    dsm[:10] = np.nan
    dtm = ground.dtm_from_ground(dsm, ground.smrf_ground(dsm, RES_M))
    assert np.isnan(dtm[:10]).all() and np.isfinite(dtm[10:]).all()
    assert np.all(dtm[10:] <= dsm[10:] + 1e-6)


def test_fill_small_gaps_fills_small_holes_only() -> None:
    dem = _terrain()
    truth = dem.copy()
    dem[20:23, 20:23] = np.nan  # 1.5 m hole
    dem[60:120, 60:120] = np.nan  # 30 m hole
    filled = ground.fill_small_gaps(dem, RES_M, steps=3)
    assert np.isfinite(filled[20:23, 20:23]).all()
    assert np.abs(filled[20:23, 20:23] - truth[20:23, 20:23]).max() <= 0.05
    big = filled[60:120, 60:120]
    assert np.isnan(big[8:-8, 8:-8]).all() and np.isnan(big).mean() >= 0.9
    measured = np.isfinite(dem)
    assert np.array_equal(filled[measured], dem[measured])  # measured cells untouched
    assert np.isnan(ground.fill_small_gaps(dem, RES_M, steps=0)[20:23, 20:23]).all()


def test_fill_small_gaps_does_not_grow_the_outer_edge_or_leave_inside() -> None:
    dem = np.full((60, 60), np.nan, dtype=np.float32)
    dem[10:50, 10:50] = 5.0
    dem[30, 30] = np.nan
    filled = ground.fill_small_gaps(dem, RES_M, steps=3)
    assert np.isnan(filled[:10]).all() and np.isnan(filled[:, 50:]).all()
    assert filled[30, 30] == pytest.approx(5.0)
    outside = np.ones(dem.shape, dtype=bool)
    outside[30, 30] = False
    assert np.isnan(ground.fill_small_gaps(dem, RES_M, 3, inside=outside)[30, 30])


def test_fill_to_footprint_fills_every_footprint_cell_smoothly_within_the_heights() -> None:
    """ODM's last gap-filling step: the large hole (a lake, a forest) is interpolated: every
    footprint cell gets a height, none outside, no height outside the range of those the DSM
    had (none invented), and no cliff (a nearest-height fill steps by up to the hill's 1 m)."""
    from prefect_odm.engine.dem import fill_to_footprint

    dem = _terrain()
    truth = dem.copy()
    dem[60:120, 60:120] = np.nan  # 30 m hole
    dem[:, :5] = np.nan  # outside the footprint
    footprint = np.ones(dem.shape, dtype=bool)
    footprint[:, :5] = False
    small = ground.fill_small_gaps(dem, RES_M, steps=3)  # growing radii first, as ODM
    filled = fill_to_footprint(small, footprint)
    assert np.isfinite(filled[footprint]).all() and np.isnan(filled[~footprint]).all()
    measured = np.isfinite(small)
    assert np.array_equal(filled[measured], small[measured])
    hole = filled[60:120, 60:120]
    assert small[measured].min() <= hole.min() and hole.max() <= small[measured].max()
    steps = np.abs(np.diff(filled[55:125, 55:125], axis=1))
    assert steps.max() <= 0.1, steps.max()  # the truth's own steps are under 0.05 m
    assert np.abs(hole - truth[60:120, 60:120]).max() <= 1.0
    assert np.isnan(fill_to_footprint(np.full((4, 4), np.nan, np.float32), footprint[:4, :4])).all()


def test_push_pull_interpolates_every_cell_and_keeps_the_known() -> None:
    rng = np.random.default_rng(0)
    truth = _terrain((50, 70))
    known = rng.random(truth.shape) < 0.05
    out = ground.push_pull(truth, known)
    assert np.isfinite(out).all() and np.array_equal(out[known], truth[known])
    assert np.abs(out - truth).max() < 0.6
    with pytest.raises(ValueError):
        ground.push_pull(truth, np.zeros(truth.shape, dtype=bool))


def test_push_pull_fills_wide_gaps_without_terraces() -> None:
    """1 % of a smooth 6 m relief known: the gaps are filled by ramps, not by flat terraces with
    steps at the pyramid's block edges (nearest-cell upsampling: rms 0.40 m, steps up to 1.07 m
    between neighbouring cells; bilinear: 0.20 m, 0.46 m)."""
    rng = np.random.default_rng(0)
    y, x = np.mgrid[0:200, 0:300]
    truth = (0.02 * x + 3 * np.sin(x / 25) * np.cos(y / 30)).astype(np.float32)
    rng.random(truth.shape)  # the draw the figures above were measured with
    known = rng.random(truth.shape) < 0.01
    out = ground.push_pull(truth, known)
    assert float(np.sqrt(np.mean((out - truth) ** 2))) < 0.3
    assert float(np.abs(np.diff(out, axis=1)).max()) < 0.7
    assert float(np.abs(np.diff(out, axis=0)).max()) < 0.7


def _pair(z: float, xy: np.ndarray, colour: int) -> PairPoints:
    xyz = np.column_stack([xy, np.full(len(xy), z)])
    return PairPoints(xyz, np.full((len(xy), 3), colour, dtype=np.uint8))


def test_fusion_keeps_heights_two_pairs_agree_on() -> None:
    grid = Grid(left=0.0, top=10.0, resolution_m=1.0, width=10, height=10)
    xs, ys = np.meshgrid(np.arange(0.25, 10, 0.5), np.arange(0.25, 10, 0.5))
    xy = np.column_stack([xs.ravel(), ys.ravel()])
    left = xy[:, 0] < 5.0
    pairs = [
        _pair(10.0, xy, 1),
        _pair(10.1, xy, 2),
        _pair(13.0, xy, 3),  # a blunder pair everywhere
        _pair(10.05, xy[~left], 4),  # a third agreeing pair on the right half only
    ]
    fused = fuse_pairs(pairs, grid, tolerance_m=0.3, min_pairs=2)
    assert np.isfinite(fused.heights).all()
    assert np.allclose(fused.heights, np.where(xs[::2, ::2] < 5, 10.05, 10.05), atol=0.06)
    assert not (fused.rgb == 3).any() and np.all(np.abs(fused.xyz[:, 2] - 10.05) <= 0.06)
    assert (fused.agreeing_pairs[:, 5:] == 3).all() and (fused.agreeing_pairs[:, :5] == 2).all()
    # one pair alone never makes a measured cell
    alone = fuse_pairs([pairs[0], pairs[2]], grid, tolerance_m=0.3, min_pairs=2)
    assert np.isnan(alone.heights).all() and len(alone.xyz) == 0


def test_fusion_drops_heights_most_pairs_seeing_the_cell_contradict() -> None:
    # Left half: seven pairs scatter as the matcher does on a near-textureless field, two agree
    # (2 of 7 < a third). Right half: three of four agree.
    grid = Grid(left=0.0, top=10.0, resolution_m=1.0, width=10, height=10)
    xs, ys = np.meshgrid(np.arange(0.25, 10, 0.5), np.arange(0.25, 10, 0.5))
    xy = np.column_stack([xs.ravel(), ys.ravel()])
    left = xy[:, 0] < 5.0
    scattered = [5.0, 7.0, 9.9, 10.0, 12.0, 14.0, 16.0]
    supported = [20.0, 20.1, 20.05, 23.0]
    pairs = [_pair(z, xy[left], k) for k, z in enumerate(scattered)]
    pairs += [_pair(z, xy[~left], 10 + k) for k, z in enumerate(supported)]
    fused = fuse_pairs(pairs, grid, tolerance_m=0.3, min_pairs=2)
    assert np.isnan(fused.heights[:, :5]).all()
    assert np.allclose(fused.heights[:, 5:], 20.05, atol=0.06)
    assert np.all(np.abs(fused.xyz[:, 2] - 20.05) <= 0.06)
    # without the share the two agreeing pairs would make a measured cell of the scatter
    loose = fuse_pairs(pairs, grid, tolerance_m=0.3, min_pairs=2, min_agreeing_share=0.0)
    assert np.allclose(loose.heights[:, :5], 9.95, atol=0.06)


def test_fusion_drops_isolated_cells() -> None:
    grid = Grid(left=0.0, top=10.0, resolution_m=1.0, width=10, height=10)
    lone = np.array([[5.5, 4.5]])
    fused = fuse_pairs([_pair(1.0, lone, 1), _pair(1.0, lone, 2)], grid)
    assert np.isnan(fused.heights).all()


def test_pc_sample_keeps_one_point_per_cube_deterministically() -> None:
    rng = np.random.default_rng(1)
    xyz = rng.random((5000, 3)) * 10.0
    chosen = sample_points(xyz, 1.0)
    keys = np.floor((xyz[chosen] - xyz.min(axis=0)) / 1.0)
    assert len(np.unique(keys, axis=0)) == len(chosen) <= 1000
    assert np.array_equal(chosen, sample_points(xyz, 1.0))
    assert np.array_equal(sample_points(xyz, 0.0), np.arange(5000))


@pytest.mark.parametrize(
    ("width", "height", "quality", "side_px"),
    [
        # ODM asks for 1600 x 0.125 x 2 = 400 px; OpenMVS will not go below 640: 800 px
        (1600, 900, "medium", 800),
        (1600, 900, "ultra", 1600),
        (1600, 900, "lowest", 400),
        # 1200 px: one halving would already be below 640, so none
        (1200, 900, "medium", 1200),
        # 12 MP: ODM asks for 500 px, level 3 gives 500 < 640, level 2 gives 1000
        (4000, 3000, "medium", 1000),
        (4000, 3000, "low", 500),
        # 20 MP: ODM's multiplier is 1 above 6 MP
        (5472, 3648, "medium", 684),
    ],
)
def test_depthmap_size_is_the_one_odm_and_openmvs_pick(
    width: int, height: int, quality: str, side_px: int
) -> None:
    assert depthmap_scale(width, height, quality) * max(width, height) == side_px


def test_depthmap_size_refuses_an_unknown_quality() -> None:
    with pytest.raises(KeyError):
        depthmap_scale(1600, 900, "extreme")


def test_smrf_keeps_undulating_ground_at_fine_cells() -> None:
    """Ground that undulates (1.6 m crest to trough every 40 m, slopes under ``smrf-slope``) with
    the heavy-tailed noise of dense matching (Student's t, 3 degrees of freedom, 5 cm scale) is
    ground on a 0.2 m DSM, and a 5 m pavilion on it is not. Each opening's threshold is
    ``slope x radius`` on a 1 m minimum surface (PDAL's ``filters.smrf``); thresholding the
    radius' increment on the 0.2 m cells instead kept 85 % of this ground and left the DTM's
    p99 error at 0.49 m.
    """
    res_m = 0.2
    rows, cols = np.mgrid[0:400, 0:400].astype(np.float64) * res_m
    terrain = 100.0 + 0.8 * np.sin(2 * np.pi * cols / 40.0) * np.cos(2 * np.pi * rows / 40.0)
    noise = 0.05 * np.random.default_rng(12).standard_t(3, terrain.shape)
    dsm = (terrain + noise).astype(np.float32)
    pavilion = (rows - 40.0) ** 2 + (cols - 30.0) ** 2 <= 2.5**2  # in a trough
    dsm[pavilion] += 2.3
    is_ground = ground.smrf_ground(dsm, res_m)
    assert is_ground[~pavilion].mean() >= 0.97
    assert not is_ground[pavilion].any()
    dtm = ground.dtm_from_ground(dsm, is_ground)
    assert np.percentile(np.abs(dtm - terrain), 99) <= 0.35
    assert np.abs(dtm - terrain)[pavilion].max() <= 0.3


def _nadir_camera(name: str, x: float, y: float, height_m: float = 70.0) -> CameraPose:
    """A north-up nadir pinhole camera (640 x 480 px, f 550 px) ``height_m`` above z = 0."""
    return CameraPose(
        name=name, width=640, height=480, focal_px=550.0, cx=320.0, cy=240.0, k1=0.0, k2=0.0,
        rotation=((1.0, 0.0, 0.0), (0.0, -1.0, 0.0), (0.0, 0.0, -1.0)),
        center=(x, y, height_m),
    )  # fmt: skip


def test_pairs_cover_the_outer_strips_of_a_two_line_block() -> None:
    """Points seen by three images of one flight line only must mostly lie in two chosen pairs.

    Two lines 20 m apart (footprints 81 m wide, 75 % side overlap): the partners across the lines
    score higher on overlap times baseline, but they share only the middle of each footprint.
    Taking each image's three best-scored partners (the selection before 0.2) chose only those,
    and none of these outer points lay in two pairs; the coverage-greedy choice adds partners
    along the line (84 %: a point at the line's ends seen by exactly three images can miss).
    """
    cameras = [_nadir_camera(f"{line}-{shot}", 20.0 * line, 15.0 * shot) for line in range(2) for shot in range(7)]  # fmt: skip
    gx, gy = np.meshgrid(np.arange(-45.0, 76.0, 2.0), np.arange(-35.0, 126.0, 2.0))
    points = np.column_stack([gx.ravel(), gy.ravel(), np.zeros(gx.size)])
    pairs = select_pairs(cameras, points)
    seen = np.array([dense._visible(c, points) for c in cameras])
    in_pairs = sum((seen[p.first] & seen[p.second]).astype(int) for p in pairs)
    by_line = [seen[:7].any(axis=0), seen[7:].any(axis=0)]
    outer = (by_line[0] ^ by_line[1]) & (seen.sum(axis=0) >= 3)
    inner = by_line[0] & by_line[1] & (seen.sum(axis=0) >= 4)
    assert outer.sum() > 300 and inner.sum() > 300
    assert np.mean(in_pairs[outer] >= 2) >= 0.8
    assert np.mean(in_pairs[inner] >= 2) >= 0.95
    assert len(pairs) <= 3 * len(cameras)


def _shifted_pair(disparity_px: int) -> dense._Rectified:
    """A rectified pair of a textured plane at ``disparity_px`` (baseline along the columns)."""
    from scipy.ndimage import gaussian_filter

    texture = gaussian_filter(np.random.default_rng(5).normal(0, 1, (240, 360)), 1.0)
    grey = np.clip(128 + 60 * texture / texture.std(), 1, 255).astype(np.uint8)
    left = np.repeat(grey[:, :, None], 3, axis=2)
    right = np.zeros_like(left)
    right[:, : 360 - disparity_px] = left[:, disparity_px:]  # x_right = x_left - disparity
    p1 = np.hstack([np.eye(3), np.zeros((3, 1))])
    p2 = p1.copy()
    p2[0, 3] = -1.0  # coord1 - coord2 > 0: no mirroring
    return dense._Rectified(left, right, np.eye(3), p1, p2, axis=0)


def test_matching_keeps_true_disparities_and_rejects_clamped_and_unseen_ones() -> None:
    """A disparity at the end of the search range, or one whose match falls outside the second
    image, is not a measurement; one inside the range that the matcher found is."""
    truth = 40
    rect = _shifted_pair(truth)
    disparity, valid = dense._match(rect, truth - 16.0, truth + 16.0)
    assert valid.mean() > 0.6
    assert np.median(np.abs(disparity[valid] - truth)) < 0.5
    assert not valid[:, :truth].any()  # these pixels are not in the second image
    # the true disparity below the search range: what the matcher returns at the range's ends
    # (where it stops) is dropped
    disparity, valid = dense._match(rect, truth + 8.0, truth + 40.0)
    low, high = math.floor(truth + 8.0), math.floor(truth + 8.0) + 32
    at_end = (disparity >= low) & (disparity <= low + dense.EDGE_DISPARITY_PX)
    assert at_end.sum() > 100  # the matcher does stop there
    kept = disparity[valid]
    assert len(kept) and kept.min() > low + dense.EDGE_DISPARITY_PX
    assert kept.max() < high - 1 - dense.EDGE_DISPARITY_PX


def _occluding_pair() -> tuple[dense._Rectified, slice]:
    """A textured plane at 15 px disparity with a textured square in front of it at 30 px;
    returns the pair and the columns of the plane the square hides from the second image."""
    from scipy.ndimage import gaussian_filter

    rect = _shifted_pair(15)
    rng = np.random.default_rng(8)
    square = gaussian_filter(rng.normal(0, 1, (80, 80)), 1.0)
    square = np.clip(128 + 60 * square / square.std(), 1, 255).astype(np.uint8)[:, :, None]
    left, right = rect.left.copy(), rect.right.copy()
    left[80:160, 150:230] = square  # x_right = x_left - 30 for the square
    right[80:160, 120:200] = square
    return dense._Rectified(left, right, rect.rect1, rect.p1, rect.p2, 0), slice(135, 150)


def test_left_right_check_drops_matches_the_second_image_cannot_see() -> None:
    """The plane's strip beside the square is seen by the first image only: the left-right
    check (``lr_check_px``) rejects what the matcher found there; without it they stay."""
    rect, hidden = _occluding_pair()
    _, checked = dense._match(rect, 0.0, 48.0, lr_check_px=dense.LR_CHECK_PX)
    _, unchecked = dense._match(rect, 0.0, 48.0, lr_check_px=None)
    strip = (slice(85, 155), hidden)
    assert unchecked[strip].mean() > checked[strip].mean() + 0.2
    assert checked[:, 250:340].mean() > 0.8  # the rest of the plane is kept


def test_fusion_keeps_isolated_cells_when_no_neighbour_is_asked() -> None:
    grid = Grid(left=0.0, top=10.0, resolution_m=1.0, width=10, height=10)
    lone = np.array([[5.5, 4.5]])
    pairs = [_pair(1.0, lone, 1), _pair(1.0, lone, 2)]
    fused = fuse_pairs(pairs, grid, min_measured_neighbours=0)
    assert np.isfinite(fused.heights).sum() == 1 and np.isfinite(fused.heights[5, 5])
