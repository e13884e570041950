"""ScaleODM (hotosm) as a processing node: a :class:`~prefect_odm.nodes.backend.NodeBackend`.

ScaleODM answers NodeODM's routes but moves no images over HTTP: ``POST /task/new`` takes
``readS3Path`` (an ``s3://`` prefix holding the images), ``writeS3Path`` (where the whole ODM
project folder is copied when the task ends, ``app/s3/files.go`` ``GenerateUploadScript``) and
``s3Endpoint``, and runs each task as one Argo workflow (download, ODM, upload). Read from
hotosm/ScaleODM ``app/api/nodeodm_api.go`` and ``app/api/schemas.go``:

* the task UUID is the Argo workflow's generated name: the ``set-uuid`` header is accepted and
  ignored, so this backend keeps its own deterministic UUID (:func:`~prefect_odm.nodes.backend.task_uuid`)
  and records ScaleODM's UUID next to the submodel's images (``{prefix}/task.json``);
* errors are HTTP 4xx/5xx with a problem document (``{"title", "status", "detail"}``), not
  NodeODM's HTTP 200 ``{"error"}``; an unknown task is HTTP 404;
* ``/info`` reports no memory and no task slots: both come from configuration
  (:class:`ScaleODMSettings`);
* ``/task/restart`` starts a new workflow under a new name and does not answer it, so
  :meth:`ScaleODMClient.restart` declines (the runner then submits the next attempt);
* a failed task's ``errorMessage`` is Argo's message (``OOMKilled (exit code 137)`` for a pod
  killed for memory), classified like NodeODM's.

The node is named in a run by the URL ``scaleodm+http(s)://host:port``; its staging prefix,
endpoint and capacity come from ``PREFECT_ODM_SCALEODM_*`` (:mod:`prefect_odm.settings`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Unpack

import requests

from prefect_odm import storage
from prefect_odm.errors import (
    InputError,
    NodeError,
    StorageError,
    TransientNodeError,
)
from prefect_odm.nodes.backend import (
    NewTask,
    NodeInfo,
    NodeOption,
    TaskState,
)
from prefect_odm.nodes.polled import PolledBackend
from prefect_odm.nodes.refs import public_url
from prefect_odm.settings import get_settings

logger = logging.getLogger(__name__)

SCHEME_PREFIX = "scaleodm+"
"""A node URL starting ``scaleodm+http://`` or ``scaleodm+https://`` is a ScaleODM."""

OOM_MARKERS = ("oomkilled", "exit code 137", "not enough memory", "out of memory")
"""Texts of a task killed for memory (Argo's pod message, ODM's own)."""

TASK_RECORD = "task.json"
"""The file under a task's staging prefix that holds ScaleODM's UUID for it."""


@dataclass(frozen=True)
class ScaleODMSettings:
    """Where a ScaleODM's tasks read and write, and what it may run at once.

    Attributes:
        staging_url: ``s3://bucket/prefix`` in the survey's bucket; each task gets
            ``{staging_url}/{task uuid}/images/`` and ``.../output/``.
        s3_endpoint: the S3 endpoint ScaleODM's workflows use (``s3Endpoint``); ``None``: the
            server's own default.
        memory_gib: memory one task may use, GiB (ScaleODM's ``/info`` gives none).
        max_parallel_tasks: tasks this library runs on it at once.
    """

    staging_url: str
    s3_endpoint: str | None = None
    memory_gib: float = 32.0
    max_parallel_tasks: int = 4

    @classmethod
    def from_environment(cls) -> ScaleODMSettings:
        """From ``PREFECT_ODM_SCALEODM_STAGING``, ``..._S3_ENDPOINT``, ``..._MEMORY_GIB`` and
        ``..._MAX_PARALLEL_TASKS``.

        Raises:
            InputError: no staging prefix, or one that is not ``s3://``.
        """
        s = get_settings()
        if not s.scaleodm_staging or not s.scaleodm_staging.startswith("s3://"):
            raise InputError(
                "a scaleodm+ node needs PREFECT_ODM_SCALEODM_STAGING=s3://bucket/prefix "
                f"(got {s.scaleodm_staging!r}): ScaleODM reads images only from S3"
            )
        return cls(
            staging_url=s.scaleodm_staging.rstrip("/"),
            s3_endpoint=s.scaleodm_s3_endpoint,
            memory_gib=s.scaleodm_memory_gib,
            max_parallel_tasks=s.scaleodm_max_parallel_tasks,
        )


