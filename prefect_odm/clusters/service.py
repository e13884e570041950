"""``prefect-odm capacity serve``: the clusters' figures over HTTP (FastAPI), for an autoscaler
(KEDA's metrics-api scaler), Prometheus or a dashboard.

Routes: ``GET /health`` (the service answers and when the figures were last refreshed),
``GET /clusters`` (every cluster's JSON), ``GET /clusters/{name}`` (one, 404 when unknown),
``GET /metrics`` (Prometheus text, version 0.0.4). No request waits on Prefect or a node: a
background thread refreshes the figures every ``refresh_seconds`` and the routes read its cache,
so ``/health`` stays fast however many runs wait.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from fastapi import FastAPI, HTTPException
from fastapi.responses import PlainTextResponse

from prefect_odm.clusters.directory import ClusterDirectory
from prefect_odm.clusters.figures import ClusterFigures, prometheus_text

logger = logging.getLogger(__name__)

DEFAULT_REFRESH_SECONDS = 5.0
"""How often the background thread reads Prefect and the nodes again."""


@dataclass
class FiguresCache:
    """The last figures of every cluster, refreshed by a daemon thread.

    ``read`` is called as ``read(directory)`` and returns the figures (normally
    :func:`prefect_odm.clusters.capacity.directory_figures`); a refresh that raises keeps the
    previous figures and records the error for ``/health``.
    """

    directory: ClusterDirectory
    read: Callable[[ClusterDirectory], list[ClusterFigures]]
    refresh_seconds: float = DEFAULT_REFRESH_SECONDS
    figures: list[ClusterFigures] = field(default_factory=list)
    refreshed_at: float | None = None
    last_error: str | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def refresh(self) -> None:
        """Read the figures once (the caller's thread)."""
        try:
            figures = self.read(self.directory)
        except Exception as exc:  # noqa: BLE001 - kept for /health; the old figures stay
            logger.warning("capacity refresh failed: %s", exc)
            with self._lock:
                self.last_error = f"{type(exc).__name__}: {exc}"
            return
        with self._lock:
            self.figures, self.refreshed_at, self.last_error = figures, time.time(), None

    def start(self) -> threading.Thread:
        """Refresh every ``refresh_seconds`` in a daemon thread until :meth:`stop`."""

        def loop() -> None:
            while not self._stop.wait(self.refresh_seconds):
                self.refresh()

        thread = threading.Thread(target=loop, name="capacity-refresh", daemon=True)
        thread.start()
        return thread

    def stop(self) -> None:
        """End the refresh thread after its current pass."""
        self._stop.set()

    def snapshot(self) -> tuple[list[ClusterFigures], float | None, str | None]:
        """The figures, when they were read (Unix seconds) and the last refresh error."""
        with self._lock:
            return list(self.figures), self.refreshed_at, self.last_error


def create_app(cache: FiguresCache) -> FastAPI:
    """The FastAPI app of the capacity service, reading ``cache`` only."""
    app = FastAPI(title="prefect-odm capacity", version="1")

    @app.get("/health")
    def health() -> dict[str, object]:
        figures, refreshed_at, error = cache.snapshot()
        age = None if refreshed_at is None else round(time.time() - refreshed_at, 3)
        return {
            "status": "ok" if refreshed_at is not None and error is None else "stale",
            "clusters": len(cache.directory.clusters),
            "ready": sorted(f.cluster for f in figures if f.ready),
            "queue_depth": sum(f.queue_depth for f in figures),
            "figures_age_seconds": age,
            "last_error": error,
        }

    @app.get("/clusters")
    def clusters() -> list[dict[str, object]]:
        return [f.to_json() for f in cache.snapshot()[0]]

    @app.get("/clusters/{name}")
    def one_cluster(name: str) -> dict[str, object]:
        for f in cache.snapshot()[0]:
            if f.cluster == name:
                return f.to_json()
        known = ", ".join(c.name for c in cache.directory.clusters)
        raise HTTPException(status_code=404, detail=f"no cluster {name!r}; known: {known}")

    @app.get("/metrics", response_class=PlainTextResponse)
    def metrics() -> PlainTextResponse:
        return PlainTextResponse(
            prometheus_text(cache.snapshot()[0]), media_type="text/plain; version=0.0.4"
        )

    return app


def serve(
    directory: ClusterDirectory,
    host: str = "127.0.0.1",
    port: int = 8900,
    refresh_seconds: float = DEFAULT_REFRESH_SECONDS,
) -> None:
    """Read the figures once, then serve them with uvicorn until interrupted."""
    import uvicorn

    from prefect_odm.clusters.capacity import PlanMemory, directory_figures

    memory = PlanMemory()
    cache = FiguresCache(directory, lambda d: directory_figures(d, memory), refresh_seconds)
    cache.refresh()
    cache.start()
    try:
        uvicorn.run(create_app(cache), host=host, port=port, log_level="warning")
    finally:
        cache.stop()
