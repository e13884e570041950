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


def _odm_project(folder: Path, tile: str) -> Path:
    """An OpenDroneMap project folder holding one tile of the merge tests' ground (its
    orthophoto and a DSM over the same cells), in ODM's layout."""
    from merge.conftest import LEFT, TILES, TOP, ground_texture, write_dem, write_rgba

    ground = ground_texture(300, 400)
    r0, r1, c0, c1 = TILES[tile]
    left, top = LEFT + c0 * 0.1, TOP - r0 * 0.1
    (folder / "odm_orthophoto").mkdir(parents=True)
    (folder / "odm_dem").mkdir()
    ortho = folder / "odm_orthophoto" / "odm_orthophoto.tif"
    write_rgba(ortho, ground[:, r0:r1, c0:c1], left, top, 0.1)
    z = (100 + ground[0, r0:r1, c0:c1] / 50).astype(np.float32)
    write_dem(folder / "odm_dem" / "dsm.tif", z, left, top, 0.1)
    return folder


def test_merge_writes_the_report_and_stac_catalogue_a_reconstruct_run_writes(tmp_path):
    """``prefect-odm merge`` (the installed command, Prefect's temporary server) of a project
    folder and an all.zip: report.md opens with the product summary and the STAC catalogue is
    written beside the products, before manifest.json, as a ``reconstruct`` run's are. The
    all.zip's members were extracted into a working folder that is gone: the manifest lists them
    as the archive's members and the catalogue gives them no Item."""
    import json
    import zipfile

    import fsspec
    import pystac

    task_a = _odm_project(tmp_path / "in" / "task-a", "a")
    b_project = _odm_project(tmp_path / "unzipped" / "task-b", "b")
    (tmp_path / "in" / "task-b").mkdir()
    archive = tmp_path / "in" / "task-b" / "all.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        for path in sorted(b_project.rglob("*.tif")):
            zf.write(path, str(path.relative_to(b_project)))
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env.update(PREFECT_ODM_HOME=str(tmp_path / "home"), PREFECT_HOME=str(tmp_path / "ph"))
    out = tmp_path / "out"
    # given relative (a new user's trial): the manifest's paths must hold from any folder
    command = [str(Path(sys.executable).with_name("prefect-odm")), "merge", "in/task-a",
               "in/task-b/all.zip", "--output", "out", "--accept-alignment"]  # fmt: skip
    proc = subprocess.run(
        command, capture_output=True, text=True, env=env, timeout=600, cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    [run] = out.iterdir()
    report = (run / "report" / "report.md").read_text()
    assert f"report: {run / 'report' / 'report.md'}" in proc.stdout
    failed = (json.loads((run / "manifest.json").read_text()).get("alignment") or {}).get(
        "failures"
    )
    # an accepted alignment says so on the console as reconstruct's does (a new user's trial)
    assert ("ALIGNMENT ACCEPTED" in proc.stdout) == bool(failed), (failed, proc.stdout)
    sections = [line for line in report.splitlines() if line.startswith("## ")]
    assert report.startswith("# Merge of existing outputs")
    assert sections[:2] == ["## Product summary", "## Products"], sections
    assert "- **How big**: the orthophoto covers" in report
    assert (
        "- **How sharp**: orthophoto written at 10.0 cm per pixel, DSM 10.0 cm per cell." in report
    )
    collection = pystac.Collection.from_file(str(run / "stac" / "collection.json"))
    items = {item.id: item for item in collection.get_items()}
    assert set(items) == {"merged", "task-a"}
    merged_assets = {
        k: Path(a.get_absolute_href() or "") for k, a in items["merged"].assets.items()
    }
    assert merged_assets == {
        "orthophoto": run / "merged" / "odm_orthophoto.tif",
        "dsm": run / "merged" / "dsm.tif",
    }
    assert Path(items["task-a"].assets["dsm"].get_absolute_href() or "") == (
        task_a / "odm_dem" / "dsm.tif"
    )
    assert "report" in collection.assets and "manifest" in collection.assets
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["products"] == {
        "orthophoto": str(run / "merged" / "odm_orthophoto.tif"),
        "dsm": str(run / "merged" / "dsm.tif"),
    }
    listed = {r["submodel_id"]: r["products"] for r in manifest["submodels"]}
    # the all.zip's products as its members (the working folder they were read from is gone)
    assert listed["task-b"] == {
        "orthophoto": f"zip://odm_orthophoto/odm_orthophoto.tif::{archive}",
        "dsm": f"zip://odm_dem/dsm.tif::{archive}",
    }
    with fsspec.open(listed["task-b"]["dsm"], "rb") as member:
        assert member.read() == (b_project / "odm_dem" / "dsm.tif").read_bytes()
    assert listed["task-a"]["dsm"] == str(task_a / "odm_dem" / "dsm.tif")
    written_last = (run / "manifest.json").stat().st_mtime_ns
    assert all(p.stat().st_mtime_ns <= written_last for p in (run / "stac").rglob("*.json"))
