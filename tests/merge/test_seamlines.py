"""Least-cost seamlines and seam colour correction on synthetic submodels."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import laspy
import numpy as np
import pyproj
import rasterio
from scipy import ndimage

from prefect_odm.grid import Block, Grid
from prefect_odm.merge import merge_dems, merge_orthophotos, merge_point_clouds
from prefect_odm.merge.balance import seam_colour_offsets
from prefect_odm.merge.seam_methods import seam_method
from prefect_odm.merge.seamline_rasters import merge_seamlines
from prefect_odm.merge.seamlines import (
    CoarseLayers,
    LabelOwners,
    least_cost_labels,
    ownership_labels,
)
from prefect_odm.models import MergeOptions
from prefect_odm.ownership import Ownership

from .conftest import CAMERAS, EPSG, LEFT, TOP, ground_texture, write_dem, write_rgba

GRID = Grid(left=0.0, top=40.0, resolution_m=0.5, width=120, height=80)
"""A 60 m x 40 m coarse grid; submodel a owns x < 30 m, b owns x > 30 m by the ownership."""
OWN = Ownership.from_cameras([(10.0, 20.0, "a"), (50.0, 20.0, "b")])


def _xy() -> tuple[np.ndarray, np.ndarray]:
    return np.meshgrid(GRID.xs(), GRID.ys())


def _seam_cells(labels: np.ndarray) -> np.ndarray:
    """Cells with a differently labelled 4-neighbour."""
    seam = np.zeros(labels.shape, dtype=bool)
    h = labels[:, :-1] != labels[:, 1:]
    v = labels[:-1, :] != labels[1:, :]
    seam[:, :-1] |= h
    seam[:, 1:] |= h
    seam[:-1, :] |= v
    seam[1:, :] |= v
    return seam


def _ground(seed: int = 3) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x, y = _xy()
    base = 120 + 30 * np.sin(x / 3.0) * np.cos(y / 4.0)
    return np.stack([base, base * 0.9, base * 0.8]) + rng.normal(0, 2, (3, *x.shape))


def test_the_seam_goes_around_a_building_on_the_bisector() -> None:
    x, y = _xy()
    building = (np.abs(x - 30) < 6) & (np.abs(y - 20) < 6)
    z = np.where(building, 112.0, 100.0).astype(np.float32)
    rgb = _ground().astype(np.float32)
    layers = CoarseLayers(GRID, rgb={"a": rgb, "b": rgb.copy()}, dsm={"a": z, "b": z.copy()})
    before, _ = ownership_labels(OWN, layers)
    assert (_seam_cells(before) & building).sum() > 20  # the bisector crosses the building
    after = least_cost_labels(OWN, layers).labels
    assert not (_seam_cells(after) & building).any()
    assert set(np.unique(after)) == {0, 1}
    assert (after[:, :20] == 0).all() and (after[:, -20:] == 1).all()


def test_the_seam_avoids_what_the_submodels_disagree_on() -> None:
    x, _ = _xy()
    a = _ground().astype(np.float32)
    b = a.copy()
    b[:, (x > 26) & (x < 33)] += 60  # a misplaced road along the bisector, seen by b only
    b[:, (x > 26) & (x < 33) & (_xy()[1] < 4)] -= 60  # except one crossing near the bottom
    layers = CoarseLayers(GRID, rgb={"a": a, "b": b}, dsm={})
    labels = least_cost_labels(OWN, layers).labels
    seam = _seam_cells(labels)
    diff = np.abs(a - b).mean(axis=0)
    before, _ = ownership_labels(OWN, layers)
    assert diff[_seam_cells(before)].mean() > 40
    assert diff[seam].mean() < 10


def test_seam_colour_offsets_close_a_gain_offset_and_vignetting_step() -> None:
    x, y = _xy()
    ground = _ground()
    vignette = 1.0 - 0.25 * ((x - 50.0) ** 2 + (y - 20.0) ** 2) / 900.0
    a = ground.astype(np.float32)
    b = (ground * 1.15 * vignette + 15.0).astype(np.float32)
    labels = np.where(x < 30, 0, 1).astype(np.int16)
    offsets = seam_colour_offsets(labels, [a, b], GRID.resolution_m)
    corrected = []
    for n, img in enumerate((a, b)):
        off = offsets[n]
        assert off is not None
        full = np.zeros_like(img)
        full[:, off.row_off : off.row_off + off.values.shape[1], off.col_off :][
            :, :, : off.values.shape[2]
        ] = off.values
        corrected.append(img + full)
    seam = _seam_cells(labels)
    before = np.abs(a - b).mean(axis=0)[seam].mean()
    after = np.abs(corrected[0] - corrected[1]).mean(axis=0)[seam].mean()
    assert before > 8
    assert after < 0.25 * before
    # far from the seam each submodel keeps its own colours
    assert np.allclose(corrected[0][:, :, :10], a[:, :, :10])


def test_least_cost_merge_balances_and_is_independent_of_blocks(
    ortho_tiles: Callable, tmp_path: Path
) -> None:
    tiles, _ = ortho_tiles(brighten={"b": 20}, scale=2)
    own = Ownership.from_cameras(CAMERAS)
    opts = MergeOptions(seam_method="least-cost")
    reports = [
        merge_orthophotos(tiles, tmp_path / f"o{n}.tif", ownership=own, options=opts, block_size=b)
        for n, b in enumerate((128, 512))
    ]
    assert reports[0].seam_mean_abs_diff_before > 10
    assert reports[0].seam_mean_abs_diff_after < 3
    with rasterio.open(tmp_path / "o0.tif") as d0, rasterio.open(tmp_path / "o1.tif") as d1:
        assert np.array_equal(d0.read(), d1.read())


def test_least_cost_seam_distances_are_zero_for_the_owner() -> None:
    rgb = _ground().astype(np.float32)
    labels = least_cost_labels(OWN, CoarseLayers(GRID, {"a": rgb, "b": rgb.copy()}, {}))
    out = Grid(left=0.0, top=40.0, resolution_m=0.1, width=600, height=400)
    seams = seam_method("least-cost", OWN, out, seamlines=labels)
    e = seams.seam_distance(Block(0, 0, 400, 600), ["a", "b"])
    assert ((e[0] == 0) | (e[1] == 0)).all()
    x = out.xs()
    assert (e[1][:, x < 20] > 9).all() and (e[0][:, x > 40] > 9).all()
    part = seams.seam_distance(Block(37, 101, 64, 77), ["a", "b"])
    assert np.array_equal(e[:, 37:101, 101:178], part)


def _two_submodels(
    tmp_path: Path, b_moved_m: tuple[float, float] = (0.0, 0.0)
) -> tuple[dict[str, Path], dict[str, Path], Ownership]:
    """A 40 m x 20 m ground at 0.1 m in two overlapping submodels (a: x < 26 m, b: x > 14 m);
    a 6 m x 10 m building of 8 m straddles the ownership seam x = 20 m. DSMs: a at 100 m,
    b at 100.5 m, so the merged DSM tells which submodel a pixel came from. ``b_moved_m``:
    b's products are placed that far east and that much higher (a submodel off by its GPS)."""
    ground = ground_texture(200, 400)
    x = (np.arange(400) + 0.5) * 0.1
    y = (np.arange(200) + 0.5) * 0.1
    gx, gy = np.meshgrid(x, y)
    building = (np.abs(gx - 20) < 3) & (np.abs(gy - 10) < 5)
    ortho, dsm = {}, {}
    for sid, (c0, c1), base in (("a", (0, 260), 100.0), ("b", (140, 400), 100.5)):
        dx, dz = b_moved_m if sid == "b" else (0.0, 0.0)
        ortho[sid] = write_rgba(
            tmp_path / f"{sid}.tif", ground[:, :, c0:c1], LEFT + c0 * 0.1 + dx, TOP, 0.1
        )
        z = (base + dz + 8.0 * building[:, c0:c1]).astype(np.float32)
        dsm[sid] = write_dem(tmp_path / f"{sid}_dsm.tif", z, LEFT + c0 * 0.1 + dx, TOP, 0.1)
    own = Ownership.from_cameras([(LEFT + 8.0, TOP - 10.0, "a"), (LEFT + 32.0, TOP - 10.0, "b")])
    return ortho, dsm, own


