"""Point-cloud merge: ownership cropping, streaming, exact header and CRS."""

from __future__ import annotations

from pathlib import Path

import laspy
import numpy as np
import pyproj
import pytest
from numpy.typing import NDArray

from prefect_odm.errors import MergeError
from prefect_odm.merge import merge_point_clouds
from prefect_odm.ownership import Ownership

from .conftest import CAMERAS, LEFT, TOP

REFERENCE = (
    Path(__file__).resolve().parents[2]
    / ".."
    / "shared"
    / "data"
    / "brighton_beach_1600"
    / "reference"
    / "model.laz"
)
OWNERSHIP = Ownership.from_cameras(CAMERAS)
TAG = {"a": 1, "b": 2, "c": 3}


def _write(
    path: Path,
    x: NDArray,
    y: NDArray,
    z: NDArray,
    tag: int,
    fmt: int = 3,
    epsg: int = 32615,
    scale: float = 0.001,
) -> Path:
    header = laspy.LasHeader(point_format=fmt, version="1.2")
    header.scales = np.array([scale, scale, 0.001])
    header.offsets = np.array([np.floor(x.min()), np.floor(y.min()), 0.0])
    header.add_crs(pyproj.CRS.from_epsg(epsg))
    las = laspy.LasData(header)
    las.x, las.y, las.z = x, y, z
    las.intensity = np.full(len(x), tag * 100, np.uint16)
    if "user_data" in las.point_format.dimension_names:
        las.user_data = np.full(len(x), tag, np.uint8)
    las.write(path)
    return path


def _tiles(tmp_path: Path, n: int = 60_000, fmt_b: int = 3) -> dict[str, Path]:
    rng = np.random.default_rng(3)
    spans = {"a": (0, 24, 0, 30), "b": (16, 40, 0, 18), "c": (16, 40, 12, 30)}  # x0,x1,y0,y1 m
    out = {}
    for sid, (x0, x1, y0, y1) in spans.items():
        x = LEFT + rng.uniform(x0, x1, n)
        y = TOP - rng.uniform(y0, y1, n)
        z = 150 + rng.normal(0, 2, n)
        out[sid] = _write(tmp_path / f"{sid}.laz", x, y, z, TAG[sid], fmt_b if sid == "b" else 3)
    return out


def test_points_kept_only_in_their_owners_area(tmp_path: Path) -> None:
    tiles = _tiles(tmp_path, fmt_b=1)
    out = tmp_path / "merged.laz"
    report = merge_point_clouds(tiles, out, ownership=OWNERSHIP, chunk_points=7_000)
    las = laspy.read(out)
    owner = OWNERSHIP.owner_of_points(np.asarray(las.x), np.asarray(las.y))
    tag = np.asarray(las.intensity) // 100
    assert np.array_equal(np.asarray([TAG[o] for o in owner]), tag)
    kept = {p.submodel_id: p.points_kept for p in report.per_submodel}
    assert len(las.points) == report.points_kept == sum(kept.values())
    for sid, n in kept.items():
        assert int((tag == TAG[sid]).sum()) == n
        assert 0 < n < 60_000
    assert report.points_in == 180_000
    # header: exact count, bounds equal to the points' extremes, CRS
    h = las.header
    assert h.point_count == len(las.points)
    assert np.array_equal(h.mins, [las.x.min(), las.y.min(), las.z.min()])
    assert np.array_equal(h.maxs, [las.x.max(), las.y.max(), las.z.max()])
    assert h.parse_crs().to_epsg() == 32615
    assert h.point_format.id == 3  # formats 3 and 1 -> 3, common dimensions copied


def test_input_in_another_crs_is_reprojected(tmp_path: Path) -> None:
    tiles = _tiles(tmp_path)
    b = laspy.read(tiles["b"])
    lon, lat = pyproj.Transformer.from_crs(32615, 4326, always_xy=True).transform(
        np.asarray(b.x), np.asarray(b.y)
    )
    tiles["b"] = _write(tmp_path / "b_geo.laz", lon, lat, np.asarray(b.z), 2, epsg=4326, scale=1e-8)
    report = merge_point_clouds(tiles, tmp_path / "m.laz", ownership=OWNERSHIP, crs_epsg=32615)
    assert report.reprojected == ("b",)
    las = laspy.read(tmp_path / "m.laz")
    assert las.header.parse_crs().to_epsg() == 32615
    mine = np.asarray(las.intensity) == 200
    assert mine.sum() == dict((p.submodel_id, p.points_kept) for p in report.per_submodel)["b"]
    assert las.x[mine].min() >= LEFT + 16 - 0.01 and las.x[mine].max() <= LEFT + 40 + 0.01
    owner = OWNERSHIP.owner_of_points(np.asarray(las.x), np.asarray(las.y))
    assert np.all(owner[mine] == "b")


