"""COPC writing: ODM's brighton cloud written as COPC, read back by laspy's CopcReader, a box query
served from S3 (moto on loopback) reading only part of the file."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import laspy
import numpy as np
import pytest

from prefect_odm.errors import MergeError
from prefect_odm.merge.copc import write_copc

BRIGHTON_LAZ = (
    Path(__file__).resolve().parents[2]
    / ".."
    / "shared"
    / "data"
    / "brighton_beach_1600"
    / "reference"
    / "model.laz"
)


def _rows(*columns: Any) -> np.ndarray:
    """The points as int64 rows in lexicographic order (a multiset comparable with array_equal)."""
    table = np.column_stack([np.asarray(c, dtype=np.int64) for c in columns])
    return table[np.lexsort(table.T[::-1])]


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


@pytest.fixture(scope="module")
def brighton_copc(tmp_path_factory):
    out = tmp_path_factory.mktemp("copc") / "model.copc.laz"
    count = write_copc(BRIGHTON_LAZ.resolve(), out)
    return out, count


def test_copc_read_back_complete(brighton_copc):
    path, count = brighton_copc
    plain = laspy.read(str(BRIGHTON_LAZ.resolve()))
    assert count == len(plain.points) == 940_393
    with laspy.CopcReader.open(str(path)) as reader:
        assert reader.header.point_count == count
        assert reader.header.point_format.id == 7  # ODM's format 3 (RGB) as COPC's RGB format
        nodes = reader.root_page.entries
        # hierarchy complete: the nodes' counts add up to the header's, every point once
        assert sum(node.point_count for node in nodes.values()) == count
        assert any(key.level > 0 for key in nodes)
        points = reader.query()
    assert len(points) == count
    got = _rows(points.X, points.Y, points.Z, points.red, points.classification)
    want = _rows(plain.X, plain.Y, plain.Z, plain.red, plain.classification)
    assert np.array_equal(got, want)
    print(
        f"COPC: {count} points in {len(nodes)} nodes, max level {max(k.level for k in nodes)}, "
        f"{path.stat().st_size / 1e6:.2f} MB vs plain LAZ {BRIGHTON_LAZ.resolve().stat().st_size / 1e6:.2f} MB"
    )


def test_copc_box_query_over_s3_reads_a_fraction(brighton_copc, s3_endpoint):
    import s3fs

    path, _ = brighton_copc
    fs = s3fs.S3FileSystem()
    fs.mkdir("copc-test")
    fs.put(str(path), "copc-test/model.copc.laz")
    plain = laspy.read(str(BRIGHTON_LAZ.resolve()))
    cx, cy = float(np.median(plain.x)), float(np.median(plain.y))
    lo = (cx - 5.0, cy - 5.0, float(plain.z.min()) - 1.0)
    hi = (cx + 5.0, cy + 5.0, float(plain.z.max()) + 1.0)
    inside = (plain.x >= lo[0]) & (plain.x <= hi[0]) & (plain.y >= lo[1]) & (plain.y <= hi[1])
    with fs.open("copc-test/model.copc.laz", "rb", cache_type="none") as remote:
        stream = _CountingReader(remote)
        with laspy.CopcReader(stream, close_fd=False) as reader:
            box = reader.query(laspy.Bounds(mins=np.array(lo), maxs=np.array(hi)))
    want = _rows(plain.X[inside], plain.Y[inside], plain.Z[inside])
    got = _rows(box.X, box.Y, box.Z)
    assert int(inside.sum()) > 1000
    assert np.array_equal(got, want)
    size = path.stat().st_size
    fraction = stream.bytes_read / size
    print(
        f"10 m box: {len(box)} points, {stream.bytes_read} of {size} bytes read from S3 ({fraction:.1%})"
    )
    assert fraction < 0.5


def test_copc_refuses_an_empty_cloud(tmp_path):
    header = laspy.LasHeader(point_format=3, version="1.2")
    empty = laspy.LasData(header)
    src = tmp_path / "empty.laz"
    empty.write(str(src))
    with pytest.raises(MergeError, match="no points"):
        write_copc(src, tmp_path / "empty.copc.laz")
    assert not (tmp_path / "empty.copc.laz").exists()
