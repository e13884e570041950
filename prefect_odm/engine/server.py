"""The built-in engine's HTTP server: :func:`serve` runs NodeODM's API for one data folder.

The pieces: :mod:`.node` (:class:`Engine`, the state and operations, and :class:`EngineConfig`),
:mod:`.routes` (the FastAPI application), :mod:`.uploads` (uploaded files), :mod:`.store` (the
durable task table), :mod:`.supervisor` and :mod:`.runner` (one process per task). It binds
127.0.0.1 unless told otherwise.
"""

from __future__ import annotations

from prefect_odm.engine.node import Engine, EngineConfig
from prefect_odm.engine.routes import create_app
from prefect_odm.errors import EngineError

__all__ = ["Engine", "EngineConfig", "EngineError", "create_app", "serve"]


def serve(config: EngineConfig) -> None:
    """Run the engine's HTTP server until SIGTERM or SIGINT (blocking).

    Raises:
        ImportError: the pipeline cannot be imported.
        StorageError: another engine process uses ``config.data_dir``, or its task table
            cannot be read.
        OSError: the address cannot be bound.
    """
    import uvicorn

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