def test_real_reference_cloud_split_in_two_halves_merges_back(tmp_path: Path) -> None:
    if not REFERENCE.exists():
        pytest.skip(f"reference data not found at {REFERENCE}")
    ref = laspy.read(REFERENCE)
    x = np.asarray(ref.x)
    mid = float(np.median(x))
    halves = {}
    for sid, sel in {"east": x >= mid - 8.0, "west": x < mid + 8.0}.items():
        part = laspy.LasData(
            laspy.LasHeader(point_format=ref.header.point_format, version=ref.header.version)
        )
        part.header.scales, part.header.offsets = ref.header.scales, ref.header.offsets
        part.header.add_crs(ref.header.parse_crs())
        part.points = ref.points[sel].copy()
        halves[sid] = tmp_path / f"{sid}.laz"
        part.write(halves[sid])
    report = merge_point_clouds(halves, tmp_path / "m.laz", ownership=None, chunk_points=200_000)
    merged = laspy.read(tmp_path / "m.laz")
    # each point of the overlap strip was in both halves and is kept exactly once
    assert report.points_in > len(ref.points)
    assert len(merged.points) == len(ref.points) == report.points_kept

    def key(las: laspy.LasData) -> NDArray:  # the same points, in centimetres
        xs = np.rint(np.asarray(las.x) * 100).astype(np.int64) - 57_600_000
        ys = np.rint(np.asarray(las.y) * 100).astype(np.int64) - 518_800_000
        zs = np.rint(np.asarray(las.z) * 100).astype(np.int64)
        return np.sort((xs * 10**6 + ys) * 10**5 + zs)

    assert np.array_equal(key(merged), key(ref))
    # exact bounds (the reference's own header bounds are off by up to half a centimetre)
    assert np.array_equal(merged.header.mins, [merged.x.min(), merged.y.min(), merged.z.min()])
    assert np.array_equal(merged.header.maxs, [merged.x.max(), merged.y.max(), merged.z.max()])
    assert np.allclose(merged.header.mins, [ref.x.min(), ref.y.min(), ref.z.min()], atol=1e-6)
    assert np.allclose(merged.header.maxs, [ref.x.max(), ref.y.max(), ref.z.max()], atol=1e-6)
    assert merged.header.parse_crs().equals(ref.header.parse_crs())


def test_errors(tmp_path: Path) -> None:
    tiles = _tiles(tmp_path, n=1000)
    with pytest.raises(MergeError, match="no point clouds"):
        merge_point_clouds({}, tmp_path / "m.laz", ownership=None)
    with pytest.raises(MergeError, match="own no camera"):
        merge_point_clouds(
            tiles, tmp_path / "m.laz", ownership=Ownership.from_cameras(CAMERAS, only=["a"])
        )
    far = Ownership.from_cameras([(0.0, 0.0, "a"), (1e7, 1e7, "b")])
    # nothing lies near b's camera, a has no points there: a still owns everything -> fine;
    # an ownership where the only inputs own nothing gives an empty result
    empty_owner = Ownership.from_cameras([(LEFT + 1e5, TOP, "a"), (LEFT + 20, TOP - 15, "z")])
    with pytest.raises(MergeError, match="empty"):
        merge_point_clouds({"a": tiles["a"]}, tmp_path / "m.laz", ownership=empty_owner)
    assert not (tmp_path / "m.laz").exists()
    merge_point_clouds({"a": tiles["a"], "b": tiles["b"]}, tmp_path / "m.laz", ownership=far)


def test_cell_owners_give_the_ownership_labels_exactly() -> None:
    from prefect_odm.merge.pointcloud import CellOwners

    rng = np.random.default_rng(5)
    cams = [
        (float(x), float(y), f"s{int(x // 40)}{int(y // 40)}")
        for x, y in rng.uniform(0, 120, (30, 2))
    ]
    own = Ownership.from_cameras(cams)
    cells = CellOwners(own, (0.0, 0.0, 120.0, 120.0), max_cells=400)
    x = rng.uniform(-5, 125, 200_000)  # some outside the table's bounds
    y = rng.uniform(-5, 125, 200_000)
    assert np.array_equal(cells.label_of_points(x, y), own.label_of_points(x, y))
