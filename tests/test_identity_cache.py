"""Unchanged images are not hashed again (issue 14), and a changed one always is."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from prefect_odm.survey.identity_cache import CACHE_FILE_NAME
from prefect_odm.survey.scan import scan_images_with_stats


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    monkeypatch.setenv("PREFECT_ODM_HOME", str(home))
    return home


def test_a_second_scan_reads_no_file_and_gives_the_same_images(
    brighton_images: Path, home: Path
) -> None:
    total = sum(p.stat().st_size for p in brighton_images.iterdir() if p.suffix.lower() == ".jpg")
    first, st1 = scan_images_with_stats(str(brighton_images))
    assert st1.identity_bytes == total
    assert (home / CACHE_FILE_NAME).exists()
    second, st2 = scan_images_with_stats(str(brighton_images))
    # Unchanged files are not opened: identity and header metadata come from the cache.
    assert st2.identity_bytes == 0 and st2.metadata_bytes == 0
    assert second.images == first.images
    assert second.fingerprint == first.fingerprint
    # Without the cache every byte is read again.
    _, st3 = scan_images_with_stats(str(brighton_images), use_identity_cache=False)
    assert st3.identity_bytes == total


def test_a_rewritten_image_is_hashed_again_even_with_its_old_mtime(
    brighton_images: Path, home: Path, tmp_path: Path
) -> None:
    images = tmp_path / "images"
    shutil.copytree(brighton_images, images)
    first, _ = scan_images_with_stats(str(images))
    victim = sorted(images.glob("*.JPG"))[0]
    before = victim.stat()
    data = bytearray(victim.read_bytes())
    data[-100] ^= 0xFF  # same size, new content, inside the entropy-coded data
    victim.write_bytes(bytes(data))
    os.utime(victim, ns=(before.st_atime_ns, before.st_mtime_ns))  # the old mtime back
    second, stats = scan_images_with_stats(str(images))
    assert stats.identity_bytes == victim.stat().st_size  # only the rewritten file
    old = {im.name: im.identity for im in first.images}
    new = {im.name: im.identity for im in second.images}
    changed = [name for name in new if new[name] != old[name]]
    assert changed == [victim.name]
