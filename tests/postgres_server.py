"""A real PostgreSQL server on 127.0.0.1 for the tests (Debian's ``postgresql`` package).

``start_postgres`` runs ``initdb`` into a fresh folder and ``postgres`` on a free loopback port
(no Unix socket outside that folder); as root, both run as the ``postgres`` user, which the
Debian package creates and which PostgreSQL needs (it refuses to run as root). ``.ci/run``
installs the package when it is missing.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from odm_server import free_port, stop_group


def _bindir() -> Path:
    """The folder of ``initdb`` and ``postgres`` (Debian keeps them out of PATH)."""
    found = shutil.which("pg_config")
    if found:
        out = subprocess.run([found, "--bindir"], capture_output=True, text=True, check=True)
        bindir = Path(out.stdout.strip())
        if (bindir / "initdb").exists():
            return bindir
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    assert candidates, "PostgreSQL is not installed (Debian: apt-get install postgresql)"
    return Path(candidates[-1]).parent


def _as_postgres_user(cmd: list[str]) -> list[str]:
    if os.geteuid() != 0:
        return cmd
    return ["runuser", "-u", "postgres", "--", *cmd]


@dataclass
class Postgres:
    """A running server: ``url(database)`` gives an SQLAlchemy asyncpg URL for Prefect."""

    port: int
    data: Path
    proc: subprocess.Popen[bytes]
    bindir: Path

    def url(self, database: str) -> str:
        return f"postgresql+asyncpg://postgres@127.0.0.1:{self.port}/{database}"

    def sql(self, database: str, query: str) -> str:
        """``psql -tA -c query`` against ``database``; the output, stripped."""
        res = subprocess.run(
            _as_postgres_user(
                [
                    str(self.bindir / "psql"),
                    "-h",
                    "127.0.0.1",
                    "-p",
                    str(self.port),
                    "-U",
                    "postgres",
                    "-d",
                    database,
                    "-tA",
                    "-c",
                    query,
                ]
            ),
            capture_output=True,
            text=True,
            check=True,
        )
        return res.stdout.strip()


@contextmanager
def start_postgres(root: Path) -> Iterator[Postgres]:
    """initdb + postgres on 127.0.0.1 (trust authentication on loopback, this test only)."""
    bindir = _bindir()
    root.mkdir(parents=True, exist_ok=True)
    # The data folder lies outside pytest's tmp_path, which is private to the user running the
    # tests (mode 0700): the postgres user must reach it.
    data = Path(tempfile.mkdtemp(prefix="prefect-odm-pgdata-"))
    if os.geteuid() == 0:
        shutil.chown(data, "postgres")
    subprocess.run(
        _as_postgres_user(
            [
                str(bindir / "initdb"),
                "-D",
                str(data),
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
            ]
        ),
        capture_output=True,
        check=True,
    )
    port = free_port()
    log = root / "postgres.log"
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            _as_postgres_user(
                [
                    str(bindir / "postgres"),
                    "-D",
                    str(data),
                    "-h",
                    "127.0.0.1",
                    "-p",
                    str(port),
                    "-k",
                    str(data),
                    "-c",
                    "max_connections=200",
                ]
            ),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    server = Postgres(port=port, data=data, proc=proc, bindir=bindir)
    try:
        deadline = time.monotonic() + 60
        while True:
            ready = subprocess.run(
                [str(bindir / "pg_isready"), "-h", "127.0.0.1", "-p", str(port)],
                capture_output=True,
            )
            if ready.returncode == 0:
                break
            assert proc.poll() is None, f"postgres exited: {log.read_text()[-2000:]}"
            assert time.monotonic() < deadline, f"postgres did not start: {log.read_text()[-2000:]}"
            time.sleep(0.3)
        yield server
    finally:
        stop_group(proc)
        shutil.rmtree(data, ignore_errors=True)
