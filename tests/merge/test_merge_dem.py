"""DEM merge: vertical offsets removed, distance-to-edge blending, nodata, COG."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import rasterio
from numpy.typing import NDArray
from rio_cogeo.cogeo import cog_validate

from prefect_odm.errors import MergeError
from prefect_odm.merge import DEM_NODATA, merge_dems
from prefect_odm.models import MergeOptions
from prefect_odm.ownership import Ownership

from .conftest import LEFT, TOP, write_dem

RES = 0.5
H, W = 160, 240


def _surface() -> NDArray[np.float32]:
    yy, xx = np.mgrid[0:H, 0:W].astype(np.float64)
    return (150 + 0.03 * xx - 0.02 * yy + 1.5 * np.sin(xx / 15) * np.cos(yy / 11)).astype(
        np.float32
    )


def _write(path: Path, z: NDArray[np.float32], col0: int) -> Path:
    return write_dem(path, z, LEFT + col0 * RES, TOP, RES)


@pytest.fixture
def two_dems(tmp_path: Path) -> tuple[dict[str, Path], NDArray[np.float32], Ownership]:
    surf = _surface()
    a = surf[:, :150].copy()
    b = surf[:, 90:] + np.float32(0.8)  # known 0.8 m vertical offset
    b[:25, :40] = DEM_NODATA  # a nodata patch inside the overlap
    tiles = {"a": _write(tmp_path / "a.tif", a, 0), "b": _write(tmp_path / "b.tif", b, 90)}
    own = Ownership.from_cameras(
        [(LEFT + 30, TOP - 40, "a"), (LEFT + 90, TOP - 40, "b")]
    )  # seam at x = 60 m = column 120, in the middle of the overlap (columns 90..150)
    return tiles, surf, own


def test_vertical_offset_removed_no_step_across_the_seam(two_dems, tmp_path: Path) -> None:
    tiles, surf, own = two_dems
    report = merge_dems(tiles, tmp_path / "dsm.tif", ownership=own, block_size=64)
    assert report.vertical_offsets_m["b"] - report.vertical_offsets_m["a"] == pytest.approx(
        0.8, abs=0.01
    )
    assert report.overlap_median_diff_m["a|b"] == pytest.approx(-0.8, abs=0.01)
    with rasterio.open(tmp_path / "dsm.tif") as ds:
        z = ds.read(1)
        assert ds.nodata == DEM_NODATA and ds.dtypes[0] == "float32"
    assert not np.any(z == DEM_NODATA)
    residual = z - surf  # the merged DSM minus the true surface: constant if seamless
    steps = np.abs(np.diff(residual, axis=1))
    assert steps.max() < 0.1
    assert np.abs(residual - residual.mean()).max() < 0.1
    valid, errors, _ = cog_validate(str(tmp_path / "dsm.tif"), quiet=True)
    assert valid, errors


def test_without_offset_removal_blending_is_smooth_but_biased(two_dems, tmp_path: Path) -> None:
    tiles, surf, own = two_dems
    merge_dems(
        tiles,
        tmp_path / "dsm.tif",
        ownership=own,
        options=MergeOptions(remove_vertical_offsets=False),
        block_size=64,
    )
    with rasterio.open(tmp_path / "dsm.tif") as ds:
        residual = ds.read(1) - surf
    # a keeps its heights far from the seam, b its +0.8 m; the change is spread over the band
    assert np.abs(residual[80, :60]).max() < 1e-4
    assert np.abs(residual[80, 200:] - 0.8).max() < 1e-4
    assert np.abs(np.diff(residual[80])).max() < 0.8


def test_dem_is_deterministic_and_needs_data(two_dems, tmp_path: Path) -> None:
    tiles, _, own = two_dems
    merge_dems(tiles, tmp_path / "1.tif", ownership=own, block_size=64, workers=1)
    merge_dems(dict(reversed(tiles.items())), tmp_path / "2.tif", ownership=None, block_size=100)
    merge_dems(dict(reversed(tiles.items())), tmp_path / "3.tif", ownership=own, block_size=37)
    # one block, blended in strips of 128 rows and 32
    merge_dems(tiles, tmp_path / "4.tif", ownership=own, block_size=512)
    with rasterio.open(tmp_path / "1.tif") as d1, rasterio.open(tmp_path / "3.tif") as d3:
        assert np.array_equal(d1.read(), d3.read())
        with rasterio.open(tmp_path / "4.tif") as d4:
            assert np.array_equal(d1.read(), d4.read())
    empty = _write(tmp_path / "e.tif", np.full((10, 10), DEM_NODATA, np.float32), 0)
    with pytest.raises(MergeError):
        merge_dems({"e": empty}, tmp_path / "e_out.tif", ownership=None)


def test_engine_grids_stay_aligned_through_the_merge(tmp_path: Path) -> None:
    """Two submodels as the built-in engine writes them (DEM cell 4 orthophoto cells, both
    grids with the same corner on whole DEM cells, the corners of the two submodels apart by a
    whole number of DEM cells): the merged DSM's pixel edges are merged orthophoto edges."""
    from prefect_odm.grid import Grid
    from prefect_odm.merge import merge_orthophotos

    from .conftest import ground_texture, write_rgba

    ortho_res, cells = 0.05, 4
    dem_res = cells * ortho_res
    corners = {"a": (LEFT + 0.2 * 7, TOP - 0.2 * 3), "b": (LEFT + 0.2 * 157, TOP - 0.2 * 11)}
    size = (120, 200)  # DEM rows, cols: 24 m x 40 m, overlapping by 10 m
    dems, orthos = {}, {}
    for sid, (left, top) in corners.items():
        z = np.full(size, 150.0, np.float32) + np.float32(0.01 * len(dems))
        dems[sid] = write_dem(tmp_path / f"dsm_{sid}.tif", z, left, top, dem_res)
        rgb = ground_texture(size[0] * cells, size[1] * cells, seed=len(orthos) + 1)
        orthos[sid] = write_rgba(tmp_path / f"ortho_{sid}.tif", rgb, left, top, ortho_res)
    merge_dems(dems, tmp_path / "dsm.tif", ownership=None, block_size=64)
    merge_orthophotos(orthos, tmp_path / "ortho.tif", ownership=None, block_size=256)
    grids = {}
    for name in ("dsm.tif", "ortho.tif"):
        with rasterio.open(tmp_path / name) as src:
            t = src.transform
            grids[name] = Grid(t.c, t.f, t.a, src.width, src.height)
    dsm, ortho = grids["dsm.tif"], grids["ortho.tif"]
    assert dsm.resolution_m == pytest.approx(dem_res) and ortho.resolution_m == (
        pytest.approx(ortho_res)
    )
    assert dsm.is_aligned_with(ortho), (dsm, ortho)
    assert (dsm.left, dsm.top) == pytest.approx((ortho.left, ortho.top), abs=1e-6)


