"""Scan the images of a local folder: one listing with one stat per file, the identity cache
read once, and a full read only of the files it does not know (adapter).

A file the cache knows with the same stat (:mod:`prefect_odm.survey.identity_cache`) takes its
identity and header metadata from there and is not opened. Any other file is read once, whole:
its bytes are hashed (``sha256:<hex>``), its header parsed (:mod:`prefect_odm.survey.exif`), and
its pixels decoded by Pillow, JPEGs at 1/8 scale in grey (libjpeg still reads and
entropy-decodes every byte of the scan, so a damaged or cut-short stream still fails; only the
inverse DCT and colour output are skipped). Images that decoded whole are remembered.
"""

from __future__ import annotations

import hashlib
import io
import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from PIL import Image, JpegImagePlugin

from prefect_odm.errors import ImageHeaderError, InputError, NoImagesError
from prefect_odm.models import ImageMetadata, RejectReason
from prefect_odm.survey.exif import RangeReader, file_range_reader, read_metadata
from prefect_odm.survey.identity_cache import IdentityCache, stat_key

#: File name endings scanned as images (case-insensitive).
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".tif", ".tiff", ".png")
_HASH_CHUNK = 1 << 20
#: Files up to this size are read into memory once (hash, header and decode from one read);
#: larger ones are hashed in chunks and decoded from the file.
WHOLE_READ_MAX_BYTES = 256 * 1024 * 1024
#: Cache writes gathered before one transaction stores them.
_CACHE_BATCH = 2000
#: Unknown files from which a scan reads them in a process per core (the header parse is
#: Python, held by the GIL); below, a pool's start (0.3 CPU-s a process) is not worth it.
POOL_MIN_FILES = 1000
#: Files a pool process reads per task (one pickled list of results each way).
POOL_CHUNK_FILES = 200


@dataclass
class FileResult:
    """One listed file as the scan saw it: where, how big, its identity, metadata or reason."""

    name: str
    url: str
    size_bytes: int
    identity: str = ""
    meta: ImageMetadata | None = None
    reason: RejectReason | None = None
    detail: str = ""
    metadata_bytes: int = 0
    identity_bytes: int = 0


def is_image_name(name: str) -> bool:
    """A scanned image by its name: an :data:`IMAGE_SUFFIXES` ending, not hidden."""
    return name.lower().endswith(IMAGE_SUFFIXES) and not os.path.basename(name).startswith(".")


def is_stray_name(name: str) -> bool:
    """A visible file that is not an image by its name (``README.txt``): listed as skipped."""
    return not is_image_name(name) and not any(part.startswith(".") for part in name.split("/"))


def stray_result(name: str, url: str, size: int) -> FileResult:
    """The ``not_an_image`` result of a stray file (see :func:`is_stray_name`)."""
    detail = f"not an image file name (expected {', '.join(IMAGE_SUFFIXES)}); skipped"
    return FileResult(name=name, url=url, size_bytes=size, reason="not_an_image", detail=detail)


def no_images_error(images: str) -> NoImagesError:
    """The error of a location with no image file by name."""
    return NoImagesError(f"{images}: no image files ({', '.join(IMAGE_SUFFIXES)}) found")


def read_header_into(res: FileResult, read: RangeReader) -> None:
    """Fill ``res.meta`` from the file's header, or its rejection reason."""
    try:
        res.meta, res.metadata_bytes = read_metadata(read, res.size_bytes)
    except ImageHeaderError as exc:
        res.reason, res.detail = exc.reason, exc.detail


def local_folder(images: str) -> Path:
    """The folder of a local images location (a path or ``file://`` URL).

    Raises:
        InputError: it does not exist or is not a folder.
    """
    root = Path(images[len("file://") :] if images.startswith("file://") else images)
    if not root.exists():
        raise InputError(f"{images}: does not exist")
    if not root.is_dir():
        raise InputError(f"{images}: is not a folder")
    return root


