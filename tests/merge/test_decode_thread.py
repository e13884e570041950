"""LAZ inputs decoded in a thread (``merge/decode_thread.py``): the chunks are laspy's own
(several short lazrs calls per chunk), a truncated input is raised in the merge's thread as an
error naming why, and the thread is joined whether the chunks were all read or not."""

from __future__ import annotations

import threading

import laspy
import numpy as np
import pytest

from prefect_odm.merge.decode_thread import DecodeThread
from tests.merge.test_decode_ahead import _tiles


def _decode_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "laz-decode"]


@pytest.mark.parametrize("step", [1_000, 5_000, 7_777])
def test_the_chunks_are_laspys_own(tmp_path, step):
    inputs, _ = _tiles(tmp_path, 23_456)
    paths = [inputs[k] for k in sorted(inputs)]
    with DecodeThread(paths, 5_000, 34, step_points=step) as decoder:
        for number, path in enumerate(paths):
            with laspy.open(path) as reader:
                header = reader.header
                expected = [c.array.copy() for c in reader.chunk_iterator(5_000)]
            got = [c.array.copy() for c in decoder.chunks(number, header)]
            assert [len(c) for c in got] == [5_000] * 4 + [3_456]
            assert all(np.array_equal(a, b) for a, b in zip(got, expected, strict=True))
    assert _decode_threads() == []


def test_a_truncated_input_is_raised_and_the_thread_joined(tmp_path):
    inputs, _ = _tiles(tmp_path, 30_000)
    paths = [inputs[k] for k in sorted(inputs)]
    data = paths[1].read_bytes()
    paths[1].write_bytes(data[: len(data) // 2])
    with laspy.open(paths[0]) as reader:
        header = reader.header
    with pytest.raises(OSError) as caught, DecodeThread(paths, 4_000, 34) as decoder:
        assert sum(len(c) for c in decoder.chunks(0, header)) == 30_000
        for _ in decoder.chunks(1, header):
            pass
    assert "\n" not in str(caught.value)
    assert _decode_threads() == []


def test_a_merge_that_stops_early_joins_the_thread(tmp_path):
    inputs, _ = _tiles(tmp_path, 30_000)
    paths = [inputs[k] for k in sorted(inputs)]
    with laspy.open(paths[0]) as reader:
        header = reader.header
    with DecodeThread(paths, 1_000, 34) as decoder:
        next(iter(decoder.chunks(0, header)))
    assert _decode_threads() == []
    with pytest.raises(ValueError, match="input 2 asked for"):
        with DecodeThread(paths, 1_000, 34) as decoder:
            next(iter(decoder.chunks(2, header)))
    assert _decode_threads() == []
