"""The stages of one alignment, measured on the products they correct and judged in order (glue:
:mod:`prefect_odm.align.stages` decides, :mod:`prefect_odm.merge.overlaps_seams` measures).

:class:`StageJudge` records the products as they are (``none``), then each stage with its seams
as it would be applied. :func:`refine_stages` solves the refinement on the stages applied so
far; when the camera step alone worsens a seam (it moves a submodel its shared cameras do not
tie, say), it tries both the camera step with its refinement and the refinement alone, each
judged against the products as they are, and applies the one with the smaller seams.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from prefect_odm.align import AlignmentOptions, AlignmentReport, AlignmentResult, GateFailure
from prefect_odm.align.similarity import RasterCorrection
from prefect_odm.align.stage_records import StageCheck, StageName
from prefect_odm.align.stages import (
    correction_failures,
    judge_stage,
    lean_refusals,
    refusals,
    seam_m,
)

if TYPE_CHECKING:
    from prefect_odm.merge.overlaps import OrthoShift

Refine = Callable[[AlignmentReport], AlignmentResult]
"""Solves the refinement on the products as ``report``'s applied stages correct them."""


class StageJudge:
    """Measures and judges the stages of one alignment.

    The orthophoto feature matches are found once, here (none without ``check_stages``).

    Args:
        dsms, orthos: submodel id -> local DSM, orthophoto.
        options: the alignment's options (``check_stages``, tolerances, plausible bounds).
        crs_epsg: the plan CRS.
    """

    def __init__(
        self,
        dsms: Mapping[str, Path],
        orthos: Mapping[str, Path],
        options: AlignmentOptions,
        crs_epsg: int | None,
    ) -> None:
        """Find the orthophoto feature matches once, when ``options.check_stages``."""
        from prefect_odm.merge.overlaps_seams import SeamMeter

        self.options = options
        self._meter = SeamMeter(dsms, orthos, crs_epsg) if options.check_stages else None

    def matched(
        self, corrections: Mapping[str, RasterCorrection] | None
    ) -> dict[tuple[str, str], OrthoShift] | None:
        """The orthophoto offsets the matches measure after ``corrections`` (None: unchecked)."""
        from prefect_odm.merge.overlaps_seams import matched_shifts

        return None if self._meter is None else matched_shifts(self._meter.matches, corrections)

    def start(self, report: AlignmentReport) -> None:
        """Record the products as they are, stage ``none``."""
        seams = self._meter.measure() if self._meter is not None else []
        report.stages = [StageCheck(stage="none", applied=True, seams=seams)]

    def judge(
        self,
        report: AlignmentReport,
        name: StageName,
        result: AlignmentResult,
        *,
        against: StageCheck | None = None,
        solved_on: StageName | None = None,
    ) -> tuple[StageCheck, list[GateFailure]]:
        """The check of stage ``name`` (``result``, already set in ``report``) measured as it
        would be applied after ``report``'s applied stages, against ``against`` (default: the
        last applied stage), and its refusals; ``report`` is left as it was."""
        options = self.options
        refused = refusals(result, options) + lean_refusals(result, report.relief_m, options)
        before = against or report.final_stage()
        kept = report.stages
        report.stages = [*kept, StageCheck(stage=name, applied=True)]
        try:
            fixes = report.raster_corrections()
        finally:
            report.stages = kept
        seams = self._meter.measure(fixes) if self._meter is not None else []
        check = judge_stage(name, result, seams, before.seams if before else [], refused, options)
        return check.model_copy(update={"solved_on": solved_on}), refused


def _applied(check: StageCheck, applied: bool, **update: object) -> StageCheck:
    return check.model_copy(update={"applied": applied, **update})


def _total_m(check: StageCheck) -> float:
    return sum(v for s in check.seams if (v := seam_m(s)) is not None)


def refine_stages(report: AlignmentReport, judge: StageJudge, refine: Refine) -> list[GateFailure]:
    """Solve, judge and record the refinement after the camera step (see the module); returns
    the refusals of what is left unapplied for being beyond plausible."""
    first = report.stage(report.first_stage)
    assert first is not None
    if first.applied or first.refused:
        report.refinement = refine(report)
        on: StageName = first.stage if first.applied else "none"
        check, refused = judge.judge(report, "refined", report.refinement, solved_on=on)
        report.stages = [*report.stages, check]
        return refused
    none = report.stage("none")
    others = [s for s in report.stages if s is not first]
    report.stages = [*others, _applied(first, True)]
    with_cameras = refine(report)
    report.refinement = with_cameras
    on_c, refused_c = judge.judge(report, "refined", with_cameras, against=none,
                                  solved_on=first.stage)  # fmt: skip
    report.stages, report.refinement = [*others, first], None
    alone = refine(report)
    report.refinement = alone
    on_0, refused_0 = judge.judge(report, "refined", alone, against=none, solved_on="none")
    # of two candidates that worsen no seam, one the correction gates pass before one they
    # fail (brighton --split 6: alone the refinement needs a 2.2 % scale, with the camera step
    # 1.4 %, their seams 0.01 m apart), then the smaller seams
    gates_c = correction_failures([report.result, with_cameras], judge.options)
    gates_0 = correction_failures([alone], judge.options)
    key_c, key_0 = (bool(gates_c), _total_m(on_c)), (bool(gates_0), _total_m(on_0))
    if on_c.applied and (not on_0.applied or key_c <= key_0):
        note = f"alone it worsens a seam ({'; '.join(first.reasons)}); applied with its refinement"
        report.refinement = with_cameras
        why = (f"the camera step with its refinement leaves smaller seams ({_total_m(on_c):.3f} m "
               f"against {_total_m(on_0):.3f} m, summed over the overlaps)")  # fmt: skip
        if gates_0 and not gates_c:
            why = f"alone it fails a correction gate ({gates_0[0].message})"
        report.stages = [*others, _applied(first, True, reasons=[], notes=[note]), on_c,
                         _applied(on_0, False, reasons=[*on_0.reasons, why])]  # fmt: skip
        return []
    reasons = on_c.reasons
    if on_c.applied and gates_c and not gates_0:
        reasons = [f"with the camera step it fails a correction gate ({gates_c[0].message}); "
                   "the refinement alone passes"]  # fmt: skip
    elif on_c.applied:
        reasons = [f"the refinement alone leaves smaller seams ({_total_m(on_0):.3f} m against "
                   f"{_total_m(on_c):.3f} m, summed over the overlaps)"]  # fmt: skip
    report.stages = [*others, first, _applied(on_c, False, reasons=reasons), on_0]
    return refused_0 if on_0.applied else refused_c + refused_0