def walk_files(root: Path) -> tuple[list[tuple[str, str, os.stat_result]], list[tuple[str, str]]]:
    """``(name, path, stat)`` of every file below ``root``, sorted by name (relative, with
    ``/``): symbolic links to files followed, links to folders not entered, unreadable folders
    skipped (as :meth:`pathlib.Path.rglob` lists them), one stat per file; and ``(name, path)``
    of each symbolic link whose target does not exist, sorted by name."""
    found: list[tuple[str, str, os.stat_result]] = []
    broken: list[tuple[str, str]] = []
    folders = [("", str(root))]
    while folders:
        prefix, folder = folders.pop()
        try:
            with os.scandir(folder) as listing:
                entries = list(listing)
        except PermissionError:
            continue
        for entry in entries:
            try:
                if entry.is_dir(follow_symlinks=False):
                    folders.append((f"{prefix}{entry.name}/", entry.path))
                elif entry.is_file():
                    found.append((prefix + entry.name, entry.path, entry.stat()))
                elif entry.is_symlink() and not os.path.exists(entry.path):
                    broken.append((prefix + entry.name, entry.path))
            except OSError:
                continue
    found.sort(key=lambda item: item[0])
    broken.sort(key=lambda item: item[0])
    return found, broken


def broken_link_result(name: str, path: str) -> FileResult:
    """The ``unreadable`` result of an image name whose symbolic link leads nowhere."""
    detail = f"a symbolic link to {os.readlink(path)}, which does not exist; skipped"
    return FileResult(name=name, url=path, size_bytes=0, reason="unreadable", detail=detail)


class _PixelsOnlyJpeg(JpegImagePlugin.JpegImageFile):
    """Pillow's JPEG reader without its EXIF read for the DPI (a decode check needs none)."""

    def _read_dpi_from_exif(self) -> None:
        return


def _open_pixels(path: str, data: bytes | None) -> Image.Image:
    """The image to decode: from ``data`` when read already (JPEGs at 1/8 scale, grey)."""
    if data is None:
        return Image.open(path)
    if data[:3] != b"\xff\xd8\xff":
        return Image.open(io.BytesIO(data))
    image = _PixelsOnlyJpeg(io.BytesIO(data))
    if image.width * image.height > 2 * (Image.MAX_IMAGE_PIXELS or image.width * image.height):
        image.close()
        raise Image.DecompressionBombError(f"{image.width} x {image.height} pixels")
    image.draft("L", (1, 1))
    return image


def decode_whole(res: FileResult, path: str, data: bytes | None = None) -> None:
    """Decode every pixel of the image (Pillow): a file with an intact header, GPS and end
    marker but scrambled data inside gets ``unreadable`` here, not in an engine stage later.

    Run once per file content: an image that decoded whole is remembered in the identity cache
    and not decoded again by a repeat scan.
    """
    try:
        with _open_pixels(path, data) as image:
            image.load()
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as exc:
        res.reason, res.detail = "unreadable", f"does not decode whole ({exc})"


def _read_file(name: str, path: str, size_bytes: int) -> FileResult:
    """Hash, header and decode of a file the cache does not know (its listed size)."""
    res = FileResult(name=name, url=path, size_bytes=size_bytes)
    data: bytes | None = None
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        if size_bytes <= WHOLE_READ_MAX_BYTES:
            data = fh.read()
            read_header_into(res, lambda offset, length: data[offset : offset + length])
            digest.update(data)
            res.identity_bytes = len(data)
        else:
            read_header_into(res, file_range_reader(fh))
            fh.seek(0)
            while chunk := fh.read(_HASH_CHUNK):
                digest.update(chunk)
                res.identity_bytes += len(chunk)
    res.identity = f"sha256:{digest.hexdigest()}"
    if res.reason is None:
        decode_whole(res, path, data)
    return res


def _read_files(files: Sequence[tuple[str, str, int]]) -> list[FileResult]:
    """:func:`_read_file` of each ``(name, path, size_bytes)``, in order (a pool process's task)."""
    return [_read_file(name, path, size) for name, path, size in files]


