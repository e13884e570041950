"""The built-in engine: a NodeODM-compatible processing node (HTTP API, durable task table,
one process per task) around the photogrammetry pipeline in :mod:`.pipeline`.

Start one with :func:`prefect_odm.engine.launch.start_engine` or
``python -m prefect_odm.engine serve``. Nothing heavy is imported here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from prefect_odm.engine.launch import EngineProcess, start_engine

__all__ = ["EngineProcess", "start_engine"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from prefect_odm.engine import launch

        return getattr(launch, name)
    raise AttributeError(name)
