"""The alignment between submodels in ``report.md``: tables and a plan-map picture (adapter:
matplotlib).

:func:`alignment_lines` gives the markdown section (gates, per-submodel transforms, per-overlap
residuals, camera-vs-GPS residuals); :func:`alignment_png` draws each submodel's correction as
an arrow at its centre on the plan map (horizontal part, exaggerated by a printed factor; colour:
height change) and each overlap as a segment coloured by its residual after alignment.
"""

from __future__ import annotations

import io

import numpy as np

from prefect_odm.align.observability import block_height_changes
from prefect_odm.align.report import AlignmentReport, AlignmentResult
from prefect_odm.align.stage_records import OverlapSeam, StageCheck
from prefect_odm.merge.reports import DemMergeReport

ALIGNMENT_PNG = "alignment.png"
"""File name of the picture, beside ``report.md``."""


def _result_lines(title: str, result: AlignmentResult) -> list[str]:
    lines = [
        "",
        f"### {title} ({result.method}, gauge {result.gauge}, {result.solve_seconds:.2f} s)",
        "",
        "| submodel | move max (m) | shift x, y, z (m) | rotation (deg) | tilt (deg) | scale - 1 |"
        " bowl at 100 m (m) | samples |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for t in result.transforms:
        dx, dy, dz = t.translation_m
        bowl = f"{t.height_bowl[0] * 1e4:+.3f}" if t.height_bowl is not None else "-"
        lines.append(
            f"| {t.submodel_id} | {t.max_correction_m:.3f} | {dx:+.3f}, {dy:+.3f}, {dz:+.3f} | "
            f"{t.rotation_deg:.3f} | {t.tilt_deg:.3f} | {t.scale_change:+.5f} | {bowl} | "
            f"{t.n_samples} |"
        )
    lines += [
        "",
        "| overlap | shared | used | rms before (m) | rms after (m) | max after (m) |",
        "|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {o.first} / {o.second} | {o.n_shared} | {o.n_used} | {o.rms_before_m:.3f} | "
        f"{o.rms_after_m:.3f} | {o.max_after_m:.3f} |"
        for o in result.overlaps
    ]
    if result.method == "dem":
        heights = {t.submodel_id: t.translation_m[2] for t in result.transforms}
        weights = {t.submodel_id: float(t.n_samples) for t in result.transforms}
        pairs = [(o.first, o.second) for o in result.overlaps if o.n_shared > 0]
        lines += [""] + [
            f"Block {', '.join(ids)}: mean height change at the submodels' own centres "
            f"{mean_m:+.3f} m (overlaps measure relative heights only; the gauge holds it at 0)."
            for ids, mean_m in block_height_changes(heights, weights, pairs)
            if len(ids) > 1
        ]
    if result.unsolved:
        lines += ["", "Not solved (the samples do not observe it):"]
        lines += [f"* {line}" for line in result.unsolved]
    if result.camera_gps:
        lines += [
            "",
            "| submodel | cameras | vs GPS rms before (m) | after (m) | horizontal (m) |"
            " vertical (m) |",
            "|---|---|---|---|---|---|",
        ]
        lines += [
            f"| {g.submodel_id} | {g.n_cameras} | {g.rms_before_m:.3f} | {g.rms_after_m:.3f} | "
            f"{g.horizontal_rms_after_m:.3f} | {g.vertical_rms_after_m:.3f} |"
            for g in result.camera_gps
        ]
    return lines


def _seam_row(label: str, seam: OverlapSeam, solver_m: float | None) -> str:
    o, d = seam.orthophoto, seam.dsm
    ortho = (
        f"{o.shift_m[0]:+.3f}, {o.shift_m[1]:+.3f} | {o.median_m:.3f} | {o.matches}"
        if o is not None
        else "- | - | -"
    )
    dsm = f"{d.median_m:+.3f} | {d.p90_m:.3f} | {d.samples}" if d is not None else "- | - | -"
    solver = f"{solver_m:.3f}" if solver_m is not None else "-"
    return f"| {label} | {seam.first} / {seam.second} | {solver} | {ortho} | {dsm} |"


def stage_lines(report: AlignmentReport, dsm: DemMergeReport | None = None) -> list[str]:
    """The seams measured on the corrected products, per stage, beside the solver's rms; and,
    with ``dsm``, the DSM merge's own figures for the stage it applied (the same numbers)."""
    if not report.stages:
        return []
    lines = [
        "",
        "### Seams measured on the corrected products",
        "",
        "Orthophotos by feature matches (median displacement east, north and median length), "
        "DSMs on the cells both measured (median of second minus first, p90 of |dz|).",
        "",
        "| stage | overlap | solver rms (m) | orthophoto shift (m) | orthophoto median (m) | "
        "matches | DSM median (m) | DSM p90 (m) | DSM samples |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for st in report.stages:
        lines += [_seam_row(stage_label(st), s, st.solver_rms_m.get(s.overlap)) for s in st.seams]
    if dsm is not None and dsm.overlap_seams:
        for key, d in sorted(dsm.overlap_seams.items()):
            first, second = key.split("|")
            seam = OverlapSeam(overlap=key, first=first, second=second, dsm=d)
            lines.append(_seam_row("merged DSM (merge.json)", seam, None))
    final = report.final_stage()
    applied = [stage_label(s) for s in report.stages if s.applied and s.stage != "none"]
    lines += ["", f"Applied: **{', '.join(applied) or 'none'}**; the merged products are "
              f"those of stage {stage_label(final) if final else 'none'}."]  # fmt: skip
    for st in report.stages:
        lines += [f"- {stage_label(st)}: {note}" for note in st.notes]
        lines += [f"- {stage_label(st)}: {why}" for why in st.reasons]
    return lines


def stage_label(stage: StageCheck) -> str:
    """A stage's name in ``report.md``: ``refined on cameras``, ``cameras (NOT APPLIED)``."""
    name = f"{stage.stage} on {stage.solved_on}" if stage.solved_on else stage.stage
    return name if stage.applied or stage.stage == "none" else f"{name} (NOT APPLIED)"


def alignment_lines(report: AlignmentReport | None, dsm: DemMergeReport | None = None) -> list[str]:
    """The ``## Alignment between submodels`` section of ``report.md`` (empty without one);
    ``dsm``: the DSM merge's report, whose overlap figures are shown beside the stages'."""
    if report is None:
        return []
    lines = ["", "## Alignment between submodels", ""]
    if report.failures:
        lines.append(
            f"**{len(report.failures)} quality gate(s) failed and were ACCEPTED by the operator "
            "(`accept_alignment`):**"
        )
        lines += [f"- {f.message}" for f in report.failures]
    else:
        lines.append("Every quality gate passed.")
    lines += _result_lines("From the cameras" if report.result.method == "cameras"
                           else "From the products", report.result)  # fmt: skip
    if report.refinement is not None:
        lines += _result_lines("Refined from the aligned DSMs and orthophotos", report.refinement)
    lines += stage_lines(report, dsm)
    lines += ["", f"![alignment]({ALIGNMENT_PNG})", ""]
    return lines


def alignment_png(report: AlignmentReport) -> bytes:
    """The plan-map picture of the corrections and overlap residuals, PNG bytes.

    Drawn through matplotlib's object API on an Agg canvas: no global pyplot state, so a
    notebook's own backend is left as it is.
    """
    from matplotlib import colormaps
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    ids = [t.submodel_id for t in report.result.transforms]
    absolute = {t.submodel_id: np.asarray(t.centre_m[:2]) for t in report.result.transforms}
    origin = np.floor(np.min(np.stack(list(absolute.values())), axis=0) / 100.0) * 100.0
    centres = {sid: c - origin for sid, c in absolute.items()}
    moves = {sid: _move(report, sid, absolute[sid]) for sid in ids}
    span = max(float(np.ptp(np.stack(list(centres.values())), axis=0).max()), 1.0)
    biggest = max((float(np.hypot(*m[:2])) for m in moves.values()), default=0.0)
    factor = 0.15 * span / biggest if biggest > 0 else 1.0
    fig = Figure(figsize=(7, 6), dpi=110)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    seams = _overlap_figures(report)
    worst = max(seams.values(), default=1.0) or 1.0
    cmap = colormaps["viridis"]
    for (first, second), value in seams.items():
        (x1, y1), (x2, y2) = centres[first], centres[second]
        ax.plot([x1, x2], [y1, y2], color=cmap(value / worst), lw=3, zorder=1)
        ax.annotate(f"{value:.2f} m", ((x1 + x2) / 2, (y1 + y2) / 2), fontsize=7)
    heights = np.array([moves[sid][2] for sid in ids])
    arrows = ax.quiver(
        [centres[s][0] for s in ids], [centres[s][1] for s in ids],
        [moves[s][0] * factor for s in ids], [moves[s][1] * factor for s in ids], heights,
        angles="xy", scale_units="xy", scale=1, cmap="coolwarm", zorder=2,
    )  # fmt: skip
    fig.colorbar(arrows, ax=ax, label="height change at centre (m)")
    for sid in ids:
        ax.annotate(
            sid, tuple(centres[sid]), fontsize=7, xytext=(3, -9), textcoords="offset points"
        )
    ax.set_title(
        f"correction at each submodel centre (arrows x{factor:.0f})\noverlap "
        f"{_FIGURE_NAME[bool(report.stages)]} (m), worst {worst:.2f}",
        fontsize=9,
    )
    ax.set_aspect("equal")
    ax.margins(0.15)
    ax.set_xlabel(f"easting - {origin[0]:.0f} (m)")
    ax.set_ylabel(f"northing - {origin[1]:.0f} (m)")
    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight")
    return buf.getvalue()


_FIGURE_NAME = {True: "seam on the products", False: "rms after"}
"""What the overlap figures are: the applied stage's seams (orthophoto median displacement or
DSM p90, the larger), else the solver's rms."""


def _overlap_figures(report: AlignmentReport) -> dict[tuple[str, str], float]:
    """``(first, second)`` -> the figure drawn for each overlap, metres: the applied stage's
    seam measured on the products (the larger of its orthophoto median displacement and DSM
    p90 ``|dz|``), else the last stage's solver rms."""
    final = report.final_stage()
    if final is not None:
        out = {}
        for s in final.seams:
            figures = [f.median_m for f in (s.orthophoto,) if f is not None]
            figures += [f.p90_m for f in (s.dsm,) if f is not None]
            out[(s.first, s.second)] = max(figures, default=0.0)
        return out
    residuals = report.refinement or report.result
    return {(o.first, o.second): o.rms_after_m for o in residuals.overlaps}


def _move(report: AlignmentReport, sid: str, centre: np.ndarray) -> np.ndarray:
    """The correction of the submodel's centre at its ground height, ``(dx, dy, dz)`` metres."""
    x = np.array([[centre[0], centre[1], report.reference_height_m(sid)]])
    moved: np.ndarray = (report.apply_points(sid, x) - x)[0]
    return moved
