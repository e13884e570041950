"""Feature matches between neighbouring orthophotos, and the displacement they measure after any
correction (adapter: rasterio, OpenCV).

Phase correlation on tiles (:func:`.overlaps.ortho_shifts`) sees an offset up to a quarter of
its tile, 5 m on 20 m tiles: a seam tens of metres wide gives wrong peaks, not its width. Here
each orthophoto is read once, over its footprint near its neighbours, at about
:data:`MATCH_PIXEL_M` (area average), and SIFT keypoints (D. G. Lowe, "Distinctive image
features from scale-invariant keypoints", IJCV 60(2), 2004; OpenCV's ``SIFT``) are
matched between neighbours by descriptor, with Lowe's ratio test, wherever they lie within
:data:`MATCH_MARGIN_M` of the other's footprint; matches that no affine map between the two
carries within :data:`RANSAC_THRESHOLD_M` are dropped (``cv2.estimateAffine2D``, RANSAC).

A match is one ground feature at ``xy_first`` in the first orthophoto and ``xy_second`` in the
second, both as they are (plan CRS metres). A merge applies a submodel's correction to its
orthophoto as a corrected geotransform (:meth:`~prefect_odm.align.RasterCorrection.
corrected_geotransform`): every pixel, and so every feature, moves by that affine and by
nothing else. The displacement between the corrected orthophotos is therefore
``C_second(xy_second) - C_first(xy_first)`` exactly (:func:`displacements`), for every stage
of an alignment, without warping and matching again (``tests/test_seam_checks.py`` checks it
against a match of the warped orthophotos).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np
import rasterio
from numpy.typing import NDArray
from rasterio.crs import CRS
from rasterio.enums import Resampling
from rasterio.warp import transform as transform_points
from rasterio.warp import transform_bounds
from rasterio.windows import Window, from_bounds

from prefect_odm.align.similarity import RasterCorrection
from prefect_odm.errors import MergeError

FloatArray = NDArray[np.float64]
Bounds4 = tuple[float, float, float, float]

MATCH_PIXEL_M = 0.2
"""Pixel size the orthophotos are matched at, metres (coarser inputs at their own): keypoints
are located to a tenth of a pixel, and the median of hundreds to about a centimetre."""
MATCH_MARGIN_M = 40.0
"""How far beyond its neighbour's footprint an orthophoto is searched, metres: the largest
displacement a match can show."""
RATIO = 0.75
"""Lowe's ratio test: a match counts when its descriptor distance is below this share of the
second nearest's."""
RANSAC_THRESHOLD_M = 1.5
"""A match further than this from the affine map fitted to all (RANSAC) is a wrong match."""
MIN_MATCHES = 12
"""Fewest matches that measure an overlap (fewer: not measured)."""
FEATURES_PER_MPX = 4000
"""SIFT keypoints kept per million pixels read (the strongest)."""


@dataclass(frozen=True)
class OverlapMatches:
    """The feature matches of one overlap, each as seen in both orthophotos as they are.

    Attributes:
        first, second: submodel ids (sorted).
        xy_first, xy_second: ``(n, 2)`` positions, plan CRS metres (east, north).
    """

    first: str
    second: str
    xy_first: FloatArray
    xy_second: FloatArray


@dataclass(frozen=True)
class _Features:
    """One orthophoto's keypoints: positions ``(n, 2)`` in the plan CRS, SIFT descriptors."""

    xy: FloatArray
    descriptors: NDArray[np.float32]


def _footprints(orthophotos: Mapping[str, Path], crs: CRS) -> dict[str, tuple[Bounds4, CRS]]:
    """Submodel id -> (bounds in ``crs``, the raster's own CRS)."""
    out: dict[str, tuple[Bounds4, CRS]] = {}
    for sid, path in sorted(orthophotos.items()):
        try:
            with rasterio.open(path) as ds:
                own = ds.crs
                b = transform_bounds(own, crs, *ds.bounds) if own != crs else tuple(ds.bounds)
        except rasterio.RasterioIOError as exc:
            raise MergeError(f"orthophoto {sid} ({path}) cannot be read: {exc}") from exc
        out[sid] = ((float(b[0]), float(b[1]), float(b[2]), float(b[3])), own)
    return out


