"""Unit tests of the node circuit breaker and the health-aware placement tie-break."""

from __future__ import annotations

import pytest

from prefect_odm.nodes.health import (
    Health,
    HealthBook,
    HealthPolicy,
    order_nodes,
    placement_key,
)

A, B, C = "http://a:3000", "http://b:3000", "http://c:3000"


class Clock:
    """A clock the test moves by hand (seconds)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


def book(clock: Clock, **policy: float) -> HealthBook:
    return HealthBook([A, B], policy=HealthPolicy(**policy), clock=clock)  # type: ignore[arg-type]


def test_new_nodes_are_healthy(clock: Clock) -> None:
    health = book(clock)
    assert health.health(A) is Health.HEALTHY
    assert health.health("http://new:1") is Health.HEALTHY


def test_a_fast_failure_suspects_a_slow_one_does_not(clock: Clock) -> None:
    health = book(clock, fast_failure_seconds=60)
    assert health.task_failed(A, elapsed_seconds=600, message="real failure") is Health.HEALTHY
    assert health.task_failed(A, elapsed_seconds=2, message="at once") is Health.SUSPECTED
    assert health.record(A).tasks_failed == 2
    assert health.record(A).tasks_failed_fast == 1
    assert health.record(A).last_error == "at once"


def test_fast_failure_threshold(clock: Clock) -> None:
    health = book(clock, suspect_after_fast_failures=2)
    assert health.task_failed(A, 1) is Health.HEALTHY
    health.task_completed(A)  # a success ends the run of failures
    assert health.task_failed(A, 1) is Health.HEALTHY
    assert health.task_failed(A, 1) is Health.SUSPECTED


def test_request_failures_in_a_row_suspect(clock: Clock) -> None:
    health = book(clock, suspect_after_request_failures=3)
    health.request_failed(A, "refused")
    health.request_failed(A, "refused")
    health.request_succeeded(A)
    health.request_failed(A, "refused")
    assert health.health(A) is Health.HEALTHY
    health.request_failed(A, "refused")
    assert health.request_failed(A, "timeout") is Health.SUSPECTED
    assert health.record(A).request_failures == 5


def test_cooldown_then_one_probe_then_healthy(clock: Clock) -> None:
    health = book(clock, cooldown_seconds=100)
    health.task_failed(A, 1)
    clock.now += 99
    assert health.health(A) is Health.SUSPECTED
    clock.now += 1
    assert health.health(A) is Health.PROBING
    assert health.may_take_task(A)
    health.task_started(A)
    assert not health.may_take_task(A)  # one probe at a time
    health.task_completed(A)
    assert health.health(A) is Health.HEALTHY
    assert health.may_take_task(A)


def test_failed_probe_doubles_the_cooldown_up_to_the_cap(clock: Clock) -> None:
    health = book(clock, cooldown_seconds=100, cooldown_backoff=2, max_cooldown_seconds=300)
    health.task_failed(A, 1)
    for expected in (200, 300, 300):
        clock.now += health.record(A).cooldown_seconds
        assert health.health(A) is Health.PROBING
        health.task_started(A)
        assert health.task_failed(A, 1) is Health.SUSPECTED
        assert health.record(A).cooldown_seconds == expected


def test_a_probe_that_processed_and_failed_heals(clock: Clock) -> None:
    health = book(clock, cooldown_seconds=10, fast_failure_seconds=60)
    health.task_failed(A, 1)
    clock.now += 10
    health.task_started(A)
    assert health.task_failed(A, 120, "bad data") is Health.HEALTHY


def test_cooldown_restarts_from_the_base_after_healing(clock: Clock) -> None:
    health = book(clock, cooldown_seconds=50)
    health.task_failed(A, 1)
    clock.now += 50
    health.task_started(A)
    health.task_failed(A, 1)
    assert health.record(A).cooldown_seconds == 100
    clock.now += 100
    health.task_started(A)
    health.task_completed(A)
    health.task_failed(A, 1)
    assert health.record(A).cooldown_seconds == 50


def test_retry_elsewhere_once_and_only_with_a_healthy_node(clock: Clock) -> None:
    health = book(clock)
    health.task_failed(A, 1)
    assert health.retry_elsewhere(A, retries_done=0)
    assert not health.retry_elsewhere(A, retries_done=1)
    health.task_failed(B, 1)
    assert not health.retry_elsewhere(A, retries_done=0)  # nobody healthy to retry on
    assert not health.retry_elsewhere(C, retries_done=0)  # C is healthy: its failure counts


def test_report_names_each_node(clock: Clock) -> None:
    health = book(clock)
    health.task_completed(B)
    health.task_failed(A, 1, "exit 1")
    report = health.report()
    assert [r.url for r in report] == [A, B]
    assert report[0].health == "suspected" and report[0].tasks_failed_fast == 1
    assert report[1].health == "healthy" and report[1].tasks_completed == 1


def test_placement_key_orders_health_then_load_then_url() -> None:
    assert placement_key(0.5, Health.HEALTHY, B) < placement_key(0.0, Health.SUSPECTED, A)
    assert placement_key(0.0, Health.HEALTHY, B) < placement_key(0.5, Health.HEALTHY, A)
    assert placement_key(0.5, Health.HEALTHY, C) < placement_key(0.5, Health.PROBING, A)
    assert placement_key(0.5, Health.PROBING, C) < placement_key(0.5, Health.SUSPECTED, A)
    assert placement_key(0.5, Health.HEALTHY, A) < placement_key(0.5, Health.HEALTHY, B)


def test_the_failing_node_gets_no_second_submodel(clock: Clock) -> None:
    """Issue 13: a node failing at once is free first; with ties broken by health the next
    submodels go to the healthy node."""
    health = book(clock)
    assert order_nodes({A: 0.0, B: 0.0}, health) == [A, B]  # the lower URL first, as before
    health.task_started(A)
    health.task_failed(A, 0.5, "failed at once")
    assert order_nodes({A: 0.0, B: 0.0}, health) == [B, A]
    assert order_nodes({A: 0.0, B: 0.5}, health) == [B, A]  # a busier healthy node still first


def test_order_leaves_out_a_node_whose_probe_is_out(clock: Clock) -> None:
    health = book(clock, cooldown_seconds=5)
    health.task_failed(A, 1)
    clock.now += 5
    assert order_nodes({A: 0.0, B: 0.0}, health) == [B, A]
    health.task_started(A)
    assert order_nodes({A: 0.0, B: 0.0}, health) == [B]


def test_submodels_started_one_at_a_time_spread_over_idle_nodes() -> None:
    # Issue 14: with the URL as the only tie-break, a survey whose submodels start one after
    # another (each finishing before the next is placed) all went to the first node.
    from prefect_odm.nodes.pool import NodePool, PoolNode

    urls = [f"http://127.0.0.1:{3000 + i}" for i in range(4)]
    pool = NodePool([PoolNode(key=u, memory_gib=16.0, max_parallel_tasks=2) for u in urls])
    placed: list[str] = []
    for i in range(40):
        with pool.lease(1.0, what=f"submodel {i}") as node:
            placed.append(node.key)
    assert [placed.count(u) for u in urls] == [10, 10, 10, 10]
    assert placed[:4] == urls  # repeatable: ties still go to the lower URL
