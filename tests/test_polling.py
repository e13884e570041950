"""How often a task's status is polled: every poll interval, more often as the task nears its
end (estimated from its own progress and processing time), less often once it has run long. Unit tests of
:func:`next_poll_seconds` and of :meth:`NodeClient.wait`'s sleeps on a scripted node; the wait
itself runs against the built-in engine and a real NodeODM in ``test_node_protocol`` and
``test_node_compat``."""

from __future__ import annotations

from typing import Any

import pytest

from prefect_odm.nodes.backend import (
    COMPLETED,
    LONGEST_POLL_SECONDS,
    QUEUED,
    RUNNING,
    SHORTEST_POLL_SECONDS,
    TaskState,
    next_poll_seconds,
)
from prefect_odm.nodes.client import NodeClient


def state(status: int, progress: float, processing_time_ms: int) -> TaskState:
    return TaskState(
        uuid="u",
        status=status,
        progress=progress,
        error_message="",
        images_count=10,
        processing_time_ms=processing_time_ms,
        info={},
    )


@pytest.mark.parametrize(
    ("status", "progress", "processing_ms", "expected"),
    [
        (QUEUED, 0.0, -1, 1.0),  # not started: the longest interval
        (RUNNING, 0.0, 5000, 1.0),  # no progress yet: nothing to extrapolate
        (RUNNING, 40.0, -1, 1.0),  # the node does not say how long it has run
        (RUNNING, 10.0, 10_000, 1.0),  # 90 s left: capped at the longest
        (RUNNING, 90.0, 36_000, 1.0),  # 4 s left: a quarter is 1 s
        (RUNNING, 95.0, 38_000, 0.5),  # 2 s left
        (RUNNING, 99.0, 99_000, 0.25),  # 1 s left
        (RUNNING, 99.9, 99_900, SHORTEST_POLL_SECONDS),  # 0.1 s left: the shortest
        (RUNNING, 100.0, 10_000, SHORTEST_POLL_SECONDS),  # done, status not yet changed
    ],
)
def test_next_poll_is_a_quarter_of_the_time_left_within_bounds(
    status: int, progress: float, processing_ms: int, expected: float
) -> None:
    assert next_poll_seconds(state(status, progress, processing_ms), 1.0) == pytest.approx(expected)


def test_a_long_task_is_polled_less_often_and_never_below_the_shortest() -> None:
    # an hour in, half done: every 0.5 % of an hour (18 s), not every second
    assert next_poll_seconds(state(RUNNING, 50.0, 3_600_000), 1.0) == pytest.approx(18.0)
    # ten hours in: capped
    assert next_poll_seconds(state(RUNNING, 50.0, 36_000_000), 1.0) == LONGEST_POLL_SECONDS
    # an hour in and about to finish: the quarter of the time left wins
    assert next_poll_seconds(state(RUNNING, 99.9, 3_600_000), 1.0) == pytest.approx(0.9, abs=0.01)
    assert next_poll_seconds(state(QUEUED, 0.0, -1), 0.0) == SHORTEST_POLL_SECONDS


class ScriptedClient(NodeClient):
    """A :class:`NodeClient` whose node answers a fixed sequence of states (no network)."""

    def __init__(self, states: list[TaskState]) -> None:
        super().__init__("http://127.0.0.1:9")
        self._states = list(states)

    def task_state(self, uuid: str, *, with_output: int | None = None) -> TaskState | None:
        return self._states.pop(0)


def test_wait_polls_faster_as_the_task_nears_its_end(monkeypatch: Any) -> None:
    sleeps: list[float] = []
    monkeypatch.setattr("prefect_odm.nodes.client.time.sleep", sleeps.append)
    client = ScriptedClient(
        [
            state(QUEUED, 0.0, -1),
            state(RUNNING, 20.0, 20_000),  # 80 s left
            state(RUNNING, 90.0, 36_000),  # 4 s left
            state(RUNNING, 98.0, 49_000),  # 1 s left
            state(COMPLETED, 100.0, 50_000),
        ]
    )
    final = client.wait("u", poll_interval_seconds=2.0)
    assert final.status == COMPLETED
    assert sleeps == pytest.approx([2.0, 2.0, 1.0, 0.25])
