"""Dense matching of the built-in engine (ODM's ``openmvs`` stage): stereo pairs to 3D points.

Steps, all on the CPU with OpenCV:

1. **Pair selection** from the sparse model (:func:`select_pairs`): two images are a candidate
   pair when they see enough of the same sparse points (overlap), their baseline over the height
   above ground is in ``[MIN_BASE_RATIO, MAX_BASE_RATIO]`` and their optical axes differ by less
   than ``MAX_AXIS_ANGLE_DEG``; each image chooses up to ``PAIRS_PER_IMAGE`` partners greedily
   by coverage, as OpenMVS's neighbour view selection weighs the points a view adds: the score
   of a candidate is the share of the image's sparse points it sees that fewer than two of the
   partners chosen so far see (fusion needs two agreeing pairs per cell), times the baseline
   ratio capped at ``GOOD_BASE_RATIO``; a candidate adding less than ``MIN_NEW_COVERAGE`` is not
   taken. With the best-scored partners alone (overlap x ratio) an image at the edge of a block
   of two flight lines took its three partners across the lines, whose footprints share only
   the middle, and its outer strip was measured by no pair.
2. **Rectification** from the SfM poses (``cv2.stereoRectify`` with the refined radial
   distortion) of both images downscaled to the depth-map size ODM and OpenMVS pick for
   ``pc-quality`` (:func:`~prefect_odm.plan.depthmaps.depthmap_scale`). A pair whose baseline runs along the image rows is transposed and
   a pair whose disparities would be negative is mirrored, so the matcher always sees a left and a
   right image with positive disparities.
3. **Semi-global matching** (Hirschmueller, "Stereo Processing by Semiglobal Matching and Mutual
   Information", PAMI 2008; ``cv2.StereoSGBM``) with OpenCV's left-right consistency check
   (``disp12MaxDiff = 1``: a disparity whose match in the right image's disparity map differs by
   more than one pixel is rejected), a uniqueness ratio and speckle filtering; the disparity range
   comes from the sparse points both images see (1st..99th percentile, padded). A disparity
   within ``EDGE_DISPARITY_PX`` of either end of the range (where the matcher stopped) or whose
   match falls outside the second image is rejected.
4. **Triangulation** of every valid disparity in the rectified frame of the first image
   (``Z = -P2[a, 3] / d``), back to UTM; colours from the first image.

Pairs run in a thread pool (``max-concurrency`` threads, one pair each at a time; OpenCV releases
the GIL while it reads, remaps and matches), so memory is bounded by the threads times one
downscaled pair. Fusion of the pairs' points is
:mod:`.dense_fusion`.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from prefect_odm.engine.camera import CameraPose

logger = logging.getLogger(__name__)

MIN_OVERLAP = 0.3
"""Least share of an image's visible sparse points the partner must see too."""

MIN_BASE_RATIO = 0.05
MAX_BASE_RATIO = 0.8
GOOD_BASE_RATIO = 0.3
"""Baseline / height above ground: the accepted range and the ratio above which a wider base no
longer scores higher (precision grows with the base, overlap and matchability fall)."""

MAX_AXIS_ANGLE_DEG = 20.0
"""Largest angle between the optical axes of a pair."""

PAIRS_PER_IMAGE = 3
"""Partners chosen per image."""

MIN_NEW_COVERAGE = 0.05
"""A further partner must see this share of the image's sparse points that fewer than two of its
partners chosen so far see."""

MIN_SHARED_POINTS = 20
"""A pair needs this many sparse points seen by both (for the disparity range)."""

MAX_DISPARITY_SHARE = 0.4
"""A pair whose disparity range exceeds this share of the rectified image's side is skipped
(steep relief or a bad pose: the matcher would search most of the image)."""

SGBM_BLOCK_SIZE = 5
"""Matching window of the semi-global matcher, pixels. Its smoothness penalties are OpenCV's
recommended ``P1 = 8 * channels * block^2`` and ``P2 = 32 * channels * block^2`` for the one
(grey) channel it is given: with three channels' worth, three times too smooth, the pairs put
brighton's cars 0.75-0.81 m above the ground where ODM's cloud has 1.14 m, and the objects over
1 m stood at 57 % of ODM's heights; with one channel's, 86 %, the DSM against ODM's cloud
unchanged (median |dz| 0.24 m, p90 0.40 m)."""

LR_CHECK_PX = 1
"""OpenCV's ``disp12MaxDiff``: the left-right check's tolerance, pixels. OpenCV takes any value
below 1 as 1, so matching without the check (``lr_check_px=None``, what
``benchmarks/bench_crowns.py --steps`` compares with) passes a tolerance no disparity reaches."""

