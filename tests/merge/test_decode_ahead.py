"""Worker processes (``merge/decode_ahead.py``, ``merge/encode_ahead.py``): the chunks are
laspy's own, the merged files (COPC and plain LAZ) are the same bytes as in process, the COPC one
read back complete by laspy's CopcReader; a broken input, or a file the compression worker cannot
write, is a one-line error saying why, and no shared memory is left behind."""

from __future__ import annotations

from multiprocessing.shared_memory import SharedMemory
from pathlib import Path
from typing import Any

import laspy
import lazrs
import numpy as np
import pyproj
import pytest

from prefect_odm.errors import MergeError
from prefect_odm.merge import decode_ahead, encode_ahead, merge_point_clouds
from prefect_odm.merge.decode_ahead import DecodeAhead, read_chunks
from prefect_odm.merge.encode_ahead import EncodeAhead
from prefect_odm.ownership import Ownership

TILE_M = 100.0
STEP_M = 80.0  # tiles overlap by 20 m


def _tiles(folder: Path, per_tile: int) -> tuple[dict[str, Path], Ownership]:
    """Four format-3 LAZ tiles in a 2 x 2 layout (overlapping), and their ownership."""
    rng = np.random.default_rng(3)
    inputs, cams = {}, []
    for n, (row, col) in enumerate([(0, 0), (0, 1), (1, 0), (1, 1)]):
        x0, y0 = 600_000.0 + col * STEP_M, 4_100_000.0 + row * STEP_M
        header = laspy.LasHeader(point_format=3, version="1.2")
        header.scales = np.array([0.001, 0.001, 0.001])
        header.offsets = np.array([x0, y0, 0.0])
        header.add_crs(pyproj.CRS.from_epsg(32633))
        las = laspy.LasData(header)
        las.x = x0 + rng.uniform(0, TILE_M, per_tile)
        las.y = y0 + rng.uniform(0, TILE_M, per_tile)
        las.z = 40 + rng.normal(0, 2, per_tile)
        las.red = rng.integers(0, 65535, per_tile, dtype=np.uint16)
        las.intensity = rng.integers(0, 4000, per_tile, dtype=np.uint16)
        sid = f"submodel_{n:04d}"
        inputs[sid] = folder / f"{sid}.laz"
        las.write(str(inputs[sid]))
        cams.append((x0 + TILE_M / 2, y0 + TILE_M / 2, sid))
    return inputs, Ownership.from_cameras(cams)


@pytest.fixture
def made(monkeypatch) -> list[str]:
    """The names of the shared-memory segments the workers' parents make (other processes, such
    as a benchmark running beside the tests, make theirs too)."""
    names: list[str] = []

    class Recorded(SharedMemory):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            names.append(self.name)

    monkeypatch.setattr(decode_ahead, "SharedMemory", Recorded)
    monkeypatch.setattr(encode_ahead, "SharedMemory", Recorded)
    return names


def _left(names: list[str]) -> list[str]:
    """Those of ``names`` still in /dev/shm."""
    return [n for n in names if (Path("/dev/shm") / n.lstrip("/")).exists()]


def test_the_chunks_are_laspys_own(tmp_path, made):
    inputs, _ = _tiles(tmp_path, 23_456)
    paths = [inputs[k] for k in sorted(inputs)]
    with DecodeAhead(paths, 5_000, 34) as decoder:
        assert len(_left(made)) == 2  # its two slots
        for number, path in enumerate(paths):
            with laspy.open(path) as reader:
                header = reader.header
                expected = [c.array.copy() for c in reader.chunk_iterator(5_000)]
            got = [c.array.copy() for c in decoder.chunks(number, header)]
            assert [len(c) for c in got] == [5_000] * 4 + [3_456]
            assert all(np.array_equal(a, b) for a, b in zip(got, expected, strict=True))
    assert decoder.worker_peak_mib > 0
    assert len(made) == 2 and _left(made) == []


def test_the_chunks_read_in_process_are_laspys_own(tmp_path):
    inputs, _ = _tiles(tmp_path, 23_456)
    path = inputs[sorted(inputs)[0]]
    with laspy.open(path) as reader:
        expected = [c.array.copy() for c in reader.chunk_iterator(5_000)]
    got, bases = [], set()
    for chunk in read_chunks(path, 5_000):
        got.append(chunk.array.copy())
        bases.add(chunk.array.__array_interface__["data"][0])
    assert [len(c) for c in got] == [5_000] * 4 + [3_456]
    assert all(np.array_equal(a, b) for a, b in zip(got, expected, strict=True))
    assert len(bases) == 1  # one buffer for every chunk


def test_a_truncated_input_read_in_process_is_named(tmp_path):
    inputs, owners = _tiles(tmp_path, 30_000)
    sid = sorted(inputs)[1]
    data = inputs[sid].read_bytes()
    inputs[sid].write_bytes(data[: len(data) // 2])
    with pytest.raises(MergeError, match=f"input {sid} .* cannot be read"):
        merge_point_clouds(
            inputs, tmp_path / "out.copc.laz", ownership=owners, point_cloud_format="copc"
        )
    assert not (tmp_path / "out.copc.laz").exists()


@pytest.mark.parametrize("point_cloud_format", ["copc", "laz"])
def test_the_merge_decoded_ahead_is_the_same_file(tmp_path, point_cloud_format):
    inputs, owners = _tiles(tmp_path, 30_000)
    suffix = ".copc.laz" if point_cloud_format == "copc" else ".laz"
    files = {}
    for ahead in (False, True):
        out = tmp_path / f"ahead_{ahead}{suffix}"
        report = merge_point_clouds(
            inputs,
            out,
            ownership=owners,
            chunk_points=7_000,
            point_cloud_format=point_cloud_format,  # type: ignore[arg-type]
            workers=ahead,
        )
        files[ahead] = out.read_bytes()
    assert files[True] == files[False]
    assert 0 < report.points_kept < report.points_in == 120_000
    if point_cloud_format == "copc":
        with laspy.CopcReader.open(str(tmp_path / "ahead_True.copc.laz")) as reader:
            nodes = reader.root_page.entries
            assert sum(e.point_count for e in nodes.values()) == report.points_kept
            points = reader.query()
        assert len(points) == report.points_kept


def test_a_broken_input_is_named_and_nothing_is_left(tmp_path, made):
    inputs, owners = _tiles(tmp_path, 20_000)
    broken = inputs["submodel_0002"]
    data = broken.read_bytes()
    broken.write_bytes(data[: len(data) // 2])  # the header stays, half the points are gone
    with pytest.raises(MergeError) as err:
        merge_point_clouds(
            inputs,
            tmp_path / "m.copc.laz",
            ownership=owners,
            chunk_points=6_000,
            point_cloud_format="copc",
            workers=True,
        )
    message = str(err.value)
    assert "submodel_0002" in message and str(broken) in message and "\n" not in message
    assert not (tmp_path / "m.copc.laz").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith((".m.", "prefect-odm-spill"))]
    assert len(made) == 2 and _left(made) == []


def test_a_compression_worker_that_cannot_write_says_why(tmp_path, made):
    vlr = lazrs.LazVlr.new_for_compression(7, 0, True)
    encoder = EncodeAhead(tmp_path / "missing" / "m.copc.laz", 375, vlr)
    with pytest.raises(OSError, match="FileNotFoundError"):
        encoder.compress_chunks([np.zeros(36 * 10, dtype=np.uint8)])
        encoder.done()
    encoder.close()
    assert len(made) == 1 and _left(made) == []