def _write_measured(
    path: Path, z: NDArray[np.float32], flags: NDArray[np.bool_], col0: int
) -> Path:
    """A DSM as the built-in engine writes it: heights and the measured band (1/0, nodata)."""
    from prefect_odm.registry import DSM_MEASURED_DESCRIPTION

    valid = z != DEM_NODATA
    with rasterio.open(
        path,
        "w",
        driver="GTiff",
        width=z.shape[1],
        height=z.shape[0],
        count=2,
        dtype="float32",
        crs="EPSG:32615",
        transform=rasterio.transform.from_origin(LEFT + col0 * RES, TOP, RES, RES),
        nodata=DEM_NODATA,
    ) as dst:
        dst.write(z, 1)
        dst.write(np.where(valid, flags.astype(np.float32), DEM_NODATA), 2)
        dst.set_band_description(1, "height")
        dst.set_band_description(2, DSM_MEASURED_DESCRIPTION)
    return path


def test_the_measured_band_is_carried_through_the_merge(two_dems, tmp_path: Path) -> None:
    """Each submodel's filled cells stay 0 in the merged DSM's measured band where that submodel
    gives the height, its measured ones 1, nodata where no DSM has a height."""
    from prefect_odm.registry import DSM_MEASURED_DESCRIPTION

    tiles, surf, own = two_dems
    a, b = surf[:, :150].copy(), surf[:, 90:] + np.float32(0.8)
    b[:25, :40] = DEM_NODATA
    a[:, :3] = DEM_NODATA  # outside a's footprint: nodata in both bands
    fa = np.ones(a.shape, dtype=bool)
    fa[40:60, 10:30] = False  # a lake a filled, far from b
    fb = np.ones(b.shape, dtype=bool)
    fb[100:130, 100:140] = False  # a forest b filled, far from a
    inputs = {
        "a": _write_measured(tmp_path / "ma.tif", a, fa, 0),
        "b": _write_measured(tmp_path / "mb.tif", b, fb, 90),
    }
    merge_dems(inputs, tmp_path / "dsm.tif", ownership=own, block_size=64)
    with rasterio.open(tmp_path / "dsm.tif") as ds:
        assert ds.count == 2 and ds.descriptions[1] == DSM_MEASURED_DESCRIPTION
        z, measured = ds.read(1), ds.read(2)
    assert set(np.unique(measured)) == {DEM_NODATA, 0.0, 1.0}
    assert np.array_equal(measured == DEM_NODATA, z == DEM_NODATA)
    assert (measured[:, :3] == DEM_NODATA).all()
    assert (measured[40:60, 10:30] == 0).all() and (measured[100:130, 190:230] == 0).all()
    assert measured[60:100, 30:80].min() == 1 and measured[60:100, 160:230].min() == 1
    # the single-band inputs of the other tests give a single-band DSM, as ODM's
    merge_dems(tiles, tmp_path / "plain.tif", ownership=own, block_size=64)
    with rasterio.open(tmp_path / "plain.tif") as ds:
        assert ds.count == 1


