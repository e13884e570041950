"""Progress events are typed records: the command line's plain lines, the board and the
listeners read their fields (no keys), and what an operator sees is what it was with keyed events."""

from __future__ import annotations

import dataclasses
import io

import pytest
from rich.console import Console

from prefect_odm import progress
from prefect_odm.cli.console import LiveProgress
from prefect_odm.progress import (
    MergeEvent,
    PlanEvent,
    StageEvent,
    SubmodelBoard,
    SubmodelEvent,
    SubmodelRunEvent,
    WarningEvent,
)

NODE = "http://127.0.0.1:3001"


def _piped_lines(events: list[progress.ProgressEvent]) -> list[str]:
    out = io.StringIO()
    console = Console(file=out, force_terminal=False, width=200)
    with LiveProgress(console) as view:
        for event in events:
            view.listen(event)
    return out.getvalue().splitlines()


def test_piped_lines_of_a_run_told_by_typed_events() -> None:
    lines = _piped_lines(
        [
            StageEvent("scan"),
            WarningEvent("GPS altitude drifts 12 m"),
            StageEvent("plan"),
            PlanEvent(("submodel-000", "submodel-001")),
            SubmodelRunEvent("submodel-000", runs=1),
            SubmodelEvent("submodel-001", "reused", 1.0),
            SubmodelEvent("submodel-000", "uploading", 0.0, node=NODE),
            SubmodelEvent("submodel-000", "uploading", 0.05),  # same state: no new line
            SubmodelEvent("submodel-000", "processing", 0.5, node=NODE),
            SubmodelEvent("submodel-000", "completed", 1.0),
            StageEvent("merge"),
            MergeEvent("orthophoto", 0, 4),
            MergeEvent("orthophoto", 2, 4),  # mid-merge: no line
            MergeEvent("orthophoto", 4, 4),
            StageEvent("done"),
        ]
    )
    assert lines == [
        "warning: GPS altitude drifts 12 m",  # warnings are printed at once
        "stage: scan",  # lines before the plan are held back until it is known
        "stage: plan",
        "plan: 2 submodels",
        "submodel-001: cached; 1 of 2 submodels done (1 cached), 0 failed, 0 running, 1 waiting",
        f"submodel-000: uploading on {NODE}; 1 of 2 submodels done (1 cached), 0 failed, "
        "1 running, 0 waiting",
        f"submodel-000: processing on {NODE}; 1 of 2 submodels done (1 cached), 0 failed, "
        "1 running, 0 waiting",
        f"submodel-000: completed on {NODE}; 2 of 2 submodels done (1 cached), 0 failed, "
        "0 running, 0 waiting",
        "stage: merge",
        "merge orthophoto 0/4",
        "merge orthophoto 4/4",
        "stage: done",
    ]


def test_board_applies_state_fraction_and_only_a_named_node() -> None:
    board = SubmodelBoard(["submodel-000"])
    assert board.apply(SubmodelEvent("submodel-000", "processing", 0.4, node=NODE))
    assert board.apply(SubmodelEvent("submodel-000", "downloading", 0.95))  # no node said
    row = board.rows["submodel-000"]
    assert (row.state, row.fraction, row.node) == ("downloading", 0.95, NODE)
    assert row.started is not None
    assert not board.apply(SubmodelEvent("submodel-000", "downloading", 0.95))
    assert board.apply(SubmodelEvent("submodel-001", "reused", 1.0))  # an unplanned id is added
    assert board.rows["submodel-001"].state == "cached"


def test_the_counts_say_how_many_were_re_attached_to_finished_tasks() -> None:
    """A task the node had finished before the run asked is neither cached nor processed here:
    the counts name it (they said "(0 cached)" for a rerun that processed nothing); one that
    uploads again afterwards (a retry elsewhere) is not counted."""
    board = SubmodelBoard(["submodel-000", "submodel-001", "submodel-002"])
    for sid in ("submodel-000", "submodel-001"):
        board.apply(SubmodelEvent(sid, progress.REATTACHED, 0.9, node=NODE))
        board.apply(SubmodelEvent(sid, "downloading", 0.95))
    assert board.counts().summary().startswith("0 of 3 submodels done (0 cached), ")
    board.apply(SubmodelEvent("submodel-000", "completed", 1.0))
    board.apply(SubmodelEvent("submodel-001", "uploading", 0.0, node=NODE))
    board.apply(SubmodelEvent("submodel-001", "completed", 1.0))
    board.apply(SubmodelEvent("submodel-002", "reused", 1.0))
    assert board.counts().summary() == (
        "3 of 3 submodels done (1 cached, 1 re-attached to finished tasks), 0 failed, "
        "0 running, 0 waiting"
    )


def test_events_are_frozen() -> None:
    event = SubmodelEvent("submodel-000", "processing", 0.5)
    with pytest.raises(dataclasses.FrozenInstanceError):
        event.state = "completed"  # type: ignore[misc]


def test_a_listener_that_raises_breaks_no_other() -> None:
    seen: list[progress.ProgressEvent] = []

    def broken(event: progress.ProgressEvent) -> None:
        raise RuntimeError("a broken progress bar")

    stop_broken = progress.subscribe(broken)
    stop_seen = progress.subscribe(seen.append)
    try:
        progress.emit(StageEvent("merge"))
    finally:
        stop_broken()
        stop_seen()
    progress.emit(StageEvent("done"))  # after unsubscribing: not seen
    assert seen == [StageEvent("merge")]


def test_piped_lines_flow_once_a_stage_after_the_plan_starts() -> None:
    """A new user tailing a piped run saw nothing for minutes: the survey's calibration runs
    before the final plan. Its stage starting means the plan passed its refusals, so the held
    lines and the calibration's come out then, not after it."""
    out = io.StringIO()
    console = Console(file=out, force_terminal=False, width=200)
    with LiveProgress(console) as view:
        for event in (StageEvent("scan"), StageEvent("plan"), StageEvent("calibration")):
            view.listen(event)
        assert out.getvalue().splitlines() == ["stage: scan", "stage: plan", "stage: calibration"]
        view.listen(PlanEvent(("submodel-000",)))
    assert out.getvalue().splitlines()[-1] == "plan: 1 submodels"


def test_a_run_refused_at_its_plan_prints_no_progress_line() -> None:
    assert _piped_lines([StageEvent("scan"), StageEvent("plan")]) == []
