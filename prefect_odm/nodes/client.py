"""NodeODM client: pyodm behind a wrapper that keeps pyodm 1.5.13's defects away from users.

The defects handled here (see DESIGN.md, "Nodes and placement"):

* ``Node.url``/``Node.get`` take a mutable default ``query={}`` and write the token into it, so a
  token leaks to every later request of every ``Node`` object, other hosts included.
  :class:`_SafeNode` copies the query on every call.
* ``Node.create_task`` can block for ever when an upload fails for good. Uploads here are our own
  loop (init, uploads in batches with retries and back-off in :mod:`prefect_odm.nodes.uploads`,
  commit) with a deadline.
* ``TaskInfo`` raises ``KeyError`` on a task without a name and ``TaskFailedError`` carries no
  message: task info is read as the raw JSON dictionary and failures are classified from the
  node's status, error message and last output lines.
* Exceptions never carry the token: URLs in messages are stripped of their query.

:class:`NodeClient` implements :class:`prefect_odm.nodes.backend.NodeBackend`, the interface the
submodel runner uses; the status codes, :class:`~prefect_odm.nodes.backend.TaskState` and
:func:`~prefect_odm.nodes.backend.task_uuid` live there and are re-exported here.

Failures are classified into :class:`~prefect_odm.errors.TransientNodeError` (connection,
timeouts, HTTP 5xx: retry, maybe elsewhere), :class:`~prefect_odm.errors.OutOfMemoryError` and
:class:`~prefect_odm.errors.ProcessingFailedError` (the node ran the task and it failed).
"""

from __future__ import annotations

import json
import logging
import re
import time
import zipfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import requests
from pydantic import JsonValue
from pyodm import Node
from pyodm.exceptions import (
    NodeConnectionError,
    NodeResponseError,
    NodeServerError,
    OdmError,
)
from pyodm.utils import MultipartEncoder, options_to_json

from prefect_odm.errors import (
    DownloadError,
    NodeError,
    StaleTaskError,
    TransientNodeError,
)
from prefect_odm.nodes.backend import (
    CANCELED,
    COMPLETED,
    FAILED,
    QUEUED,
    RUNNING,
    TASK_UUID_NAMESPACE,
    NodeInfo,
    NodeOption,
    TaskState,
    task_uuid,
)
from prefect_odm.nodes.messages import is_unknown_task_error
from prefect_odm.nodes.polled import PolledBackend
from prefect_odm.nodes.refs import public_url
from prefect_odm.nodes.uploads import Uploads

__all__ = [
    "CANCELED",
    "COMPLETED",
    "FAILED",
    "QUEUED",
    "RUNNING",
    "TASK_UUID_NAMESPACE",
    "NodeClient",
    "TaskState",
    "public_url",
    "task_uuid",
]

logger = logging.getLogger(__name__)

OOM_MARKERS = ("not enough memory", "out of memory", "exit code 137", "returned 137", "killed")


_ERRNO_TEXT = re.compile(r"\[Errno -?\d+\] ([^'\")\]]+)")


def connection_reason(exc: BaseException) -> str | None:
    """What a failed connection came to, in a few words, or None when ``exc`` is not one.

    urllib3 nests the socket error three levels deep ("HTTPConnectionPool(host=...): Max
    retries exceeded ... NewConnectionError(...: [Errno 111] Connection refused)"); a user
    needs the last part.
    """
    text = str(exc)
    if isinstance(exc, requests.Timeout) or "timed out" in text.lower():
        return "timed out"
    found = _ERRNO_TEXT.search(text)
    if found and isinstance(exc, requests.ConnectionError | NodeConnectionError):
        return found.group(1).strip().rstrip(".").lower()
    if "Name or service not known" in text or "NameResolutionError" in text:
        return "host name not found"
    return None


class _SafeNode(Node):  # type: ignore[misc]
    """pyodm ``Node`` whose query dictionaries are never shared between calls."""

    def url(self, url: str, query: Mapping[str, Any] | None = None) -> str:
        return str(super().url(url, dict(query or {})))

    def get(self, url: str, query: Mapping[str, Any] | None = None, **kwargs: Any) -> Any:
        return super().get(url, dict(query or {}), **kwargs)

    def post(self, url: str, data: Any = None, headers: Mapping[str, str] | None = None) -> Any:
        return super().post(url, data=data, headers=dict(headers or {}))