def test_orthophoto_dem_and_point_cloud_share_the_least_cost_labels(tmp_path: Path) -> None:
    ortho, dsm, own = _two_submodels(tmp_path)
    labels = merge_seamlines(own, orthophotos=ortho, dsms=dsm, crs_epsg=EPSG, colour_balance=True)
    opts = MergeOptions(seam_method="least-cost", remove_vertical_offsets=False, dem_feather_m=2.0)
    merge_dems(dsm, tmp_path / "dsm.tif", ownership=own, options=opts, seamlines=labels)
    with rasterio.open(tmp_path / "dsm.tif") as ds:
        z, tf = ds.read(1), ds.transform
    gx, gy = np.meshgrid(
        tf.c + (np.arange(z.shape[1]) + 0.5) * tf.a, tf.f + (np.arange(z.shape[0]) + 0.5) * tf.e
    )
    owner = labels.label_of_points(gx, gy)
    roof = z > 105
    # the roof comes from one submodel only: no seam (no blend of 108 and 108.5) across it
    # (its edge, within the 1 m blending band of a seam that runs along it, may blend)
    inner = ndimage.binary_erosion(roof, iterations=10)
    assert inner.sum() > 2000
    assert np.unique(np.round(z[inner], 3)).size == 1
    # the DSM's owner away from seams is the label's owner
    seams = seam_method(
        "least-cost", own, Grid(tf.c, tf.f, tf.a, z.shape[1], z.shape[0]), seamlines=labels
    )
    e = seams.seam_distance(Block(0, 0, z.shape[0], z.shape[1]), ["a", "b"])
    far = (e.max(axis=0) > 6.0) & (owner >= 0) & ~roof
    assert far.sum() > 10_000
    expected = np.where(owner == 0, 100.0, 100.5)
    assert np.allclose(z[far], expected[far], atol=1e-4)
    # and the point cloud keeps each point where the labels say its submodel owns it
    rng = np.random.default_rng(5)
    clouds = {}
    for sid, (x0, x1) in (("a", (0.0, 26.0)), ("b", (14.0, 40.0))):
        px, py = LEFT + rng.uniform(x0, x1, 20_000), TOP - rng.uniform(0, 20, 20_000)
        clouds[sid] = _write_laz(tmp_path / f"{sid}.laz", px, py, 1 if sid == "a" else 2)
    merge_point_clouds(clouds, tmp_path / "m.laz", ownership=own, seamlines=labels)
    las = laspy.read(tmp_path / "m.laz")
    lab = LabelOwners(labels, own).label_of_points(np.asarray(las.x), np.asarray(las.y))
    assert np.array_equal(lab + 1, np.asarray(las.intensity))
    moved = lab != own.label_of_points(np.asarray(las.x), np.asarray(las.y))
    assert moved.sum() > 100  # the labels, not the nearest camera, decided


