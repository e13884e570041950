"""Seeing a split plan before compute: GeoJSON, a PNG map and tables (adapter: matplotlib Agg).

Everything is in the plan's CRS (``EPSG:<plan.crs_epsg>``, metres). The GeoJSON carries the
legacy ``crs`` member (GeoJSON 2008 named CRS) because RFC 7946 GeoJSON is WGS 84 only; GDAL/QGIS
read it.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

from prefect_odm.models import SplitPlan, Survey

if TYPE_CHECKING:
    from matplotlib.axes import Axes

logger = logging.getLogger(__name__)


def plan_geojson(plan: SplitPlan) -> dict[str, Any]:
    """The plan as a GeoJSON FeatureCollection in the plan CRS.

    Features, in this order: one ``core_area`` and one ``footprint`` polygon per submodel
    (properties ``kind``, ``submodel``, ``images``, ``core_images``, ``overlap_images``,
    ``area_m2``, ``estimated_memory_gib``), then one ``camera`` point per image (properties
    ``kind``, ``name``, ``submodel``, ``z_m``).
    """
    features: list[dict[str, Any]] = []
    for sm in plan.submodels:
        common = {
            "submodel": sm.id,
            "images": len(sm.image_names),
            "core_images": len(sm.core_image_names),
            "overlap_images": sm.overlap_image_count,
            "area_m2": sm.area_m2,
            "estimated_memory_gib": sm.estimated_memory_gib,
        }
        features.append(
            {
                "type": "Feature",
                "geometry": sm.core_area,
                "properties": {"kind": "core_area", **common},
            }
        )
        features.append(
            {
                "type": "Feature",
                "geometry": sm.footprint,
                "properties": {"kind": "footprint", **common},
            }
        )
    for cam in plan.cameras:
        features.append(
            {
                "type": "Feature",
                "geometry": {"type": "Point", "coordinates": [cam.x_m, cam.y_m]},
                "properties": {
                    "kind": "camera",
                    "name": cam.name,
                    "submodel": cam.submodel_id,
                    "z_m": cam.z_m,
                },
            }
        )
    return {
        "type": "FeatureCollection",
        "crs": {"type": "name", "properties": {"name": f"urn:ogc:def:crs:EPSG::{plan.crs_epsg}"}},
        "features": features,
    }


def write_plan_files(
    folder: str, plan: SplitPlan, survey: Survey, *, pictures: bool = True
) -> None:
    """Write a plan folder (:data:`prefect_odm.layout.PLAN_FILES`) under ``folder``, a path or an
    fsspec URL: ``survey.json``, then ``plan.geojson`` and ``plan.png`` (unless ``pictures`` is
    False: this very plan's are stored already), ``plan.json`` last, since ``process_submodel``
    runs read it and ``survey.json`` beside it. Each file is written atomically. The one writer
    of these files (``prefect-odm plan`` and the flow's ``publish_plan``).

    Raises:
        StorageError: a file cannot be written.
    """
    import tempfile

    from prefect_odm import storage
    from prefect_odm.layout import PLAN_FILES, plan_file

    storage.write_json_atomic(plan_file(folder, "survey"), survey.model_dump(mode="json"))
    if pictures:
        storage.write_json_atomic(plan_file(folder, "geojson"), plan_geojson(plan))
        with tempfile.TemporaryDirectory() as tmp:
            png = Path(tmp) / PLAN_FILES["png"]
            plan_png(plan, png)
            storage.put_file(png, plan_file(folder, "png"))
    storage.write_json_atomic(plan_file(folder, "plan"), plan.model_dump(mode="json"))


def plan_rows(plan: SplitPlan) -> list[dict[str, Any]]:
    """One row per submodel: ``submodel``, ``images``, ``overlap_images``, ``area_m2``,
    ``estimated_memory_gib`` (for tables and Prefect table artifacts)."""
    return [
        {
            "submodel": sm.id,
            "images": len(sm.image_names),
            "overlap_images": sm.overlap_image_count,
            "area_m2": sm.area_m2,
            "estimated_memory_gib": sm.estimated_memory_gib,
        }
        for sm in plan.submodels
    ]


def _polygons(geometry: dict[str, Any]) -> list[list[list[list[float]]]]:
    if not geometry or not geometry.get("coordinates"):
        return []
    if geometry["type"] == "Polygon":
        return [geometry["coordinates"]]
    if geometry["type"] == "MultiPolygon":
        return list(geometry["coordinates"])
    return []


#: Submodel colours of :func:`plan_png` (Tableau 10); neighbours never share one
#: (:func:`submodel_colours`).
_PALETTE = (
    "#4e79a7",
    "#f28e2b",
    "#e15759",
    "#76b7b2",
    "#59a14f",
    "#edc948",
    "#b07aa1",
    "#ff9da7",
    "#9c755f",
    "#bab0ac",
)
#: Most submodels whose ids :func:`plan_png` writes on the map.
_MAX_LABELLED_SUBMODELS = 60


def submodel_colours(plan: SplitPlan) -> dict[str, str]:
    """A colour of :data:`_PALETTE` per submodel id, different for submodels whose core areas
    touch (greedy colouring in plan order, most-connected first: deterministic).

    Greedy colouring runs out of the ten colours only where a submodel touches ten or more
    others; there the colour least used among its neighbours repeats.
    """
    import shapely
    from shapely.geometry import shape

    cores = [shape(sm.core_area) for sm in plan.submodels]
    tree = shapely.STRtree(cores)
    neighbours: list[set[int]] = [set() for _ in cores]
    for i, core in enumerate(cores):
        for j in tree.query(core.buffer(1e-6), predicate="intersects"):
            if int(j) != i:
                neighbours[i].add(int(j))
    order = sorted(range(len(cores)), key=lambda i: (-len(neighbours[i]), i))
    chosen: dict[int, int] = {}
    for i in order:
        used = [chosen[j] for j in neighbours[i] if j in chosen]
        free = [k for k in range(len(_PALETTE)) if k not in used]
        chosen[i] = free[0] if free else min(range(len(_PALETTE)), key=used.count)
    return {sm.id: _PALETTE[chosen[i]] for i, sm in enumerate(plan.submodels)}


def drawn_core_areas(plan: SplitPlan) -> dict[str, dict[str, Any]]:
    """Each submodel's core area as the map draws it (GeoJSON, plan CRS): clipped to the
    survey's image footprint, the cameras' hull buffered by half an image's footprint (what
    ``area_m2`` counts; the convex hull of the submodels' footprints). The plan's core areas
    reach out to the ownership clip, up to ~150 m beyond the cameras, so that ownership covers
    every pixel a node may return; drawn so, they showed ground no image sees."""
    import shapely
    from shapely.geometry import mapping, shape

    feet = [shape(sm.footprint) for sm in plan.submodels if sm.footprint]
    if not feet:
        return {sm.id: sm.core_area for sm in plan.submodels}
    survey = shapely.union_all(feet).convex_hull
    out: dict[str, dict[str, Any]] = {}
    for sm in plan.submodels:
        if not sm.core_area:
            out[sm.id] = sm.core_area
            continue
        parts = shapely.get_parts(shapely.intersection(shape(sm.core_area), survey))
        polygons = [g for g in parts if g.geom_type in ("Polygon", "MultiPolygon") and g.area > 0]
        out[sm.id] = mapping(shapely.union_all(polygons)) if polygons else {}
    return out


def _draw_areas(ax: Axes, plan: SplitPlan, colour: dict[str, str]) -> None:
    """Core areas filled, footprints dashed, in each submodel's colour: two collections, not
    a patch per polygon (1,000 patches of a 500-submodel plan were most of its plan files'
    time; issue 33)."""
    from matplotlib.collections import PolyCollection
    from matplotlib.colors import to_rgba

    drawn = drawn_core_areas(plan)
    cores = [(poly[0], colour[sm.id]) for sm in plan.submodels for poly in _polygons(drawn[sm.id])]
    feet = [(poly[0], colour[sm.id]) for sm in plan.submodels for poly in _polygons(sm.footprint)]
    if cores:
        ax.add_collection(
            PolyCollection(
                [ring for ring, _ in cores],
                closed=True,
                facecolors=[to_rgba(c, 0.25) for _, c in cores],
                edgecolors=[to_rgba(c, 0.25) for _, c in cores],
                linewidths=0.8,
            )
        )
    if feet:
        ax.add_collection(
            PolyCollection(
                [ring for ring, _ in feet],
                closed=True,
                facecolors="none",
                edgecolors=[c for _, c in feet],
                linewidths=0.8,
                linestyles="--",
            )
        )


def _draw_cameras(ax: Axes, plan: SplitPlan, colour: dict[str, str]) -> None:
    """Cameras as dots in their submodel's colour; submodel ids at their cameras' centroid."""
    import numpy as np
    from matplotlib.colors import to_rgba

    xs = np.array([c.x_m for c in plan.cameras], dtype=float)
    ys = np.array([c.y_m for c in plan.cameras], dtype=float)
    ids = list(colour)
    index = {sm_id: i for i, sm_id in enumerate(ids)}
    palette = np.array([to_rgba(colour[sm_id]) for sm_id in ids]).reshape(-1, 4)
    ax.scatter(
        xs,
        ys,
        s=4 if len(xs) < 5000 else 0.5,
        # one colour parse per submodel; arrays, not lists (matplotlib made 50,000 tuples a
        # masked array in 1.3 CPU-s; issue 33)
        c=palette[np.array([index[c.submodel_id] for c in plan.cameras], dtype=np.intp)],
        zorder=3,
    )
    if len(plan.submodels) > _MAX_LABELLED_SUBMODELS:
        return
    for sm in plan.submodels:
        own = [c for c in plan.cameras if c.submodel_id == sm.id]
        if own:
            cx = sum(c.x_m for c in own) / len(own)
            cy = sum(c.y_m for c in own) / len(own)
            ax.annotate(
                sm.id.removeprefix("submodel-"),
                (cx, cy),
                ha="center",
                va="center",
                fontsize=8,
                weight="bold",
                zorder=4,
            )


def plan_png(plan: SplitPlan, path: Path) -> None:
    """Draw the plan as a PNG map: core areas filled per submodel (neighbours in different
    colours), footprints dashed, cameras as dots, submodel ids at the core centroids, a legend.
    Axes in metres of ``EPSG:<crs_epsg>``.

    Uses matplotlib's Agg backend through the object API (no global pyplot state).
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    fig = Figure(figsize=(8, 8), dpi=110)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    colour = submodel_colours(plan)
    _draw_areas(ax, plan, colour)
    _draw_cameras(ax, plan, colour)
    fig.legend(
        handles=[
            Patch(facecolor="grey", alpha=0.25, edgecolor="grey", label="core area (owned)"),
            Line2D([], [], color="grey", lw=0.8, ls="--", label="processed: core + overlap"),
            Line2D([], [], color="grey", marker="o", ls="", markersize=3, label="camera"),
        ],
        loc="lower center",
        ncol=3,
        fontsize=8,
        frameon=False,
    )
    ax.set_aspect("equal")
    ax.autoscale_view()
    ax.set_xlabel(f"x (m, EPSG:{plan.crs_epsg})")
    ax.set_ylabel(f"y (m, EPSG:{plan.crs_epsg})")
    ax.set_title(
        f"{len(plan.submodels)} submodels, split {plan.split}, overlap {plan.split_overlap_m:g} m"
    )
    ax.ticklabel_format(useOffset=False, style="plain")
    fig.tight_layout(rect=(0.0, 0.04, 1.0, 1.0))  # room for the legend below
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png")


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|")


def _neighbour_lines(plan: SplitPlan) -> list[str]:
    """The plan's pairs of neighbours: what the alignment will tie each seam with (issue 30)."""
    if not plan.neighbours:
        return []
    lines = ["", "## Neighbours (what the alignment ties each seam with)", ""]
    if plan.split_overlap_asked_m is not None:
        lines += [
            f"The split overlap was widened from {plan.split_overlap_asked_m:g} m to "
            f"{plan.split_overlap_m:g} m so that the alignment can tie every pair.",
            "",
        ]
    lines += [
        "| submodels | shared images | footprint overlap (m²) | tied by |",
        "|---|---:|---:|---|",
    ]
    lines += [
        f"| {p.first} / {p.second} | {p.shared_images} | {p.footprint_overlap_m2:,.0f} | "
        f"{p.tied_by} |"
        for p in plan.neighbours
    ]
    return lines


def plan_markdown(plan: SplitPlan, survey: Survey) -> str:
    """A markdown report of the plan: submodel table, the pairs of neighbours with what the
    alignment will tie them with, cameras, rejected images with reasons, coverage gaps."""
    lines = [
        f"# Split plan `{plan.fingerprint[:12]}`",
        "",
        f"- survey `{survey.fingerprint[:12]}` from `{_md_escape(survey.source)}`: "
        f"{len(survey.images)} images accepted, {len(survey.rejected)} rejected",
        f"- CRS EPSG:{plan.crs_epsg}; split {plan.split} images; "
        f"overlap {plan.split_overlap_m:g} m; "
        f"minimum submodel {plan.min_submodel_images} images",
        "",
        "| submodel | images | overlap images | area (m²) | estimated memory (GiB) |",
        "|---|---:|---:|---:|---:|",
    ]
    for row in plan_rows(plan):
        lines.append(
            f"| {row['submodel']} | {row['images']} | {row['overlap_images']} | "
            f"{row['area_m2']:,.0f} | {row['estimated_memory_gib']:.2f} |"
        )
    lines += _neighbour_lines(plan)
    lines += ["", "## Cameras", ""]
    if survey.cameras:
        lines += ["| camera | images |", "|---|---:|"]
        lines += [
            f"| {_md_escape(name)} | {count} |" for name, count in sorted(survey.cameras.items())
        ]
        if len(survey.cameras) > 1:
            lines += ["", f"Mixed cameras: {len(survey.cameras)} models in one survey."]
    lines += ["", "## Rejected images", ""]
    if survey.rejected:
        lines += ["| image | reason | detail |", "|---|---|---|"]
        lines += [
            f"| {_md_escape(r.name)} | {r.reason} | {_md_escape(r.detail)} |"
            for r in survey.rejected
        ]
    else:
        lines.append("None.")
    gaps = survey_gaps(plan, survey)
    lines += ["", "## Coverage gaps", ""]
    if gaps["sequence_gaps"] or gaps["coverage_gaps"]:
        lines += [
            f"- {g['missing']} missing shot(s) between `{g['before']}` and `{g['after']}` "
            f"({g['length_m']:.0f} m) at ({g['x_m']:.0f}, {g['y_m']:.0f})"
            for g in gaps["sequence_gaps"]
        ]
        lines += [
            f"- hole of radius {g['radius_m']:.0f} m ({g['area_m2']:,.0f} m²) at ({g['x_m']:.0f}, {g['y_m']:.0f})"
            for g in gaps["coverage_gaps"]
        ]
    else:
        lines.append("None found.")
    if gaps["flight_tail_images"]:
        lines += [
            "",
            f"Take-off/landing tails (shots flying to or from the survey lines): "
            f"{len(gaps['flight_tail_images'])} images, kept in the plan.",
        ]
    return "\n".join(lines + gps_markdown(plan)) + "\n"


GPS_WARNING_TITLES = {
    "altitude_trend": "altitude trend",
    "altitude_jump": "altitude jumps",
    "implausible_speed": "implausible speed",
    "position_jump": "position jumps",
}


def gps_markdown(plan: SplitPlan) -> list[str]:
    """The plan report's "GPS before compute" section: one row per GPS warning, or "None found.",
    then what the reconstruction does about the altitudes and the cameras' calibration."""
    lines = ["", "## GPS before compute", ""]
    if not plan.gps_warnings:
        lines.append("None found (altitude trend and jumps, speeds, jumping positions checked).")
    else:
        lines += ["| check | value | threshold | detail |", "|---|---:|---:|---|"]
        lines += [
            f"| {GPS_WARNING_TITLES[w.kind]} | {w.value:.2f} | {w.threshold:g} | "
            f"{_md_escape(w.message)} |"
            for w in plan.gps_warnings
        ]
    if plan.altitude_correction is not None:
        lines += ["", f"{plan.altitude_correction.message}."]
    if "cameras" in plan.options.extra and plan.options.extra["cameras"] not in ("", "{}"):
        lines += ["", "Every submodel holds one camera calibration (the `cameras` option)."]
    return lines


class ShotGap(TypedDict):
    """Missing shots between two images (:class:`prefect_odm.survey.flight_checks.SequenceGap`
    with the images named); the gap's midpoint in the plan CRS and its length, metres."""

    before: str
    after: str
    missing: int
    x_m: float
    y_m: float
    length_m: float


class CoverageHole(TypedDict):
    """A hole in the camera coverage (:class:`prefect_odm.plan.coverage_gaps.CoverageGap`):
    centre in the plan CRS and radius, metres; area, square metres."""

    x_m: float
    y_m: float
    radius_m: float
    area_m2: float


class SurveyGaps(TypedDict):
    """What :func:`survey_gaps` finds."""

    sequence_gaps: list[ShotGap]
    coverage_gaps: list[CoverageHole]
    flight_tail_images: list[str]
    """Names of the take-off and landing shots (kept in the plan)."""


def survey_gaps(plan: SplitPlan, survey: Survey) -> SurveyGaps:
    """Missing shots, holes in camera coverage and take-off/landing tails of a survey.

    Returns:
        The gaps (see :class:`SurveyGaps`); positions in the plan CRS, metres (see :func:`prefect_odm.survey.flight_checks.find_sequence_gaps`,
        :func:`prefect_odm.plan.coverage_gaps.find_coverage_gaps`, :func:`prefect_odm.survey.flight_checks.flight_tail_mask`).
    """
    import numpy as np

    from prefect_odm.plan.coverage_gaps import find_coverage_gaps
    from prefect_odm.survey.flight_checks import find_sequence_gaps, flight_tail_mask

    position = {c.name: (c.x_m, c.y_m) for c in plan.cameras}
    images = [im for im in survey.images if im.name in position]
    out: SurveyGaps = {"sequence_gaps": [], "coverage_gaps": [], "flight_tail_images": []}
    if len(images) < 4:
        return out
    x = np.array([position[im.name][0] for im in images])
    y = np.array([position[im.name][1] for im in images])
    times = [im.capture_time for im in images]
    names = [im.name for im in images]
    for g in find_sequence_gaps(times, x, y):
        out["sequence_gaps"].append(
            {
                "before": names[g.before],
                "after": names[g.after],
                "missing": g.missing,
                "x_m": g.x_m,
                "y_m": g.y_m,
                "length_m": g.length_m,
            }
        )
    for c in find_coverage_gaps(x, y):
        out["coverage_gaps"].append(
            {"x_m": c.x_m, "y_m": c.y_m, "radius_m": c.radius_m, "area_m2": c.area_m2}
        )
    tails = flight_tail_mask(times, x, y)
    out["flight_tail_images"] = [n for n, t in zip(names, tails, strict=True) if t]
    return out
