"""The attempt record: every outcome of a submodel run is made from one record, so a completed
and a failed result carry the same options, early fingerprint, method and phases."""

from __future__ import annotations

from pathlib import Path

from prefect_odm.errors import NodeError, ProcessingFailedError
from prefect_odm.models import Submodel
from prefect_odm.nodes.attempt import SubmodelAttempt, first_line

SUBMODEL = Submodel(
    id="submodel-001",
    image_names=["a.jpg", "b.jpg"],
    core_image_names=["a.jpg"],
    overlap_image_count=1,
    core_area={},
    footprint={},
    area_m2=1.0,
    estimated_memory_gib=2.0,
    fingerprint="f" * 64,
)


def _record() -> SubmodelAttempt:
    return SubmodelAttempt(SUBMODEL, {"fast-orthophoto": True}, "e" * 64, "direct", start=0.0)


def test_completed_result_carries_the_record_and_what_the_path_adds(tmp_path: Path) -> None:
    record = _record()
    record.clock.add("upload", 1.23456)
    stored = tmp_path / "o.tif"
    stored.write_bytes(b"x" * 1234)  # the stored product (its size is recorded for reuse)
    result = record.completed({"orthophoto": str(stored)}, "http://n1", "uuid-1", 2, "openmvs")
    assert (result.submodel_id, result.fingerprint, result.status) == (
        "submodel-001", "f" * 64, "completed",
    )  # fmt: skip
    assert result.products == {"orthophoto": str(stored)}
    assert result.product_sizes == {"orthophoto": 1234}
    assert (result.node_url, result.task_uuid, result.attempts) == ("http://n1", "uuid-1", 2)
    assert result.options == {"fast-orthophoto": True} and result.early_fingerprint == "e" * 64
    assert result.method == "direct" and result.rerun_from == "openmvs"
    assert result.phase_seconds == {"upload": 1.235}
    assert result.duration_seconds > 0  # since start=0.0 on the monotonic clock


def test_failed_result_prefers_the_errors_node_and_task() -> None:
    record = _record()
    named = ProcessingFailedError(
        "exit 1\nmore", node_url="http://n2", task_uuid="uuid-2", last_output=["x", "y"]
    )
    result = record.failed(named, "http://n1", "uuid-1", 3)
    assert (result.status, result.node_url, result.task_uuid) == ("failed", "http://n2", "uuid-2")
    assert result.error == "exit 1" and result.last_output == ["x", "y"] and result.attempts == 3
    bare = record.failed(NodeError("no answer"), "http://n1", None, 1)
    assert (bare.node_url, bare.task_uuid) == ("http://n1", None)


def test_a_new_clock_keeps_the_start_and_drops_the_phases() -> None:
    record = _record()
    record.clock.add("processing", 5.0)
    fresh = record.with_new_clock()
    assert fresh.start == record.start and fresh.clock.seconds == {}
    assert fresh.early_fingerprint == record.early_fingerprint


def test_first_line_of_an_error() -> None:
    assert first_line(RuntimeError("a\nb")) == "a"
    assert first_line(RuntimeError()) == "RuntimeError"
