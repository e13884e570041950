"""Core areas (Voronoi cells per submodel) and overlap in metres (pure core: numpy, scipy, shapely).

Steps 4-5 of :mod:`prefect_odm.plan.planning`. A submodel's core area is the union of the Voronoi
cells of its cameras, i.e. exactly the region :mod:`prefect_odm.ownership` assigns to it (nearest
core camera), clipped to a polygon. It is built from the Delaunay triangulation: the Voronoi edges
are the segments between circumcentres of adjacent triangles, and those whose shared edge joins
cameras of different submodels bound the core areas; they are polygonized per submodel. The
overlap adds every camera within ``split_overlap_m`` of a core area.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
import shapely
from numpy.typing import NDArray
from scipy.spatial import Delaunay, cKDTree
from shapely.geometry import MultiPoint
from shapely.geometry.base import BaseGeometry

VERTEX_SNAP_DECIMALS = 6
"""Voronoi vertices are snapped to 10**-6 m (1 micrometre) before the cells are polygonized."""

RING_COUNT = 64
"""Far points around the survey that close the outer cameras' cells."""


def multipoint(xy: NDArray[np.float64]) -> MultiPoint:
    """The ``(n, 2)`` positions as one MultiPoint geometry."""
    # shapely's overloads cannot tell that a 2-D array makes one geometry, not an array of them.
    return cast(MultiPoint, shapely.multipoints(xy))


def camera_hulls(
    xy: NDArray[np.float64], members: Sequence[NDArray[np.intp]]
) -> NDArray[np.object_]:
    """The convex hull of each group's positions: ``(len(members),)`` geometries for
    ``xy`` ``(n, 2)`` and index arrays ``members`` (each non-empty); the MultiPoints are made
    in one call (``shapely.from_ragged_array``), not point by point."""
    offsets = np.zeros(len(members) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(m) for m in members])
    coords = xy[np.concatenate(members)] if len(members) else np.empty((0, 2))
    groups = shapely.from_ragged_array(shapely.GeometryType.MULTIPOINT, coords, (offsets,))
    hulls: NDArray[np.object_] = shapely.convex_hull(groups)
    return hulls


def circumcentres(
    points: NDArray[np.float64], simplices: NDArray[np.integer[Any]]
) -> NDArray[np.float64]:
    """Circumcentres of triangles: ``(m, 2)`` for ``points`` ``(n, 2)`` and ``simplices`` ``(m, 3)``.

    A degenerate (collinear) triangle gets a centre far away instead of a division by zero.
    """
    a = points[simplices[:, 0]]
    b = points[simplices[:, 1]] - a
    c = points[simplices[:, 2]] - a
    d = 2.0 * (b[:, 0] * c[:, 1] - b[:, 1] * c[:, 0])
    d = np.where(d == 0.0, np.finfo(np.float64).tiny, d)
    b2 = (b * b).sum(axis=1)
    c2 = (c * c).sum(axis=1)
    ux = (c[:, 1] * b2 - b[:, 1] * c2) / d
    uy = (b[:, 0] * c2 - c[:, 0] * b2) / d
    centres: NDArray[np.float64] = np.column_stack([ux, uy]) + a
    return centres


