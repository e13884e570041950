"""Which task UUID a submodel's attempt uses and which node holds it
(:mod:`prefect_odm.nodes.task_lookup`, moved out of the runner): against the built-in engine on
127.0.0.1."""

from __future__ import annotations

from pathlib import Path

from prefect_odm import storage
from prefect_odm.engine.launch import start_engine
from prefect_odm.layout import OutputLayout
from prefect_odm.models import Submodel
from prefect_odm.nodes.backend import task_uuid
from prefect_odm.nodes.client import NodeClient
from prefect_odm.nodes.pool import NodePool, PoolNode
from prefect_odm.nodes.task_lookup import TaskLookup


def test_uuids_whose_upload_began_on_no_node_are_passed_over(tmp_path: Path) -> None:
    submodel = Submodel(
        id="submodel-000", image_names=["a.JPG"], core_image_names=["a.JPG"],
        overlap_image_count=0, core_area={}, footprint={}, area_m2=1.0,
        estimated_memory_gib=1.0, fingerprint="cd" * 32,
    )  # fmt: skip
    layout = OutputLayout(str(tmp_path / "out"), "ab" * 32)
    said: list[str] = []
    with start_engine(tmp_path / "node", method="direct") as engine:
        client = NodeClient(engine.url)
        lookup = TaskLookup(
            layout, {engine.url: client}, NodePool([PoolNode(engine.url, 8, 1)]), 4, said.append
        )
        # a first run: no upload mark, so no node is asked
        assert lookup.left_attempt(submodel) == (0, None)
        assert lookup.usable_task_uuid(submodel, 0, [], None) == (
            0, task_uuid(submodel.fingerprint, 0), None,
        )  # fmt: skip
        assert said == []
        for attempt in (0, 1):  # a killed run began two uploads; the node has neither task
            mark = layout.submodel_upload_mark(
                submodel.id, submodel.fingerprint, task_uuid(submodel.fingerprint, attempt)
            )
            storage.write_bytes_atomic(mark, b"")
        found, holders = lookup.left_attempt(submodel)
        assert holders == {task_uuid(submodel.fingerprint, a): [] for a in (0, 1)}
        assert lookup.usable_task_uuid(submodel, found, [], holders) == (
            2, task_uuid(submodel.fingerprint, 2), None,
        )  # fmt: skip
        assert len(said) == 2 and all("taking the next task UUID" in line for line in said)
        assert lookup.locate(task_uuid(submodel.fingerprint, 0), ()) is None
