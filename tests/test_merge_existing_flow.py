"""merge_existing on OpenDroneMap output folders (all.zip of built-in engine tasks)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import rasterio
from rio_cogeo.cogeo import cog_validate

from prefect_odm.engine.launch import start_engine
from prefect_odm.models import ProcessingOptions
from prefect_odm.nodes.client import NodeClient

pytestmark = pytest.mark.integration


def test_merge_existing_equals_the_flows_own_merge(
    prefect_api, brighton_images, tmp_path, odm_home
):
    from prefect_odm.flows import reconstruct
    from prefect_odm.flows.merge_existing import merge_existing

    with start_engine(tmp_path / "node", method="direct", max_parallel_tasks=2) as engine:
        manifest = reconstruct(
            images=str(brighton_images),
            output=str(tmp_path / "out"),
            nodes=[engine.url],
            split=10,
            split_overlap_m=20,
            options=ProcessingOptions(pipeline="direct"),
        )
        client = NodeClient(engine.url)
        folders = []
        for result in manifest.submodels:  # each task's all.zip, as NodeODM hands it out
            folder = tmp_path / "downloads" / f"task-{result.task_uuid[:8]}"
            client.download(result.task_uuid, folder)
            folders.append(str(folder))
    plan_json = str(Path(manifest.products["orthophoto"]).parents[1] / "plan" / "plan.json")
    again = merge_existing(inputs=folders, output=str(tmp_path / "merged"), plan=plan_json)
    with (
        rasterio.open(manifest.products["orthophoto"]) as a,
        rasterio.open(again.products["orthophoto"]) as b,
    ):
        assert a.transform == b.transform and a.crs == b.crs
        assert np.array_equal(a.read(), b.read())
    # The run's own submodel folders with the plan of another run (here: one image of
    # submodel-000 moved out of it) are refused, naming the folder and the image.
    import json

    from prefect_odm.errors import InputError

    other = json.loads(Path(plan_json).read_text())
    first = next(sm for sm in other["submodels"] if sm["id"] == "submodel-000")
    gone = first["image_names"].pop(0)
    other_plan = tmp_path / "other-plan.json"
    other_plan.write_text(json.dumps(other))
    submodels = Path(plan_json).parents[1] / "submodels"
    with pytest.raises(InputError, match=rf"submodel-000-.*{gone}.* are not in submodel-000"):
        merge_existing(
            inputs=[str(submodels)], output=str(tmp_path / "wrong"), plan=str(other_plan)
        )
    assert not (tmp_path / "wrong").exists()
    # Two folders of one submodel (a run keeps one per set of options): refused, naming both.
    import shutil

    kept = next(submodels.glob("submodel-000-*"))
    twin = tmp_path / "twins" / "submodel-000-ffffffffffff"
    shutil.copytree(kept, twin)
    with pytest.raises(InputError, match=rf"2 inputs match submodel-000 .*{kept.name}"):
        merge_existing(
            inputs=[str(submodels), str(twin)], output=str(tmp_path / "twice"), plan=plan_json
        )
    assert not (tmp_path / "twice").exists()
    # ... and without a plan too: the older version would own half of the ground.
    with pytest.raises(InputError, match=rf"2 inputs are versions of submodel-000 .*{kept.name}"):
        merge_existing(inputs=[str(submodels), str(twin)], output=str(tmp_path / "twice"))
    assert not (tmp_path / "twice").exists()
    # Without a plan: ownership from the orthophotos' footprints; still a valid, complete COG.
    env = dict(os.environ)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "prefect_odm.cli",
            "merge",
            *folders,
            "--output",
            str(tmp_path / "noplan"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    report = next((tmp_path / "noplan").glob("*/report/report.md"))
    assert f"report: {report}" in proc.stdout and "manifest: " in proc.stdout
    text = report.read_text()
    assert (
        text.startswith("# Merge of existing outputs") and "## Alignment between submodels" in text
    )
    assert "bowl at 100 m (m)" in text and text.count("![alignment](alignment.png)") == 1
    assert (report.parent / "alignment.png").read_bytes().startswith(b"\x89PNG")
    ortho = next((tmp_path / "noplan").glob("*/merged/odm_orthophoto.tif"))
    assert cog_validate(str(ortho))[0]
    with rasterio.open(ortho) as ds:
        assert ds.crs.to_epsg() == 32615 and ds.count == 4


def test_merge_existing_missing_folder_is_a_clear_error(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "prefect_odm.cli",
            "merge",
            str(tmp_path / "nope"),
            "--output",
            str(tmp_path / "o"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2
    assert "nope" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_merge_to_an_output_under_a_file_is_refused_before_prefect(tmp_path):
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    blocker = tmp_path / "afile"
    blocker.write_text("not a folder")
    proc = subprocess.run(
        [sys.executable, "-m", "prefect_odm.cli", "merge", str(inputs), "--output", str(blocker)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"prefect-odm: error: {blocker}: cannot write the output here ({blocker} is not a folder)"
    ]
    assert blocker.read_text() == "not a folder"