def test_threads_leave_heights_and_figures_unchanged(tmp_path: Path) -> None:
    """Edge distances and overlap samples are read on the merge's threads, blocks through one
    or more shared handles per source: one thread, three (one handle) or four (two handles)
    give the same DSM (both bands, every overview) and the same offsets, medians and seams."""
    surf = _surface()
    cols = {"a": (0, 110), "b": (80, 190), "c": (160, 240)}
    inputs = {}
    for n, (sid, (c0, c1)) in enumerate(cols.items()):
        z = surf[:, c0:c1] + np.float32(0.3 * n)
        z[n * 20 : n * 20 + 15, 5:25] = DEM_NODATA  # a hole in each
        flags = np.ones(z.shape, dtype=bool)
        flags[100:120, 10:30] = False
        inputs[sid] = _write_measured(tmp_path / f"{sid}.tif", z, flags, c0)
    own = Ownership.from_cameras(
        [(LEFT + RES * (c0 + c1) / 2, TOP - 40, s) for s, (c0, c1) in cols.items()]
    )
    one = merge_dems(inputs, tmp_path / "one.tif", ownership=own, block_size=64, workers=1)
    for n in (3, 4):
        other = merge_dems(inputs, tmp_path / f"{n}.tif", ownership=own, block_size=64, workers=n)
        assert one.vertical_offsets_m == other.vertical_offsets_m
        assert one.overlap_median_diff_m == other.overlap_median_diff_m
        assert one.overlap_seams == other.overlap_seams and len(one.overlap_seams) == 2
        with rasterio.open(tmp_path / "one.tif") as d1, rasterio.open(tmp_path / f"{n}.tif") as dn:
            assert d1.count == 2 and d1.overviews(1) == dn.overviews(1)
            assert np.array_equal(d1.read(), dn.read())
            for f in d1.overviews(1):
                shape = (2, -(-H // f), -(-W // f))
                assert np.array_equal(d1.read(out_shape=shape), dn.read(out_shape=shape))


def test_direct_decimated_reads_sample_the_cells_gdals_warper_samples(tmp_path: Path) -> None:
    """The overlap samples of DSMs on the grid are sliced from full-resolution strips instead of
    warped: for odd and even factors, windows off the factor's lattice and a source at an odd
    offset, the same values, validity and window as the warped coarse read."""
    from rasterio.enums import Resampling

    from prefect_odm.merge.overlap_sampling import _STRIP_ROWS, read_decimated_direct
    from prefect_odm.merge.sources import SourceReader, plan_grid

    rng = np.random.default_rng(3)
    rows, cols = _STRIP_ROWS + 77, 301  # more rows than one strip
    z = rng.normal(150.0, 5.0, (rows, cols)).astype(np.float32)
    z[rng.random(z.shape) < 0.1] = DEM_NODATA
    flags = rng.random(z.shape) < 0.7
    inputs = {
        "a": _write_measured(tmp_path / "a.tif", z, flags, 0),
        "b": _write_measured(tmp_path / "b.tif", z[::-1].copy(), flags, 37),
    }
    plan = plan_grid(inputs, resolution_m=None, crs_epsg=None, value_bands=2)
    reader = SourceReader(plan, Resampling.nearest)
    try:
        src = plan.sources[1]
        assert (src.col_off, src.warp) == (37, False)
        for factor in (2, 3, 4, 5, 8):
            for window in [src.window, (3, 40, rows - 10, 200), (101, 38, 333, 17)]:
                got = read_decimated_direct(reader, src, window, factor)
                want = reader.read_decimated(src, window, factor)
                assert got[2] == want[2], (factor, window)
                assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])
    finally:
        reader.close()