def _grown_intersection(a: Bounds4, b: Bounds4, margin_m: float) -> Bounds4 | None:
    """``a`` within ``margin_m`` of ``b`` (None when empty)."""
    left, bottom = max(a[0], b[0] - margin_m), max(a[1], b[1] - margin_m)
    right, top = min(a[2], b[2] + margin_m), min(a[3], b[3] + margin_m)
    return (left, bottom, right, top) if right > left and top > bottom else None


def _union(boxes: list[Bounds4]) -> Bounds4:
    return (
        min(b[0] for b in boxes),
        min(b[1] for b in boxes),
        max(b[2] for b in boxes),
        max(b[3] for b in boxes),
    )


def _features(path: Path, box: Bounds4, crs: CRS, own: CRS) -> _Features:
    """SIFT keypoints of one orthophoto over ``box`` (plan CRS), read at about
    :data:`MATCH_PIXEL_M` with area averaging, on its valid pixels only."""
    with rasterio.open(path) as ds:
        local = transform_bounds(crs, own, *box) if own != crs else box
        win = from_bounds(*local, transform=ds.transform).intersection(
            Window(0, 0, ds.width, ds.height)
        )
        win = win.round_offsets().round_lengths()
        factor = max(1.0, MATCH_PIXEL_M / min(abs(ds.res[0]), abs(ds.res[1])))
        shape = (max(1, int(win.height / factor)), max(1, int(win.width / factor)))
        bands = [1, 2, 3] if ds.count >= 3 else [1]
        rgb = ds.read(bands, window=win, out_shape=(len(bands), *shape),
                      resampling=Resampling.average)  # fmt: skip
        valid = ds.read_masks(1, window=win, out_shape=shape, resampling=Resampling.nearest)
        tf = ds.window_transform(win) * rasterio.Affine.scale(
            win.width / shape[1], win.height / shape[0]
        )
    grey = np.clip(rgb.astype(np.float32).mean(axis=0), 0, 255).astype(np.uint8)
    mask = cv2.erode((valid > 0).astype(np.uint8) * 255, np.ones((5, 5), np.uint8))
    count = max(500, int(FEATURES_PER_MPX * grey.size / 1e6))
    keypoints, descriptors = cv2.SIFT.create(nfeatures=count).detectAndCompute(grey, mask)
    if descriptors is None or not keypoints:
        return _Features(np.zeros((0, 2)), np.zeros((0, 128), dtype=np.float32))
    # keypoint coordinates count from the corner of pixel (0, 0), as the geotransform does
    cols = np.array([k.pt[0] for k in keypoints]) + 0.5
    rows = np.array([k.pt[1] for k in keypoints]) + 0.5
    x = tf.a * cols + tf.b * rows + tf.c
    y = tf.d * cols + tf.e * rows + tf.f
    if own != crs:
        x, y = (np.asarray(v) for v in transform_points(own, crs, x, y))
    return _Features(np.stack([x, y], axis=1), np.asarray(descriptors, dtype=np.float32))


def _inside(xy: FloatArray, box: Bounds4) -> NDArray[np.bool_]:
    return (xy[:, 0] >= box[0]) & (xy[:, 0] <= box[2]) & (xy[:, 1] >= box[1]) & (xy[:, 1] <= box[3])


def _match(fa: _Features, fb: _Features) -> tuple[FloatArray, FloatArray]:
    """Ratio-tested matches ``(xy_a, xy_b)`` that an affine map carries within
    :data:`RANSAC_THRESHOLD_M` (RANSAC), each ``(n, 2)``."""
    empty = (np.zeros((0, 2)), np.zeros((0, 2)))
    if len(fa.xy) < 2 or len(fb.xy) < 2:
        return empty
    pairs = cv2.BFMatcher(cv2.NORM_L2).knnMatch(fa.descriptors, fb.descriptors, k=2)
    good = [p[0] for p in pairs if len(p) == 2 and p[0].distance < RATIO * p[1].distance]
    if len(good) < MIN_MATCHES:
        return empty
    xa = fa.xy[[g.queryIdx for g in good]]
    xb = fb.xy[[g.trainIdx for g in good]]
    origin = xa.mean(axis=0)  # RANSAC in float32: metres about the overlap, not the CRS origin
    _, inliers = cv2.estimateAffine2D(
        (xa - origin).astype(np.float32), (xb - origin).astype(np.float32),
        method=cv2.RANSAC, ransacReprojThreshold=RANSAC_THRESHOLD_M, maxIters=4000,
        confidence=0.999, refineIters=0,
    )  # fmt: skip
    if inliers is None:
        return empty
    keep = inliers.ravel().astype(bool)
    return xa[keep], xb[keep]


