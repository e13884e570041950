"""Which alignment stages a merge applies: none that is beyond plausible, leans more than a raster
correction carries, or worsens a seam measured on the products (pure core).

Each stage's correction is judged before it is applied:

* **plausible** (:func:`refusals`): a rotation above ``plausible_rotation_deg``, a shift of a
  submodel's centre above ``plausible_shift_m`` or a scale change above
  ``plausible_scale_change`` is no misregistration of a GPS-tagged block but a failed
  reconstruction or solve; it is refused, and ``accept_alignment`` does not apply it either;
* **carried by the rasters**: a raster takes a similarity's horizontal part at the submodel's
  ground height (:meth:`~prefect_odm.align.Similarity.raster_correction`); a cell ``h`` metres
  above or below it lands ``|lean| * h`` away from where the point cloud's full similarity puts
  it (``lean`` the third column of ``s R``'s first two rows: ``sin(tilt)``). Applying the full
  effect needs each orthophoto pixel's height and an inverse map that folds at every height
  edge, so a correction whose lean reaches more than ``max_raster_lean_m`` at the DSM's 2nd or
  98th height percentile is refused for every product (:func:`lean_refusals`): 0.25 m is
  1.4 deg over 10 m of relief, 0.7 deg over 20 m;
* **confirmed** (:func:`worsened`): with ``check_stages``, a stage whose products show, in any
  overlap, a seam (the orthophoto median displacement and the DSM p90 ``|dz|`` as one
  distance, :func:`seam_m`) more than ``seam_tolerance_m`` above the applied stage before it
  (the products as they are, first) is not applied, with the reason recorded;
* **relative** (:func:`block_height_refusals`): a correction from the products alone that moves
  a connected block's mean height at its submodels' own centres beyond
  ``max_block_height_change_m`` is refused (overlaps do not measure absolute height).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from prefect_odm.align.observability import block_height_changes
from prefect_odm.align.options import AlignmentOptions
from prefect_odm.align.report import AlignmentResult, GateFailure, check_alignment
from prefect_odm.align.stage_records import OverlapSeam, StageCheck, StageName


def _refusal(subject: str, figure: str, value: float, limit: float, text: str) -> GateFailure:
    return GateFailure(
        subject=subject,
        figure=figure,
        value=value,
        threshold=limit,
        message=f"{subject}: {text} {value:.3g} > {figure}={limit:g}: refused, not applied "
        "(even with accept_alignment)",
    )


def refusals(result: AlignmentResult, options: AlignmentOptions) -> list[GateFailure]:
    """Every correction of ``result`` beyond plausible, one :class:`GateFailure` per figure."""
    out = []
    o = options
    for t in result.transforms:
        sid, shift = t.submodel_id, float(np.linalg.norm(t.translation_m))
        if t.rotation_deg > o.plausible_rotation_deg:
            text = "rotation deg beyond plausible"
            out.append(_refusal(sid, "plausible_rotation_deg", t.rotation_deg,
                                o.plausible_rotation_deg, text))  # fmt: skip
        if shift > o.plausible_shift_m:
            text = "shift of its centre m beyond plausible"
            out.append(_refusal(sid, "plausible_shift_m", shift, o.plausible_shift_m, text))
        if abs(t.scale_change) > o.plausible_scale_change:
            text = "scale change beyond plausible"
            out.append(_refusal(sid, "plausible_scale_change", abs(t.scale_change),
                                o.plausible_scale_change, text))  # fmt: skip
    return out + block_height_refusals(result, options)


def block_height_refusals(result: AlignmentResult, options: AlignmentOptions) -> list[GateFailure]:
    """A correction solved from the products alone (``method='dem'``) that moves a connected
    block's sample-weighted mean height at its submodels' own centres beyond
    ``max_block_height_change_m``: overlaps tell relative heights only, so that move is no
    measurement (the camera step, held on the GPS, is not judged here)."""
    if result.method != "dem" or len(result.transforms) < 2:
        return []
    heights = {t.submodel_id: t.translation_m[2] for t in result.transforms}
    weights = {t.submodel_id: float(t.n_samples) for t in result.transforms}
    pairs = [(o.first, o.second) for o in result.overlaps if o.n_shared > 0]
    out = []
    for members, mean_m in block_height_changes(heights, weights, pairs):
        if len(members) > 1 and abs(mean_m) > options.max_block_height_change_m:
            subject = "block " + "+".join(members)
            text = "mean height change m at the submodels' own centres (no overlap measures it)"
            out.append(_refusal(subject, "max_block_height_change_m", abs(mean_m),
                                options.max_block_height_change_m, text))  # fmt: skip
    return out


def lean_refusals(
    result: AlignmentResult, relief_m: Mapping[str, float], options: AlignmentOptions
) -> list[GateFailure]:
    """Every similarity of ``result`` whose lean reaches beyond ``max_raster_lean_m`` over its
    submodel's relief (``relief_m``: submodel id -> metres; submodels without a DSM are not
    judged)."""
    out = []
    for t in result.transforms:
        if t.kind != "similarity" or t.submodel_id not in relief_m:
            continue
        s, r, _ = t.similarity().origin_form()
        lean = float(np.hypot(s * r[0, 2], s * r[1, 2]))
        error = lean * relief_m[t.submodel_id]
        if error > options.max_raster_lean_m:
            text = (
                f"tilt {t.tilt_deg:.2f} deg over {relief_m[t.submodel_id]:.1f} m of relief leaves "
                "a raster error m"
            )
            out.append(_refusal(t.submodel_id, "max_raster_lean_m", error,
                                options.max_raster_lean_m, text))  # fmt: skip
    return out


CORRECTION_GATES = ("max_correction_m", "max_rotation_deg", "max_scale_change")
"""The gates on a stage's own transforms (the others judge overlaps and the camera GPS)."""


