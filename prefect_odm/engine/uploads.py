"""Files a client sends the built-in engine: safe names, where each goes, zip archives.

Task folder layout (``{data_dir}/tasks/{uuid}/``): ``images/`` (the images), extra files at the
top (``gcp_list.txt`` for any GCP ``*.txt``, ``geo.txt``, ``image_groups.txt``, ``align.*``),
``seed.zip`` unpacked there at commit.
"""

from __future__ import annotations

import os
import re
import shutil
import zipfile
from pathlib import Path, PurePosixPath
from typing import IO

from prefect_odm.errors import EngineError

IMAGE_SUFFIXES = frozenset({".jpg", ".jpeg", ".tif", ".tiff", ".png", ".dng", ".raw"})
COPY_CHUNK_BYTES = 1 << 20


def sanitize_upload_name(filename: str | None) -> str:
    """The base name an uploaded file is stored under.

    Folders in the name are dropped (``a/b.jpg`` -> ``b.jpg``); names that try to leave the task
    folder (``..`` parts, absolute paths, drive letters) or are empty are refused.

    Raises:
        EngineError: the name is refused (``noRetry``: sending it again cannot help).
    """
    raw = filename or ""
    text = raw.replace("\\", "/")
    parts = [p for p in text.split("/") if p not in ("", ".")]
    if (
        not parts
        or "\x00" in text
        or text.startswith("/")
        or re.match(r"^[A-Za-z]:", text)
        or any(p == ".." for p in parts)
    ):
        raise EngineError(f"Invalid file name: {raw!r}", no_retry=True)
    name = parts[-1]
    if name.startswith("."):
        raise EngineError(f"Invalid file name: {raw!r}", no_retry=True)
    return name


def route_upload(name: str) -> tuple[str, str]:
    """Where an uploaded file goes: ``(folder relative to the task folder, file name)``.

    Images go to ``images/``; ``seed.zip``, ``geo.txt``, ``image_groups.txt`` and ``align.*``
    keep their names at the top of the task folder; any other ``*.txt`` is the GCP file,
    stored as ``gcp_list.txt`` (ODM's name); anything else goes to the top folder unchanged.
    """
    lower = name.lower()
    suffix = PurePosixPath(lower).suffix
    if suffix in IMAGE_SUFFIXES and not lower.startswith("align."):
        return "images", name
    if lower in ("seed.zip", "geo.txt", "image_groups.txt"):
        return ".", lower
    if lower.startswith("align.") and suffix in (".las", ".laz", ".tif", ".tiff"):
        return ".", lower
    if suffix == ".txt":
        return ".", "gcp_list.txt"
    return ".", name


def unique_path(folder: Path, name: str) -> Path:
    """``folder/name``, or ``folder/stem_N.ext`` with the first free N when it exists."""
    candidate = folder / name
    stem, suffix = os.path.splitext(name)
    n = 1
    while candidate.exists():
        candidate = folder / f"{stem}_{n}{suffix}"
        n += 1
    return candidate


def safe_extract_zip(archive: Path, destination: Path) -> int:
    """Unpack a zip into ``destination``, refusing members that would leave it.

    Returns:
        Number of files written.

    Raises:
        EngineError: the archive is not a zip or holds an unsafe member name.
    """
    root = destination.resolve()
    count = 0
    try:
        with zipfile.ZipFile(archive) as zf:
            for member in zf.infolist():
                target = (root / member.filename).resolve()
                if not (target == root or root in target.parents):
                    raise EngineError(f"Unsafe path in {archive.name}: {member.filename!r}")
                if member.is_dir():
                    target.mkdir(parents=True, exist_ok=True)
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                with zf.open(member) as src, open(target, "wb") as dst:
                    shutil.copyfileobj(src, dst, COPY_CHUNK_BYTES)
                count += 1
    except zipfile.BadZipFile as exc:
        raise EngineError(f"{archive.name} is not a valid zip file") from exc
    return count


def count_images(task_dir: Path) -> int:
    """Number of image files (by suffix, :data:`IMAGE_SUFFIXES`) in ``task_dir/images``."""
    folder = task_dir / "images"
    if not folder.is_dir():
        return 0
    return sum(1 for p in folder.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)


def save_upload(stream: IO[bytes], tmp: Path, *, name: str, limit_mb: float | None) -> None:
    """Copy ``stream`` to ``tmp``, flushed and fsync'ed, refusing files over ``limit_mb`` MiB.

    Raises:
        EngineError: the file is larger than ``limit_mb`` (``noRetry``); ``tmp`` may be left
            partly written (the caller removes it).
    """
    size = 0
    with open(tmp, "wb") as out:
        while chunk := stream.read(COPY_CHUNK_BYTES):
            size += len(chunk)
            if limit_mb is not None and size > limit_mb * 1024 * 1024:
                raise EngineError(f"File too large: {name} is over {limit_mb} MB", no_retry=True)
            out.write(chunk)
        out.flush()
        os.fsync(out.fileno())


def fetch_zip_into(url: str, task_dir: Path) -> int:
    """Download a zip of images from ``url`` and route its files into ``task_dir``.

    Each file goes where :func:`route_upload` says (duplicates renamed ``stem_N.ext``).

    Returns:
        Number of files unpacked.

    Raises:
        EngineError: the URL is not http(s), the download failed or the zip is unsafe.
    """
    import requests

    if not re.match(r"^https?://", url):
        raise EngineError(f"Invalid zipurl: {url}")
    archive = task_dir / ".zipurl.zip"
    try:
        with requests.get(url, stream=True, timeout=60) as res:
            res.raise_for_status()
            with open(archive, "wb") as out:
                for chunk in res.iter_content(COPY_CHUNK_BYTES):
                    out.write(chunk)
    except requests.RequestException as exc:
        raise EngineError(f"Cannot download zipurl: {exc}") from exc
    staging = task_dir / ".zipurl"
    try:
        safe_extract_zip(archive, staging)
        files = [p for p in staging.rglob("*") if p.is_file()]
        for path in files:
            folder_name, target_name = route_upload(path.name)
            folder = task_dir / folder_name
            folder.mkdir(parents=True, exist_ok=True)
            os.replace(path, unique_path(folder, target_name))
    finally:
        archive.unlink(missing_ok=True)
        shutil.rmtree(staging, ignore_errors=True)
    return len(files)
