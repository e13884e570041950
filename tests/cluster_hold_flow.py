"""A flow run that holds a worker and says how much memory it holds (``memory_gib``, read by
the capacity figures): another survey's submodel running on a cluster, for the routing test."""

from __future__ import annotations

import time

from prefect import flow


@flow(name="hold")
def hold(memory_gib: float, seconds: float = 900.0) -> None:
    """Sleep ``seconds`` (until cancelled), holding ``memory_gib`` of its cluster."""
    time.sleep(seconds)
