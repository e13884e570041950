"""The image uploads of a new NodeODM task: our own loop instead of pyodm's ``create_task``,
which can block for ever when an upload fails for good (see :mod:`prefect_odm.nodes.client`)."""

from __future__ import annotations

import contextvars
import mimetypes
import random
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, wait
from dataclasses import dataclass, field
from functools import partial
from pathlib import PurePosixPath
from typing import Any

import requests
from pyodm.utils import MultipartEncoder

from prefect_odm import storage
from prefect_odm.errors import NodeError, TransientNodeError
from prefect_odm.nodes.upload_lanes import lane_for, upload_ticket


@dataclass
class Uploads:
    """The image uploads of one new task: batches of files, each one request retried with
    back-off and jitter, one deadline for all, a progress count (files), and a stop flag once
    one batch failed for good."""

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

    def run(self, files: Sequence[str], parallel_uploads: int, batch_files: int = 8) -> None:
        """Upload every file in batches (:func:`upload_batches`, sized for ``parallel_uploads``
        requests at once) through the node's lane (:mod:`prefect_odm.nodes.upload_lanes`): at
        most ``PREFECT_ODM_NODE_UPLOAD_REQUESTS`` requests to the node at once across every
        upload of the process, this upload's batches served before those of uploads that
        entered the lane later. The first failure stops the rest and is raised once no batch of
        this upload is being sent.

        The progress callback runs in the calling thread, as each batch is accepted, never on
        a lane thread: it may call the Prefect API (a submodel's progress artifact), and at
        10k images on 20 nodes on a loaded machine the lane threads spent 0.57 of their time
        in such calls while the node waited for its next batch (issue 33). Each batch still
        runs in a copy of the caller's context (:mod:`contextvars`), for the caller's Prefect
        settings. The time a batch waits in the lane counts against the upload's deadline.
        """
        lane = lane_for(self.node_url)
        ticket = upload_ticket()
        futures = [
            lane.submit(ticket, partial(contextvars.copy_context().run, self.batch, b))
            for b in upload_batches(files, parallel_uploads, batch_files)
        ]
        try:
            pending = set(futures)
            while pending:
                finished, pending = wait(pending, return_when=FIRST_COMPLETED)
                errors = [e for f in finished if not f.cancelled() and (e := f.exception())]
                if errors:
                    raise errors[0]
                if self.progress is not None:
                    with self.lock:
                        done = self.done
                    self.progress(done, self.total)
        except BaseException:
            self.stop.set()
            for f in futures:
                f.cancel()
            wait(futures)  # a batch being sent ends at its next attempt (the stop flag)
            raise
        finally:
            for session in self._sessions:
                session.close()

    def _session(self) -> requests.Session:
        """This upload thread's session: its connection is reused from batch to batch (no TCP
        or TLS handshake per request; on loopback the node's per-request cost dominates, issue
        14)."""
        session: requests.Session | None = getattr(self._local, "session", None)
        if session is None:
            session = self._local.session = requests.Session()
            with self.lock:
                self._sessions.append(session)
        return session

    def batch(self, paths: Sequence[str]) -> None:
        """Upload one batch of files in one request, retried as a whole until it is accepted,
        refused for good, or out of time."""
        parts = []
        for path in paths:
            base = PurePosixPath(path.split("?")[0]).name
            mime = mimetypes.guess_type(base)[0] or "image/jpeg"
            parts.append((base, storage.read_bytes(path), mime))
        what = (
            parts[0][0]
            if len(parts) == 1
            else f"{parts[0][0]}..{parts[-1][0]} ({len(parts)} files)"
        )
        for attempt in range(self.max_retries + 1):
            if self.stop.is_set():
                return
            if time.monotonic() > self.deadline:
                raise TransientNodeError(
                    f"upload of {what} did not finish within {self.deadline_seconds:.0f} s",
                    node_url=self.node_url,
                    task_uuid=self.uuid,
                )
            why = self._post(what, parts)
            if why is None:
                return
            if attempt == self.max_retries:
                raise TransientNodeError(
                    f"upload of {what} failed after {attempt + 1} attempts ({why})",
                    node_url=self.node_url,
                    task_uuid=self.uuid,
                )
            pause = self.retry_base_seconds * (2**attempt) * (0.5 + random.random())
            time.sleep(min(pause, max(0.0, self.deadline - time.monotonic())))

    def _post(self, what: str, parts: Sequence[tuple[str, bytes, str]]) -> str | None:
        """One upload attempt of a batch: ``None`` when accepted, else why it failed (worth a
        retry).

        Raises:
            NodeError: the node refused the files for good (``noRetry``).
        """
        try:
            enc = MultipartEncoder(fields=[("images", part) for part in parts])
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
                self.done += len(parts)
            return None
        if isinstance(body, dict) and body.get("noRetry"):
            raise NodeError(
                f"upload of {what} refused: {body.get('error')}",
                node_url=self.node_url,
                task_uuid=self.uuid,
            )
        return f"HTTP {res.status_code} {self.scrub(str(body))[:200]}"


def upload_batches(
    files: Sequence[str], parallel_uploads: int, batch_files: int
) -> list[list[str]]:
    """Split ``files`` into consecutive batches, one upload request each.

    Each batch holds ``ceil(len(files) / parallel_uploads)`` files, at most ``batch_files``:
    a small task goes up in one request per connection, a large one in requests of
    ``batch_files`` files. Fewer requests is the point: the built-in engine spends about 7 ms on
    each on loopback, and one request per image reached only 0.45 of one plain multipart POST
    of the same files, batches 1.05 (``benchmarks/bench_orchestration.py --upload-only``,
    issue 14). Both
    NodeODM (``multer``'s ``upload.array("images")``) and the built-in engine take any number of
    files per request. Memory held: up to ``parallel_uploads * batch_files`` images.

    Args:
        files: image locations, in upload order.
        parallel_uploads: requests in flight at once (>= 1).
        batch_files: most files in one request (>= 1).

    Returns:
        The batches, in order; every file in exactly one.
    """
    if not files:
        return []
    size = max(1, min(batch_files, -(-len(files) // max(1, parallel_uploads))))
    return [list(files[i : i + size]) for i in range(0, len(files), size)]


def _json_or_none(res: requests.Response) -> Any:
    try:
        return res.json()
    except ValueError:
        return None
