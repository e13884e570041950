"""The image uploads of a new NodeODM task: our own loop instead of pyodm's ``create_task``,
which can block for ever when an upload fails for good (see :mod:`prefect_odm.nodeodm`)."""

from __future__ import annotations

import mimetypes
import random
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

import requests
from pyodm.utils import MultipartEncoder

from prefect_odm import storage
from prefect_odm.errors import NodeError, TransientNodeError


@dataclass
class Uploads:
    """The image uploads of one new task: per-file retries with back-off and jitter, one
    deadline for all, a progress count, and a stop flag once one file failed for good."""

    node_url: str
    upload_url: str
    uuid: str
    timeout_seconds: float
    scrub: Callable[[str], str]
    total: int
    deadline: float
    deadline_seconds: float
    max_retries: int
    retry_base_seconds: float
    progress: Callable[[int, int], None] | None
    done: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    stop: threading.Event = field(default_factory=threading.Event)
    _local: threading.local = field(default_factory=threading.local)
    _sessions: list[requests.Session] = field(default_factory=list)

    def run(self, files: Sequence[str], parallel_uploads: int) -> None:
        """Upload every file, ``parallel_uploads`` at once, each stream on one kept-alive
        connection; the first failure stops the rest and is raised."""
        try:
            with ThreadPoolExecutor(max_workers=max(1, parallel_uploads)) as pool:
                futures = [pool.submit(self.one, f) for f in files]
                finished, _ = wait(futures, return_when=FIRST_EXCEPTION)
                errors = [e for f in finished if (e := f.exception()) is not None]
                if errors:
                    self.stop.set()
                    for f in futures:
                        f.cancel()
                    raise errors[0]
        finally:
            for session in self._sessions:
                session.close()

    def _session(self) -> requests.Session:
        """This upload thread's session: its connection is reused from file to file (no TCP or
        TLS handshake per image; on loopback the node's per-request cost dominates, issue 14)."""
        session: requests.Session | None = getattr(self._local, "session", None)
        if session is None:
            session = self._local.session = requests.Session()
            with self.lock:
                self._sessions.append(session)
        return session

    def one(self, path: str) -> None:
        """Upload one file, retried until it is accepted, refused for good, or out of time."""
        data = storage.read_bytes(path)
        base = PurePosixPath(path.split("?")[0]).name
        mime = mimetypes.guess_type(base)[0] or "image/jpeg"
        for attempt in range(self.max_retries + 1):
            if self.stop.is_set():
                return
            if time.monotonic() > self.deadline:
                raise TransientNodeError(
                    f"upload of {base} did not finish within {self.deadline_seconds:.0f} s",
                    node_url=self.node_url,
                    task_uuid=self.uuid,
                )
            why = self._post(base, data, mime)
            if why is None:
                return
            if attempt == self.max_retries:
                raise TransientNodeError(
                    f"upload of {base} failed after {attempt + 1} attempts ({why})",
                    node_url=self.node_url,
                    task_uuid=self.uuid,
                )
            pause = self.retry_base_seconds * (2**attempt) * (0.5 + random.random())
            time.sleep(min(pause, max(0.0, self.deadline - time.monotonic())))

    def _post(self, base: str, data: bytes, mime: str) -> str | None:
        """One upload attempt: ``None`` when accepted, else why it failed (worth a retry).

        Raises:
            NodeError: the node refused the file for good (``noRetry``).
        """
        try:
            enc = MultipartEncoder(fields={"images": (base, data, mime)})
            timeout = max(1.0, min(self.timeout_seconds, self.deadline - time.monotonic()))
            res = self._session().post(
                self.upload_url,
                data=enc,
                headers={"Content-Type": enc.content_type},
                timeout=timeout,
            )
            body = _json_or_none(res)
        except requests.RequestException as exc:
            return type(exc).__name__
        if res.status_code == 200 and isinstance(body, dict) and body.get("success"):
            with self.lock:
                self.done += 1
                if self.progress is not None:
                    self.progress(self.done, self.total)
            return None
        if isinstance(body, dict) and body.get("noRetry"):
            raise NodeError(
                f"upload of {base} refused: {body.get('error')}",
                node_url=self.node_url,
                task_uuid=self.uuid,
            )
        return f"HTTP {res.status_code} {self.scrub(str(body))[:200]}"


def _json_or_none(res: requests.Response) -> Any:
    try:
        return res.json()
    except ValueError:
        return None
