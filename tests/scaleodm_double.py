"""A loopback double of hotosm/ScaleODM's NodeODM-compatible API, for the ScaleODM backend's tests.

It follows ScaleODM's routes and answers as ``app/api/nodeodm_api.go`` writes them (HEAD of
hotosm/ScaleODM): ``POST /task/new`` takes multipart fields ``readS3Path`` (required, ``s3://``),
``writeS3Path`` (default ``readS3Path + "output/"``), ``s3Endpoint``, ``options`` (JSON text),
``name``; the ``set-uuid`` header is accepted and ignored (the UUID is a generated workflow
name); errors are HTTP 4xx/5xx problem documents (``{"title", "status", "detail"}``); an unknown
task is HTTP 404; ``/info`` has no memory and no task slots; cancel and remove read a JSON
``{"uuid"}``. Where ScaleODM runs an Argo workflow (rclone download, ODM, rclone upload of the
project folder to ``writeS3Path``), the double downloads the images from the S3 endpoint it was
given, processes them on a real built-in engine (``engine_url``), and copies that engine's
products (ODM's folder layout) to ``writeS3Path``.

Faults: ``oom_first=N`` makes the first N tasks fail as Argo reports a pod killed for memory
(``OOMKilled (exit code 137)``), after their images were read; ``fail_first=N`` makes the
first N fail as Argo reports a container that exited with an error (``Error (exit code 1)``).
"""

from __future__ import annotations

import json
import tempfile
import threading
import time
import uuid as uuidlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from prefect_odm.errors import NodeError
from prefect_odm.nodes.client import NodeClient


@dataclass
class Job:
    uuid: str
    name: str
    read: str
    write: str
    endpoint: str | None
    options: list[dict[str, Any]]
    images: list[str]
    created_ms: int
    status: int = 10
    progress: int = 0
    error: str = ""
    output: list[str] = field(default_factory=list)
    started: float | None = None


def _problem(status: int, detail: str) -> JSONResponse:
    title = {400: "Bad Request", 404: "Not Found", 500: "Internal Server Error"}.get(status, "")
    return JSONResponse({"title": title, "status": status, "detail": detail}, status_code=status)


def _s3(endpoint: str | None) -> Any:
    import s3fs

    kwargs = {"client_kwargs": {"endpoint_url": endpoint}} if endpoint else {}
    return s3fs.S3FileSystem(skip_instance_cache=True, **kwargs)