def is_scaleodm_url(url: str) -> bool:
    """Whether ``url`` names a ScaleODM (``scaleodm+http(s)://``)."""
    return url.startswith(SCHEME_PREFIX)


class ScaleODMClient(PolledBackend):
    """One ScaleODM server (implements :class:`~prefect_odm.nodes.backend.NodeBackend`).

    Args:
        url: ``scaleodm+http://host:port`` (or plain ``http://``); a ``?token=`` is the token.
        token: the API token (ScaleODM's ``token`` query parameter).
        settings: staging prefix, S3 endpoint and capacity; from the environment when ``None``.
        timeout_seconds: per-request timeout.

    Raises:
        ValueError: not an http(s) URL.
        InputError: no usable staging prefix.
    """

    oom_markers = OOM_MARKERS
    no_message = "task failed (ScaleODM gave no error message)"

    def __init__(
        self,
        url: str,
        token: str | None = None,
        *,
        settings: ScaleODMSettings | None = None,
        timeout_seconds: float = 30.0,
    ) -> None:
        """Check the URL and resolve the settings (nothing is sent to the server yet)."""
        self.url = public_url(url)
        api = self.url.removeprefix(SCHEME_PREFIX)
        if not api.startswith(("http://", "https://")):
            raise ValueError(
                f"not a ScaleODM URL: {self.url!r} (expected scaleodm+http://host:port)"
            )
        self._api = api
        self._token = token
        self.settings = settings or ScaleODMSettings.from_environment()
        self.timeout_seconds = timeout_seconds
        self._session = requests.Session()

    def __repr__(self) -> str:
        """The server's URL (the token never appears)."""
        return f"ScaleODMClient({self.url!r})"

    # HTTP

    def _request(
        self,
        method: str,
        route: str,
        *,
        uuid: str | None = None,
        missing_ok: bool = False,
        **kwargs: Any,
    ) -> Any:
        """One call; the JSON answer (``None`` for a 404 when ``missing_ok``).

        Raises:
            TransientNodeError: no connection, a time-out or HTTP 5xx.
            NodeError: HTTP 4xx (the problem document's ``detail`` or ``title`` quoted).
        """
        params = {"token": self._token} if self._token else None
        try:
            answer = self._session.request(
                method, self._api + route, params=params, timeout=self.timeout_seconds, **kwargs
            )
        except requests.RequestException as exc:
            said = type(exc).__name__
            raise self.error(TransientNodeError, f"{method} {route}: {said}", uuid) from exc
        if answer.status_code == 404 and missing_ok:
            return None
        if answer.status_code >= 400:
            said = _problem_text(answer)
            kind = TransientNodeError if answer.status_code >= 500 else NodeError
            raise self.error(kind, f"{method} {route}: HTTP {answer.status_code} {said!r}", uuid)
        try:
            return answer.json()
        except ValueError as exc:
            said = answer.text[:80]
            raise self.error(NodeError, f"{method} {route}: not JSON ({said!r})", uuid) from exc

    # where a task's files are

    def task_prefix(self, uuid: str) -> str:
        """``{staging_url}/{uuid}``: the task's images (``/images/``), products (``/output/``)
        and ScaleODM's UUID for it (``/task.json``)."""
        return f"{self.settings.staging_url}/{uuid}"

    def _remote_uuid(self, uuid: str) -> str | None:
        record = f"{self.task_prefix(uuid)}/{TASK_RECORD}"
        try:
            if not storage.exists(record):
                return None
            return str(storage.read_json(record)["scaleodm_uuid"])
        except (StorageError, OSError, KeyError, ValueError) as exc:
            raise TransientNodeError(
                f"cannot read {record}: {exc}", node_url=self.url, task_uuid=uuid
            ) from exc

    # NodeBackend

    def info(self) -> NodeInfo:
        """``/info`` with the configured memory and task slots in place of what ScaleODM
        leaves out (``totalMemory``, ``maxParallelTasks``)."""
        raw = self._request("GET", "/info")
        if not isinstance(raw, dict) or "engine" not in raw:
            raise NodeError(f"GET /info answered {raw!r}", node_url=self.url)
        raw = {
            **raw,
            "totalMemory": int(self.settings.memory_gib * 2**30 / 0.9),
            "maxParallelTasks": self.settings.max_parallel_tasks,
        }
        return NodeInfo.from_json(raw)

    def options(self) -> list[NodeOption]:
        """``/options`` (ScaleODM lists ODM's options as NodeODM does)."""
        raw = self._request("GET", "/options")
        return [NodeOption.from_json(o) for o in raw if isinstance(o, dict)]

    def task_list(self) -> list[str]:
        """Always raises: ScaleODM lists its own workflow names, not this library's UUIDs, so
        callers ask for each UUID (:func:`~prefect_odm.nodes.backend.find_tasks` does)."""
        raise NodeError("ScaleODM task names are not this library's UUIDs", node_url=self.url)

    def task_state(self, uuid: str, *, with_output: int | None = None) -> TaskState | None:
        """The state of this library's task ``uuid``; ``None`` when it was never created here
        or ScaleODM forgot it (HTTP 404)."""
        remote = self._remote_uuid(uuid)
        if remote is None:
            return None
        route = f"/task/{remote}/info"
        if with_output is not None:
            route += f"?with_output={int(with_output)}"
        raw = self._request("GET", route, uuid=uuid, missing_ok=True)
        if raw is None:
            return None
        status = raw.get("status") or {}
        return TaskState(
            uuid=uuid,
            status=int(status.get("code", 0)),
            progress=float(raw.get("progress", 0) or 0),
            error_message=str(status.get("errorMessage", "") or ""),
            images_count=int(raw.get("imagesCount", 0) or 0),
            processing_time_ms=int(raw.get("processingTime", -1) or -1),
            info={**raw, "scaleodm_uuid": remote},
        )

    def output(self, uuid: str, line: int = -30) -> list[str]:
        """Console lines of the task (``/task/{uuid}/output``); empty when unknown."""
        remote = self._remote_uuid(uuid)
        if remote is None:
            return []
        raw = self._request(
            "GET", f"/task/{remote}/output?line={int(line)}", uuid=uuid, missing_ok=True
        )
        return [str(x) for x in raw] if isinstance(raw, list) else []

    def create_task(
        self, uuid: str, files: Sequence[str], options: Mapping[str, Any], **new: Unpack[NewTask]
    ) -> str:
        """Copy the images under the task's prefix, then ``POST /task/new`` with
        ``readS3Path``/``writeS3Path``/``s3Endpoint``; returns ``uuid``.

        Images already in S3 are copied server-side (s3fs ``copy``: S3 CopyObject); others
        are uploaded. ``outputs`` is not sent: ScaleODM copies the whole project folder.

        Raises:
            TransientNodeError: the copy or the request failed for a transient reason.
            NodeError: ScaleODM refused the task.
        """
        prefix = self.task_prefix(uuid)
        copy_images(files, f"{prefix}/images", progress=new.get("progress"))
        fields = {
            "name": new["name"],
            "options": json.dumps([{"name": k, "value": v} for k, v in sorted(options.items())]),
            "readS3Path": f"{prefix}/images/",
            "writeS3Path": f"{prefix}/output/",
            "skipPostProcessing": "true",
        }
        if self.settings.s3_endpoint:
            fields["s3Endpoint"] = self.settings.s3_endpoint
        answer = self._request(
            "POST",
            "/task/new",
            uuid=uuid,
            files={k: (None, v) for k, v in fields.items()},
            headers={"set-uuid": uuid},
        )
        remote = answer.get("uuid") if isinstance(answer, dict) else None
        if not remote:
            raise NodeError(
                f"POST /task/new answered {answer!r}", node_url=self.url, task_uuid=uuid
            )
        storage.write_json_atomic(
            f"{prefix}/{TASK_RECORD}", {"scaleodm_uuid": remote, "node": self.url}
        )
        logger.info("%s: task %s is ScaleODM task %s", self.url, uuid, remote)
        return uuid

    def download(self, uuid: str, dest: Path) -> Path:
        """Copy the task's products from ``writeS3Path`` into ``dest`` (ODM's folder layout).

        Raises:
            TransientNodeError: the output prefix cannot be read.
        """
        source = f"{self.task_prefix(uuid)}/output"
        try:
            fs, path = storage.filesystem(source)
            found = [str(p) for p in fs.find(path)]
            for item in found:
                relative = item[len(path) :].lstrip("/")
                if not relative or ".." in relative.split("/"):
                    continue
                target = dest / relative
                target.parent.mkdir(parents=True, exist_ok=True)
                fs.get_file(item, str(target))
        except (StorageError, OSError) as exc:
            raise TransientNodeError(
                f"cannot read the products under {source}: {exc}",
                node_url=self.url,
                task_uuid=uuid,
            ) from exc
        return dest

    def cancel(self, uuid: str) -> bool:
        """``POST /task/cancel`` (deletes the Argo workflow)."""
        return self._post_uuid("/task/cancel", uuid)

    def remove(self, uuid: str) -> bool:
        """``POST /task/remove`` (workflow and metadata)."""
        return self._post_uuid("/task/remove", uuid)

    def restart(self, uuid: str, options: Mapping[str, Any] | None = None) -> bool:
        """Declines (``False``): ScaleODM restarts a task as a new workflow whose name it does
        not answer, so the task could no longer be followed."""
        return False

    def _post_uuid(self, route: str, uuid: str) -> bool:
        remote = self._remote_uuid(uuid)
        if remote is None:
            return False
        answer = self._request("POST", route, uuid=uuid, json={"uuid": remote}, missing_ok=True)
        return bool(isinstance(answer, dict) and answer.get("success"))


