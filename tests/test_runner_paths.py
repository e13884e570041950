"""The submodel runner's retry paths in milliseconds, against scripted fake nodes.

Each test scripts what the nodes answer (a :class:`~prefect_odm.nodes.backend.NodeBackend`
is a Protocol) and checks the path the runner takes: the task UUIDs it submits, the nodes it
uses, the memory it asks for, the back-off it sleeps and the result it stores. The real-server
tests (``tests/test_pool_runs.py``, ``tests/test_node_*.py``) stay beside these.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any, Unpack

import laspy
import numpy as np
import pytest
import rasterio
from pyproj import CRS
from rasterio.transform import from_origin

from prefect_odm.errors import (
    NodeError,
    OutOfMemoryError,
    ProcessingFailedError,
    RunCancelledError,
    TransientNodeError,
)
from prefect_odm.layout import OutputLayout
from prefect_odm.models import ProcessingOptions, SplitPlan, Survey
from prefect_odm.nodes.backend import (
    CANCELED,
    COMPLETED,
    FAILED,
    RUNNING,
    NewTask,
    NodeInfo,
    NodeOption,
    TaskState,
    task_uuid,
)
from prefect_odm.nodes.pool import NodePool, PoolNode
from prefect_odm.nodes.runner import SubmodelRunner
from prefect_odm.plan.planning import plan_split
from prefect_odm.registry import PRODUCTS
from prefect_odm.survey.scan import scan_images

Outcome = BaseException | Callable[[], None] | None
"""What one ``wait`` of a fake node does: raise the error, call the hook, or complete (None)."""


def _write_products(dest: Path) -> None:
    """Tiny products that pass the runner's checks: RGBA orthophoto, DSM, LAZ, all EPSG:32630."""
    crs = "EPSG:32630"
    for name, bands in (("orthophoto", 4), ("dsm", 1)):
        path = dest / PRODUCTS[name].odm_path
        path.parent.mkdir(parents=True, exist_ok=True)
        profile = {"driver": "GTiff", "width": 4, "height": 4, "count": bands, "dtype": "uint8"}
        with rasterio.open(
            path, "w", crs=crs, transform=from_origin(500000, 5600000, 1, 1), **profile
        ) as ds:
            ds.write(np.ones((bands, 4, 4), dtype=np.uint8))
    header = laspy.LasHeader(point_format=3, version="1.2")
    header.add_crs(CRS.from_epsg(32630))
    las = laspy.LasData(header)
    las.x = np.array([500000.0, 500001.0])
    las.y = np.array([5600000.0, 5600001.0])
    las.z = np.array([1.0, 2.0])
    path = dest / PRODUCTS["point_cloud"].odm_path
    path.parent.mkdir(parents=True, exist_ok=True)
    las.write(path)


class ScriptedNode:
    """A NodeODM-like node whose task waits follow a script (one outcome per ``wait``)."""

    def __init__(self, url: str, waits: Sequence[Outcome] = (), *, alive: bool = True) -> None:
        self.url = url
        self.waits = list(waits)
        self.alive = alive
        self.tasks: dict[str, TaskState] = {}
        self.created: list[str] = []
        self.cancelled: list[str] = []

    def _state(self, uuid: str, status: int, options: Mapping[str, Any]) -> TaskState:
        info = {"options": [{"name": k, "value": v} for k, v in options.items()]}
        return TaskState(uuid, status, 0.0, "", 2, -1, info)

    def seed(self, uuid: str, status: int, options: Mapping[str, Any]) -> None:
        """A task an earlier run left on the node."""
        self.tasks[uuid] = self._state(uuid, status, options)

    def info(self) -> NodeInfo:
        if not self.alive:
            raise TransientNodeError("connection refused", node_url=self.url)
        return NodeInfo("fake", "1", 64 * 2**30, 4)

    def options(self) -> list[NodeOption]:
        return []

    def task_list(self) -> list[str]:
        return sorted(self.tasks)

    def task_state(self, uuid: str, *, with_output: int | None = None) -> TaskState | None:
        return self.tasks.get(uuid)

    def output(self, uuid: str, line: int = -30) -> list[str]:
        return []

    def create_task(
        self, uuid: str, files: Sequence[str], options: Mapping[str, Any], **new: Unpack[NewTask]
    ) -> str:
        self.created.append(uuid)
        self.tasks[uuid] = self._state(uuid, RUNNING, options)
        return uuid

    def wait(
        self,
        uuid: str,
        *,
        poll_interval_seconds: float = 2.0,
        on_progress: Callable[[TaskState], None] | None = None,
    ) -> TaskState:
        outcome = self.waits.pop(0) if self.waits else None
        state = self.tasks[uuid]
        if isinstance(outcome, BaseException):
            self.tasks[uuid] = self._state(uuid, FAILED, state.options)
            raise outcome
        if outcome is not None:
            outcome()
        if on_progress is not None:
            on_progress(state)
        self.tasks[uuid] = self._state(uuid, COMPLETED, state.options)
        return self.tasks[uuid]

    def classify_failure(self, state: TaskState) -> NodeError:
        return ProcessingFailedError("failed", node_url=self.url, task_uuid=state.uuid)

    def download(self, uuid: str, dest: Path) -> Path:
        _write_products(dest)
        return dest

    def cancel(self, uuid: str) -> bool:
        self.cancelled.append(uuid)
        self.tasks[uuid] = self._state(uuid, CANCELED, self.tasks[uuid].options)
        return True

    def remove(self, uuid: str) -> bool:
        return self.tasks.pop(uuid, None) is not None

    def restart(self, uuid: str, options: Mapping[str, Any] | None = None) -> bool:
        return False


