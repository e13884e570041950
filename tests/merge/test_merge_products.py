"""Merging ODM outputs that lack some products: each product from the inputs that have it."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import laspy
import numpy as np
import pyproj
import pytest
import rasterio

from prefect_odm.registry import PRODUCTS

from .conftest import EPSG, write_dem

pytestmark = pytest.mark.integration


def _odm_folders(tiles: dict[str, Path], root: Path, point_cloud_in: set[str]) -> list[str]:
    """ODM project folders with an orthophoto and a DSM each; a point cloud only in some."""
    folders = []
    for sid, ortho in sorted(tiles.items()):
        folder = root / sid
        target = folder / PRODUCTS["orthophoto"].odm_path
        target.parent.mkdir(parents=True)
        shutil.copy(ortho, target)
        with rasterio.open(ortho) as ds:
            left, top, res, shape = ds.transform.c, ds.transform.f, ds.res[0], ds.shape
        yy, xx = np.mgrid[0 : shape[0], 0 : shape[1]]
        z = (150 + 0.01 * xx + 0.02 * yy).astype(np.float32)
        (folder / PRODUCTS["dsm"].odm_path).parent.mkdir(parents=True)
        write_dem(folder / PRODUCTS["dsm"].odm_path, z, left, top, res)
        if sid in point_cloud_in:
            header = laspy.LasHeader(point_format=3, version="1.2")
            header.offsets, header.scales = [left, top - 40, 100], [0.001] * 3
            header.add_crs(pyproj.CRS.from_epsg(EPSG))
            las = laspy.LasData(header)
            rng = np.random.default_rng(5)
            las.x = left + rng.uniform(0, shape[1] * res, 2000)
            las.y = top - rng.uniform(0, shape[0] * res, 2000)
            las.z = np.full(2000, 150.0)
            (folder / PRODUCTS["point_cloud"].odm_path).parent.mkdir(parents=True)
            las.write(folder / PRODUCTS["point_cloud"].odm_path)
        folders.append(str(folder))
    return folders


def test_outputs_without_point_clouds_merge_their_orthophoto_and_dsm(
    prefect_api, ortho_tiles: Callable, tmp_path: Path
) -> None:
    from prefect_odm.flows.merge_existing import merge_existing

    tiles, _ = ortho_tiles()
    folders = _odm_folders(tiles, tmp_path / "none", point_cloud_in=set())
    manifest = merge_existing(inputs=folders, output=str(tmp_path / "out-none"))
    assert set(manifest.products) == {"orthophoto", "dsm"}
    assert manifest.crs_epsg == EPSG and manifest.coverage["coverage_of_union"] >= 0.995
    reports = json.loads(
        (Path(manifest.products["dsm"]).parents[1] / "report/merge.json").read_text()
    )
    assert set(reports) == {"orthophoto", "dsm", "coverage", "alignment"}
    # each product's report names the stored product, not the merge's deleted staging file
    assert {p: reports[p]["path"] for p in ("orthophoto", "dsm")} == {
        p: manifest.products[p] for p in ("orthophoto", "dsm")
    }
    # no cameras: aligned from the products (DSM differences, orthophoto phase correlation)
    assert reports["alignment"]["result"]["method"] == "dem"
    assert manifest.alignment is not None and manifest.alignment.failures == []
    # a point cloud in one input only: merged from that input
    folders = _odm_folders(tiles, tmp_path / "one", point_cloud_in={"a"})
    manifest = merge_existing(inputs=folders, output=str(tmp_path / "out-one"))
    assert set(manifest.products) == {"orthophoto", "dsm", "point_cloud"}
    with laspy.open(manifest.products["point_cloud"]) as reader:
        assert 0 < reader.header.point_count <= 2000
