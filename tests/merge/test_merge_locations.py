"""Products that do not lie where their submodel's images are are refused before the merge reads
them (NodeODM's test mode returns brighton's canned products wherever the survey is), and no
merge builds a grid far larger than its inputs (the 83.5 TiB raster of such a merge)."""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Callable
from pathlib import Path

import laspy
import numpy as np
import pyproj
import pytest
import rasterio
from rasterio.crs import CRS
from rasterio.transform import from_origin
from shapely.geometry import box, mapping

from prefect_odm.errors import MergeError, MisplacedProductError
from prefect_odm.grid import Grid, check_mosaic_size
from prefect_odm.merge import coverage_report, merge_orthophotos
from prefect_odm.merge.locations import check_product_locations, misplaced_products
from prefect_odm.ownership import Ownership
from prefect_odm.registry import PRODUCTS

from .conftest import CAMERAS, EPSG, write_dem

FREETOWN_EPSG = 32628
FREETOWN = (695_000.0, 937_000.0)
"""A place in Freetown (EPSG:32628 metres): another UTM zone than brighton's 32615."""


def _move(path: Path, dx_m: float, dy_m: float = 0.0, *, epsg: int | None = None) -> None:
    """Move a GeoTIFF by ``(dx_m, dy_m)`` (to ``FREETOWN`` in ``epsg`` when given), in place."""
    with rasterio.open(path, "r+") as ds:
        t = ds.transform
        if epsg is not None:
            ds.crs = CRS.from_epsg(epsg)
            ds.transform = from_origin(FREETOWN[0], FREETOWN[1], t.a, -t.e)
        else:
            ds.transform = from_origin(t.c + dx_m, t.f + dy_m, t.a, -t.e)


def _write_cloud(path: Path, left: float, top: float, width_m: float, height_m: float) -> Path:
    header = laspy.LasHeader(point_format=3, version="1.2")
    header.offsets, header.scales = [np.floor(left), np.floor(top - height_m), 100], [0.001] * 3
    header.add_crs(pyproj.CRS.from_epsg(EPSG))
    las = laspy.LasData(header)
    rng = np.random.default_rng(5)
    las.x = left + rng.uniform(0, width_m, 500)
    las.y = top - rng.uniform(0, height_m, 500)
    las.z = np.full(500, 150.0)
    las.write(path)
    return path


def _products(tiles: dict[str, Path], root: Path) -> dict[str, dict[str, str]]:
    """Each tile as an ODM project folder: its orthophoto, a DSM on its grid and a point cloud."""
    out = {}
    for sid, ortho in sorted(tiles.items()):
        folder = root / sid
        files = {name: folder / PRODUCTS[name].odm_path for name in ("orthophoto", "dsm")}
        files["point_cloud"] = folder / PRODUCTS["point_cloud"].odm_path
        for f in files.values():
            f.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ortho, files["orthophoto"])
        with rasterio.open(ortho) as ds:
            left, top, res, (h, w) = ds.transform.c, ds.transform.f, ds.res[0], ds.shape
        yy, xx = np.mgrid[0:h, 0:w]
        write_dem(files["dsm"], (150 + 0.01 * xx + 0.02 * yy).astype(np.float32), left, top, res)
        _write_cloud(files["point_cloud"], left, top, w * res, h * res)
        out[sid] = {name: str(path) for name, path in files.items()}
    return out


def _footprints(products: dict[str, dict[str, str]]) -> dict[str, dict]:
    """Each submodel's planned footprint: its orthophoto's area as first written."""
    out = {}
    for sid, prods in products.items():
        with rasterio.open(prods["orthophoto"]) as ds:
            out[sid] = mapping(box(*ds.bounds))
    return out


