"""The gates judge the alignment that is applied: a submodel the cameras cannot tie (too few
shared images) but the DSM/orthophoto refinement ties is not a failure (issue 30, item 1)."""

from __future__ import annotations

import numpy as np
from align_blocks import make_block

from prefect_odm.align import (
    AlignmentOptions,
    DemOverlap,
    align_heights,
    align_submodels,
    check_report,
)


def _dsm_overlap(first: str, second: str, x0_m: float, dz_m: float) -> DemOverlap:
    """A 10 m x 100 m strip of DSM samples at ``x0_m`` where ``second`` lies ``dz_m`` higher."""
    gx, gy = np.meshgrid(np.linspace(x0_m, x0_m + 10.0, 11), np.linspace(0.0, 100.0, 21))
    return DemOverlap(first, second, gx.ravel(), gy.ravel(), np.full(gx.size, dz_m), None)


def test_a_submodel_tied_only_by_the_refinement_passes() -> None:
    # Three submodels in a row with 10 m overlaps at 20 m camera spacing: no camera is shared
    # between neighbours, so the camera step ties nothing.
    block = make_block(3, 1, overlap_m=5.0)
    gps = {n: tuple(x) for n, x in block.truth.items()}
    cameras = align_submodels(block.tables(), gps=gps)
    options = AlignmentOptions()
    assert all(o.n_used < options.min_shared_cameras for o in cameras.overlaps)
    alone = {f.subject for f in check_report(cameras, None, options) if f.figure == "min_overlaps"}
    assert alone == {"submodel-000", "submodel-001", "submodel-002"}
    # The refinement from the DSMs ties each neighbour with 231 samples: nothing is missing.
    ids = ["submodel-000", "submodel-001", "submodel-002"]
    centres = np.array([[60.0, 50.0], [180.0, 50.0], [300.0, 50.0]])
    overlaps = [
        _dsm_overlap(ids[0], ids[1], 115.0, 0.3),
        _dsm_overlap(ids[1], ids[2], 235.0, -0.2),
    ]
    refined = align_heights(ids, centres, overlaps, options)
    failures = check_report(cameras, refined, options)
    assert failures == [], [f.message for f in failures]
    # Only the last stage's overlap figures are judged: a refinement that leaves an overlap
    # 3 m apart fails on that overlap, whatever the camera step said.
    worse = refined.overlaps[1].model_copy(update={"rms_after_m": 3.0})
    late = refined.model_copy(update={"overlaps": [refined.overlaps[0], worse]})
    failed = check_report(cameras, late, options)
    assert [(f.subject, f.figure) for f in failed] == [
        ("submodel-001|submodel-002", "max_overlap_rms_m")
    ]


def test_an_accepted_alignment_says_so_on_the_console() -> None:
    from prefect_odm.align import AlignmentReport

    block = make_block(3, 1, overlap_m=5.0)
    cameras = align_submodels(block.tables())
    failures = check_report(cameras, None, AlignmentOptions())
    clean = AlignmentReport(result=cameras)
    accepted = AlignmentReport(result=cameras, failures=failures, accepted=True)
    assert _lines(clean) == []
    lines = _lines(accepted)
    assert lines[0].startswith("ALIGNMENT ACCEPTED with 3 failed quality gate(s)")
    assert [line.strip() for line in lines[1:]] == [f.message for f in failures]


def _lines(report: object) -> list[str]:
    """The console lines for a stand-in manifest carrying only ``report`` (all they read)."""
    from prefect_odm.cli.reconstruct import accepted_alignment_lines

    class _Manifest:
        alignment = report

    return accepted_alignment_lines(_Manifest())  # type: ignore[arg-type]


def test_a_failed_alignment_names_the_command_that_merges_the_stored_submodels() -> None:
    from types import SimpleNamespace

    from prefect_odm.flows.reconstruct import merge_command

    from prefect_odm.align import AlignmentError
    from prefect_odm.layout import OutputLayout

    layout = OutputLayout("/data/out", "f" * 64)
    merged = [
        SimpleNamespace(submodel_id=f"submodel-00{i}", fingerprint=f"{i}" * 64) for i in (0, 1)
    ]
    ways_on = merge_command(layout, merged)  # type: ignore[arg-type]
    folders = [layout.submodel_dir(r.submodel_id, r.fingerprint) for r in merged]
    assert f"prefect-odm merge {folders[0]} {folders[1]} --plan {layout.plan_json}" in ways_on
    failures = check_report(align_submodels(make_block(3, 1, overlap_m=5.0).tables()), None,
                            AlignmentOptions())  # fmt: skip
    message = str(AlignmentError(failures, ways_on))
    assert message.startswith("alignment quality gates failed (3): submodel-000")
    assert message.endswith("--accept-alignment")