NO_LR_CHECK_PX = 1 << 20
"""The ``disp12MaxDiff`` that turns the left-right check off."""

EDGE_DISPARITY_PX = 1.0
"""Disparities within this of either end of the search range are rejected (clamped, not
matched): on the synthetic 150 m slope 4-16 % of an along-track pair's points sat at the far
end, 25-49 m below the ground, and two neighbouring pairs agreed on them."""


@dataclass(frozen=True)
class StereoPair:
    """Two images to match: indices into the camera list, the baseline ratio and the overlap."""

    first: int
    second: int
    base_ratio: float
    overlap: float


@dataclass(frozen=True)
class PairPoints:
    """The points of one pair: UTM metres ``(n, 3)`` float64 and colours ``(n, 3)`` uint8."""

    xyz: NDArray[np.float64]
    rgb: NDArray[np.uint8]


def _visible(camera: CameraPose, points: NDArray[np.float64]) -> NDArray[np.bool_]:
    u, v, depth = camera.project(points[:, 0], points[:, 1], points[:, 2])
    return np.asarray(
        (depth > 0) & (u >= 0) & (u < camera.width) & (v >= 0) & (v < camera.height), dtype=bool
    )


def select_pairs(
    cameras: Sequence[CameraPose],
    points_xyz: NDArray[np.float64],
    *,
    pairs_per_image: int = PAIRS_PER_IMAGE,
) -> list[StereoPair]:
    """Stereo pairs from the sparse model (criteria in the module docstring).

    Args:
        cameras: the posed cameras (UTM).
        points_xyz: sparse points, UTM metres, shape ``(n, 3)``.
        pairs_per_image: partners chosen per image (at most).

    Returns:
        Unordered pairs (``first < second``), sorted, each once.
    """
    if len(points_xyz) == 0 or len(cameras) < 2:
        return []
    seen = np.array([_visible(c, points_xyz) for c in cameras])
    ground_z = float(np.median(points_xyz[:, 2]))
    centres = np.array([c.center for c in cameras])
    axes = np.array([np.asarray(c.rotation)[2] for c in cameras])  # optical axis, world frame
    shared = seen.astype(np.int32) @ seen.T.astype(np.int32)
    counts = np.maximum(seen.sum(axis=1), 1)
    chosen: set[tuple[int, int]] = set()
    stats: dict[tuple[int, int], StereoPair] = {}
    for i in range(len(cameras)):
        candidates = []
        for j in range(len(cameras)):
            if i == j or shared[i, j] < MIN_SHARED_POINTS:
                continue
            height = max(0.5 * (centres[i, 2] + centres[j, 2]) - ground_z, 1.0)
            ratio = float(np.linalg.norm(centres[i] - centres[j]) / height)
            angle = math.degrees(math.acos(float(np.clip(axes[i] @ axes[j], -1.0, 1.0))))
            overlap = float(shared[i, j] / min(counts[i], counts[j]))
            if not (MIN_BASE_RATIO <= ratio <= MAX_BASE_RATIO) or angle > MAX_AXIS_ANGLE_DEG:
                continue
            if overlap < MIN_OVERLAP:
                continue
            candidates.append((j, ratio, overlap))
        views = seen[:, seen[i]]  # what each image sees of image i's sparse points
        times_seen = np.zeros(views.shape[1], dtype=np.int32)  # by the partners chosen so far
        for _ in range(pairs_per_image):
            best: tuple[float, int, float, float] | None = None
            for j, ratio, overlap in candidates:
                new = float(np.mean(views[j] & (times_seen < 2)))
                score = new * min(ratio, GOOD_BASE_RATIO)
                if new >= MIN_NEW_COVERAGE and (best is None or score > best[0]):
                    best = (score, j, ratio, overlap)
            if best is None:
                break
            _, j, ratio, overlap = best
            times_seen += views[j]
            candidates = [c for c in candidates if c[0] != j]
            key = (min(i, j), max(i, j))
            chosen.add(key)
            stats[key] = StereoPair(key[0], key[1], ratio, overlap)
    return [stats[k] for k in sorted(chosen)]


def _intrinsics(camera: CameraPose, scale: float) -> tuple[NDArray[np.float64], NDArray[Any]]:
    """OpenCV camera matrix and distortion of ``camera`` at ``scale`` (COLMAP's pixel-corner
    convention to OpenCV's pixel centres: ``c - 0.5``)."""
    k = np.array(
        [
            [camera.focal_px * scale, 0.0, camera.cx * scale - 0.5],
            [0.0, camera.focal_px * scale, camera.cy * scale - 0.5],
            [0.0, 0.0, 1.0],
        ]
    )
    return k, np.array([camera.k1, camera.k2, 0.0, 0.0])


