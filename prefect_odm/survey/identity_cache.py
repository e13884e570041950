"""Image identities remembered by file location and stat, so unchanged images are not hashed again.

A run hashes every byte of every local image for its content identity (``sha256:<hex>``): 100 GB
for 10,000 images of 10 MB (issue 14). This cache (an SQLite file in ``PREFECT_ODM_HOME``, shared
by every run of the machine) keeps each file's identity under its resolved path, with the stat
fields that change whenever its content can have changed: size, modification time, status-change
time (``st_ctime_ns``, which a write or an ``os.utime`` that resets the modification time still
moves), inode and device. A file whose stat differs in any of them is hashed again. Object stores
need no cache: their identity is the ETag and size, read from the listing.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
from pathlib import Path

logger = logging.getLogger(__name__)

CACHE_FILE_NAME = "image-identities.sqlite"
"""The cache's file name inside ``PREFECT_ODM_HOME``."""

_SCHEMA = """
CREATE TABLE IF NOT EXISTS identities (
    path TEXT PRIMARY KEY,
    size INTEGER NOT NULL,
    mtime_ns INTEGER NOT NULL,
    ctime_ns INTEGER NOT NULL,
    inode INTEGER NOT NULL,
    device INTEGER NOT NULL,
    identity TEXT NOT NULL
)
"""

_StatKey = tuple[int, int, int, int, int]


def _stat_key(st: os.stat_result) -> _StatKey:
    return (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev)


class IdentityCache:
    """Path + stat -> content identity, in one SQLite file; safe across threads and processes.

    Args:
        path: the SQLite file (created with its folder).

    Raises:
        sqlite3.Error: the file cannot be opened or is not a cache (callers that can do without
            a cache catch this, see :func:`open_default_cache`).
    """

    def __init__(self, path: Path) -> None:
        """Open (or create) the cache file in write-ahead-log mode."""
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._lock = threading.Lock()
        self._db = sqlite3.connect(path, timeout=30.0, check_same_thread=False)
        with self._lock, self._db:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute(_SCHEMA)

    def get(self, file: Path, st: os.stat_result) -> str | None:
        """The identity stored for ``file`` if its stat is still ``st``, else None."""
        with self._lock:
            row = self._db.execute(
                "SELECT size, mtime_ns, ctime_ns, inode, device, identity FROM identities "
                "WHERE path = ?",
                (str(file.resolve()),),
            ).fetchone()
        if row is None or tuple(row[:5]) != _stat_key(st):
            return None
        return str(row[5])

    def put(self, file: Path, st: os.stat_result, identity: str) -> None:
        """Remember ``identity`` for ``file`` as of stat ``st``."""
        with self._lock, self._db:
            self._db.execute(
                "INSERT OR REPLACE INTO identities VALUES (?, ?, ?, ?, ?, ?, ?)",
                (str(file.resolve()), *_stat_key(st), identity),
            )

    def close(self) -> None:
        """Close the database connection."""
        with self._lock:
            self._db.close()


def open_default_cache(home: Path) -> IdentityCache | None:
    """The machine's cache in ``home``, or None (every image hashed) when it cannot be opened:
    the cache only saves reading, so an unwritable home costs time, never a wrong identity."""
    try:
        return IdentityCache(home / CACHE_FILE_NAME)
    except (OSError, sqlite3.Error) as exc:
        logger.info("image identity cache in %s not used: %s", home, exc)
        return None