@dataclass(frozen=True)
class VoronoiFrame:
    """What the core areas of every labelling of the same positions share: built once per plan.

    The Delaunay triangulation (scipy/Qhull, 1.5 s at 100,000 positions) depends on the
    positions and the clip only, not on the parts; the load balancing of
    :mod:`prefect_odm.plan.planning` labels the same positions up to 9 times.

    Attributes:
        points: ``(n + 64, 2)`` the positions and a ring of far points closing the outer cells.
        simplices: ``(m, 3)`` triangles, indices into ``points``.
        neighbors: ``(m, 3)`` the triangle across each triangle's edge ``i`` (-1 on the hull).
        centres: ``(m, 2)`` circumcentres, snapped to :data:`VERTEX_SNAP_DECIMALS`.
        tree: KD-tree of the ``n`` positions (nearest camera, cameras within a reach).
        cameras: ``(n,)`` the positions as shapely Points (the overlap's distance tests).
        ring_centre: ``(2,)`` centre of the far ring, metres.
        ring_radius_m: radius of the far ring, metres.
        memo: results of earlier plans on this frame (a labelling's owned faces, the labels of
            a list of core sizes), reused by the widths and rounds that repeat them.
    """

    points: NDArray[np.float64]
    simplices: NDArray[np.int64]
    neighbors: NDArray[np.int64]
    centres: NDArray[np.float64]
    tree: cKDTree
    cameras: NDArray[np.object_]
    ring_centre: NDArray[np.float64]
    ring_radius_m: float
    memo: dict[Any, Any] = field(default_factory=dict, compare=False, repr=False)

    def remember(self, key: Any, make: Callable[[], Any]) -> Any:
        """``memo[key]``, made by ``make()`` when not held."""
        if key not in self.memo:
            self.memo[key] = make()
        return self.memo[key]

    def closes(self, clip: BaseGeometry) -> bool:
        """Whether the far ring leaves the cameras' Voronoi cells inside ``clip`` exact: every
        point of ``clip``'s bounds is nearer to a camera (at most their diagonal away, the
        cameras lying inside ``clip``) than to any ring point."""
        minx, miny, maxx, maxy = clip.bounds
        corners = np.array([[minx, miny], [minx, maxy], [maxx, miny], [maxx, maxy]])
        far = float(np.max(np.hypot(*(corners - self.ring_centre).T)))
        return self.ring_radius_m - far > math.hypot(maxx - minx, maxy - miny)


def voronoi_frame(xy: NDArray[np.float64], clip: BaseGeometry) -> VoronoiFrame:
    """The :class:`VoronoiFrame` of positions ``xy`` ``(n, 2)`` (metres) for cells clipped to ``clip``.

    A ring of far points closes the cells of the outer cameras: far enough that no bisector with
    a real camera enters ``clip``.
    """
    minx, miny, maxx, maxy = clip.bounds
    centre = np.array([(minx + maxx) / 2, (miny + maxy) / 2])
    radius = max(maxx - minx, maxy - miny, 1.0)
    angles = np.arange(RING_COUNT) * (2 * np.pi / RING_COUNT)
    ring = centre + 4.0 * radius * np.column_stack([np.cos(angles), np.sin(angles)])
    points = np.vstack([xy, ring])
    tri = Delaunay(points)
    simplices = tri.simplices.astype(np.int64)
    # Snapped: positions regular up to round-off (a lon/lat <-> UTM round trip leaves ~1e-10 m)
    # give pairs of circumcentres a hair apart, whose tiny edges polygonize cannot close into
    # cells; snapped, they are one Voronoi vertex and the zero-length edge is dropped below.
    cc = np.round(circumcentres(points, simplices), VERTEX_SNAP_DECIMALS)
    neighbors = tri.neighbors.astype(np.int64)
    cameras = np.asarray(shapely.points(xy), dtype=object)
    return VoronoiFrame(
        points, simplices, neighbors, cc, cKDTree(xy), cameras, centre, 4.0 * radius
    )


