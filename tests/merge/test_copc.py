"""COPC: the merged brighton cloud written as COPC while it is streamed, read back by laspy's
CopcReader (hierarchy complete, every point once, as many as the plain LAZ merge), every node
decoded by copclib (another LAZ implementation) and inside its octree box, a 10 m box query
served from S3 (moto on loopback) reading a fraction of the file; the spill path forced on small
cells gives a complete tree too."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import copclib
import laspy
import numpy as np
import pytest

from prefect_odm.errors import MergeError
from prefect_odm.merge import merge_point_clouds
from prefect_odm.merge.copc import write_copc
from prefect_odm.merge.octree import LEAF_POINTS, MAX_DEPTH, build_cell, morton

BRIGHTON_LAZ = (
    Path(__file__).resolve().parents[2]
    / ".."
    / "shared"
    / "data"
    / "brighton_beach_1600"
    / "reference"
    / "model.laz"
).resolve()


def _rows(*columns: Any) -> np.ndarray:
    """The points as int64 rows in lexicographic order (a multiset comparable with array_equal)."""
    table = np.column_stack([np.asarray(c, dtype=np.int64) for c in columns])
    return table[np.lexsort(table.T[::-1])]


def _key(las: Any) -> np.ndarray:
    return _rows(las.X, las.Y, las.Z, las.red, las.green, las.blue, las.classification)


class _CountingReader(io.RawIOBase):
    """A read-only stream over an s3fs file that counts the bytes fetched."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.bytes_read = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = 0) -> int:
        return int(self.inner.seek(offset, whence))

    def tell(self) -> int:
        return int(self.inner.tell())

    def readinto(self, buffer: Any) -> int:
        data = self.inner.read(len(buffer))
        buffer[: len(data)] = data
        self.bytes_read += len(data)
        return len(data)


def _quadrants(folder: Path, overlap_m: float = 8.0) -> dict[str, Path]:
    """ODM's brighton cloud cut into four submodels that overlap by ``overlap_m`` (as a split)."""
    ref = laspy.read(str(BRIGHTON_LAZ))
    x, y = np.asarray(ref.x), np.asarray(ref.y)
    mx, my = float(np.median(x)), float(np.median(y))
    half = overlap_m / 2
    out = {}
    for n, (east, north) in enumerate([(0, 0), (1, 0), (0, 1), (1, 1)]):
        sel = (x >= mx - half) if east else (x < mx + half)
        sel &= (y >= my - half) if north else (y < my + half)
        part = laspy.LasData(laspy.LasHeader(point_format=3, version="1.2"))
        part.header.scales, part.header.offsets = ref.header.scales, ref.header.offsets
        part.header.add_crs(ref.header.parse_crs())
        part.points = ref.points[sel].copy()
        out[f"submodel_{n:04d}"] = folder / f"submodel_{n:04d}.laz"
        part.write(str(out[f"submodel_{n:04d}"]))
    return out


@pytest.fixture(scope="module")
def merged_brighton(tmp_path_factory):
    """The four brighton submodels merged twice: as COPC and as the plain LAZ."""
    folder = tmp_path_factory.mktemp("copc-merge")
    inputs = _quadrants(folder)
    copc = merge_point_clouds(
        inputs, folder / "m.copc.laz", ownership=None, point_cloud_format="copc"
    )
    plain = merge_point_clouds(inputs, folder / "m.laz", ownership=None, point_cloud_format="laz")
    return folder / "m.copc.laz", folder / "m.laz", copc, plain