@dataclass(frozen=True)
class _Rectified:
    """Rectified images of a pair and what maps their pixels back to the world."""

    left: NDArray[np.uint8]  # (rows, cols, 3) BGR, rectified first image
    right: NDArray[np.uint8]
    rect1: NDArray[np.float64]  # rectification rotation of the first camera
    p1: NDArray[np.float64]  # (3, 4) projection of the first rectified camera
    p2: NDArray[np.float64]
    axis: int  # 0: baseline along rectified columns, 1: along rows


def _rectify(
    first: CameraPose, second: CameraPose, image1: NDArray[np.uint8], image2: NDArray[np.uint8]
) -> _Rectified:
    import cv2

    scale = image1.shape[1] / first.width
    k1, d1 = _intrinsics(first, scale)
    k2, d2 = _intrinsics(second, scale)
    r1w, r2w = np.asarray(first.rotation), np.asarray(second.rotation)
    rotation = r2w @ r1w.T
    translation = (r2w @ (np.asarray(first.center) - np.asarray(second.center))).reshape(3, 1)
    side = int(round(1.1 * max(image1.shape[:2])))
    rect1, rect2, p1, p2, _, _, _ = cv2.stereoRectify(
        k1, d1, k2, d2, (image1.shape[1], image1.shape[0]), rotation, translation,
        flags=cv2.CALIB_ZERO_DISPARITY, alpha=1.0, newImageSize=(side, side),
    )  # fmt: skip
    maps = [
        cv2.initUndistortRectifyMap(k, d, r, p, (side, side), cv2.CV_32FC1)
        for k, d, r, p in ((k1, d1, rect1, p1), (k2, d2, rect2, p2))
    ]
    left: NDArray[np.uint8] = np.asarray(
        cv2.remap(image1, *maps[0], cv2.INTER_LINEAR, borderValue=(0, 0, 0)), dtype=np.uint8
    )
    right: NDArray[np.uint8] = np.asarray(
        cv2.remap(image2, *maps[1], cv2.INTER_LINEAR, borderValue=(0, 0, 0)), dtype=np.uint8
    )
    axis = 0 if abs(p2[0, 3]) >= abs(p2[1, 3]) else 1
    return _Rectified(left, right, np.asarray(rect1), np.asarray(p1), np.asarray(p2), axis)


def _sparse_disparities(
    rect: _Rectified, first: CameraPose, second: CameraPose, points: NDArray[np.float64]
) -> NDArray[np.float64]:
    """Disparities ``coord1 - coord2`` along the baseline axis of sparse points both see.

    OpenCV's ``P1`` and ``P2`` both project points given in the first rectified camera's frame.
    """
    both = _visible(first, points) & _visible(second, points)
    cam = (np.asarray(first.rotation) @ (points[both] - np.asarray(first.center)).T).T
    xr = np.column_stack([(rect.rect1 @ cam.T).T, np.ones(len(cam))])
    coords = []
    for p in (rect.p1, rect.p2):
        pix = (p @ xr.T).T
        coords.append(pix[:, rect.axis] / pix[:, 2])
    return np.asarray(coords[0] - coords[1])


def _match(
    rect: _Rectified, low: float, high: float, lr_check_px: int | None = LR_CHECK_PX
) -> tuple[NDArray[np.float32], NDArray[np.bool_]]:
    """SGBM disparity (``coord1 - coord2``, rectified frame of the first image) and validity."""
    import cv2

    flip = rect.p2[rect.axis, 3] > 0  # then coord1 - coord2 < 0: mirror to make it positive
    images = [rect.left, rect.right]
    if rect.axis == 1:
        images = [np.ascontiguousarray(np.swapaxes(i, 0, 1)) for i in images]
    if flip:
        images = [np.ascontiguousarray(i[:, ::-1]) for i in images]
    low_pos, high_pos = (-high, -low) if flip else (low, high)
    min_disp = int(math.floor(low_pos))
    count = max(16, int(math.ceil((high_pos - min_disp) / 16.0)) * 16)
    block = SGBM_BLOCK_SIZE
    sgbm = cv2.StereoSGBM.create(
        minDisparity=min_disp, numDisparities=count, blockSize=block,
        P1=8 * block * block, P2=32 * block * block, disp12MaxDiff=NO_LR_CHECK_PX if lr_check_px is None else lr_check_px,
        uniquenessRatio=10, speckleWindowSize=100, speckleRange=2,
        mode=cv2.STEREO_SGBM_MODE_SGBM,
    )  # fmt: skip
    gray = [cv2.cvtColor(i, cv2.COLOR_BGR2GRAY) for i in images]
    disparity = sgbm.compute(gray[0], gray[1]).astype(np.float32) / 16.0
    # A disparity at either end of the search range is where the matcher stopped, not a match:
    # ground outside the sparse points' range (a slope, a tall roof) clamps to the nearest end,
    # and pairs looking alike clamp alike, so fusion's agreement test cannot catch it.
    inside = (disparity > min_disp + EDGE_DISPARITY_PX) & (
        disparity < min_disp + count - 1 - EDGE_DISPARITY_PX
    )
    second: NDArray[np.uint8] = np.asarray(gray[1])
    cols = np.arange(disparity.shape[1])[None, :]
    col2 = np.rint(cols - disparity).astype(np.int64)  # the match in the second image
    in_frame = (col2 >= 0) & (col2 < second.shape[1])
    matched = np.take_along_axis(second, np.clip(col2, 0, second.shape[1] - 1), axis=1)
    valid = inside & in_frame & (matched > 0) & (gray[0] > 0)
    if flip:
        disparity, valid = -disparity[:, ::-1], valid[:, ::-1]
    if rect.axis == 1:
        disparity, valid = disparity.T, valid.T
    return np.ascontiguousarray(disparity), np.ascontiguousarray(valid)


