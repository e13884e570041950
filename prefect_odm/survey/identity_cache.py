"""Images remembered by file location and stat, so unchanged images are not read again.

A run hashes every byte of every local image for its content identity (``sha256:<hex>``): 100 GB
for 10,000 images of 10 MB (issue 14). This cache (an SQLite file in ``PREFECT_ODM_HOME``, shared
by every run of the machine) keeps each file's identity under its path (the survey folder resolved, then the file's name
in it), with the stat
fields that change whenever its content can have changed: size, modification time, status-change
time (``st_ctime_ns``, which a write or an ``os.utime`` that resets the modification time still
moves), inode and device, and with it the header metadata the scan read, so that a rescan of
an unchanged folder is one stat per file and one query (no file opened). A file whose stat differs
in any of them is read, hashed and decoded again. Object stores
need no cache: their identity is the ETag and size, read from the listing.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple

logger = logging.getLogger(__name__)

CACHE_FILE_NAME = "image-identities.sqlite"
"""The cache's file name inside ``PREFECT_ODM_HOME``."""

# One row per image that read and decoded whole: its stat, identity and header metadata (the
# JSON of ImageMetadata as the reader of ``reader`` wrote it), so a rescan reads no file.
# The first table ("identities", identities only) is dropped: every file is read once more.
_SCHEMA = """
CREATE TABLE IF NOT EXISTS scanned_images (
    path TEXT PRIMARY KEY,
    size INTEGER NOT NULL,
    mtime_ns INTEGER NOT NULL,
    ctime_ns INTEGER NOT NULL,
    inode INTEGER NOT NULL,
    device INTEGER NOT NULL,
    identity TEXT NOT NULL,
    metadata TEXT NOT NULL,
    reader TEXT NOT NULL
)
"""

StatKey = tuple[int, int, int, int, int]
"""A file's ``(size, mtime_ns, ctime_ns, inode, device)``: any change of content moves one."""


def stat_key(st: os.stat_result) -> StatKey:
    """The :data:`StatKey` of a stat result."""
    return (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev)


class CachedImage(NamedTuple):
    """What the cache holds for one file: its stat then, identity and metadata JSON."""

    stat: StatKey
    identity: str
    metadata_json: str


class IdentityCache:
    """Path + stat -> content identity and header metadata, in one SQLite file; safe across
    threads and processes.

    Args:
        path: the SQLite file (created with its folder).
        reader: the version of the header reader whose metadata is stored; rows another
            reader wrote are not returned (they are replaced as their files are read again).

    Raises:
        sqlite3.Error: the file cannot be opened or is not a cache (callers that can do without
            a cache catch this, see :func:`open_default_cache`).
    """

    def __init__(self, path: Path, reader: str) -> None:
        """Open (or create) the cache file in write-ahead-log mode."""
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.reader = reader
        self._lock = threading.Lock()
        self._db = sqlite3.connect(path, timeout=30.0, check_same_thread=False)
        with self._lock, self._db:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("DROP TABLE IF EXISTS identities")
            self._db.execute(_SCHEMA)

    def images_under(self, folder: str) -> dict[str, CachedImage]:
        """Every stored file below ``folder`` (a resolved path), by path: one query for a
        whole survey, so a rescan costs one stat per file and this read."""
        low = folder.rstrip("/") + "/"
        high = low[:-1] + chr(ord("/") + 1)  # the paths that start with ``low``, in key order
        with self._lock:
            rows = self._db.execute(
                "SELECT path, size, mtime_ns, ctime_ns, inode, device, identity, metadata "
                "FROM scanned_images WHERE path >= ? AND path < ? AND reader = ?",
                (low, high, self.reader),
            ).fetchall()
        return {row[0]: CachedImage(tuple(row[1:6]), row[6], row[7]) for row in rows}

    def put_many(self, entries: Iterable[tuple[str, os.stat_result, str, str]]) -> None:
        """Remember ``(path, stat, identity, metadata_json)`` for each entry, in one
        transaction (``path`` resolved, as :meth:`images_under` is asked)."""
        rows = [(p, *stat_key(st), ident, meta, self.reader) for p, st, ident, meta in entries]
        if not rows:
            return
        with self._lock, self._db:
            self._db.executemany(
                "INSERT OR REPLACE INTO scanned_images VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", rows
            )

    def close(self) -> None:
        """Close the database connection."""
        with self._lock:
            self._db.close()


def open_default_cache(home: Path, reader: str) -> IdentityCache | None:
    """The machine's cache in ``home``, or None (every image read) when it cannot be opened:
    the cache only saves reading, so an unwritable home costs time, never a wrong identity."""
    try:
        return IdentityCache(home / CACHE_FILE_NAME, reader)
    except (OSError, sqlite3.Error) as exc:
        logger.info("image identity cache in %s not used: %s", home, exc)
        return None
