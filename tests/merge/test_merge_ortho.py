"""Orthophoto merge on synthetic tiles of one textured ground image."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import rasterio
from rasterio.warp import Resampling, calculate_default_transform, reproject
from rio_cogeo.cogeo import cog_validate

from prefect_odm.errors import MergeError
from prefect_odm.merge import merge_orthophotos
from prefect_odm.models import MergeOptions
from prefect_odm.ownership import Ownership

from .conftest import CAMERAS, LEFT, TOP, write_rgba

OWNERSHIP = Ownership.from_cameras(CAMERAS)


def _read(path: Path) -> np.ndarray:
    with rasterio.open(path) as ds:
        return ds.read()


def test_balancing_removes_a_20_dn_step(ortho_tiles: Callable, tmp_path: Path) -> None:
    tiles, ground = ortho_tiles(brighten={"b": 20})
    report = merge_orthophotos(tiles, tmp_path / "o.tif", ownership=OWNERSHIP)
    assert report.seam_mean_abs_diff_before > 10
    assert report.seam_mean_abs_diff_after < 3
    assert {(s.a, s.b) for s in report.seams} >= {("a", "b"), ("b", "c")}
    for seam in report.seams:
        if "b" in (seam.a, seam.b):
            assert seam.mean_abs_diff_before == pytest.approx(20, abs=1)
        assert seam.mean_abs_diff_after < 3
    # and in the merged pixels: b's part is as close to a's and c's tone as they are
    out = _read(tmp_path / "o.tif").astype(float)
    delta = out[:3] - ground.astype(float)
    in_b = delta[:, 20:100, 300:380].mean()
    in_c = delta[:, 220:280, 300:380].mean()
    assert abs(in_b - in_c) < 3


def test_without_balancing_the_step_stays(ortho_tiles: Callable, tmp_path: Path) -> None:
    tiles, _ = ortho_tiles(brighten={"b": 20})
    report = merge_orthophotos(
        tiles, tmp_path / "o.tif", ownership=OWNERSHIP, options=MergeOptions(colour_balance=False)
    )
    assert report.seam_mean_abs_diff_after > 10


def test_output_is_a_valid_cog_with_overviews_on_the_snapped_grid(
    ortho_tiles: Callable, tmp_path: Path
) -> None:
    tiles, ground = ortho_tiles(scale=3)
    out = tmp_path / "o.tif"
    report = merge_orthophotos(tiles, out, ownership=OWNERSHIP, block_size=256)
    valid, errors, _ = cog_validate(str(out), quiet=True)
    assert valid, errors
    with rasterio.open(out) as ds:
        assert ds.count == 4 and ds.dtypes[0] == "uint8"
        assert ds.crs.to_epsg() == 32615
        assert ds.overviews(1), "no overviews"
        assert ds.colorinterp[3] == rasterio.enums.ColorInterp.alpha
        assert ds.transform.c / ds.transform.a == pytest.approx(
            round(ds.transform.c / ds.transform.a)
        )
        assert (ds.width, ds.height) == (1200, 900)
    assert report.coverage_of_union == 1.0
    assert report.pixels == 1200 * 900
    # no colour change where the tiles agree: the mosaic is the ground image
    assert np.array_equal(_read(out)[:3], ground)


def test_input_order_workers_and_blocks_do_not_change_pixels(
    ortho_tiles: Callable, tmp_path: Path
) -> None:
    tiles, _ = ortho_tiles(brighten={"c": -15, "b": 12})
    forward = dict(sorted(tiles.items()))
    backward = dict(sorted(tiles.items(), reverse=True))
    merge_orthophotos(forward, tmp_path / "1.tif", ownership=OWNERSHIP, workers=1, block_size=512)
    merge_orthophotos(backward, tmp_path / "2.tif", ownership=OWNERSHIP, workers=2, block_size=96)
    merge_orthophotos(
        {k: backward[k] for k in ("b", "a", "c")},
        tmp_path / "3.tif",
        ownership=OWNERSHIP,
        workers=3,
        block_size=64,
    )
    one = _read(tmp_path / "1.tif")
    assert np.array_equal(one, _read(tmp_path / "2.tif"))
    assert np.array_equal(one, _read(tmp_path / "3.tif"))


def test_hole_in_the_owner_is_filled_from_another_submodel(
    ortho_tiles: Callable, tmp_path: Path
) -> None:
    # a owns columns < ~200; b and c cover columns >= 160. a's hole at columns 165-185 lies in
    # its own cell, deep enough that b gets no feathering weight there.
    tiles, ground = ortho_tiles(holes={"a": [(20, 60, 165, 185), (100, 140, 10, 30)]})
    report = merge_orthophotos(tiles, tmp_path / "o.tif", ownership=OWNERSHIP)
    out = _read(tmp_path / "o.tif")
    assert np.all(out[3, 20:60, 165:185] == 255)
    assert np.array_equal(out[:3, 20:60, 165:185], ground[:, 20:60, 165:185])
    assert np.all(out[3, 100:140, 10:30] == 0)  # nobody has data there
    assert report.pixels == report.union_pixels == 300 * 400 - 40 * 20


def test_input_in_another_crs_is_warped(ortho_tiles: Callable, tmp_path: Path) -> None:
    tiles, ground = ortho_tiles()
    src = tiles["b"]
    geo = tmp_path / "b_4326.tif"
    with rasterio.open(src) as ds:
        tr, w, h = calculate_default_transform(ds.crs, "EPSG:4326", ds.width, ds.height, *ds.bounds)
        data = np.zeros((4, h, w), np.uint8)
        reproject(
            ds.read(),
            data,
            src_transform=ds.transform,
            src_crs=ds.crs,
            dst_transform=tr,
            dst_crs="EPSG:4326",
            resampling=Resampling.nearest,
        )
        prof = ds.profile | {"crs": "EPSG:4326", "transform": tr, "width": w, "height": h}
    with rasterio.open(geo, "w", **prof) as dst:
        dst.write(data)
    tiles["b"] = geo
    report = merge_orthophotos(tiles, tmp_path / "o.tif", ownership=OWNERSHIP)
    assert report.warped == ("b",)
    assert report.crs_epsg == 32615
    assert report.coverage_of_union >= 0.995
    out = _read(tmp_path / "o.tif").astype(int)
    # deep in b's own cell the warped pixels still show the ground (resampled twice)
    assert np.abs(out[:3, 20:80, 300:380] - ground[:, 20:80, 300:380]).mean() < 12
    assert np.all(out[3, 5:170, 170:395] == 255)


def test_no_ownership_uses_footprint_centres(ortho_tiles: Callable, tmp_path: Path) -> None:
    from prefect_odm.merge import ownership_from_rasters

    tiles, ground = ortho_tiles(brighten={"a": 7})
    report = merge_orthophotos(tiles, tmp_path / "o.tif", ownership=None)
    assert report.ownership_from_footprints
    assert report.coverage_of_union == 1.0
    # the same as passing the ownership derived from the rasters explicitly
    own = ownership_from_rasters(tiles)
    assert own.submodel_ids == ("a", "b", "c")
    merge_orthophotos(tiles, tmp_path / "p.tif", ownership=own)
    assert np.array_equal(_read(tmp_path / "o.tif"), _read(tmp_path / "p.tif"))
    # seams between centroids: a's centre (12 m, -15 m) is a's, b's (28, -9) b's, c's c's
    assert list(
        own.owner_of_points(
            np.array([LEFT + 12, LEFT + 28, LEFT + 28]), np.array([TOP - 15, TOP - 9, TOP - 21])
        )
    ) == ["a", "b", "c"]
    del ground


def test_unknown_submodel_and_empty_inputs_raise(ortho_tiles: Callable, tmp_path: Path) -> None:
    tiles, _ = ortho_tiles()
    only_ab = Ownership.from_cameras(CAMERAS, only=["a", "b"])
    with pytest.raises(MergeError, match="c"):
        merge_orthophotos(tiles, tmp_path / "o.tif", ownership=only_ab)
    empty = write_rgba(
        tmp_path / "empty.tif",
        np.zeros((3, 50, 50), np.uint8),
        LEFT,
        TOP,
        0.1,
        alpha=np.zeros((50, 50), bool),
    )
    with pytest.raises(MergeError, match="empty"):
        merge_orthophotos({"a": empty}, tmp_path / "e.tif", ownership=None)
    assert not (tmp_path / "e.tif").exists()
    with pytest.raises(MergeError, match="no inputs"):
        merge_orthophotos({}, tmp_path / "n.tif", ownership=None)


def test_progress_is_reported(ortho_tiles: Callable, tmp_path: Path) -> None:
    tiles, _ = ortho_tiles()
    calls: list[tuple[int, int]] = []
    merge_orthophotos(
        tiles,
        tmp_path / "o.tif",
        ownership=OWNERSHIP,
        block_size=128,
        progress=lambda d, t: calls.append((d, t)),
    )
    assert calls[-1] == (12, 12) and [c[0] for c in calls] == list(range(1, 13))


def test_coverage_guard_and_overview_levels() -> None:
    from prefect_odm.merge.blocks import check_union_coverage
    from prefect_odm.merge.cog import overview_factors

    check_union_coverage(Path("x.tif"), 995, 1000)
    with pytest.raises(MergeError, match="covers 99.4%"):
        check_union_coverage(Path("x.tif"), 994, 1000)
    with pytest.raises(MergeError, match="empty"):
        check_union_coverage(Path("x.tif"), 0, 0)
    assert overview_factors(1200, 900) == [2, 4]
    assert overview_factors(500, 400) == []
    assert overview_factors(14400, 14400) == [2, 4, 8, 16, 32]


def test_rgb_with_nodata_is_merged_and_16_bit_is_refused(tmp_path: Path) -> None:
    rgb = np.full((3, 40, 60), 120, np.uint8)
    rgb[:, :, :10] = 0  # nodata strip
    with rasterio.open(
        tmp_path / "rgb.tif",
        "w",
        driver="GTiff",
        width=60,
        height=40,
        count=3,
        dtype="uint8",
        crs="EPSG:32615",
        transform=rasterio.transform.from_origin(LEFT, TOP, 0.1, 0.1),
        nodata=0,
    ) as dst:
        dst.write(rgb)
    report = merge_orthophotos({"a": tmp_path / "rgb.tif"}, tmp_path / "o.tif", ownership=None)
    assert report.pixels == 40 * 50
    out = _read(tmp_path / "o.tif")
    assert np.all(out[3, :, :10] == 0) and np.all(
        out[:, :, 10:] == [[[120]], [[120]], [[120]], [[255]]]
    )
    with rasterio.open(
        tmp_path / "u16.tif",
        "w",
        driver="GTiff",
        width=60,
        height=40,
        count=3,
        dtype="uint16",
        crs="EPSG:32615",
        transform=rasterio.transform.from_origin(LEFT, TOP, 0.1, 0.1),
        nodata=0,
    ) as dst:
        dst.write(rgb.astype(np.uint16))
    with pytest.raises(MergeError, match="uint8"):
        merge_orthophotos({"a": tmp_path / "u16.tif"}, tmp_path / "p.tif", ownership=None)