def _triangulate(
    rect: _Rectified, first: CameraPose, disparity: NDArray[np.float32], valid: NDArray[np.bool_]
) -> PairPoints:
    rows, cols = np.nonzero(valid & (np.abs(disparity) > 0.1))
    d = disparity[rows, cols].astype(np.float64)
    f, cx, cy = rect.p1[0, 0], rect.p1[0, 2], rect.p1[1, 2]
    z = -rect.p2[rect.axis, 3] / d
    good = z > 0
    rows, cols, z = rows[good], cols[good], z[good]
    xr = np.column_stack([(cols - cx) / f * z, (rows - cy) / f * z, z])
    cam = xr @ rect.rect1  # rect1^T applied to row vectors
    world = cam @ np.asarray(first.rotation) + np.asarray(first.center)
    rgb = rect.left[rows, cols][:, ::-1].astype(np.uint8)  # BGR -> RGB
    return PairPoints(world, np.ascontiguousarray(rgb))


def _read_scaled(path: Path, scale: float) -> NDArray[np.uint8]:
    import cv2

    image = cv2.imread(str(path), cv2.IMREAD_COLOR)
    if image is None:
        raise OSError(f"{path}: cannot read the image")
    if scale < 1.0:
        size = (max(1, round(image.shape[1] * scale)), max(1, round(image.shape[0] * scale)))
        image = cv2.resize(image, size, interpolation=cv2.INTER_AREA)
    return np.asarray(image, dtype=np.uint8)


def match_pair(
    first: CameraPose,
    second: CameraPose,
    image_dir: Path,
    points_xyz: NDArray[np.float64],
    scale: float,
    *,
    lr_check_px: int | None = LR_CHECK_PX,
) -> PairPoints:
    """Dense points of one pair (rectify, SGBM with left-right check, triangulate).

    Args:
        first, second: the pair's cameras (UTM poses).
        image_dir: folder of the image files.
        points_xyz: sparse points (UTM metres, ``(n, 3)``) for the disparity range.
        scale: image scale of the depth map (:func:`~prefect_odm.plan.depthmaps.depthmap_scale`).
        lr_check_px: the left-right check's tolerance, pixels (:data:`LR_CHECK_PX`; None: none).

    Returns:
        The pair's points; empty when the pair shares too few sparse points or its disparity
        range exceeds :data:`MAX_DISPARITY_SHARE` of the image.

    Raises:
        OSError: an image cannot be read.
    """
    images = [_read_scaled(image_dir / c.name, scale) for c in (first, second)]
    rect = _rectify(first, second, images[0], images[1])
    sparse = _sparse_disparities(rect, first, second, points_xyz)
    if len(sparse) < MIN_SHARED_POINTS:
        return PairPoints(np.zeros((0, 3)), np.zeros((0, 3), dtype=np.uint8))
    low, high = np.percentile(sparse, [1.0, 99.0])
    pad = 0.15 * (high - low) + 4.0
    if (high - low) + 2 * pad > MAX_DISPARITY_SHARE * min(rect.left.shape[:2]):
        return PairPoints(np.zeros((0, 3)), np.zeros((0, 3), dtype=np.uint8))
    disparity, valid = _match(rect, float(low - pad), float(high + pad), lr_check_px)
    return _triangulate(rect, first, disparity, valid)
