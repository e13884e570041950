"""The built-in engine's HTTP layer: NodeODM's API over FastAPI, translated into :class:`.Engine`.

Every route and answer shape follows ``NODEODM_API.md`` (NodeODM 2.2.x as pyodm, WebODM and
ClusterODM see it): errors are HTTP 200 ``{"error": ...}``, an injected upload failure is a bare
HTTP 500, unknown routes are 404. When a token is configured every route needs ``?token=``.
Every request is logged to ``{data_dir}/requests.log`` as one JSON line with the method, the path
and the *names* of the query parameters (never their values, so a token is never written down);
every accepted upload request adds one line to ``{data_dir}/uploads.log`` with the task and the
names of the files it stored (requests carry several files: tests count files there).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections.abc import AsyncIterator, Iterator
from typing import IO, Any

from fastapi import Depends, FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from pydantic import JsonValue

import prefect_odm
from prefect_odm.engine.api_records import ErrorAnswer
from prefect_odm.engine.node import Engine
from prefect_odm.engine.uploads import COPY_CHUNK_BYTES
from prefect_odm.errors import EngineError

logger = logging.getLogger(__name__)

Form = tuple[dict[str, str], list[tuple[str | None, IO[bytes]]]]
"""A multipart body: ``(text fields, [(file name, file)] of the "images" fields)``."""


class _AuthError(Exception):
    pass


def _json(payload: Any) -> JSONResponse:
    return JSONResponse(payload, status_code=200)


def _error(message: str, *, no_retry: bool = False) -> ErrorAnswer:
    answer: ErrorAnswer = {"error": message}
    if no_retry:
        answer["noRetry"] = True
    return answer


def _int_param(value: str | None, default: int | None) -> int | None:
    if value is None or value == "":
        return default
    try:
        return int(float(value))
    except ValueError:
        return default


# -- body parsing ---------------------------------------------------------------------------------


async def read_form(request: Request) -> Form:
    """The text fields and the ``images`` files of a multipart (or urlencoded) body."""
    form = await request.form(max_files=1_000_000, max_fields=10_000)
    fields: dict[str, str] = {}
    files: list[tuple[str | None, IO[bytes]]] = []
    for key, value in form.multi_items():
        if isinstance(value, str):
            fields[key] = value
        elif key == "images":
            files.append((value.filename, value.file))
    return fields, files


async def read_action_fields(request: Request) -> dict[str, JsonValue]:
    """The fields of a cancel/remove/restart body: JSON, multipart or urlencoded.

    NodeODM (and pyodm, which sends urlencoded) reads these from urlencoded or JSON bodies; our
    client once sent multipart, which the engine keeps accepting. A JSON body's values are kept
    as they are (restart's ``options`` may be JSON text or a list).
    """
    if request.headers.get("content-type", "").split(";")[0].strip() == "application/json":
        try:
            body = await request.json()
        except ValueError:
            return {}
        return dict(body) if isinstance(body, dict) else {}
    fields, _ = await read_form(request)
    return {name: value for name, value in fields.items()}


async def _uuid_field(request: Request) -> tuple[str, dict[str, JsonValue]]:
    """The ``uuid`` field and all the fields of a cancel/remove/restart body.

    Raises:
        EngineError: no ``uuid`` field.
    """
    fields = await read_action_fields(request)
    uuid = fields.get("uuid")
    if not uuid or not isinstance(uuid, str):
        raise EngineError("uuid param missing.")
    return uuid, fields


# -- the application ------------------------------------------------------------------------------


def create_app(engine: Engine, *, manage_lifecycle: bool = True) -> FastAPI:
    """The FastAPI application serving NodeODM's API for ``engine``.

    Args:
        engine: the engine.
        manage_lifecycle: start the engine on application start-up and stop it on shutdown.
    """

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        if manage_lifecycle:
            engine.start()
        try:
            yield
        finally:
            if manage_lifecycle:
                engine.stop()

    app = FastAPI(
        title="prefect-odm built-in engine",
        version=prefect_odm.__version__,
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    _add_request_log(app, engine)
    _add_error_answers(app)
    auth = _auth(engine)
    _add_info_routes(app, engine, auth)
    _add_new_task_routes(app, engine, auth)
    _add_task_routes(app, engine, auth)
    _add_task_action_routes(app, engine, auth)
    return app


def _auth(engine: Engine) -> list[Any]:
    """The dependency list every route carries: the ``?token=`` check."""

    async def check_token(request: Request) -> None:
        if not engine.check_token(request.query_params.get("token")):
            raise _AuthError()

    return [Depends(check_token)]


def _add_request_log(app: FastAPI, engine: Engine) -> None:
    request_log = engine.data_dir / "requests.log"

    @app.middleware("http")
    async def log_request(request: Request, call_next: Any) -> Any:
        line = json.dumps(
            {
                "method": request.method,
                "path": request.url.path,
                "query": sorted(request.query_params),
            }
        )
        with open(request_log, "a", encoding="utf-8") as fh:
            fh.write(line + "\n")
        return await call_next(request)


def _add_error_answers(app: FastAPI) -> None:
    @app.exception_handler(_AuthError)
    async def _auth_failed(_: Request, __: _AuthError) -> JSONResponse:
        return _json(_error("Invalid authentication token: token does not match."))

    @app.exception_handler(EngineError)
    async def _refused(_: Request, exc: EngineError) -> JSONResponse:
        return _json(_error(str(exc), no_retry=exc.no_retry))


def _add_info_routes(app: FastAPI, engine: Engine, auth: list[Any]) -> None:
    @app.get("/info", dependencies=auth)
    def info() -> JSONResponse:
        return _json(engine.info())

    @app.get("/options", dependencies=auth)
    def options() -> JSONResponse:
        return _json(engine.options())


def _add_new_task_routes(app: FastAPI, engine: Engine, auth: list[Any]) -> None:
    """``/task/new/init``, ``/task/new/upload/{uuid}``, ``/task/new/commit/{uuid}``, ``/task/new``."""

    @app.post("/task/new/init", dependencies=auth)
    async def task_new_init(request: Request) -> JSONResponse:
        fields, _ = await read_form(request)
        result = await run_in_threadpool(engine.init_task, fields, request.headers.get("set-uuid"))
        return _json(result)

    @app.post("/task/new/upload/{uuid}", dependencies=auth)
    async def task_new_upload(uuid: str, request: Request) -> Response:
        ordinal = engine.next_upload_ordinal()
        if engine.config.faults.upload_should_fail(ordinal):
            return PlainTextResponse("Internal Server Error (injected fault)", status_code=500)
        try:
            _, files = await read_form(request)
        except Exception as exc:  # a broken multipart body: the chunk failed, the client retries
            logger.warning("upload to %s failed: %s", uuid, exc)
            return PlainTextResponse(f"Upload failed: {exc}", status_code=500)
        stored = await run_in_threadpool(engine.store_files, uuid, files)
        with open(engine.data_dir / "uploads.log", "a", encoding="utf-8") as fh:
            fh.write(json.dumps({"uuid": uuid, "files": stored}) + "\n")
        engine.config.faults.die_if_upload_limit(ordinal)
        return _json({"success": True})

    @app.post("/task/new/commit/{uuid}", dependencies=auth)
    async def task_new_commit(uuid: str) -> JSONResponse:
        return _json(await run_in_threadpool(engine.commit, uuid))

    @app.post("/task/new", dependencies=auth)
    async def task_new(request: Request) -> JSONResponse:
        fields, files = await read_form(request)
        created = await run_in_threadpool(engine.init_task, fields, request.headers.get("set-uuid"))
        uuid = created["uuid"]
        try:
            if files:
                await run_in_threadpool(engine.store_files, uuid, files)
            if fields.get("zipurl"):
                await run_in_threadpool(engine.fetch_zipurl, uuid, fields["zipurl"])
            if not files and not fields.get("zipurl"):
                raise EngineError("Need at least 1 file.", no_retry=True)
            return _json(await run_in_threadpool(engine.commit, uuid))
        except EngineError:
            await run_in_threadpool(engine.discard, uuid)
            raise


def _add_task_routes(app: FastAPI, engine: Engine, auth: list[Any]) -> None:
    """``/task/list``, ``/task/{uuid}/info``, ``/task/{uuid}/output``, the download."""

    @app.get("/task/list", dependencies=auth)
    def task_list() -> JSONResponse:
        return _json(engine.list_tasks())

    @app.get("/task/{uuid}/info", dependencies=auth)
    def task_info(uuid: str, request: Request) -> JSONResponse:
        with_output = _int_param(request.query_params.get("with_output"), None)
        return _json(engine.info_of(uuid, with_output))

    @app.get("/task/{uuid}/output", dependencies=auth)
    def task_output(uuid: str, request: Request) -> JSONResponse:
        line = _int_param(request.query_params.get("line"), 0) or 0
        return _json(engine.output_of(uuid, line))

    @app.get("/task/{uuid}/download/{asset}", dependencies=auth)
    def task_download(uuid: str, asset: str) -> Response:
        path = engine.zip_of(uuid, asset)
        if engine.config.faults.slow_download_seconds > 0:
            time.sleep(engine.config.faults.slow_download_seconds)
        handle = open(path, "rb")  # noqa: SIM115 - closed by the generator
        size = os.fstat(handle.fileno()).st_size

        def chunks() -> Iterator[bytes]:
            with handle:
                while chunk := handle.read(COPY_CHUNK_BYTES):
                    yield chunk

        return StreamingResponse(
            chunks(),
            media_type="application/zip",
            headers={
                "Content-Length": str(size),
                "Content-Disposition": f'attachment; filename="{asset}"',
            },
        )


def _add_task_action_routes(app: FastAPI, engine: Engine, auth: list[Any]) -> None:
    """``/task/cancel``, ``/task/remove``, ``/task/restart``."""

    @app.post("/task/cancel", dependencies=auth)
    async def task_cancel(request: Request) -> JSONResponse:
        uuid, _ = await _uuid_field(request)
        return _json(await run_in_threadpool(engine.cancel, uuid))

    @app.post("/task/remove", dependencies=auth)
    async def task_remove(request: Request) -> JSONResponse:
        uuid, _ = await _uuid_field(request)
        return _json(await run_in_threadpool(engine.remove, uuid))

    @app.post("/task/restart", dependencies=auth)
    async def task_restart(request: Request) -> JSONResponse:
        uuid, fields = await _uuid_field(request)
        options = fields.get("options")
        if options is not None and not isinstance(options, str | list | dict):
            options = json.dumps(options)
        return _json(await run_in_threadpool(engine.restart, uuid, options))
