"""Split planning: balanced submodels in metres, core areas, overlap in metres (pure core).

The algorithm, in the plan's projected CRS (one UTM zone for the whole survey, metres):

1. **Canonical order.** Positions are sorted by ``(x, y, identity rank)`` before anything else,
   so a shuffled or renamed input yields the same arrays and therefore the same plan.
2. **Target sizes.** ``k`` submodels with sizes as equal as possible and within +-20 % of
   ``split`` (:func:`target_sizes`). Only when no such ``k`` exists (``1.2 split < n < 1.6 split``)
   one submodel takes the remainder; a remainder smaller than ``min_submodel_images`` is spread
   over the others instead (a tiny cluster joins its neighbours).
3. **Balanced partition by recursive bisection** (:func:`partition_positions`): the list of target
   sizes is halved, the points are cut across their longer principal axis at the count quantile
   of the first half, and both halves recurse. Sizes are met exactly; every cut is a straight
   line, so submodels are compact and contiguous. This is orthogonal recursive bisection as used
   for balanced spatial domain decomposition (Berger & Bokhari 1987, "A partitioning strategy for
   nonuniform problems on multiprocessors", IEEE Trans. Computers C-36(5)), with the principal
   axis instead of a coordinate axis. Cost O(n log n log k).
4. **Core areas** (:func:`core_areas`): the union of the Voronoi cells of each submodel's
   cameras, i.e. exactly the region :mod:`prefect_odm.ownership` assigns to it (nearest core
   camera), clipped to the camera hull buffered by ``clip_buffer_m``. Built from the Delaunay
   triangulation (Voronoi edges = segments between circumcentres of adjacent triangles whose
   shared edge joins cameras of different submodels), polygonized per submodel.
5. **Overlap in metres** (:func:`overlap_members`): every camera within ``split_overlap_m`` of a
   submodel's core area is added to that submodel; the added count is reported.

Nothing here imports Prefect or does I/O.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import shapely
from numpy.typing import ArrayLike, NDArray
from scipy.spatial import Delaunay, cKDTree
from shapely.geometry import mapping
from shapely.geometry.base import BaseGeometry

from prefect_odm.errors import PlanningError
from prefect_odm.fingerprints import fingerprint, submodel_fingerprint
from prefect_odm.geo import half_footprint_m, project_lonlat
from prefect_odm.memory import MemoryModel, estimate_peak_memory_gib, max_images_within
from prefect_odm.models import CameraPosition, ProcessingOptions, SplitPlan, Submodel, Survey
from prefect_odm.settings import DEFAULT_SPLIT, DEFAULT_SPLIT_OVERLAP_M

logger = logging.getLogger(__name__)

#: Relative size tolerance the planner aims for (+-20 % of ``split``).
SIZE_TOLERANCE = 0.2
#: Engine identities (lower-case prefixes) whose memory is estimated with the built-in model.
BUILTIN_ENGINE_PREFIXES = ("builtin", "prefect-odm-engine")
#: Decimal places of coordinates written to the plan (millimetres).
COORD_DECIMALS = 3


def default_min_submodel_images(split: int) -> int:
    """The default minimum submodel size: ``max(5, split // 4)``."""
    return max(5, int(split) // 4)


def target_sizes(n: int, split: int, min_submodel_images: int | None = None) -> list[int]:
    """Core image counts of the submodels, in planning order.

    Args:
        n: number of cameras (>= 1).
        split: the asked average submodel size in images (>= 1).
        min_submodel_images: smallest allowed submodel (default
            :func:`default_min_submodel_images`).

    Returns:
        Sizes summing to ``n``. A single submodel when ``n <= split * 1.2``. Otherwise sizes as
        equal as
        possible with every size within +-20 % of ``split`` when such a count exists; else
        ``split``-sized submodels and one remainder (last), or -- when the remainder is below
        ``min_submodel_images`` -- the remainder spread over the others (unless that would push
        them all out of tolerance, possible only for a ``split`` of a few images).

    Raises:
        PlanningError: for ``n < 1`` or ``split < 1``.
    """
    if n < 1:
        raise PlanningError("nothing to plan: no camera positions")
    if split < 1:
        raise PlanningError(f"split must be >= 1 image, got {split}")
    lo, hi = (1 - SIZE_TOLERANCE) * split, (1 + SIZE_TOLERANCE) * split
    if n <= hi:
        return [n]
    min_size = (
        default_min_submodel_images(split) if min_submodel_images is None else min_submodel_images
    )
    best: tuple[float, int] | None = None
    for k in {max(1, n // split), max(1, -(-n // split)), max(1, round(n / split))}:
        small, extra = divmod(n, k)
        big = small + (1 if extra else 0)
        if lo <= small and big <= hi:
            score = (abs(n / k - split), -k)
            if best is None or score < (abs(n / best[1] - split), -best[1]):
                best = (score[0], k)
    if best is not None:
        k = best[1]
        small, extra = divmod(n, k)
        return [small + 1] * extra + [small] * (k - extra)
    q, r = divmod(n, split)
    if r == 0:
        return [split] * q
    if r >= min_size:
        return [split] * q + [r]
    add, extra = divmod(r, q)
    spread = [split + add + 1] * extra + [split + add] * (q - extra)
    if q == 1 or spread[0] <= hi:
        return spread
    # Very small ``split`` (a few images): spreading would push every submodel out of
    # tolerance, so the remainder stays the one exception.
    return [split] * q + [r]


def canonical_order(
    x_m: NDArray[np.float64], y_m: NDArray[np.float64], tie_rank: NDArray[np.int64] | None = None
) -> NDArray[np.intp]:
    """Indices sorting positions by ``(x, y, tie_rank)`` -- the order every step works in."""
    keys: tuple[NDArray[Any], ...] = (y_m, x_m)
    if tie_rank is not None:
        keys = (tie_rank, y_m, x_m)
    return np.lexsort(keys)


def _principal_axis(xy: NDArray[np.float64]) -> NDArray[np.float64]:
    centred = xy - xy.mean(axis=0)
    cov = centred.T @ centred
    # Closed form for the 2x2 symmetric case: exact, sign-stable and cheap.
    a, b, d = float(cov[0, 0]), float(cov[0, 1]), float(cov[1, 1])
    if abs(b) < 1e-12 * max(a, d, 1e-300):
        return np.array([1.0, 0.0]) if a >= d else np.array([0.0, 1.0])
    lam = 0.5 * (a + d) + math.sqrt(0.25 * (a - d) ** 2 + b * b)
    v = np.array([b, lam - a])
    v /= np.hypot(v[0], v[1])
    if v[0] < 0 or (v[0] == 0 and v[1] < 0):
        v = -v
    return v


def partition_positions(xy: NDArray[np.float64], sizes: Sequence[int]) -> NDArray[np.int32]:
    """Balanced partition of positions by recursive principal-axis bisection.

    Args:
        xy: ``(n, 2)`` positions in metres, already in canonical order.
        sizes: target size of each part (sum ``n``); part ``i`` gets exactly ``sizes[i]`` points.

    Returns:
        ``(n,)`` int32 part label of each position, labels numbered along the cuts (spatial order).
    """
    n = len(xy)
    if sum(sizes) != n:
        raise PlanningError(f"target sizes sum to {sum(sizes)}, not to the {n} positions")
    labels = np.empty(n, dtype=np.int32)
    stack: list[tuple[NDArray[np.intp], int, int]] = [(np.arange(n), 0, len(sizes))]
    size_arr = list(sizes)
    while stack:
        idx, first, stop = stack.pop()
        if stop - first == 1:
            labels[idx] = first
            continue
        mid = (first + stop) // 2
        count = sum(size_arr[first:mid])
        pts = xy[idx]
        axis = _principal_axis(pts)
        proj = pts @ axis
        order = np.argsort(proj, kind="stable")
        left = np.sort(idx[order[:count]])
        right = np.sort(idx[order[count:]])
        stack.append((right, mid, stop))
        stack.append((left, first, mid))
    return labels


def _circumcentres(
    points: NDArray[np.float64], simplices: NDArray[np.int32]
) -> NDArray[np.float64]:
    a = points[simplices[:, 0]]
    b = points[simplices[:, 1]] - a
    c = points[simplices[:, 2]] - a
    d = 2.0 * (b[:, 0] * c[:, 1] - b[:, 1] * c[:, 0])
    d = np.where(d == 0.0, np.finfo(np.float64).tiny, d)
    b2 = (b * b).sum(axis=1)
    c2 = (c * c).sum(axis=1)
    ux = (c[:, 1] * b2 - b[:, 1] * c2) / d
    uy = (b[:, 0] * c2 - c[:, 0] * b2) / d
    return np.column_stack([ux, uy]) + a


def core_areas(
    xy: NDArray[np.float64], labels: NDArray[np.int32], k: int, clip: BaseGeometry
) -> list[BaseGeometry]:
    """Per part, the union of its cameras' Voronoi cells, clipped to ``clip``.

    Agrees with :class:`prefect_odm.ownership.Ownership` (nearest camera, grouped by part)
    everywhere inside ``clip`` up to floating point on the cell boundaries.

    Args:
        xy: ``(n, 2)`` camera positions in metres (local coordinates are fine).
        labels: ``(n,)`` part of each camera, ``0..k-1``.
        k: number of parts.
        clip: the polygon to clip the cells to (must contain every camera).

    Returns:
        ``k`` Polygon/MultiPolygon geometries (empty when a part owns no area inside ``clip``).
    """
    if k == 1:
        return [clip]
    minx, miny, maxx, maxy = clip.bounds
    centre = np.array([(minx + maxx) / 2, (miny + maxy) / 2])
    radius = max(maxx - minx, maxy - miny, 1.0)
    ring_count = 64
    angles = np.arange(ring_count) * (2 * np.pi / ring_count)
    # Far enough that no bisector with a real camera enters ``clip``.
    ring = centre + 4.0 * radius * np.column_stack([np.cos(angles), np.sin(angles)])
    points = np.vstack([xy, ring])
    all_labels = np.concatenate([labels, np.full(ring_count, -1, dtype=np.int32)])
    tri = Delaunay(points)
    simplices = tri.simplices.astype(np.int64)
    neighbors = tri.neighbors.astype(np.int64)
    cc = _circumcentres(points, simplices)
    seg_a: list[NDArray[np.int64]] = []
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
        seg_a.append(a[keep])
        seg_t.append(tidx[keep])
        seg_t2.append(t2[keep])
        seg_lab_a.append(la[keep])
        seg_lab_b.append(lb[keep])
    t1 = np.concatenate(seg_t)
    t2 = np.concatenate(seg_t2)
    lab_a = np.concatenate(seg_lab_a)
    lab_b = np.concatenate(seg_lab_b)
    p1, p2 = cc[t1], cc[t2]
    nonzero = np.any(p1 != p2, axis=1)
    p1, p2, lab_a, lab_b = p1[nonzero], p2[nonzero], lab_a[nonzero], lab_b[nonzero]
    segs = np.stack([p1, p2], axis=1)
    # Each boundary segment belongs to both parts it separates.
    seg_labels = np.concatenate([lab_a, lab_b])
    seg_all = np.concatenate([segs, segs])
    order = np.argsort(seg_labels, kind="stable")
    seg_labels, seg_all = seg_labels[order], seg_all[order]
    bounds = np.searchsorted(seg_labels, np.arange(-1, k + 1))
    tree = cKDTree(xy)
    faces: list[BaseGeometry] = []
    face_part: list[int] = []
    for part in range(k):
        s, e = bounds[part + 1], bounds[part + 2]
        if e <= s:
            continue
        lines = shapely.linestrings(seg_all[s:e])
        polys = shapely.get_parts(shapely.polygonize(lines.tolist()))
        faces.extend(polys.tolist())
        face_part.extend([part] * len(polys))
    out: list[BaseGeometry] = [shapely.Polygon() for _ in range(k)]
    if faces:
        reps = shapely.get_coordinates(shapely.point_on_surface(np.array(faces, dtype=object)))
        _, nearest = tree.query(reps, k=1)
        owner = labels[nearest]
        kept: list[list[BaseGeometry]] = [[] for _ in range(k)]
        for face, part, own in zip(faces, face_part, owner, strict=True):
            if own == part:
                kept[part].append(face)
        shapely.prepare(clip)
        for part in range(k):
            if kept[part]:
                merged = shapely.union_all(kept[part]) if len(kept[part]) > 1 else kept[part][0]
                out[part] = shapely.intersection(merged, clip)
    return out


def overlap_members(
    xy: NDArray[np.float64],
    labels: NDArray[np.int32],
    areas: Sequence[BaseGeometry],
    split_overlap_m: float,
) -> list[NDArray[np.intp]]:
    """Per part, the sorted indices of every camera it processes: its own plus those within
    ``split_overlap_m`` metres of its core area.

    Args:
        xy: ``(n, 2)`` camera positions, same coordinates as ``areas``.
        labels: ``(n,)`` core part of each camera.
        areas: core area of each part.
        split_overlap_m: overlap width in metres (>= 0).
    """
    k = len(areas)
    own = [np.flatnonzero(labels == part) for part in range(k)]
    if split_overlap_m <= 0 or k == 1:
        return own
    tree = cKDTree(xy)
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
            near = shapely.dwithin(area, shapely.points(xy[cand]), split_overlap_m)
            extra = cand[near]
        else:
            extra = cand
        out.append(np.sort(np.concatenate([own[part], extra])))
    return out


@dataclass(frozen=True)
class PositionPlan:
    """A split of raw positions (indices refer to the input arrays, coordinates are absolute).

    Attributes:
        labels: ``(n,)`` core part of each input position, parts numbered in spatial order.
        members: per part, sorted input indices of everything it processes (core + overlap).
        core_areas: per part, its core area in the input CRS (None when not computed).
        clip: the buffered camera hull the core areas are clipped to.
    """

    labels: NDArray[np.int32]
    members: list[NDArray[np.intp]]
    core_areas: list[BaseGeometry] | None
    clip: BaseGeometry | None

    @property
    def k(self) -> int:
        return len(self.members)

    def core_counts(self) -> NDArray[np.int64]:
        return np.bincount(self.labels, minlength=self.k)

    def overlap_counts(self) -> NDArray[np.int64]:
        return np.array([len(m) for m in self.members]) - self.core_counts()


def plan_from_positions(
    x_m: ArrayLike,
    y_m: ArrayLike,
    *,
    split: int = DEFAULT_SPLIT,
    split_overlap_m: float = DEFAULT_SPLIT_OVERLAP_M,
    min_submodel_images: int | None = None,
    tie_rank: ArrayLike | None = None,
    clip_buffer_m: float = 100.0,
    geometry: bool = True,
) -> PositionPlan:
    """Plan submodels on raw projected positions (the engine of :func:`plan_submodels`).

    Args:
        x_m, y_m: camera positions in a projected CRS, metres, shape ``(n,)``.
        split: average submodel size in images.
        split_overlap_m: overlap width in metres.
        min_submodel_images: see :func:`target_sizes`.
        tie_rank: ``(n,)`` integers breaking ties between identical positions (e.g. the rank of
            each image's content identity); without it ties fall back to input order.
        clip_buffer_m: buffer of the camera hull that core areas are clipped to, metres.
        geometry: compute core areas and the metre overlap; without it, members are core only.

    Returns:
        The :class:`PositionPlan`; identical for any permutation of the input (given tie ranks).

    Raises:
        PlanningError: for no positions, non-finite positions or a bad ``split``.
    """
    x = np.asarray(x_m, dtype=np.float64)
    y = np.asarray(y_m, dtype=np.float64)
    n = len(x)
    if n == 0:
        raise PlanningError("nothing to plan: no camera positions")
    if not (np.all(np.isfinite(x)) and np.all(np.isfinite(y))):
        raise PlanningError("camera positions must be finite numbers")
    rank = None if tie_rank is None else np.asarray(tie_rank, dtype=np.int64)
    order = canonical_order(x, y, rank)
    # Work in local coordinates around a rounded origin: exact offsets, better precision.
    origin = np.array([math.floor(float(np.min(x))), math.floor(float(np.min(y)))])
    xy = np.column_stack([x[order] - origin[0], y[order] - origin[1]])
    sizes = target_sizes(n, split, min_submodel_images)
    labels_sorted = partition_positions(xy, sizes)
    # Identical positions must share a part (ownership cannot tell them apart).
    same = np.flatnonzero(np.all(xy[1:] == xy[:-1], axis=1)) + 1
    for i in same:
        labels_sorted[i] = labels_sorted[i - 1]
    # Parts emptied by that (many images at one spot) are dropped, keeping the order.
    used, inverse = np.unique(labels_sorted, return_inverse=True)
    labels_sorted = inverse.astype(np.int32)
    k = len(used)
    areas: list[BaseGeometry] | None = None
    clip: BaseGeometry | None = None
    if geometry:
        hull = shapely.multipoints(xy).convex_hull
        clip = shapely.buffer(hull, max(clip_buffer_m, 1.0), quad_segs=8)
        local_areas = core_areas(xy, labels_sorted, k, clip)
        members_sorted = overlap_members(xy, labels_sorted, local_areas, split_overlap_m)
        areas = [shapely.transform(a, lambda c: c + origin) for a in local_areas]
        clip = shapely.transform(clip, lambda c: c + origin)
    else:
        members_sorted = [np.flatnonzero(labels_sorted == p) for p in range(k)]
    labels = np.empty(n, dtype=np.int32)
    labels[order] = labels_sorted
    members = [np.sort(order[m]) for m in members_sorted]
    return PositionPlan(labels=labels, members=members, core_areas=areas, clip=clip)


def _round_geometry(geom: BaseGeometry) -> dict[str, Any]:
    if geom.is_empty:
        return {"type": "Polygon", "coordinates": []}
    rounded = shapely.set_precision(geom, 10.0**-COORD_DECIMALS)
    gj = mapping(rounded)

    def _clean(obj: Any) -> Any:
        if isinstance(obj, (list, tuple)):
            if obj and isinstance(obj[0], float):
                return [round(float(v), COORD_DECIMALS) for v in obj]
            return [_clean(o) for o in obj]
        return obj

    return {"type": gj["type"], "coordinates": _clean(gj["coordinates"])}


def _auto_split(
    survey: Survey,
    options: ProcessingOptions,
    node_memory_gib: Sequence[float],
    megapixels: float,
    split_overlap_m: float,
    memory_model: MemoryModel,
) -> int:
    if not node_memory_gib:
        raise PlanningError(
            "split='auto' needs the memory of the available nodes (node_memory_gib)"
        )
    largest = max(node_memory_gib)
    fits = max_images_within(largest, megapixels, options.to_nodeodm(), model=memory_model)
    if fits < 2:
        raise PlanningError(
            f"no submodel fits in the largest node ({largest:g} GiB): "
            f"even 1 image of {megapixels:.1f} MP needs more"
        )
    # Leave room for the overlap images and the +20 % size tolerance.
    headroom = 1.2 * (1.0 + min(1.0, split_overlap_m / 100.0))
    return max(1, int(fits / headroom))


def plan_submodels(
    survey: Survey,
    *,
    split: int | Literal["auto"] = DEFAULT_SPLIT,
    split_overlap_m: float = DEFAULT_SPLIT_OVERLAP_M,
    min_submodel_images: int | None = None,
    options: ProcessingOptions | None = None,
    engine_identity: str = "unknown",
    node_memory_gib: Sequence[float] = (),
    memory_model: MemoryModel | None = None,
) -> SplitPlan:
    """Partition a scanned survey into submodels.

    Args:
        survey: the scanned survey (accepted images only are planned).
        split: average core images per submodel, or ``"auto"`` to choose it from the memory model
            and the largest of ``node_memory_gib``.
        split_overlap_m: overlap width in metres; every camera within it of a submodel's core area
            is processed by that submodel too.
        min_submodel_images: smallest submodel (default ``max(5, split // 4)``).
        options: processing options (fingerprints, memory estimate).
        engine_identity: engine name/version, part of each submodel fingerprint.
        node_memory_gib: memory of each available node, GiB; when given, a submodel whose
            estimated peak exceeds every node is an error.
        memory_model: memory anchor table (default ``"builtin"`` when ``engine_identity`` starts
            with one of :data:`BUILTIN_ENGINE_PREFIXES`, else ``"odm"``).

    Returns:
        The :class:`~prefect_odm.models.SplitPlan` in ``survey.crs_epsg``; identical (byte for
        byte as JSON) for shuffled input.

    Raises:
        PlanningError: no images, a bad ``split``, ``"auto"`` without node memory, or a submodel
            larger than any node.
    """
    options = options or ProcessingOptions.model_validate({})
    if split_overlap_m < 0:
        raise PlanningError(f"split_overlap_m must be >= 0, got {split_overlap_m}")
    if memory_model is None:
        memory_model = (
            "builtin" if engine_identity.lower().startswith(BUILTIN_ENGINE_PREFIXES) else "odm"
        )
    images = sorted(survey.images, key=lambda im: (im.identity, im.name))
    if not images:
        raise PlanningError(f"{survey.source}: no accepted image to plan")
    lon = np.array([im.longitude for im in images])
    lat = np.array([im.latitude for im in images])
    x, y = project_lonlat(lon, lat, survey.crs_epsg)
    megapixels = float(np.mean([im.width * im.height / 1e6 for im in images]))
    if split == "auto":
        split_n = _auto_split(
            survey, options, node_memory_gib, megapixels, split_overlap_m, memory_model
        )
    else:
        split_n = int(split)
        if split_n < 1:
            raise PlanningError(f"split must be >= 1 image, got {split}")
    min_size = (
        default_min_submodel_images(split_n)
        if min_submodel_images is None
        else int(min_submodel_images)
    )

    heights = [
        im.relative_altitude_m
        for im in images
        if im.relative_altitude_m is not None and im.relative_altitude_m > 0
    ]
    f35 = [im.focal_length_35mm for im in images if im.focal_length_35mm]
    half_fp = half_footprint_m(
        float(np.median(heights)) if heights else None, float(np.median(f35)) if f35 else None
    )
    clip_buffer = max(3.0 * half_fp, 2.0 * split_overlap_m, 50.0)
    pplan = plan_from_positions(
        x,
        y,
        split=split_n,
        split_overlap_m=split_overlap_m,
        min_submodel_images=min_size,
        tie_rank=np.arange(len(images)),
        clip_buffer_m=clip_buffer,
    )
    assert pplan.core_areas is not None
    node_options = options.to_nodeodm()
    submodels: list[Submodel] = []
    ids = [f"submodel-{i:03d}" for i in range(pplan.k)]
    largest_node = max(node_memory_gib) if node_memory_gib else None
    for part, members in enumerate(pplan.members):
        member_images = [images[i] for i in members]
        core_images = [images[i] for i in np.flatnonzero(pplan.labels == part)]
        mp = float(np.mean([im.width * im.height / 1e6 for im in member_images]))
        memory = estimate_peak_memory_gib(len(member_images), mp, node_options, model=memory_model)
        if largest_node is not None and memory > largest_node:
            raise PlanningError(
                f"{ids[part]} needs an estimated {memory:.1f} GiB for {len(member_images)} images, "
                f"more than the largest node ({largest_node:g} GiB); lower split or split_overlap_m"
            )
        coords = np.column_stack([x[members], y[members]])
        footprint = shapely.buffer(shapely.multipoints(coords).convex_hull, half_fp, quad_segs=8)
        area = pplan.core_areas[part]
        submodels.append(
            Submodel(
                id=ids[part],
                image_names=sorted(im.name for im in member_images),
                core_image_names=sorted(im.name for im in core_images),
                overlap_image_count=len(member_images) - len(core_images),
                core_area=_round_geometry(area),
                footprint=_round_geometry(footprint),
                area_m2=round(float(area.area), 2),
                estimated_memory_gib=memory,
                fingerprint=submodel_fingerprint(
                    [im.identity for im in member_images], node_options, engine_identity
                ),
            )
        )
    cameras = [
        CameraPosition(
            name=im.name,
            x_m=round(float(x[i]), COORD_DECIMALS),
            y_m=round(float(y[i]), COORD_DECIMALS),
            z_m=None if im.altitude_m is None else round(float(im.altitude_m), COORD_DECIMALS),
            submodel_id=ids[int(pplan.labels[i])],
        )
        for i, im in enumerate(images)
    ]
    cameras.sort(key=lambda c: c.name)
    plan = SplitPlan(
        survey_fingerprint=survey.fingerprint,
        crs_epsg=survey.crs_epsg,
        split=split_n,
        split_overlap_m=float(split_overlap_m),
        min_submodel_images=min_size,
        options=options,
        engine_identity=engine_identity,
        submodels=submodels,
        cameras=cameras,
        fingerprint="",
    )
    # The plan's identity is its partition of image *contents*: file names (and so renaming the
    # inputs) do not enter it; the submodel fingerprints already cover images and options.
    identity = {im.name: im.identity for im in images}
    content = plan.model_dump(
        mode="json",
        exclude={
            "fingerprint": True,
            "cameras": True,
            "submodels": {"__all__": {"image_names", "core_image_names"}},
        },
    )
    content["cameras"] = sorted(
        (identity[c.name], c.x_m, c.y_m, c.z_m, c.submodel_id) for c in plan.cameras
    )
    content["core_images"] = {
        sm.id: sorted(identity[n] for n in sm.core_image_names) for sm in plan.submodels
    }
    return plan.model_copy(update={"fingerprint": fingerprint(content)})


@dataclass(frozen=True)
class CoverageGap:
    """A hole in the camera coverage: a place farther from every camera than the flight pattern
    explains.

    Attributes:
        x_m, y_m: centre of the hole (largest empty circle found), plan CRS metres.
        radius_m: distance from the centre to the nearest camera, metres.
        area_m2: area of the Delaunay triangles forming the hole, square metres.
    """

    x_m: float
    y_m: float
    radius_m: float
    area_m2: float


def find_coverage_gaps(
    x_m: ArrayLike, y_m: ArrayLike, *, factor: float = 2.0, min_triangles: int = 1
) -> list[CoverageGap]:
    """Holes in a survey's camera coverage, from the Delaunay triangulation of the positions.

    In a regular flight pattern every Delaunay triangle has about the same circumradius (half the
    diagonal of the shot-by-line-spacing rectangle). A triangle whose circumradius exceeds
    ``factor`` times the median, whose circumcentre lies inside the camera hull, and which does not
    touch the hull boundary (concave survey outlines are not holes), marks a gap; touching such
    triangles are merged into one gap.

    Args:
        x_m, y_m: camera positions in a projected CRS, metres, shape ``(n,)``, n >= 3.
        factor: circumradius ratio to the median above which a triangle is part of a gap.
        min_triangles: smallest number of triangles a reported gap must span.

    Returns:
        Gaps sorted by decreasing radius.
    """
    x = np.asarray(x_m, dtype=np.float64)
    y = np.asarray(y_m, dtype=np.float64)
    if len(x) < 4:
        return []
    origin = np.array([x.min(), y.min()])
    pts = np.column_stack([x, y]) - origin
    tri = Delaunay(pts)
    cc = _circumcentres(pts, tri.simplices)
    r = np.hypot(*(cc - pts[tri.simplices[:, 0]]).T)
    median_r = float(np.median(r))
    on_hull = np.zeros(len(pts), dtype=bool)
    on_hull[np.unique(tri.convex_hull)] = True
    touches_hull = on_hull[tri.simplices].all(axis=1) | (tri.neighbors == -1).any(axis=1)
    hull = shapely.convex_hull(shapely.multipoints(pts))
    inside = shapely.contains_xy(hull, cc[:, 0], cc[:, 1])
    big = (r > factor * median_r) & inside & ~touches_hull
    cand = np.flatnonzero(big)
    if len(cand) == 0:
        return []
    # Connected components of big triangles through shared edges.
    parent = {int(t): int(t) for t in cand}

    def find(t: int) -> int:
        while parent[t] != t:
            parent[t] = parent[parent[t]]
            t = parent[t]
        return t

    for t in cand:
        for nb in tri.neighbors[t]:
            if nb >= 0 and big[nb]:
                ra, rb = find(int(t)), find(int(nb))
                if ra != rb:
                    parent[max(ra, rb)] = min(ra, rb)
    groups: dict[int, list[int]] = {}
    for t in cand:
        groups.setdefault(find(int(t)), []).append(int(t))
    a = pts[tri.simplices[:, 0]]
    b = pts[tri.simplices[:, 1]]
    c = pts[tri.simplices[:, 2]]
    tri_area = 0.5 * np.abs(
        (b[:, 0] - a[:, 0]) * (c[:, 1] - a[:, 1]) - (b[:, 1] - a[:, 1]) * (c[:, 0] - a[:, 0])
    )
    gaps: list[CoverageGap] = []
    for members in groups.values():
        if len(members) < min_triangles:
            continue
        best = max(members, key=lambda t: (r[t], -t))
        gaps.append(
            CoverageGap(
                x_m=float(cc[best, 0] + origin[0]),
                y_m=float(cc[best, 1] + origin[1]),
                radius_m=float(r[best]),
                area_m2=float(tri_area[members].sum()),
            )
        )
    gaps.sort(key=lambda g: (-g.radius_m, g.x_m, g.y_m))
    return gaps