class FrameCache:
    """The last :class:`VoronoiFrame` built, for plans of the same positions and clip (the
    overlap widening of :mod:`prefect_odm.plan.planning` plans up to 4 widths); keyed by a
    digest of both, so other positions build their own.

    With ``share_ring``, a frame also serves another clip of the same positions that its far
    ring closes (:meth:`VoronoiFrame.closes`): the core areas are the same up to floating point,
    their vertices' order aside (the widening's search compares shared-image counts only; the
    plan it keeps is made with its own frame). :attr:`exact` says whether the last frame
    handed out was built for that clip.
    """

    def __init__(self, share_ring: bool = False) -> None:
        """An empty cache; ``share_ring``: see the class."""
        self.share_ring = share_ring
        self.exact = True
        self._key = self._xy_key = b""
        self._frame: VoronoiFrame | None = None

    def get(self, xy: NDArray[np.float64], clip: BaseGeometry) -> VoronoiFrame:
        """The frame of ``xy`` and ``clip`` (:func:`voronoi_frame`), built when not held."""
        xy_key = hashlib.blake2b(xy.tobytes()).digest()
        key = hashlib.blake2b(xy_key + shapely.to_wkb(clip)).digest()
        self.exact = key == self._key
        if self._frame is not None and self.exact:
            return self._frame
        if self.share_ring and self._frame is not None and xy_key == self._xy_key:
            if self._frame.closes(clip):
                return self._frame
        self._key, self._xy_key, self.exact = key, xy_key, True
        self._frame = voronoi_frame(xy, clip)
        return self._frame


def _voronoi_boundaries(
    frame: VoronoiFrame, labels: NDArray[np.int32], k: int
) -> tuple[NDArray[np.float64], NDArray[np.int64]]:
    """The Voronoi edges between cameras of different parts, each listed once per side.

    The frame's far ring has label -1.

    Returns:
        ``(segments, bounds)``: the segments ``(s, 2, 2)`` sorted by the part of their side, and
        ``bounds`` ``(k + 2,)`` such that the segments of part ``p`` are
        ``segments[bounds[p + 1]:bounds[p + 2]]``.
    """
    simplices, neighbors, cc = frame.simplices, frame.neighbors, frame.centres
    all_labels = np.concatenate([labels, np.full(RING_COUNT, -1, dtype=np.int32)])
    seg_t: list[NDArray[np.int64]] = []
    seg_t2: list[NDArray[np.int64]] = []
    seg_lab_a: list[NDArray[np.int32]] = []
    seg_lab_b: list[NDArray[np.int32]] = []
    tidx = np.arange(len(simplices))
    for i in range(3):
        a = simplices[:, (i + 1) % 3]
        b = simplices[:, (i + 2) % 3]
        t2 = neighbors[:, i]
        la, lb = all_labels[a], all_labels[b]
        keep = (la != lb) & (t2 > tidx)
        seg_t.append(tidx[keep])
        seg_t2.append(t2[keep])
        seg_lab_a.append(la[keep])
        seg_lab_b.append(lb[keep])
    p1, p2 = cc[np.concatenate(seg_t)], cc[np.concatenate(seg_t2)]
    lab_a, lab_b = np.concatenate(seg_lab_a), np.concatenate(seg_lab_b)
    nonzero = np.any(p1 != p2, axis=1)
    p1, p2, lab_a, lab_b = p1[nonzero], p2[nonzero], lab_a[nonzero], lab_b[nonzero]
    segs = np.stack([p1, p2], axis=1)
    # Each boundary segment belongs to both parts it separates.
    seg_labels = np.concatenate([lab_a, lab_b])
    seg_all = np.concatenate([segs, segs])
    order = np.argsort(seg_labels, kind="stable")
    seg_labels, seg_all = seg_labels[order], seg_all[order]
    bounds = np.searchsorted(seg_labels, np.arange(-1, k + 1))
    return seg_all, bounds


def core_areas(
    xy: NDArray[np.float64],
    labels: NDArray[np.int32],
    k: int,
    clip: BaseGeometry,
    frame: VoronoiFrame | None = None,
) -> list[BaseGeometry]:
    """Per part, the union of its cameras' Voronoi cells, clipped to ``clip``.

    Agrees with :class:`prefect_odm.ownership.Ownership` (nearest camera, grouped by part)
    everywhere inside ``clip`` up to floating point on the cell boundaries.

    Args:
        xy: ``(n, 2)`` camera positions in metres (local coordinates are fine).
        labels: ``(n,)`` part of each camera, ``0..k-1``.
        k: number of parts.
        clip: the polygon to clip the cells to (must contain every camera).
        frame: :func:`voronoi_frame` of ``xy`` and ``clip``, when it was built already.

    Returns:
        ``k`` Polygon/MultiPolygon geometries (empty when a part owns no area inside ``clip``).
    """
    if k == 1:
        return [clip]
    frame = frame if frame is not None else voronoi_frame(xy, clip)
    key = ("owned", hashlib.blake2b(labels.tobytes()).digest(), k)
    owned: list[BaseGeometry | None] = frame.remember(key, lambda: _owned_areas(frame, labels, k))
    out: list[BaseGeometry] = [shapely.Polygon() for _ in range(k)]
    shapely.prepare(clip)
    for part, merged in enumerate(owned):
        if merged is not None:
            out[part] = shapely.intersection(merged, clip)
    return out