def scan_processes(files: int, max_workers: int) -> int:
    """Processes that read ``files`` unknown files: one per core this process may run on (at
    most ``max_workers``), none (threads in this process) for fewer than
    :data:`POOL_MIN_FILES` files or on one core."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    processes = min(cores or 1, max_workers)
    return processes if files >= POOL_MIN_FILES and processes > 1 else 0


def read_unknown_files(
    files: Sequence[tuple[str, str, os.stat_result]], max_workers: int
) -> Iterator[FileResult]:
    """:func:`_read_file` of each file the cache does not know, in order: in
    :func:`scan_processes` processes (``spawn``: no fork of a process that may run threads) in
    tasks of :data:`POOL_CHUNK_FILES` files, else (or where a pool cannot start or a process of
    it dies) on ``max_workers`` threads here. A file's error (one that vanished) is raised as the
    threads raise it. The same results either way: each file is read by
    the same code, in a process of its own or not.
    """
    items = [(name, path, st.st_size) for name, path, st in files]
    processes = scan_processes(len(items), max_workers)
    done = 0
    if processes:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor
        from concurrent.futures.process import BrokenProcessPool

        chunks = [items[i : i + POOL_CHUNK_FILES] for i in range(0, len(items), POOL_CHUNK_FILES)]
        context = multiprocessing.get_context("spawn")
        try:
            with ProcessPoolExecutor(processes, mp_context=context) as pool:
                for results in pool.map(_read_files, chunks):
                    yield from results
                    done += len(results)
            return
        except BrokenProcessPool:
            pass  # the rest on threads, below
    yield from map_in_threads(lambda f: _read_file(*f), items[done:], max_workers)


_T = TypeVar("_T")


def map_in_threads(
    scan: Callable[[_T], FileResult], items: Sequence[_T], max_workers: int
) -> Iterator[FileResult]:
    """``scan`` of each item on up to ``max_workers`` threads, in item order."""
    with ThreadPoolExecutor(max_workers=max(1, max_workers)) as pool:
        yield from pool.map(scan, items)


def scan_local(images: str, max_workers: int, cache: IdentityCache | None) -> list[FileResult]:
    """The :class:`FileResult` of every file below a local images location, strays included
    (unsorted: the images first, by name).

    Raises:
        InputError: the location does not exist or is not a folder.
        NoImagesError: no file in it has an image name.
    """
    root = local_folder(images)
    files, broken = walk_files(root)
    strays = [stray_result(n, p, st.st_size) for n, p, st in files if is_stray_name(n)]
    strays += [broken_link_result(n, p) for n, p in broken if is_image_name(n)]
    files = [f for f in files if is_image_name(f[0])]
    if not files:
        raise no_images_error(images)
    key_root = str(root.resolve()).rstrip("/") + "/"
    known = cache.images_under(key_root) if cache is not None else {}
    found: dict[str, FileResult] = {}
    unknown: list[tuple[str, str, os.stat_result]] = []
    for name, path, st in files:
        row = known.get(key_root + name)
        if row is not None and row.stat == stat_key(st):
            meta = ImageMetadata.model_validate_json(row.metadata_json)
            found[name] = FileResult(name, path, st.st_size, identity=row.identity, meta=meta)
        else:
            unknown.append((name, path, st))
    pending: list[tuple[str, os.stat_result, str, str]] = []
    for (name, _, st), res in zip(unknown, read_unknown_files(unknown, max_workers), strict=True):
        found[name] = res
        if cache is not None and res.reason is None and res.meta is not None:
            pending.append((key_root + name, st, res.identity, res.meta.model_dump_json()))
            if len(pending) >= _CACHE_BATCH:
                cache.put_many(pending)
                pending = []
    if cache is not None:
        cache.put_many(pending)
    return [found[name] for name, _, _ in files] + strays