def correction_failures(
    results: Sequence[AlignmentResult], options: AlignmentOptions
) -> list[GateFailure]:
    """Every gate of :data:`CORRECTION_GATES` the transforms of ``results`` (the stages a
    candidate applies) fail: of two candidates with seams alike, the one a gate would refuse
    is not the one to apply."""
    return [f for r in results for f in check_alignment(r, options) if f.figure in CORRECTION_GATES]


def seam_m(seam: OverlapSeam) -> float | None:
    """An overlap's seam as one distance, metres: ``hypot`` of its orthophoto median
    displacement and its DSM p90 ``|dz|`` (those measured; None when neither is)."""
    parts = [f.median_m for f in (seam.orthophoto,) if f is not None]
    parts += [f.p90_m for f in (seam.dsm,) if f is not None]
    return float(np.hypot.reduce(parts)) if parts else None


def _parts(seam: OverlapSeam) -> str:
    o, d = seam.orthophoto, seam.dsm
    ortho = f"orthophoto {o.median_m:.3f} m" if o is not None else "orthophoto -"
    return f"{ortho}, DSM p90 {d.p90_m:.3f} m" if d is not None else f"{ortho}, DSM -"


def worsened(
    before: Sequence[OverlapSeam], after: Sequence[OverlapSeam], tolerance_m: float
) -> list[str]:
    """Why ``after`` is worse than ``before`` (empty: no overlap is worse).

    An overlap is worse when its seam (:func:`seam_m`: the orthophoto median displacement and
    the DSM p90 ``|dz|`` as one distance) grows by more than ``tolerance_m``, or when it can no
    longer be measured (the products moved apart). Overlaps new in ``after`` are not judged.
    """
    now = {s.overlap: s for s in after}
    out = []
    for old in before:
        was = seam_m(old)
        new = now.get(old.overlap)
        is_ = seam_m(new) if new is not None else None
        if was is None:
            continue
        if new is None or is_ is None:
            out.append(f"{old.overlap}: seam {was:.3f} m before, not measurable after")
        elif is_ > was + tolerance_m:
            out.append(
                f"{old.overlap}: seam {is_:.3f} m ({_parts(new)}) against {was:.3f} m "
                f"({_parts(old)}) before (seam_tolerance_m={tolerance_m:g})"
            )
    return out


def judge_stage(
    name: StageName,
    result: AlignmentResult,
    seams: Sequence[OverlapSeam],
    before: Sequence[OverlapSeam],
    refused: Sequence[GateFailure],
    options: AlignmentOptions,
) -> StageCheck:
    """The check of one stage: refused (``refused`` non-empty: :func:`refusals` and
    :func:`lean_refusals`), else not applied when it worsens a seam of ``before`` (the
    applied stage before it; with ``check_stages``), else applied."""
    solver = {o.overlap: o.rms_after_m for o in result.overlaps}
    if refused:
        reasons = [f.message for f in refused]
        return StageCheck(stage=name, applied=False, seams=list(seams), solver_rms_m=solver,
                          reasons=reasons, refused=True)  # fmt: skip
    reasons = worsened(before, seams, options.seam_tolerance_m) if options.check_stages else []
    return StageCheck(stage=name, applied=not reasons, seams=list(seams), solver_rms_m=solver,
                      reasons=reasons)  # fmt: skip
