"""Merges with an alignment: transforms applied to rasters and points, a slope never flattened.

Synthetic rasters and clouds (one module under test); the real-run acceptance is in
``tests/test_align_wired.py``.
"""

from __future__ import annotations

from pathlib import Path

import laspy
import numpy as np
import pyproj
import pytest
import rasterio
from numpy.typing import NDArray

from prefect_odm.align import AlignmentOptions, AlignmentReport, Similarity, check_alignment
from prefect_odm.align.residuals import transform_record
from prefect_odm.errors import MergeError
from prefect_odm.merge import DEM_NODATA, merge_dems, merge_point_clouds
from prefect_odm.merge.overlaps import align_from_products, dem_overlaps
from prefect_odm.models import MergeOptions
from prefect_odm.ownership import Ownership

from .conftest import EPSG, LEFT, TOP, write_dem

RES = 0.5
H, W = 160, 240
SLOPE_PER_M = 0.3
"""Ground rising 0.3 m per metre east: 36 m over the 120 m survey."""


def _slope() -> NDArray[np.float32]:
    yy, xx = np.mgrid[0:H, 0:W].astype(np.float64)
    bumps = 1.5 * np.sin(xx / 15) * np.cos(yy / 11)
    return (150 + SLOPE_PER_M * RES * xx + bumps).astype(np.float32)


def _tiles(tmp_path: Path, a: NDArray[np.float32], b: NDArray[np.float32]) -> dict[str, Path]:
    return {
        "a": write_dem(tmp_path / "a.tif", a, LEFT, TOP, RES),
        "b": write_dem(tmp_path / "b.tif", b, LEFT + 90 * RES, TOP, RES),
    }


OWN = Ownership.from_cameras([(LEFT + 30, TOP - 40, "a"), (LEFT + 90, TOP - 40, "b")])


def _report(moves: dict[str, Similarity], centre: tuple[float, float, float]) -> AlignmentReport:
    """An alignment report holding the given similarities (identity elsewhere)."""
    from prefect_odm.align import AlignmentResult

    cams = np.array([centre])
    transforms = [transform_record(sid, moves.get(sid, Similarity()), cams) for sid in ("a", "b")]
    result = AlignmentResult(
        method="cameras", gauge="gps", transforms=transforms, overlaps=[], submodels=[],
        solve_seconds=0.0, iterations=0,
    )  # fmt: skip
    return AlignmentReport(result=result, ground_heights_m={"a": 160.0, "b": 160.0})


def test_flat_plane_per_submodel_on_a_slope_fails_naming_the_submodel(tmp_path: Path) -> None:
    """The `direct` pipeline's DSM is one plane per submodel: on a slope the free offset solve
    took the planes' difference for a bias and flattened the survey. Now it is a named failure."""
    surf = _slope()
    a = np.full((H, 150), np.median(surf[:, :150]), dtype=np.float32)
    b = np.full((H, 150), np.median(surf[:, 90:]), dtype=np.float32)  # 13.5 m higher
    with pytest.raises(MergeError, match=r"submodel|max_dem_offset_m") as err:
        merge_dems(_tiles(tmp_path, a, b), tmp_path / "dsm.tif", ownership=OWN)
    assert "max_dem_offset_m=5" in str(err.value)
    assert not (tmp_path / "dsm.tif").exists()


def test_alignment_from_planes_on_a_slope_fails_its_correction_gate(tmp_path: Path) -> None:
    surf = _slope()
    a = np.full((H, 150), np.median(surf[:, :150]), dtype=np.float32)
    b = np.full((H, 150), np.median(surf[:, 90:]), dtype=np.float32)
    tiles = _tiles(tmp_path, a, b)
    result = align_from_products(tiles, {}, AlignmentOptions())
    failed = {(f.subject, f.figure) for f in check_alignment(result, AlignmentOptions())}
    assert ("a", "max_correction_m") in failed and ("b", "max_correction_m") in failed


