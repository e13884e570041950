"""Unit tests of the ``/info`` sanitiser, the unknown-task messages, the plan checks, and that
these modules stay in the pure core."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass

import pytest

from prefect_odm.nodes.capacity import node_capacity
from prefect_odm.nodes.messages import is_bad_token_error, is_unknown_task_error
from prefect_odm.plan.checks import (
    drop_duplicate_submodels,
    find_duplicate_submodels,
    kept_submodel_of,
    overlap_warning,
)

U = "2ed6657d-e927-568b-95e1-2665a8aea6a2"

NODEODM_INFO = {
    "version": "2.2.4",
    "taskQueueCount": 1,
    "totalMemory": 25276502016,
    "availableMemory": 24607834112,
    "cpuCores": 2,
    "maxImages": None,
    "maxParallelTasks": 1,
    "engineVersion": "?",
    "engine": "odm",
}
# ClusterODM libs/proxy.js /info, no limits set
CLUSTERODM_INFO = {
    "version": "1.5.3",
    "taskQueueCount": 0,
    "totalMemory": 99999999999,
    "availableMemory": 99999999999,
    "cpuCores": 99999999999,
    "maxImages": None,
    "maxParallelTasks": 99999999999,
    "engineVersion": "3.5.5",
    "engine": "odm",
}


def test_nodeodm_info() -> None:
    cap = node_capacity(NODEODM_INFO)
    assert cap.total_memory_bytes == 25276502016
    assert cap.available_memory_bytes == 24607834112
    assert cap.total_memory_gib == pytest.approx(23.54, abs=0.01)
    assert (cap.cpu_cores, cap.max_parallel_tasks, cap.max_images, cap.queue_count) == (
        2,
        1,
        None,
        1,
    )
    assert cap.engine is None  # test mode reports engineVersion "?"
    assert cap.unknown == ()


def test_clusterodm_sentinels_are_unknown() -> None:
    cap = node_capacity(CLUSTERODM_INFO)
    assert cap.total_memory_bytes is None and cap.available_memory_bytes is None
    assert cap.cpu_cores is None and cap.max_parallel_tasks is None
    assert cap.total_memory_gib is None
    assert cap.engine == "odm 3.5.5"
    assert set(cap.unknown) == {"totalMemory", "availableMemory", "cpuCores", "maxParallelTasks"}


@pytest.mark.parametrize("bad", [0, -1, -1024, "lots", True, float("inf"), 10**15])
def test_implausible_memory_is_unknown(bad: object) -> None:
    cap = node_capacity({**NODEODM_INFO, "totalMemory": bad, "availableMemory": bad})
    assert cap.total_memory_bytes is None and cap.available_memory_bytes is None
    assert "totalMemory" in cap.unknown


def test_missing_fields_are_unknown_not_zero() -> None:
    cap = node_capacity({})
    assert cap.total_memory_bytes is None and cap.max_parallel_tasks is None
    assert cap.queue_count == 0 and cap.unknown == () and cap.engine is None


def test_available_above_total_is_unknown() -> None:
    cap = node_capacity({**NODEODM_INFO, "availableMemory": NODEODM_INFO["totalMemory"] + 1})  # type: ignore[operator]
    assert cap.available_memory_bytes is None and cap.total_memory_bytes == 25276502016


@pytest.mark.parametrize(
    "message",
    [
        f"{U} not found",
        "Invalid uuid (not found)",
        f"Invalid route for taskId {U}:info, no task table entry.",
        f"Invalid route for taskId {U}:download/all.zip, no task table entry.",
        f"Invalid route for taskId {U}, no nodes in routing table.",
        "Invalid taskId: the task no longer exists.",
    ],
)
def test_unknown_task_messages(message: str) -> None:
    assert is_unknown_task_error(message, U)
    assert is_unknown_task_error(message)


@pytest.mark.parametrize(
    "message",
    [
        f"Invalid route for taskId {U}:download, no valid route possible.",
        "Invalid authentication token: token does not match.",
        "Asset not ready",
        "file not found on disk while zipping",  # "not found" alone is not enough
        "uuid param missing.",
    ],
)
def test_other_messages_are_not_unknown_task(message: str) -> None:
    assert not is_unknown_task_error(message, U)


def test_a_message_about_another_task_is_not_this_one() -> None:
    other = "00000000-0000-4000-8000-000000000000"
    assert not is_unknown_task_error(f"{other} not found", U)
    assert not is_unknown_task_error(
        f"Invalid route for taskId {other}:info, no task table entry.", U
    )


def test_bad_token_messages() -> None:
    assert is_bad_token_error("Invalid authentication token: token does not match.")
    assert is_bad_token_error("Unauthorized. Do you need to set a token?")  # pyodm, on a 401
    assert not is_bad_token_error(f"{U} not found")
    assert not is_unknown_task_error("Invalid authentication token: token does not match.")


@dataclass(frozen=True)
class Sub:
    id: str
    image_names: list[str]


def test_identical_image_sets_are_found_and_dropped() -> None:
    """brighton, --split 6, 50 m overlap: three submodels of all 18 images (issue 13)."""
    images = [f"IMG_{i:02d}.JPG" for i in range(18)]
    plan = [Sub("0", images), Sub("1", images[::-1]), Sub("2", images), Sub("3", images[:4])]
    dup = find_duplicate_submodels(plan)
    assert dup.groups == (("0", "1", "2"),)
    assert (dup.images_processed, dup.distinct_images) == (58, 18)
    assert dup.factor == pytest.approx(58 / 18)
    assert [s.id for s in drop_duplicate_submodels(plan)] == ["0", "3"]
    assert kept_submodel_of(dup) == {"1": "0", "2": "0"}
    warning = overlap_warning(dup, 50)
    assert warning is not None and "3.2 times" in warning and "50 m" in warning


def test_no_duplicates_no_warning() -> None:
    plan = [Sub("0", ["a", "b", "c"]), Sub("1", ["c", "d", "e"])]
    dup = find_duplicate_submodels(plan)
    assert dup.groups == () and dup.factor == pytest.approx(6 / 5)
    assert overlap_warning(dup, 20) is None
    assert find_duplicate_submodels([]).factor == 0.0


def test_new_modules_stay_in_the_pure_core() -> None:
    code = (
        "import sys\n"
        "import prefect_odm.nodes.health, prefect_odm.nodes.capacity, prefect_odm.nodes.messages,"
        " prefect_odm.nodes.option_check, prefect_odm.plan.checks\n"
        "heavy = [m for m in ('prefect', 'pyodm', 'requests', 'rasterio', 'laspy', 'pycolmap')"
        " if m in sys.modules]\n"
        "print(heavy)\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert res.stdout.strip() == "[]"


def test_planning_memory_and_slots() -> None:
    from prefect_odm.nodes.capacity import memory_for_auto_split, node_memory_gib, node_task_slots

    real, proxy = node_capacity(NODEODM_INFO), node_capacity(CLUSTERODM_INFO)
    assert node_memory_gib(real, None) == pytest.approx(21.19, abs=0.01)
    assert node_memory_gib(real, 8.0) == 8.0
    assert node_memory_gib(proxy, None) is None
    assert node_memory_gib(proxy, 64.0) == 64.0
    assert (
        node_task_slots(real, None),
        node_task_slots(proxy, None),
        node_task_slots(proxy, 6),
    ) == (1, 1, 6)
    assert memory_for_auto_split({"http://a": 8.0, "http://b": 16.0}) == [8.0, 16.0]
    with pytest.raises(ValueError, match=r"http://cluster:3000 reported none.*memory_gib"):
        memory_for_auto_split({"http://a": 8.0, "http://cluster:3000": None})
