"""A reverse proxy in front of a Prefect API that answers 503 to a share of requests (issue 14).

``FlakyProxy(upstream, failure_rate, window_seconds)`` listens on a free 127.0.0.1 port; for
``window_seconds`` after :meth:`FlakyProxy.start_failing` every HTTP request fails with
``503 Service Unavailable`` with probability ``failure_rate`` (a seeded generator, so a run's
sequence of answers repeats), as SQLite-backed Prefect servers answer for a locked database.
Other requests and every websocket (Prefect's events and logs streams) pass through.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from dataclasses import dataclass, field

import httpx
import uvicorn
import websockets
from odm_server import free_port
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

_HOP_HEADERS = {"host", "content-length", "transfer-encoding", "connection", "keep-alive"}


@dataclass
class ProxyCounts:
    forwarded: int = 0
    failed: int = 0
    failed_paths: dict[str, int] = field(default_factory=dict)


class FlakyProxy:
    """Forward ``http://127.0.0.1:{port}/api/...`` to ``upstream`` (``http://host:port``)."""

    def __init__(self, upstream: str, failure_rate: float, window_seconds: float, seed: int = 7):
        self.upstream = upstream.rstrip("/")
        self.failure_rate = failure_rate
        self.window_seconds = window_seconds
        self.port = free_port()
        self.counts = ProxyCounts()
        self._random = random.Random(seed)
        self._failing_until = 0.0
        self._lock = threading.Lock()
        app = Starlette(
            routes=[
                WebSocketRoute("/{path:path}", self._websocket),
                Route(
                    "/{path:path}",
                    self._http,
                    methods=["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"],
                ),
            ]
        )
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, daemon=True)
        self._client: httpx.AsyncClient | None = None

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api"

    def __enter__(self) -> FlakyProxy:
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            assert time.monotonic() < deadline, "the proxy did not start"
            time.sleep(0.05)
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)

    def start_failing(self) -> None:
        with self._lock:
            self._failing_until = time.monotonic() + self.window_seconds

    def _fail_now(self, path: str) -> bool:
        with self._lock:
            if time.monotonic() >= self._failing_until:
                return False
            if self._random.random() >= self.failure_rate:
                return False
            self.counts.failed += 1
            self.counts.failed_paths[path] = self.counts.failed_paths.get(path, 0) + 1
            return True

    async def _http(self, request: Request) -> Response:
        path = request.url.path
        if path.startswith("/api/") and self._fail_now(path):
            return Response(b'{"detail":"Service Unavailable"}', status_code=503)
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=120.0)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_HEADERS}
        upstream = await self._client.request(
            request.method,
            f"{self.upstream}{path}",
            params=request.query_params.multi_items(),
            headers=headers,
            content=await request.body(),
        )
        with self._lock:
            self.counts.forwarded += 1
        out = {k: v for k, v in upstream.headers.items() if k.lower() not in _HOP_HEADERS}
        out.pop("content-encoding", None)
        return Response(upstream.content, status_code=upstream.status_code, headers=out)

    async def _websocket(self, ws: WebSocket) -> None:
        target = self.upstream.replace("http://", "ws://") + ws.url.path
        if ws.url.query:
            target += "?" + ws.url.query
        async with websockets.connect(target, max_size=None) as upstream:
            await ws.accept()

            async def down() -> None:
                async for message in upstream:
                    if isinstance(message, bytes):
                        await ws.send_bytes(message)
                    else:
                        await ws.send_text(message)

            async def up() -> None:
                try:
                    while True:
                        message = await ws.receive()
                        if message["type"] == "websocket.disconnect":
                            return
                        if message.get("text") is not None:
                            await upstream.send(message["text"])
                        elif message.get("bytes") is not None:
                            await upstream.send(message["bytes"])
                except WebSocketDisconnect:
                    return

            tasks = [asyncio.create_task(down()), asyncio.create_task(up())]
            _, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for task in pending:
                task.cancel()
