"""Holes in a survey's camera coverage, from the Delaunay triangulation (pure core).

Shown with a plan (:func:`prefect_odm.plan.picture.survey_gaps`) so that missing strips of a flight are
seen before compute.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import shapely
from numpy.typing import ArrayLike
from scipy.spatial import Delaunay

from prefect_odm.plan.core_areas import circumcentres, multipoint


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
    cc = circumcentres(pts, tri.simplices)
    r = np.hypot(*(cc - pts[tri.simplices[:, 0]]).T)
    median_r = float(np.median(r))
    on_hull = np.zeros(len(pts), dtype=bool)
    on_hull[np.unique(tri.convex_hull)] = True
    touches_hull = on_hull[tri.simplices].all(axis=1) | (tri.neighbors == -1).any(axis=1)
    hull = shapely.convex_hull(multipoint(pts))
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