class ScaleODMDouble:
    """The double's state and its FastAPI app (``app``)."""

    def __init__(self, engine_url: str, *, oom_first: int = 0, fail_first: int = 0) -> None:
        self.engine = NodeClient(engine_url)
        self.oom_left = oom_first
        self.fail_left = fail_first
        self.jobs: dict[str, Job] = {}
        self.requests: list[dict[str, Any]] = []
        """Every ``POST /task/new`` as received: form fields and the ``set-uuid`` header."""
        self._lock = threading.Lock()
        self.app = self._build()

    def _build(self) -> FastAPI:
        app = FastAPI()

        @app.get("/info")
        def info() -> dict[str, Any]:
            queued = sum(1 for j in self.jobs.values() if j.status in (10, 20))
            return {
                "version": "0.0.0-double",
                "taskQueueCount": queued,
                "maxImages": None,
                "engine": "odm",
                "engineVersion": "opendronemap/odm:3.5.6",
            }

        @app.get("/options")
        def options() -> Any:
            return [o.raw for o in self.engine.options()]

        @app.post("/task/new")
        async def task_new(request: Request) -> Any:
            form = await request.form()
            fields = {k: str(v) for k, v in form.items()}
            self.requests.append({**fields, "set-uuid": request.headers.get("set-uuid")})
            read = fields.get("readS3Path", "")
            if not read:
                return _problem(400, "readS3Path is required (or zipurl for legacy support)")
            if not read.startswith("s3://"):
                return _problem(400, "readS3Path must be an s3:// path")
            read = read.rstrip("/") + "/"
            write = fields.get("writeS3Path") or read + "output/"
            if not write.startswith("s3://"):
                return _problem(400, "writeS3Path must be an s3:// path")
            try:
                opts = json.loads(fields.get("options") or "[]")
            except json.JSONDecodeError:
                return _problem(400, "Invalid options JSON")
            endpoint = fields.get("s3Endpoint") or None
            fs = _s3(endpoint)
            images = sorted(
                p
                for p in fs.find(read.removeprefix("s3://"), maxdepth=1)
                if p.lower().endswith((".jpg", ".jpeg", ".tif", ".tiff", ".png"))
            )
            if not images:
                return _problem(400, "Unable to read imagery from readS3Path")
            name = f"odm-workflow-{uuidlib.uuid4().hex[:5]}"
            job = Job(
                name, fields.get("name") or "odm-project", read, write, endpoint, opts, images,
                int(time.time() * 1000),
            )  # fmt: skip
            with self._lock:
                self.jobs[name] = job
            threading.Thread(target=self._run, args=(job,), daemon=True).start()
            return {"uuid": name}

        @app.get("/task/list")
        def task_list() -> Any:
            return [{"uuid": u} for u in sorted(self.jobs)]

        @app.get("/task/{uuid}/info")
        def task_info(uuid: str, with_output: int = 0) -> Any:
            job = self.jobs.get(uuid)
            if job is None:
                return _problem(404, "Task not found")
            status: dict[str, Any] = {"code": job.status}
            if job.error:
                status["errorMessage"] = job.error
            answer = {
                "uuid": job.uuid,
                "name": job.name,
                "dateCreated": job.created_ms,
                "processingTime": -1
                if job.started is None
                else int((time.time() - job.started) * 1000),
                "status": status,
                "options": job.options,
                "imagesCount": len(job.images),
                "progress": job.progress,
            }
            if with_output:
                answer["output"] = job.output[with_output:]
            return answer

        @app.get("/task/{uuid}/output")
        def task_output(uuid: str, line: int = 0) -> Any:
            job = self.jobs.get(uuid)
            if job is None:
                return _problem(404, "Task not found")
            return job.output[line:]

        @app.post("/task/cancel")
        async def cancel(request: Request) -> Any:
            uuid = (await request.json()).get("uuid", "")
            job = self.jobs.get(uuid)
            if job is None:
                return _problem(404, "Task not found")
            job.status = 50
            return {"success": True}

        @app.post("/task/remove")
        async def remove(request: Request) -> Any:
            uuid = (await request.json()).get("uuid", "")
            with self._lock:
                self.jobs.pop(uuid, None)
            return {"success": True}

        return app

    def _run(self, job: Job) -> None:
        """The workflow: download from S3, process on the engine, upload the project folder."""
        job.status, job.started = 20, time.time()
        fs = _s3(job.endpoint)
        with tempfile.TemporaryDirectory(prefix="scaleodm-double-") as tmp:
            local = Path(tmp) / "images"
            local.mkdir()
            for key in job.images:
                fs.get_file(key, str(local / key.rsplit("/", 1)[-1]))
            job.output.append(f"downloaded {len(job.images)} images from {job.read}")
            with self._lock:
                oom, fail = self.oom_left > 0, self.oom_left <= 0 < self.fail_left
                self.oom_left -= int(oom)
                self.fail_left -= int(fail)
            if oom:
                job.output.append("process: OOMKilled")
                job.status, job.error = 30, "OOMKilled (exit code 137)"
                return
            if fail:
                job.output.append("process: [ERROR] The program exited with code 1")
                job.status, job.error = 30, "Error (exit code 1)"
                return
            try:
                uuid = self.engine.create_task(
                    str(uuidlib.uuid4()),
                    [str(p) for p in sorted(local.iterdir())],
                    {o["name"]: o["value"] for o in job.options},
                    name=job.name,
                )
                state = self.engine.wait(
                    uuid, on_progress=lambda s: setattr(job, "progress", int(s.progress))
                )
                job.output.extend(self.engine.output(uuid, -10))
                project = self.engine.download(state.uuid, Path(tmp) / "project")
                target = job.write.removeprefix("s3://").rstrip("/")
                for path in sorted(p for p in project.rglob("*") if p.is_file()):
                    fs.put_file(str(path), f"{target}/{path.relative_to(project).as_posix()}")
            except NodeError as exc:
                job.status, job.error = 30, str(exc).splitlines()[0]
                return
            if job.status == 20:
                job.status, job.progress = 40, 100


class Served:
    """The double served by uvicorn on 127.0.0.1 in a thread (``url``, ``stop()``)."""

    def __init__(self, double: ScaleODMDouble) -> None:
        config = uvicorn.Config(double.app, host="127.0.0.1", port=0, log_level="warning")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("the ScaleODM double did not start")
            time.sleep(0.05)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