def _write_laz(path: Path, x: np.ndarray, y: np.ndarray, tag: int) -> Path:
    header = laspy.LasHeader(point_format=3, version="1.2")
    header.scales = np.array([0.001, 0.001, 0.001])
    header.offsets = np.array([np.floor(x.min()), np.floor(y.min()), 0.0])
    header.add_crs(pyproj.CRS.from_epsg(EPSG))
    las = laspy.LasData(header)
    las.x, las.y, las.z = x, y, np.full(x.size, 100.0)
    las.intensity = np.full(x.size, tag, np.uint16)
    las.write(path)
    return path


def test_seamlines_are_cut_between_the_products_where_the_alignment_puts_them(
    tmp_path: Path,
) -> None:
    """b's products lie 3 m east and 1.5 m high; given the alignment that moves them back, the
    seamlines are those of products that line up (the building avoided), and without it they
    are not."""
    from prefect_odm.align.similarity import RasterCorrection

    (tmp_path / "true").mkdir()
    (tmp_path / "off").mkdir()
    ortho, dsm, own = _two_submodels(tmp_path / "true")
    reference = merge_seamlines(
        own, orthophotos=ortho, dsms=dsm, crs_epsg=EPSG, colour_balance=True
    ).labels
    ortho_off, dsm_off, _ = _two_submodels(tmp_path / "off", b_moved_m=(3.0, 1.5))
    back = RasterCorrection(
        affine=((1.0, 0.0, -3.0), (0.0, 1.0, 0.0)), lean_m_per_m=(0.0, 0.0),
        reference_height_m=0.0, z_scale=1.0, z_plane=(-1.5, 0.0, 0.0),
    )  # fmt: skip
    aligned = merge_seamlines(
        own, orthophotos=ortho_off, dsms=dsm_off, crs_epsg=EPSG, colour_balance=True,
        alignment={"b": back},
    ).labels  # fmt: skip
    unaligned = merge_seamlines(
        own, orthophotos=ortho_off, dsms=dsm_off, crs_epsg=EPSG, colour_balance=True
    ).labels
    assert aligned.shape == reference.shape
    assert np.mean(aligned == reference) > 0.999
    common = tuple(
        slice(0, min(a, b)) for a, b in zip(unaligned.shape, reference.shape, strict=True)
    )
    assert np.mean(unaligned[common] != reference[common]) > 0.01
