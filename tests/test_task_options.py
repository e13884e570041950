"""Whether a node's task still holds the options a submodel's fingerprint was made with.

A rerun that changes only late options restarts the earlier task in place, with its own options
(``rerun-from``); that task's UUID then no longer gives the earlier fingerprint's products. Unit
tests of :func:`differing_option` and :attr:`TaskState.options`; the path a user takes (a forced
run with the first options after such a rerun) is
``test_pool_runs.test_changing_only_orthophoto_resolution_restarts_tasks_from_that_stage``, on the
built-in engine, and a re-attach to a real NodeODM in ``test_node_compat``.
"""

from __future__ import annotations

from typing import Any

from prefect_odm.nodes.backend import COMPLETED, TaskState, differing_option


def _state(options: Any) -> TaskState:
    info = {"uuid": "u", "status": {"code": COMPLETED}, "options": options}
    return TaskState("u", COMPLETED, 100.0, "", 10, 1000, info)


WANTED = {"dsm": True, "orthophoto-resolution": 5.0, "pipeline": "direct"}


def test_the_same_options_typed_as_a_node_types_them_agree() -> None:
    held = _state(
        [
            {"name": "dsm", "value": "true"},
            {"name": "orthophoto-resolution", "value": 5},
            {"name": "pipeline", "value": "direct"},
        ]
    ).options
    assert differing_option(held, WANTED) is None


def test_a_task_restarted_with_another_value_differs() -> None:
    held = _state(
        [
            {"name": "dsm", "value": True},
            {"name": "orthophoto-resolution", "value": 10.0},
            {"name": "pipeline", "value": "direct"},
            {"name": "rerun-from", "value": "odm_orthophoto"},
        ]
    ).options
    assert differing_option(held, WANTED) == ("orthophoto-resolution", 10.0, 5.0)


def test_an_option_on_one_side_only_says_nothing() -> None:
    # NodeODM drops options it does not list (the built-in engine's pipeline) and adds its own
    dropped = {"dsm": True, "orthophoto-resolution": 5}
    assert differing_option(dropped, WANTED) is None
    added = {**WANTED, "pc-ept": True, "cog": True, "gltf": True}
    assert differing_option(added, WANTED) is None


def test_a_node_that_reports_no_options_agrees() -> None:
    assert _state(None).options == {}
    assert _state("not a list").options == {}
    assert differing_option({}, WANTED) is None