@pytest.fixture(scope="module")
def survey_plan(brighton_images: Path) -> tuple[Survey, SplitPlan]:
    survey = scan_images(str(brighton_images), use_identity_cache=False)
    plan = plan_split(
        survey, split=1, split_overlap_m=0, options=ProcessingOptions(pipeline="direct")
    )
    return survey, plan


@pytest.fixture
def sleeps(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[float]]:
    """The runner's back-off sleeps, recorded instead of slept."""
    slept: list[float] = []
    monkeypatch.setattr("prefect_odm.nodes.runner.time.sleep", slept.append)
    yield slept


class Run:
    """A runner over scripted nodes; ``admitted`` records the memory each attempt asked for."""

    def __init__(
        self, survey_plan: tuple[Survey, SplitPlan], tmp_path: Path, *nodes: ScriptedNode
    ) -> None:
        survey, plan = survey_plan
        self.plan = plan
        self.submodel = plan.submodels[0]
        self.nodes = {n.url: n for n in nodes}
        self.pool = NodePool(
            [PoolNode(n.url, memory_gib=512.0, max_parallel_tasks=1) for n in nodes]
        )
        self.admitted: list[float] = []
        self.runner = SubmodelRunner(
            plan,
            survey,
            OutputLayout(str(tmp_path / "out"), survey.fingerprint),
            self.pool,
            self.nodes,
            admit=self._admit,
            poll_interval_seconds=0.0,
        )

    def _admit(self, submodel_id: str, memory_gib: float) -> AbstractContextManager[object]:
        self.admitted.append(memory_gib)
        return nullcontext()

    def uuid(self, attempt: int) -> str:
        return task_uuid(self.submodel.fingerprint, attempt)


def test_transient_error_retries_on_the_live_node_with_back_off(survey_plan, tmp_path, sleeps):
    node = ScriptedNode("http://a", [TransientNodeError("HTTP 502", node_url="http://a")])
    run = Run(survey_plan, tmp_path, node)
    result = run.runner.run(run.submodel.id)
    assert result.status == "completed"
    assert result.attempts == 2
    assert node.created == [run.uuid(0), run.uuid(1)]
    assert result.task_uuid == run.uuid(1)
    assert sleeps == [0.5]
    assert run.pool.down_keys() == frozenset()


def test_transient_error_on_a_dead_node_moves_to_another(survey_plan, tmp_path, sleeps):
    dead = ScriptedNode("http://a", [TransientNodeError("reset", node_url="http://a")])
    other = ScriptedNode("http://b")
    run = Run(survey_plan, tmp_path, dead, other)
    dead.alive = False  # the lease picks "http://a" first (sorted), then it stops answering
    result = run.runner.run(run.submodel.id)
    assert result.status == "completed", result.error
    assert result.node_url == "http://b"
    assert run.pool.down_keys() == frozenset({"http://a"})
    assert dead.created == [run.uuid(0)] and other.created == [run.uuid(1)]