class NodeClient(PolledBackend):
    """One NodeODM-API node (implements :class:`prefect_odm.nodes.backend.NodeBackend`).

    Args:
        url: base URL, e.g. ``http://127.0.0.1:3000``; a ``?token=`` in it is taken as the token.
        token: authentication token (sent only to this node, as NodeODM's query parameter).
        timeout_seconds: per-request timeout.
    """

    oom_markers = OOM_MARKERS

    def __init__(
        self, url: str, token: str | None = None, *, timeout_seconds: float = 30.0
    ) -> None:
        """Check the URL and take its token (nothing is sent to the node yet).

        Raises:
            ValueError: ``url`` is not an ``http(s)://host[:port]`` URL.
        """
        parsed = urlparse(url)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise ValueError(f"not a node URL: {public_url(url)!r} (expected http://host:port)")
        self.url = public_url(url)
        query_token = dict(p.split("=", 1) for p in parsed.query.split("&") if "=" in p).get(
            "token"
        )
        self._token = token or query_token or ""
        port = parsed.port or (443 if parsed.scheme == "https" else 80)
        self._node = _SafeNode(parsed.hostname, port, self._token, timeout=timeout_seconds)
        self.timeout_seconds = timeout_seconds

    def __repr__(self) -> str:
        """The node's URL (the token never appears)."""
        return f"NodeClient({self.url!r})"

    # -- error handling -------------------------------------------------------------------

    def _scrub(self, text: str) -> str:
        return text.replace(self._token, "***") if self._token else text

    def _reason(self, exc: BaseException) -> str:
        """A connection failure in a few words ("connection refused", "timed out"), not
        urllib3's three nested reprs; any other error's own text (token scrubbed)."""
        return connection_reason(exc) or self._scrub(str(exc))

    def _call(self, what: str, fn: Callable[[], Any], task_uuid: str | None = None) -> Any:
        try:
            return fn()
        except (NodeConnectionError, NodeServerError, requests.RequestException) as exc:
            said = self._reason(exc)
            raise self.error(TransientNodeError, f"{what} failed: {said}", task_uuid) from None
        except NodeResponseError as exc:
            said = self._scrub(str(exc))
            raise self.error(NodeError, f"{what}: node answered {said!r}", task_uuid) from None
        except OdmError as exc:  # any other pyodm error
            raise self.error(NodeError, f"{what}: {self._scrub(str(exc))}", task_uuid) from None

    # -- node level -----------------------------------------------------------------------

    def info(self) -> NodeInfo:
        """``/info`` (memory in bytes; the whole answer in ``raw``)."""
        result = self._call("GET /info", lambda: self._node.get("/info"))
        if not isinstance(result, dict):
            raise TransientNodeError("GET /info: not JSON", node_url=self.url)
        return NodeInfo.from_json(result)

    def options(self) -> list[NodeOption]:
        """``/options``: the node's option list."""
        result = self._call("GET /options", lambda: self._node.get("/options"))
        return [NodeOption.from_json(o) for o in result if isinstance(o, dict)]

    def task_list(self) -> list[str]:
        """UUIDs of the tasks the node knows."""
        result = self._call("GET /task/list", lambda: self._node.get("/task/list"))
        return [str(t["uuid"]) for t in result]

    # -- one task -------------------------------------------------------------------------

    def task_state(self, uuid: str, *, with_output: int | None = None) -> TaskState | None:
        """The task's state, or ``None`` when the node does not know the UUID."""
        query: dict[str, int] = {} if with_output is None else {"with_output": with_output}
        try:
            raw = self._node.get(f"/task/{uuid}/info", query)
        except NodeResponseError as exc:
            if is_unknown_task_error(str(exc), uuid):
                return None
            raise self.error(NodeError, f"task info: {self._scrub(str(exc))}", uuid) from None
        except (NodeConnectionError, NodeServerError, requests.RequestException) as exc:
            said = self._reason(exc)
            raise self.error(TransientNodeError, f"task info failed: {said}", uuid) from None
        status = raw.get("status") or {}
        return TaskState(
            uuid=uuid,
            status=int(status.get("code", 0)),
            progress=float(raw.get("progress") or 0.0),
            error_message=str(status.get("errorMessage") or ""),
            images_count=int(raw.get("imagesCount") or 0),
            processing_time_ms=int(raw.get("processingTime") or -1),
            info=raw,
        )

    def output(self, uuid: str, line: int = -30) -> list[str]:
        """Console lines of the task (negative ``line``: the last lines)."""
        result = self._call(
            "task output", lambda: self._node.get(f"/task/{uuid}/output", {"line": line}), uuid
        )
        return [str(x) for x in result] if isinstance(result, list) else []

    def cancel(self, uuid: str) -> bool:
        """Cancel the task (``POST /task/cancel``); whether the node accepted."""
        return bool(self._post_form("/task/cancel", {"uuid": uuid}, uuid).get("success", False))

    def remove(self, uuid: str) -> bool:
        """Remove the task and its files (``POST /task/remove``); whether the node accepted."""
        return bool(self._post_form("/task/remove", {"uuid": uuid}, uuid).get("success", False))

    def restart(self, uuid: str, options: Mapping[str, Any] | None = None) -> bool:
        """Restart a finished task, optionally replacing all its options (``rerun-from`` etc.)."""
        fields = {"uuid": uuid}
        if options is not None:
            fields["options"] = options_to_json(dict(options))
        return bool(self._post_form("/task/restart", fields, uuid).get("success", False))

    def _post_form(
        self, route: str, fields: Mapping[str, str], uuid: str | None
    ) -> dict[str, JsonValue]:
        def go() -> Any:  # urlencoded, as pyodm's Task.cancel/remove/restart send it:
            # NodeODM reads these fields from urlencoded or JSON bodies only (never multipart)
            return self._node.post(route, data=dict(fields))

        result = self._call(f"POST {route}", go, uuid)
        return result if isinstance(result, dict) else {}

    def create_task(
        self,
        uuid: str,
        files: Sequence[str],
        options: Mapping[str, Any],
        *,
        name: str,
        outputs: Sequence[str] = (),
        parallel_uploads: int = 4,
        upload_batch_files: int = 8,
        max_retries: int = 5,
        retry_base_seconds: float = 1.0,
        deadline_seconds: float = 1800.0,
        progress: Callable[[int, int], None] | None = None,
    ) -> str:
        """Create a task with a chosen UUID: init, upload the files in batches (retried), commit.

        Args:
            uuid: the task UUID to set (``set-uuid``), see :func:`task_uuid`.
            files: image locations (local paths or fsspec URLs), uploaded under their base names.
            options: NodeODM option name -> value.
            name: task name shown by the node.
            outputs: limit all.zip to these paths (NodeODM ``outputs``).
            parallel_uploads: upload requests in flight at once.
            upload_batch_files: most files in one upload request
                (:func:`~prefect_odm.nodes.uploads.upload_batches`).
            max_retries: attempts per request after the first one (back-off with jitter).
            retry_base_seconds: the first back-off, seconds (doubled per attempt, 0.5x-1.5x jitter).
            deadline_seconds: the whole upload must finish within this time.
            progress: called with (files uploaded, total files) in the calling thread (never
                an upload lane's), as batches are accepted.

        Returns:
            The task UUID.

        Raises:
            TransientNodeError: the node could not be reached, or the deadline passed.
            StaleTaskError: the UUID is taken by a task an interrupted run left (NodeODM
                refuses a ``set-uuid`` it knows; it keeps the files of an upload that was
                never committed, so a second upload under that UUID has each image twice:
                such a task is removed).
            NodeError: the node refused the task (invalid options).
        """
        uploads = Uploads(
            node_url=self.url,
            upload_url=self._upload_url(uuid),
            uuid=uuid,
            timeout_seconds=self.timeout_seconds,
            scrub=self._scrub,
            total=len(files),
            deadline=time.monotonic() + deadline_seconds,
            deadline_seconds=deadline_seconds,
            max_retries=max_retries,
            retry_base_seconds=retry_base_seconds,
            progress=progress,
        )
        self._init_task(uuid, options, name=name, outputs=outputs)
        uploads.run(files, parallel_uploads, upload_batch_files)
        self._commit_task(uuid)
        self._check_images_count(uuid, len(files))
        return uuid

    def _check_images_count(self, uuid: str, expected: int) -> None:
        """Remove a just-committed task that holds more images than were uploaded (an
        interrupted upload's files under the same UUID) and raise :class:`StaleTaskError`."""
        state = self.task_state(uuid)
        if state is None or state.images_count <= expected:
            return
        self.cancel(uuid)
        self.remove(uuid)
        raise StaleTaskError(
            f"task held {state.images_count} images for {expected} uploaded (files of an "
            "interrupted upload under the same UUID); removed",
            node_url=self.url,
            task_uuid=uuid,
        )

    def _init_task(
        self, uuid: str, options: Mapping[str, Any], *, name: str, outputs: Sequence[str]
    ) -> None:
        """``POST /task/new/init`` with ``set-uuid``: the node must answer with that UUID."""
        fields = {"name": name, "options": options_to_json(dict(options))}
        if outputs:
            fields["outputs"] = json.dumps(list(outputs))

        def init() -> Any:
            enc = MultipartEncoder(fields=fields)
            return self._node.post(
                "/task/new/init",
                data=enc,
                headers={"Content-Type": enc.content_type, "set-uuid": uuid},
            )

        try:
            result = self._call("POST /task/new/init", init, uuid)
        except NodeError as exc:
            if "invalid set-uuid" in str(exc).lower():
                raise StaleTaskError(
                    "the node refused the task UUID (set-uuid): it has a task of that UUID",
                    node_url=self.url,
                    task_uuid=uuid,
                ) from None
            raise
        if not isinstance(result, dict) or result.get("uuid") != uuid:
            raise NodeError(f"task init answered {result!r}", node_url=self.url, task_uuid=uuid)

    def _upload_url(self, uuid: str) -> str:
        """The upload route of task ``uuid``, with the token (never logged)."""
        return str(self._node.url(f"/task/new/upload/{uuid}"))

    def _commit_task(self, uuid: str) -> None:
        """``POST /task/new/commit``: processing starts; the node must answer with the UUID."""
        result = self._call(
            "POST /task/new/commit", lambda: self._node.post(f"/task/new/commit/{uuid}"), uuid
        )
        if not isinstance(result, dict) or result.get("uuid") != uuid:
            raise NodeError(f"task commit answered {result!r}", node_url=self.url, task_uuid=uuid)

    def download(self, uuid: str, dest: Path, *, max_retries: int = 3) -> Path:
        """Download all.zip, verify it, and extract it into ``dest`` (no path may leave ``dest``).

        Returns:
            ``dest``.

        Raises:
            DownloadError: the download failed ``max_retries + 1`` times (truncated, corrupt,
                unreachable).
            NodeError: the node refused the download, or an archive entry would leave
                ``dest`` (the message names the node and the entry).
        """
        dest.mkdir(parents=True, exist_ok=True)
        zip_path = dest / f".{uuid}.all.zip.part"
        last_error = ""
        for attempt in range(max_retries + 1):
            try:
                with requests.get(
                    self._node.url(f"/task/{uuid}/download/all.zip"),
                    stream=True,
                    timeout=self.timeout_seconds,
                ) as res:
                    if res.status_code != 200:
                        raise NodeServerError(f"HTTP {res.status_code}")
                    if "application/json" in res.headers.get("Content-Type", ""):
                        raise NodeError(
                            f"download refused: {self._scrub(str(res.json()))}",
                            node_url=self.url,
                            task_uuid=uuid,
                        )
                    expected = res.headers.get("Content-Length")
                    size = 0
                    with open(zip_path, "wb") as fh:
                        for chunk in res.iter_content(1 << 20):
                            fh.write(chunk)
                            size += len(chunk)
                if expected is not None and int(expected) != size:
                    raise NodeServerError(f"got {size} of {expected} bytes")
                with zipfile.ZipFile(zip_path) as archive:
                    bad = archive.testzip()
                    if bad is not None:
                        raise NodeServerError(f"corrupt member {bad}")
                    _safe_extract(archive, dest, self.url, uuid)
                zip_path.unlink()
                return dest
            except (NodeServerError, requests.RequestException, zipfile.BadZipFile) as exc:
                last_error = self._scrub(str(exc)) or type(exc).__name__
                time.sleep(min(10.0, 2.0**attempt))
        zip_path.unlink(missing_ok=True)
        raise DownloadError(
            f"download of all.zip failed {max_retries + 1} times: {last_error}",
            node_url=self.url,
            task_uuid=uuid,
        )


def _safe_extract(archive: zipfile.ZipFile, dest: Path, node_url: str, uuid: str) -> None:
    """Extract members whose resolved path stays inside ``dest``; refuse the archive otherwise
    (before anything is written)."""
    root = dest.resolve()
    for member in archive.infolist():
        target = (root / member.filename).resolve()
        if target != root and root not in target.parents:
            raise NodeError(
                f"all.zip: archive member {member.filename!r} would leave the output folder",
                node_url=node_url,
                task_uuid=uuid,
            )
    archive.extractall(root)
