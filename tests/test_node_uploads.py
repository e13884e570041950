"""How an upload is cut into requests (``prefect_odm.nodes.uploads.upload_batches``)."""

from __future__ import annotations

import pytest

from prefect_odm.nodes.uploads import local_sizes, upload_batches

FILES = [f"/survey/IMG_{i:04d}.JPG" for i in range(167)]


@pytest.mark.parametrize(
    ("n", "parallel", "most", "sizes"),
    [
        (0, 4, 8, []),
        (1, 4, 8, [1]),
        (18, 4, 8, [5, 5, 5, 3]),  # a small task: one request per connection
        (18, 2, 4, [4, 4, 4, 4, 2]),
        (167, 4, 8, [8] * 20 + [7]),  # a large one: requests of at most 8 files
        (5, 1, 1, [1] * 5),  # one file per request, as before
    ],
)
def test_batches_keep_order_and_hold_every_file_once(
    n: int, parallel: int, most: int, sizes: list[int]
) -> None:
    batches = upload_batches(FILES[:n], parallel, most)
    assert [len(b) for b in batches] == sizes
    assert [f for b in batches for f in b] == FILES[:n]


@pytest.mark.parametrize(
    ("n", "parallel", "size_bytes", "sizes"),
    [
        (150, 2, 4_096, [75, 75]),  # small images: one request per connection, any count
        (167, 4, 4_096, [42, 42, 42, 41]),
        (20, 2, 8 << 20, [8, 8, 4]),  # large ones: requests of 8, as without sizes
        (20, 2, 1 << 20, [10, 10]),  # 10 MiB per request at most: 16 allowed, 10 per connection
        (3, 1, 40 << 20, [3]),  # above the budget: the 8 files a batch takes whatever their size
    ],
)
def test_batches_of_small_files_fill_the_byte_budget(
    n: int, parallel: int, size_bytes: int, sizes: list[int]
) -> None:
    budget = 16 << 20
    batches = upload_batches(FILES[:n], parallel, 8, [size_bytes] * n, budget)
    assert [len(b) for b in batches] == sizes
    assert [f for b in batches for f in b] == FILES[:n]
    assert all(len(b) <= 8 or len(b) * size_bytes <= budget for b in batches)


def test_without_sizes_or_budget_batches_are_counted_in_files() -> None:
    assert [len(b) for b in upload_batches(FILES[:20], 2, 8, None, 16 << 20)] == [8, 8, 4]
    assert [len(b) for b in upload_batches(FILES[:20], 2, 8, [1] * 20, 0)] == [8, 8, 4]


def test_sizes_are_read_for_local_files_only(tmp_path) -> None:
    a, b = tmp_path / "a.jpg", tmp_path / "b.jpg"
    a.write_bytes(b"x" * 10)
    b.write_bytes(b"x" * 3)
    assert local_sizes([str(a), f"file://{b}"]) == [10, 3]
    assert local_sizes([str(a), "s3://bucket/b.jpg"]) is None
    assert local_sizes([str(a), str(tmp_path / "missing.jpg")]) is None