def _check_nodes(path: Path) -> tuple[np.ndarray, int]:
    """Decode every node with copclib, check its count and that its points lie in its box
    (the spec's cube: COPC info centre and halfsize); returns all points' rows and the nodes."""
    with laspy.CopcReader.open(str(path)) as reader:
        info, header = reader.copc_info, reader.header
        counts = {
            (k.level, k.x, k.y, k.z): e.point_count for k, e in reader.root_page.entries.items()
        }
    dtype = header.point_format.dtype()
    files = copclib.FileReader(str(path))
    rows, keys = [], set()
    for node in files.GetAllNodes():
        key = (node.key.d, node.key.x, node.key.y, node.key.z)
        keys.add(key)
        pts = np.frombuffer(bytes(files.GetPointData(node)), dtype=dtype)
        assert pts.size == node.point_count == counts[key]
        side = 2 * info.halfsize / 2 ** key[0]
        low = np.asarray(info.center) - info.halfsize + side * np.asarray(key[1:])
        xyz = np.column_stack(
            [pts[a] * s + o for a, s, o in zip("XYZ", header.scales, header.offsets, strict=True)]
        )
        tol = 1e-6
        assert np.all(xyz >= low - tol) and np.all(xyz <= low + side + tol), key
        rows.append(pts)
    # every node's parent is in the hierarchy (a reader walks down to it from the root)
    assert all((d - 1, x // 2, y // 2, z // 2) in keys for d, x, y, z in keys if d > 0)
    assert keys == set(counts)
    files.Close()
    return np.concatenate(rows), len(keys)


def test_merged_copc_is_complete_and_equal_to_the_plain_merge(merged_brighton):
    copc_path, plain_path, copc, plain = merged_brighton
    assert copc.copc and not plain.copc and copc.point_format == 7 and copc.las_version == "1.4"
    assert copc.points_kept == plain.points_kept == 940_393  # each overlap point kept once
    plain_las = laspy.read(str(plain_path))
    with laspy.CopcReader.open(str(copc_path)) as reader:
        header, info = reader.header, reader.copc_info
        entries = reader.root_page.entries
        assert header.point_count == copc.points_kept
        assert sum(e.point_count for e in entries.values()) == header.point_count
        everything = reader.query()
        assert header.parse_crs().equals(plain_las.header.parse_crs())
    assert np.array_equal(_key(everything), _key(plain_las))
    # COPC info: a cube holding the header bounds, spacing = cube side / 128
    assert np.all(np.asarray(info.center) - info.halfsize <= header.mins)
    assert np.all(np.asarray(info.center) + info.halfsize >= header.maxs)
    assert info.spacing == pytest.approx(2 * info.halfsize / 128)
    # the info VLR first, right after the 375-byte LAS 1.4 header (COPC 1.0 requires it there)
    with copc_path.open("rb") as fh:
        start = fh.read(429)
    assert start[377:381] == b"copc" and int.from_bytes(start[393:395], "little") == 1
    assert start[104] == 7 | 0x80  # point format 7, compressed
    # the root hierarchy page: one 32-byte entry per node, at the offset the info VLR gives
    assert info.hierarchy_root_size == 32 * len(entries)
    with copc_path.open("rb") as fh:
        fh.seek(info.hierarchy_root_offset - 60)  # the EVLR's header precedes its data
        assert (
            fh.read(24)[2:6] == b"copc" and info.hierarchy_root_offset > header.offset_to_point_data
        )
    assert np.allclose(header.mins, plain_las.header.mins) and np.allclose(
        header.maxs, plain_las.header.maxs
    )
    decoded, nodes = _check_nodes(copc_path)
    assert decoded.size == header.point_count
    assert np.array_equal(
        _rows(decoded["X"], decoded["Y"], decoded["Z"]),
        _rows(plain_las.X, plain_las.Y, plain_las.Z),
    )
    levels = {k.level for k in entries}
    print(
        f"\nmerged brighton COPC: {header.point_count:,} points in {nodes} nodes, levels "
        f"{min(levels)}-{max(levels)}, {copc_path.stat().st_size / 1e6:.2f} MB vs plain LAZ "
        f"{plain_path.stat().st_size / 1e6:.2f} MB"
    )


def test_a_10_m_box_query_over_s3_reads_a_fraction(merged_brighton, s3_endpoint):
    import s3fs

    copc_path, plain_path, _, _ = merged_brighton
    fs = s3fs.S3FileSystem()
    fs.mkdir("copc-test")
    fs.put(str(copc_path), "copc-test/model.copc.laz")
    plain = laspy.read(str(plain_path))
    cx, cy = float(np.median(plain.x)), float(np.median(plain.y))
    lo = (cx - 5.0, cy - 5.0, float(plain.z.min()) - 1.0)
    hi = (cx + 5.0, cy + 5.0, float(plain.z.max()) + 1.0)
    inside = (plain.x >= lo[0]) & (plain.x <= hi[0]) & (plain.y >= lo[1]) & (plain.y <= hi[1])
    with fs.open("copc-test/model.copc.laz", "rb", cache_type="none") as remote:
        stream = _CountingReader(remote)
        with laspy.CopcReader(stream, close_fd=False) as reader:
            box = reader.query(laspy.Bounds(mins=np.array(lo), maxs=np.array(hi)))
    assert int(inside.sum()) > 1000
    assert np.array_equal(_key(box), _key(plain[inside]))
    size = copc_path.stat().st_size
    fraction = stream.bytes_read / size
    print(
        f"\n10 m box: {len(box):,} points, {stream.bytes_read:,} of {size:,} bytes read from S3 "
        f"({fraction:.1%})"
    )
    assert fraction < 0.5


def test_spilled_and_split_cells_give_a_complete_tree(tmp_path, monkeypatch):
    """Tiny cells and spill budget: the spill files, the split of oversized cells and the
    ancestors gathered across cells are all used; the tree is still complete and exact."""
    import prefect_odm.merge.copc as copc_module
    import prefect_odm.merge.octree as octree_module
    import prefect_odm.merge.spill as spill_module

    monkeypatch.setattr(octree_module, "CELL_POINTS", 60_000)
    monkeypatch.setattr(copc_module, "CELL_POINTS", 60_000)
    monkeypatch.setattr(spill_module, "SPILL_BUDGET_BYTES", 2 * 2**20)
    out = tmp_path / "spilled.copc.laz"
    assert write_copc(BRIGHTON_LAZ, out, chunk_points=100_000, work=tmp_path) == 940_393
    assert sorted(p.name for p in tmp_path.iterdir()) == ["spilled.copc.laz"]  # spill removed
    decoded, nodes = _check_nodes(out)
    plain = laspy.read(str(BRIGHTON_LAZ))
    assert np.array_equal(
        _rows(decoded["X"], decoded["Y"], decoded["Z"], decoded["red"]),
        _rows(plain.X, plain.Y, plain.Z, plain.red),
    )
    with laspy.CopcReader.open(str(out)) as reader:
        depth = max(k.level for k in reader.root_page.entries)
    print(f"\nspilled: {nodes} nodes, depth {depth}")


def test_cell_build_places_every_point_once_inside_its_node() -> None:
    rng = np.random.default_rng(7)
    n = 300_000
    g = [rng.integers(0, 2**15, n) for _ in range(2)] + [rng.integers(2**14, 2**14 + 64, n)]
    build = build_cell(morton(*g), 0)
    assert np.array_equal(np.sort(build.order), np.arange(n)) and not build.ancestors
    for (level, x, y, z), start, stop in build.nodes:
        idx = build.order[start:stop]
        shift = 15 - level
        assert np.all(g[0][idx] >> shift == x) and np.all(g[1][idx] >> shift == y)
        assert np.all(g[2][idx] >> shift == z)
        assert 0 <= level <= MAX_DEPTH
    sizes = {key: stop - start for key, start, stop in build.nodes}
    parents = {(lv - 1, x // 2, y // 2, z // 2) for lv, x, y, z in sizes if lv > 0}
    leaves = [size for key, size in sizes.items() if key not in parents]
    assert max(leaves) <= LEAF_POINTS


def test_copc_refuses_an_empty_cloud(tmp_path):
    header = laspy.LasHeader(point_format=3, version="1.2")
    empty = laspy.LasData(header)
    src = tmp_path / "empty.laz"
    empty.write(str(src))
    with pytest.raises(MergeError, match="no points"):
        write_copc(src, tmp_path / "empty.copc.laz")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty.laz"]


def test_copc_refuses_points_outside_their_header_bounds(tmp_path):
    las = laspy.read(str(BRIGHTON_LAZ))
    src = tmp_path / "lying.laz"
    las.write(str(src))
    with open(src, "r+b") as fh:  # the header's max x (LAS 1.2 offset 179) 100 m too small
        fh.seek(179)
        fh.write(np.float64(float(las.header.maxs[0]) - 100.0).tobytes())
    with pytest.raises(MergeError, match=r"lying\.laz.*outside the bounds"):
        write_copc(src, tmp_path / "lying.copc.laz")
    assert not (tmp_path / "lying.copc.laz").exists()


def test_the_command_line_and_the_layout_follow_the_point_cloud_format() -> None:
    from prefect_odm.cli.args import build_parser, merge_options
    from prefect_odm.layout import OutputLayout

    parser = build_parser()
    default = merge_options(parser.parse_args(["merge", "odm/", "-o", "out"]))
    plain = merge_options(
        parser.parse_args(["reconstruct", "img/", "-o", "out", "--point-cloud-format", "laz"])
    )
    assert (default.point_cloud_format, plain.point_cloud_format) == ("copc", "laz")
    with pytest.raises(SystemExit):
        parser.parse_args(["merge", "odm/", "-o", "out", "--point-cloud-format", "ept"])
    layout = OutputLayout("out", "f" * 64)
    assert layout.merged_product("point_cloud", "copc").endswith(
        "/merged/odm_georeferenced_model.copc.laz"
    )
    assert layout.merged_product("point_cloud", "laz").endswith(
        "/merged/odm_georeferenced_model.laz"
    )
    assert layout.merged_product("dsm", "copc").endswith("/merged/dsm.tif")


@pytest.mark.parametrize("source_format", [0, 1, 2, 3])
def test_the_fast_conversion_to_copc_formats_equals_laspy_dimension_by_dimension(source_format):
    from prefect_odm.merge.las_points import _copy_dimensions, convert_points

    rng = np.random.default_rng(source_format)
    header = laspy.LasHeader(point_format=source_format, version="1.2")
    header.offsets, header.scales = np.array([500_000.0, 5e6, 0.0]), np.array([0.01] * 3)
    src = laspy.ScaleAwarePointRecord.zeros(5000, header=header)
    raw = src.array.view(np.uint8).reshape(5000, -1)
    raw[:, 12:] = rng.integers(0, 256, raw[:, 12:].shape, dtype=np.uint8)  # every bit set somewhere
    src["scan_angle_rank"] = rng.integers(-90, 91, 5000)
    src.X, src.Y, src.Z = (rng.integers(0, 10**6, 5000) for _ in range(3))
    out_header = laspy.LasHeader(point_format=7 if source_format in (2, 3) else 6, version="1.4")
    out_header.offsets, out_header.scales = np.array([499_990.0, 5e6, 0.0]), header.scales
    fast = convert_points(src, out_header)
    slow = laspy.ScaleAwarePointRecord.zeros(5000, header=out_header)
    _copy_dimensions(src, slow)
    slow.x, slow.y, slow.z = src.x, src.y, src.z
    for name in out_header.point_format.dimension_names:
        assert np.asarray(fast[name]).tobytes() == np.asarray(slow[name]).tobytes(), name
    assert np.allclose(fast.x, src.x) and np.array_equal(fast.X, np.asarray(src.X) + 1000)