def orthophoto_matches(
    orthophotos: Mapping[str, Path], *, crs_epsg: int | None = None
) -> list[OverlapMatches]:
    """The feature matches of every pair of orthophotos within :data:`MATCH_MARGIN_M` of each
    other, found on the orthophotos as they are.

    Args:
        orthophotos: submodel id -> local RGB(A) GeoTIFF.
        crs_epsg: the plan CRS the positions are given in (None: the first input's).

    Returns:
        one :class:`OverlapMatches` per pair (sorted ids) with at least :data:`MIN_MATCHES`
        matches.

    Raises:
        MergeError: an orthophoto that cannot be read.
    """
    ids = sorted(orthophotos)
    if len(ids) < 2:
        return []
    if crs_epsg is not None:
        crs = CRS.from_epsg(crs_epsg)
    else:
        with rasterio.open(orthophotos[ids[0]]) as ds:
            crs = ds.crs
    feet = _footprints(orthophotos, crs)
    near: dict[str, dict[str, Bounds4]] = {sid: {} for sid in ids}
    for i, a in enumerate(ids):
        for b in ids[i + 1 :]:
            box_a = _grown_intersection(feet[a][0], feet[b][0], MATCH_MARGIN_M)
            box_b = _grown_intersection(feet[b][0], feet[a][0], MATCH_MARGIN_M)
            if box_a is not None and box_b is not None:
                near[a][b], near[b][a] = box_a, box_b
    features = {
        sid: _features(orthophotos[sid], _union(list(near[sid].values())), crs, feet[sid][1])
        for sid in ids
        if near[sid]
    }
    out: list[OverlapMatches] = []
    for a in ids:
        for b in sorted(s for s in near[a] if s > a):
            fa, fb = features[a], features[b]
            ka, kb = _inside(fa.xy, near[a][b]), _inside(fb.xy, near[b][a])
            xa, xb = _match(_Features(fa.xy[ka], fa.descriptors[ka]),
                            _Features(fb.xy[kb], fb.descriptors[kb]))  # fmt: skip
            if len(xa) >= MIN_MATCHES:
                out.append(OverlapMatches(a, b, xa, xb))
    return out


def _moved(fix: RasterCorrection | None, xy: FloatArray) -> FloatArray:
    """Positions ``(n, 2)`` after a raster correction's horizontal affine (as they are without)."""
    if fix is None:
        return xy
    (a, b, c), (d, e, f) = fix.affine
    return np.stack([a * xy[:, 0] + b * xy[:, 1] + c, d * xy[:, 0] + e * xy[:, 1] + f], axis=1)


def displacements(
    matches: OverlapMatches, corrections: Mapping[str, RasterCorrection] | None = None
) -> FloatArray:
    """Where each matched feature lies in the second corrected orthophoto minus where it lies in
    the first, ``(n, 2)`` metres (east, north): ``C_second(xy_second) - C_first(xy_first)``."""
    fixes = corrections or {}
    moved_b = _moved(fixes.get(matches.second), matches.xy_second)
    moved: FloatArray = moved_b - _moved(fixes.get(matches.first), matches.xy_first)
    return moved


def moved(
    matches: OverlapMatches, corrections: Mapping[str, RasterCorrection] | None = None
) -> FloatArray:
    """Where each matched feature lies in the first corrected orthophoto, ``(n, 2)`` metres."""
    return _moved((corrections or {}).get(matches.first), matches.xy_first)