def _digests(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


@pytest.fixture
def products(ortho_tiles: Callable, tmp_path: Path) -> dict[str, dict[str, str]]:
    tiles, _ = ortho_tiles()
    return _products(tiles, tmp_path / "odm")


def test_products_moved_50_km_are_refused_naming_submodel_file_distance_and_crs(products):
    footprints = _footprints(products)
    _move(Path(products["b"]["orthophoto"]), 50_000.0)
    with pytest.raises(MisplacedProductError) as caught:
        check_product_locations(products, footprints, EPSG, lambda sid: f"rerun {sid}")
    err = caught.value
    assert (err.submodel_id, err.path) == ("b", products["b"]["orthophoto"])
    assert 49_900 < err.distance_m < 50_000
    assert str(err) == (
        f"b: {products['b']['orthophoto']} lies 50.0 km from its images (EPSG:32615 product, "
        "survey EPSG:32615): not this submodel's products; rerun b"
    )
    assert "\n" not in str(err)


def test_products_in_another_utm_zone_are_refused_with_both_crs(products):
    footprints = _footprints(products)
    for sid in ("a", "c"):
        _move(Path(products[sid]["dsm"]), 0.0, epsg=FREETOWN_EPSG)
    with pytest.raises(MisplacedProductError) as caught:
        check_product_locations(products, footprints, EPSG, lambda sid: "merge the others")
    err = caught.value
    assert (err.submodel_id, err.path, err.others) == ("a", products["a"]["dsm"], ("c",))
    assert 8_000_000 < err.distance_m < 9_500_000  # Freetown to brighton, geodesic
    assert "km from its images (EPSG:32628 product, survey EPSG:32615)" in str(err)
    assert "(nor are 1 other submodels': c); merge the others" in str(err)


def test_a_point_cloud_elsewhere_is_refused_from_its_header(products):
    footprints = _footprints(products)
    cloud = Path(products["c"]["point_cloud"])
    with rasterio.open(products["c"]["orthophoto"]) as ds:
        left, top = ds.transform.c, ds.transform.f
    _write_cloud(cloud, left - 3_000, top, 10, 10)
    [found] = misplaced_products(products, footprints, EPSG)
    assert (found.submodel_id, found.place.path) == ("c", str(cloud))
    assert 2_900 < found.distance_m < 3_000


@pytest.mark.parametrize("shift_m", [3.0, 12.0, 45.0])
def test_products_within_gps_error_are_accepted_and_merge(products, tmp_path, shift_m):
    footprints = _footprints(products)
    for prods in products.values():
        for name in ("orthophoto", "dsm"):
            _move(Path(prods[name]), shift_m, -shift_m / 2)
    assert misplaced_products(products, footprints, EPSG) == []
    inputs = {sid: Path(p["orthophoto"]) for sid, p in products.items()}
    report = merge_orthophotos(inputs, tmp_path / "merged.tif", ownership=None)
    assert report.path == str(tmp_path / "merged.tif")


def test_a_bare_merge_of_one_far_input_refuses_the_grid_before_allocating(products, tmp_path):
    """No plan at hand (a bare ``merge_orthophotos`` on files): the grid guard still refuses."""
    _move(Path(products["b"]["orthophoto"]), 3_000_000.0, 2_000_000.0)
    inputs = {sid: Path(p["orthophoto"]) for sid, p in products.items()}
    out = tmp_path / "merged" / "odm_orthophoto.tif"
    out.parent.mkdir()
    with pytest.raises(MergeError) as caught:
        merge_orthophotos(inputs, out, ownership=Ownership.from_cameras(CAMERAS))
    message = str(caught.value)
    assert message.startswith("mosaic grid of ")
    assert " px at 0.1 m (bounds " in message
    assert "b lies 3,606 km from the inputs' median centre" in message
    assert "\n" not in message
    assert list(out.parent.iterdir()) == []


def test_the_mosaic_size_rule():
    square = 100.0  # m, 1,000 x 1,000 px at 0.1 m
    # a diagonal chain of 30 squares touching at their corners: 30 times their pixels, accepted
    chain = {
        f"s{i}": (i * square, i * square, (i + 1) * square, (i + 1) * square) for i in range(30)
    }
    check_mosaic_size(Grid(0.0, 30 * square, 0.1, 30_000, 30_000), chain)
    # one of three squares 100 km away: refused
    far = {"a": (0.0, 0.0, square, square), "b": (square, 0.0, 2 * square, square)}
    far["z"] = (100_000.0, 0.0, 100_000.0 + square, square)
    grid = Grid(0.0, square, 0.1, 1_001_000, 1_000)
    with pytest.raises(MergeError, match=r"z lies 99.9 km from the inputs' median centre"):
        check_mosaic_size(grid, far)


def test_coverage_against_a_far_footprint_is_a_figure_not_a_huge_mask(products, tmp_path):
    """The comparison grid is decimated over the footprint too: a footprint in another place
    than the merged raster gives 0 % of it covered (an error), not an 83.5 TiB mask."""
    inputs = {sid: Path(p["orthophoto"]) for sid, p in products.items()}
    merged = tmp_path / "merged.tif"
    merge_orthophotos(inputs, merged, ownership=None)
    with rasterio.open(merged) as ds:
        left, bottom, right, top = ds.bounds
    far = mapping(box(left + 4_000_000, bottom - 4_000_000, right + 4_000_000, top - 4_000_000))
    with pytest.raises(MergeError, match=r"covers 0.0% of the planned footprint"):
        coverage_report(merged, inputs, far)


@pytest.mark.integration
def test_merge_products_refuses_at_the_start_writing_nothing(prefect_api, products, tmp_path):
    from prefect_odm.tasks.merge import merge_products

    _move(Path(products["b"]["orthophoto"]), 50_000.0)
    _move(Path(products["b"]["dsm"]), 50_000.0)
    before = _digests(tmp_path / "odm")
    stored = tmp_path / "stored"
    with pytest.raises(MisplacedProductError) as caught:
        merge_products(
            products,
            lambda name, _fmt: str(stored / name),
            ownership=Ownership.from_cameras(CAMERAS),
            crs_epsg=EPSG,
            planned_footprint=None,
        )
    assert str(caught.value).startswith(f"b: {products['b']['orthophoto']} lies 50.0 km from")
    assert "nothing was merged" in str(caught.value)
    assert not stored.exists()
    assert _digests(tmp_path / "odm") == before


@pytest.mark.integration
def test_merge_products_within_gps_error_merges_everything(prefect_api, products, tmp_path):
    from prefect_odm.tasks.merge import merge_products

    for prods in products.values():
        for name in ("orthophoto", "dsm"):
            _move(Path(prods[name]), 20.0, 10.0)
    stored = tmp_path / "stored"
    stored.mkdir()
    merged = merge_products(
        products,
        lambda name, _fmt: str(stored / name),
        ownership=Ownership.from_cameras(CAMERAS),
        crs_epsg=EPSG,
        planned_footprint=None,
    )
    assert set(merged.stored) == {"orthophoto", "dsm", "point_cloud"}


def _plan(products: dict[str, dict[str, str]], path: Path) -> str:
    """A prefect-odm plan of the three tiles: each submodel's footprint its tile's area."""
    from prefect_odm.models import CameraPosition, ProcessingOptions, SplitPlan, Submodel

    footprints = _footprints(products)
    plan = SplitPlan(
        survey_fingerprint="s" * 64,
        crs_epsg=EPSG,
        split=2,
        split_overlap_m=5.0,
        min_submodel_images=1,
        options=ProcessingOptions(),
        engine_identity="test",
        submodels=[
            Submodel(
                id=sid,
                image_names=[],
                core_image_names=[],
                overlap_image_count=0,
                core_area=footprints[sid],
                footprint=footprints[sid],
                area_m2=1.0,
                estimated_memory_gib=1.0,
                fingerprint=sid * 8,
            )  # fmt: skip
            for sid in sorted(products)
        ],
        cameras=[
            CameraPosition(name=f"{sid}{n}.JPG", x_m=x, y_m=y, z_m=190.0, submodel_id=sid)
            for n, (x, y, sid) in enumerate(CAMERAS)
        ],
        fingerprint="p" * 64,
    )
    path.write_text(plan.model_dump_json())
    return str(path)


@pytest.mark.integration
def test_merge_existing_with_its_plan_refuses_before_the_alignment(prefect_api, products, tmp_path):
    """``prefect-odm merge ... --plan``'s flow: the check runs before the alignment reads the
    products; the error names the command that merges the others."""
    from prefect_odm.flows.merge_existing import merge_existing

    plan = _plan(products, tmp_path / "plan.json")
    _move(Path(products["c"]["orthophoto"]), 0.0, epsg=FREETOWN_EPSG)
    folders = [str(tmp_path / "odm" / sid) for sid in sorted(products)]
    before = _digests(tmp_path / "odm")
    with pytest.raises(MisplacedProductError) as caught:
        merge_existing(inputs=folders, output=str(tmp_path / "out"), plan=plan)
    message = str(caught.value)
    assert message.startswith(f"c: {products['c']['orthophoto']} lies ")
    assert "(EPSG:32628 product, survey EPSG:32615)" in message
    assert message.endswith(
        f"merge the others: prefect-odm merge {folders[0]} {folders[1]} --plan {plan} --output OUT"
    )
    assert not list((tmp_path / "out").rglob("merged/*"))
    assert _digests(tmp_path / "odm") == before


def test_merge_command_refuses_products_elsewhere_before_prefect_starts(
    products, tmp_path, monkeypatch, capsys
):
    """``prefect-odm merge ... --plan`` of another survey: refused from the headers before
    Prefect's server starts (it and the flow's extraction cost 20-80 s before the refusal), in
    one line, exit 2 (the user's inputs), nothing written."""
    import importlib

    cli = importlib.import_module(
        "prefect_odm.cli.main"
    )  # the module (the package's main: a function)

    def _no_prefect(verbose: bool) -> None:
        raise AssertionError("Prefect started before the inputs were refused")

    monkeypatch.setattr(cli, "start_prefect", _no_prefect)
    plan = _plan(products, tmp_path / "plan.json")
    _move(Path(products["c"]["orthophoto"]), 0.0, epsg=FREETOWN_EPSG)
    folders = [str(tmp_path / "odm" / sid) for sid in sorted(products)]
    before = _digests(tmp_path / "odm")
    out = tmp_path / "out"
    assert cli.main(["merge", *folders, "--plan", plan, "--output", str(out)]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"prefect-odm: error: c: {products['c']['orthophoto']} lies ")
    assert "(EPSG:32628 product, survey EPSG:32615)" in line
    assert not out.exists() and _digests(tmp_path / "odm") == before


def test_an_archive_elsewhere_is_refused_from_its_members_headers(products, tmp_path):
    """An ``all.zip`` input is checked without extracting it: each member's header through
    ``zip://MEMBER::ARCHIVE`` (its point cloud's too, a ``.laz`` inside a ``.zip``)."""
    import zipfile

    from prefect_odm.merge.existing_checks import check_existing_merge

    plan = _plan(products, tmp_path / "plan.json")
    _move(Path(products["c"]["orthophoto"]), 0.0, epsg=FREETOWN_EPSG)
    archive = tmp_path / "zipped" / "c" / "all.zip"
    archive.parent.mkdir(parents=True)
    with zipfile.ZipFile(archive, "w") as zf:
        for path in sorted((tmp_path / "odm" / "c").rglob("*.*")):
            zf.write(path, str(path.relative_to(tmp_path / "odm" / "c")))
    inputs = [str(tmp_path / "odm" / "a"), str(tmp_path / "odm" / "b"), str(archive)]
    with pytest.raises(MisplacedProductError) as caught:
        check_existing_merge(inputs, plan)
    assert str(caught.value).startswith(
        f"c: zip://odm_orthophoto/odm_orthophoto.tif::{archive} lies "
    )
    assert list(archive.parent.iterdir()) == [archive]  # nothing extracted beside it