def _owned_areas(
    frame: VoronoiFrame, labels: NDArray[np.int32], k: int
) -> list[BaseGeometry | None]:
    """Per part, the union of the faces it owns (unclipped), None for a part with none."""
    seg_all, bounds = _voronoi_boundaries(frame, labels, k)
    # The faces polygonized from a part's boundary segments, kept when that part owns them.
    faces: list[BaseGeometry] = []
    face_part: list[int] = []
    for part in range(k):
        s, e = bounds[part + 1], bounds[part + 2]
        if e <= s:
            continue
        lines = np.asarray(shapely.linestrings(seg_all[s:e]))
        polys = shapely.get_parts(shapely.polygonize(lines.tolist()))
        faces.extend(polys.tolist())
        face_part.extend([part] * len(polys))
    out: list[BaseGeometry | None] = [None] * k
    if not faces:
        return out
    reps = shapely.get_coordinates(shapely.point_on_surface(np.array(faces, dtype=object)))
    _, nearest = frame.tree.query(reps, k=1)
    owner = labels[nearest]
    kept: list[list[BaseGeometry]] = [[] for _ in range(k)]
    for face, part, own in zip(faces, face_part, owner, strict=True):
        if own == part:
            kept[part].append(face)
    for part in range(k):
        if kept[part]:
            out[part] = shapely.union_all(kept[part]) if len(kept[part]) > 1 else kept[part][0]
    return out


def overlap_members(
    xy: NDArray[np.float64],
    labels: NDArray[np.int32],
    areas: Sequence[BaseGeometry],
    split_overlap_m: float,
    frame: VoronoiFrame | None = None,
) -> list[NDArray[np.intp]]:
    """Per part, the sorted indices of every camera it processes: its own plus those within
    ``split_overlap_m`` metres of its core area.

    Args:
        xy: ``(n, 2)`` camera positions, same coordinates as ``areas``.
        labels: ``(n,)`` core part of each camera.
        areas: core area of each part.
        split_overlap_m: overlap width in metres (>= 0).
        frame: :func:`voronoi_frame` of ``xy``, when it was built already (its KD-tree and
            points are used).
    """
    k = len(areas)
    own = [np.flatnonzero(labels == part) for part in range(k)]
    if split_overlap_m <= 0 or k == 1:
        return own
    tree = frame.tree if frame is not None else cKDTree(xy)
    out: list[NDArray[np.intp]] = []
    for part, area in enumerate(areas):
        if area.is_empty:
            out.append(own[part])
            continue
        minx, miny, maxx, maxy = area.bounds
        centre = ((minx + maxx) / 2, (miny + maxy) / 2)
        reach = 0.5 * math.hypot(maxx - minx, maxy - miny) + split_overlap_m
        cand = np.asarray(tree.query_ball_point(centre, reach), dtype=np.intp)
        cand = cand[labels[cand] != part]
        if len(cand):
            shapely.prepare(area)
            cams = frame.cameras[cand] if frame is not None else shapely.points(xy[cand])
            near = shapely.dwithin(area, cams, split_overlap_m)
            extra = cand[near]
        else:
            extra = cand
        out.append(np.sort(np.concatenate([own[part], extra])))
    return out