def test_out_of_memory_retries_with_a_larger_reservation(survey_plan, tmp_path, sleeps):
    oom = OutOfMemoryError("killed: out of memory", node_url="http://a")
    node = ScriptedNode("http://a", [oom])
    run = Run(survey_plan, tmp_path, node)
    result = run.runner.run(run.submodel.id)
    assert result.status == "completed"
    first = run.submodel.estimated_memory_gib
    assert run.admitted == pytest.approx([first, first * run.runner.oom_memory_factor])
    assert node.created == [run.uuid(0), run.uuid(1)]
    assert sleeps == []


def test_stale_uuid_moves_to_the_next_task_uuid(survey_plan, tmp_path, sleeps):
    node = ScriptedNode("http://a")
    run = Run(survey_plan, tmp_path, node)
    # a task restarted with other options holds attempt 0's UUID: not this submodel's result
    node.seed(run.uuid(0), COMPLETED, {"orthophoto-resolution": 99.0})
    result = run.runner.run(run.submodel.id)
    assert result.status == "completed"
    assert node.created == [run.uuid(1)]
    assert result.task_uuid == run.uuid(1)
    assert result.attempts == 2
    assert sleeps == []


def test_processing_failure_retries_once_on_another_healthy_node(survey_plan, tmp_path, sleeps):
    failed = ProcessingFailedError("exit code 1", node_url="http://a")
    bad = ScriptedNode("http://a", [failed, failed])
    good = ScriptedNode("http://b")
    run = Run(survey_plan, tmp_path, bad, good)
    suspect_after = run.pool.record(lambda book: book.policy.suspect_after_fast_failures)
    for _ in range(suspect_after - 1):  # earlier fast failures: this one makes it suspected
        run.pool.record(lambda book: book.task_failed("http://a", 0.0))
    result = run.runner.run(run.submodel.id)
    assert result.status == "completed", result.error
    assert result.node_url == "http://b"
    assert result.attempts == 2
    assert bad.created == [run.uuid(0)] and good.created == [run.uuid(1)]


def test_processing_failure_without_another_node_fails_the_submodel(survey_plan, tmp_path, sleeps):
    node = ScriptedNode("http://a", [ProcessingFailedError("exit code 1", node_url="http://a")])
    run = Run(survey_plan, tmp_path, node)
    result = run.runner.run(run.submodel.id)
    assert result.status == "failed"
    assert result.error is not None and result.error.startswith("exit code 1")
    assert node.created == [run.uuid(0)]
    stored = run.runner.layout.submodel_result(run.submodel.id, run.submodel.fingerprint)
    assert not Path(stored).exists()


def test_cancel_while_processing_cancels_the_remote_task(survey_plan, tmp_path, sleeps):
    node = ScriptedNode("http://a")
    run = Run(survey_plan, tmp_path, node)
    node.waits = [run.runner.cancelled.set]
    with pytest.raises(RunCancelledError):
        run.runner.run(run.submodel.id)
    assert node.cancelled == [run.uuid(0)]
    assert run.pool.nodes[0].running == 0 and run.pool.nodes[0].used_memory_gib == 0.0


class CountingNode(ScriptedNode):
    """A :class:`ScriptedNode` counting its ``/task/list`` calls."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.listed = 0

    def task_list(self) -> list[str]:
        self.listed += 1
        return super().task_list()


def test_a_first_run_lists_no_node_and_a_rerun_each_node_once(survey_plan, tmp_path, sleeps):
    """No node can hold a task under a UUID no run began an upload under: a first run asks no
    node for its task; a rerun after a kill asks each node once (not twice) and re-attaches."""
    nodes = [CountingNode(f"http://{c}") for c in "abcd"]
    run = Run(survey_plan, tmp_path, *nodes)
    first = run.runner.run(run.submodel.id)
    assert first.status == "completed", first.error
    assert [n.listed for n in nodes] == [0, 0, 0, 0]
    # killed before its result was stored: the task stays on its node, the upload mark too
    Path(run.runner.layout.submodel_result(run.submodel.id, run.submodel.fingerprint)).unlink()
    again = run.runner.run(run.submodel.id)
    assert again.status == "completed", again.error
    assert [n.listed for n in nodes] == [1, 1, 1, 1]
    assert again.task_uuid == first.task_uuid and again.node_url == first.node_url
    assert sum(len(n.created) for n in nodes) == 1
