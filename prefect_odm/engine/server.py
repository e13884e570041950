"""The built-in engine's HTTP server: :func:`serve` runs NodeODM's API for one data folder.

The pieces: :mod:`.node` (:class:`Engine`, the state and operations, and :class:`EngineConfig`),
:mod:`.routes` (the FastAPI application), :mod:`.uploads` (uploaded files), :mod:`.store` (the
durable task table), :mod:`.supervisor` and :mod:`.runner` (one process per task). It binds
127.0.0.1 unless told otherwise.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time

from prefect_odm.engine.node import Engine, EngineConfig
from prefect_odm.engine.routes import create_app
from prefect_odm.errors import EngineError

__all__ = ["Engine", "EngineConfig", "EngineError", "create_app", "serve"]

logger = logging.getLogger(__name__)

PARENT_POLL_SECONDS = 0.5
"""How often an engine with a starter checks that its starter still runs."""


def watch_parent(parent_pid: int, poll_seconds: float = PARENT_POLL_SECONDS) -> threading.Thread:
    """SIGTERM this process (a graceful stop) once ``parent_pid`` is no longer its parent.

    When a process dies its children are re-parented (to PID 1 or a sub-reaper), so a changed
    ``os.getppid()`` means the starter is gone, whatever killed it. Runs in a daemon thread.
    """

    def loop() -> None:
        while os.getppid() == parent_pid:
            time.sleep(poll_seconds)
        logger.warning("the engine's starter (pid %d) is gone; stopping", parent_pid)
        os.kill(os.getpid(), signal.SIGTERM)

    thread = threading.Thread(target=loop, name="engine-parent-watch", daemon=True)
    thread.start()
    return thread


def serve(config: EngineConfig, *, parent_pid: int | None = None) -> None:
    """Run the engine's HTTP server until SIGTERM or SIGINT (blocking).

    Args:
        config: the engine settings.
        parent_pid: the starter's pid: the engine stops when that process ends (None: never).

    Raises:
        ImportError: the pipeline cannot be imported.
        StorageError: another engine process uses ``config.data_dir``, or its task table
            cannot be read.
        OSError: the address cannot be bound.
    """
    import uvicorn

    if parent_pid is not None:
        watch_parent(parent_pid)
    engine = Engine(config)
    app = create_app(engine)
    uvicorn_config = uvicorn.Config(
        app,
        host=config.host,
        port=config.port,
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=5,
    )
    uvicorn.Server(uvicorn_config).run()
