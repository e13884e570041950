"""How an upload is cut into requests (``prefect_odm.nodes.uploads.upload_batches``)."""

from __future__ import annotations

import pytest

from prefect_odm.nodes.uploads import upload_batches

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
