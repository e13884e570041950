"""Finding OpenDroneMap products in project folders and all.zip files, and merging them."""

from __future__ import annotations

import shutil
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import rasterio

from prefect_odm.errors import InputError
from prefect_odm.merge import find_existing_outputs, merge_orthophotos


def _odm_folder(root: Path, ortho: Path) -> Path:
    (root / "odm_orthophoto").mkdir(parents=True)
    shutil.copy(ortho, root / "odm_orthophoto" / "odm_orthophoto.tif")
    (root / "odm_dem").mkdir()
    (root / "odm_dem" / "dsm.tif").write_bytes(b"not read here")
    return root


def test_project_folders_zip_and_submodels_layout(ortho_tiles: Callable, tmp_path: Path) -> None:
    tiles, _ = ortho_tiles()
    task_a = _odm_folder(tmp_path / "flights" / "task-a", tiles["a"])
    _odm_folder(tmp_path / "flights" / "task-b", tiles["b"])
    (tmp_path / "flights" / "notes").mkdir()
    zdir = tmp_path / "zips" / "task-c"
    zdir.mkdir(parents=True)
    with zipfile.ZipFile(zdir / "all.zip", "w") as zf:
        zf.write(tiles["c"], "odm_orthophoto/odm_orthophoto.tif")
    split = tmp_path / "odm_split"
    _odm_folder(split / "submodels" / "submodel_0000", tiles["a"])

    found = find_existing_outputs([str(tmp_path / "flights")], tmp_path / "work")
    assert [f.submodel_id for f in found] == ["task-a", "task-b"]
    assert set(found[0].products) == {"orthophoto", "dsm"}
    found = find_existing_outputs([str(tmp_path / "zips")], tmp_path / "work")
    assert [f.submodel_id for f in found] == ["task-c"]

    found = find_existing_outputs(
        [str(task_a), str(zdir / "all.zip"), str(split)], tmp_path / "work"
    )
    assert [f.submodel_id for f in found] == ["submodel_0000", "task-a", "task-c"]
    extracted = Path(found[2].products["orthophoto"])
    assert extracted.read_bytes() == tiles["c"].read_bytes()

    with pytest.raises(InputError, match="no such"):
        find_existing_outputs([str(tmp_path / "missing")], tmp_path / "work")
    with pytest.raises(InputError, match="no OpenDroneMap product"):
        find_existing_outputs([str(tmp_path / "flights" / "notes")], tmp_path / "work")


def test_merging_found_outputs_equals_merging_the_files(
    ortho_tiles: Callable, tmp_path: Path
) -> None:
    tiles, _ = ortho_tiles(brighten={"a": 9})
    for sid, path in tiles.items():
        _odm_folder(tmp_path / "odm" / sid, path)
    found = find_existing_outputs([str(tmp_path / "odm")], tmp_path / "work")
    inputs = {f.submodel_id: Path(f.products["orthophoto"]) for f in found}
    merge_orthophotos(inputs, tmp_path / "existing.tif", ownership=None)
    merge_orthophotos(tiles, tmp_path / "direct.tif", ownership=None)
    with rasterio.open(tmp_path / "existing.tif") as e, rasterio.open(tmp_path / "direct.tif") as d:
        assert np.array_equal(e.read(), d.read())


def test_fsspec_urls_are_searched_and_zips_extracted(ortho_tiles: Callable, tmp_path: Path) -> None:
    import fsspec

    tiles, _ = ortho_tiles()
    fs = fsspec.filesystem("memory")
    root = f"/merge-test-{tmp_path.name}"
    fs.pipe(f"{root}/flights/t1/odm_orthophoto/odm_orthophoto.tif", tiles["a"].read_bytes())
    buf = tmp_path / "all.zip"
    with zipfile.ZipFile(buf, "w") as zf:
        zf.write(tiles["b"], "odm_orthophoto/odm_orthophoto.tif")
    fs.pipe(f"{root}/flights/t2/all.zip", buf.read_bytes())
    found = find_existing_outputs(
        [f"memory://{root}/flights/t1", f"memory://{root}/flights/t2/all.zip"], tmp_path / "w"
    )
    assert [f.submodel_id for f in found] == ["t1", "t2"]
    assert (
        found[0].products["orthophoto"]
        == f"memory://{root}/flights/t1/odm_orthophoto/odm_orthophoto.tif"
    )
    assert Path(found[1].products["orthophoto"]).read_bytes() == tiles["b"].read_bytes()
    fs.rm(root, recursive=True)
