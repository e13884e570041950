"""An image the engine cannot decode is named in the error (Pillow's own message never names it)."""

from __future__ import annotations

from pathlib import Path

import pytest


def _damaged(brighton_images: Path, tmp_path: Path) -> Path:
    """brighton's DJI_0020.JPG with a stray start-of-frame marker inside its entropy-coded data."""
    data = bytearray((brighton_images / "DJI_0020.JPG").read_bytes())
    middle = len(data) // 2
    data[middle : middle + 4] = b"\xff\xc0\x00\x02"
    path = tmp_path / "DJI_0020.JPG"
    path.write_bytes(bytes(data))
    return path


def test_the_orthophoto_and_direct_stages_name_an_image_that_does_not_decode(
    brighton_images: Path, tmp_path: Path
) -> None:
    from prefect_odm.engine.direct import _grey_small
    from prefect_odm.engine.ortho_blend import load_rgb

    path = _damaged(brighton_images, tmp_path)
    for read in (load_rgb, lambda p: _grey_small(p, 1)):
        with pytest.raises(OSError, match=r"^DJI_0020\.JPG: cannot decode the image \(broken"):
            read(path)
    assert load_rgb(brighton_images / "DJI_0018.JPG").shape == (900, 1600, 3)