def copy_images(
    files: Sequence[str], prefix: str, *, progress: Callable[[int, int], None] | None = None
) -> list[str]:
    """Copy ``files`` (local paths or fsspec URLs) to ``{prefix}/{name}``; the URLs written.

    Objects already in the same S3 endpoint are copied server-side (S3 CopyObject through
    s3fs), so the images never pass through this machine; local files are uploaded.

    Raises:
        TransientNodeError: a copy failed.
    """
    written = []
    for done, source in enumerate(files, start=1):
        target = f"{prefix}/{source.rstrip('/').rsplit('/', 1)[-1]}"
        try:
            if source.startswith("s3://") and prefix.startswith("s3://"):
                fs, path = storage.filesystem(source)
                fs.copy(path, target.removeprefix("s3://"))
            else:
                storage.put_file(Path(storage.local_path(source)), target)
        except (StorageError, OSError) as exc:
            raise TransientNodeError(f"cannot copy {source} to {target}: {exc}") from exc
        written.append(target)
        if progress is not None:
            progress(done, len(files))
    return written


def _problem_text(answer: requests.Response) -> str:
    """The ``detail`` (else ``title``, ``error``) of an error answer, else its first text."""
    try:
        body = answer.json()
    except ValueError:
        return answer.text[:200]
    if isinstance(body, dict):
        for key in ("detail", "title", "error"):
            if body.get(key):
                return str(body[key])
    return str(body)[:200]
