"""Helpers shared by the node protocol tests: the node handle and task shortcuts (no fixtures;
those are in ``node_backends``, registered with ``pytest_plugins``)."""

from __future__ import annotations

import time
import uuid as uuidlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import peers

from prefect_odm.nodes.client import (
    QUEUED,
    RUNNING,
    NodeClient,
    TaskState,
    task_uuid,
)

BACKENDS = ("engine", "nodeodm")
IMAGES = sorted((peers.SHARED / "data" / "brighton_beach_1600" / "images").glob("*.JPG"))
POLL_SECONDS = 0.2


@dataclass
class Node:
    """A running node of either backend, with what a test may do to it."""

    backend: str
    url: str
    token: str | None
    kill: Callable[[], None]
    restart: Callable[[], None]
    stop: Callable[[], None]
    durable: bool
    """The task table survives SIGKILL (the engine's does; NodeODM's only at SIGTERM/hourly)."""

    def client(self, *, token: str | None = None) -> NodeClient:
        """Our client for this node (with this node's token unless another is given)."""
        return NodeClient(
            self.url, token=self.token if token is None else token, timeout_seconds=15
        )

    @property
    def params(self) -> dict[str, str]:
        """Query parameters for raw HTTP requests."""
        return {"token": self.token} if self.token else {}


NodeFactory = Callable[..., Node]


def images(n: int) -> list[str]:
    assert len(IMAGES) >= n, f"brighton images not found under {peers.SHARED / 'data'}"
    return [str(p) for p in IMAGES[:n]]


def new_uuid() -> str:
    return task_uuid(uuidlib.uuid4().hex, 0)


def create(client: NodeClient, n: int = 2, options: dict[str, Any] | None = None, **kw: Any) -> str:
    return client.create_task(
        new_uuid(), images(n), options or {}, name="protocol-test", retry_base_seconds=0.05, **kw
    )


def wait_for(
    client: NodeClient, uuid: str, codes: set[int], timeout_seconds: float = 60
) -> TaskState:
    deadline = time.monotonic() + timeout_seconds
    state = client.task_state(uuid)
    while time.monotonic() < deadline:
        state = client.task_state(uuid)
        if state is not None and state.status in codes:
            return state
        time.sleep(POLL_SECONDS)
    raise AssertionError(f"task {uuid} did not reach {codes} in {timeout_seconds} s: {state}")


def running_and_queued(client: NodeClient) -> tuple[str, str]:
    """Two tasks on a node with one slot: the first RUNNING, the second QUEUED behind it."""
    first = create(client, 1)
    wait_for(client, first, {RUNNING})
    second = create(client, 1)
    wait_for(client, second, {QUEUED}, timeout_seconds=10)
    return first, second