def test_aligned_dem_merge_keeps_the_slope_and_has_no_seam_step(tmp_path: Path) -> None:
    """b is off by a known height plane (0.8 m + 0.4 deg); the alignment from the products
    finds it, the merge applies it, and the slope keeps its relief."""
    surf = _slope()
    yy, xx = np.mgrid[0:H, 90:W].astype(np.float64)
    tilt = np.tan(np.radians(0.4)) * RES * (xx - 90)
    a, b = surf[:, :150].copy(), (surf[:, 90:] + 0.8 + tilt).astype(np.float32)
    tiles = _tiles(tmp_path, a, b)
    result = align_from_products(tiles, {}, AlignmentOptions())
    report = AlignmentReport(result=result)
    assert check_alignment(result, AlignmentOptions()) == []
    merged = merge_dems(tiles, tmp_path / "dsm.tif", ownership=OWN, alignment=report)
    assert merged.heights_from_alignment and set(merged.vertical_offsets_m.values()) == {0.0}
    steps = [
        float(np.median(o.dz)) for o in dem_overlaps(tiles, corrections=report.raster_corrections())
    ]
    print(f"overlap median step after alignment: {steps} m")
    assert all(abs(s) < 0.02 for s in steps)
    with rasterio.open(tmp_path / "dsm.tif") as ds:
        z = ds.read(1, masked=True)
    relief = float(z.max() - z.min())
    truth = float(surf.max() - surf.min())
    print(f"merged DSM range {relief:.2f} m, truth {truth:.2f} m")
    assert abs(relief - truth) < 0.05 * truth


def test_identity_alignment_leaves_dem_and_points_byte_identical(tmp_path: Path) -> None:
    surf = _slope()
    tiles = _tiles(tmp_path, surf[:, :150].copy(), surf[:, 90:].copy())
    ident = _report({}, (LEFT + 60, TOP - 40, 200.0))
    opts = MergeOptions(remove_vertical_offsets=False)
    merge_dems(tiles, tmp_path / "plain.tif", ownership=OWN, options=opts)
    merge_dems(tiles, tmp_path / "ident.tif", ownership=OWN, options=opts, alignment=ident)
    with rasterio.open(tmp_path / "plain.tif") as p, rasterio.open(tmp_path / "ident.tif") as q:
        assert np.array_equal(p.read(1), q.read(1))
    clouds = {sid: _cloud(tmp_path / f"{sid}.laz", x0) for sid, x0 in (("a", 0.0), ("b", 45.0))}
    merge_point_clouds(clouds, tmp_path / "plain.laz", ownership=OWN)
    merge_point_clouds(clouds, tmp_path / "ident.laz", ownership=OWN, alignment=ident)
    assert (tmp_path / "plain.laz").read_bytes() == (tmp_path / "ident.laz").read_bytes()


def _cloud(path: Path, x0: float) -> Path:
    rng = np.random.default_rng(int(x0))
    header = laspy.LasHeader(point_format=3, version="1.2")
    header.scales, header.offsets = np.array([0.001] * 3), np.array([LEFT, TOP - 80, 0.0])
    header.add_crs(pyproj.CRS.from_epsg(EPSG))
    las = laspy.LasData(header)
    n = 5000
    las.x = LEFT + x0 + rng.uniform(0, 75, n)
    las.y = TOP - rng.uniform(0, 80, n)
    las.z = 150 + rng.uniform(0, 5, n)
    las.write(path)
    return path


def test_point_cloud_moved_by_its_transform_while_streamed(tmp_path: Path) -> None:
    clouds = {sid: _cloud(tmp_path / f"{sid}.laz", x0) for sid, x0 in (("a", 0.0), ("b", 45.0))}
    centre = np.array([LEFT + 80, TOP - 40, 152.0])
    move = Similarity.from_parameters(
        np.radians([0.5, 0, 0.2]), np.log(1.001), np.array([1.0, -0.5, 0.3]), centre
    )
    report = _report({"b": move}, tuple(centre))
    merge_point_clouds(clouds, tmp_path / "out.laz", ownership=OWN, alignment=report)
    out = laspy.read(tmp_path / "out.laz")
    src = laspy.read(clouds["b"])
    xyz = move.apply(np.stack([src.x, src.y, src.z], axis=1))
    mine = OWN.label_of_points(xyz[:, 0], xyz[:, 1]) == OWN.submodel_ids.index("b")
    got = np.stack([out.x, out.y, out.z], axis=1)
    got_b = got[OWN.label_of_points(got[:, 0], got[:, 1]) == OWN.submodel_ids.index("b")]
    assert len(got_b) == int(mine.sum())
    expect = np.sort(np.round(xyz[mine], 3).view([("", float)] * 3).ravel())
    actual = np.sort(np.round(got_b, 3).view([("", float)] * 3).ravel())
    assert np.allclose(
        expect.view(float).reshape(-1, 3), actual.view(float).reshape(-1, 3), atol=0.0015
    )
    assert DEM_NODATA == -9999.0
