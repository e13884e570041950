"""Both node backends for the protocol tests: the built-in engine and the real NodeODM 2.2.4.

``start_node`` (a fixture, parametrised by ``backend``) starts nodes of the backend under test
with NodeODM's test flags mapped onto the engine's fault injection: ``token``, ``drop_uploads``
(NodeODM ``--test_drop_uploads``; engine ``upload_error_every=2``), ``parallel`` (``-q``;
``max_parallel_tasks``), ``task_seconds`` (``--test_seconds``; ``slow_seconds``) and
``fail_tasks`` (``--test_fail_tasks``; ``fail_task_name="."``). Test modules register this
module with ``pytest_plugins = ("node_backends",)`` and import their helpers from
``node_helpers``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import peers
import pytest
from node_helpers import BACKENDS, Node, NodeFactory

from prefect_odm.engine.launch import EngineProcess, start_engine


@dataclass
class Flags:
    token: str | None = None
    drop_uploads: bool = False
    parallel: int = 2
    task_seconds: float = 0.0
    fail_tasks: bool = False
    extra: list[str] = field(default_factory=list)


def start_engine_node(work: Path, flags: Flags) -> Node:
    faults: dict[str, Any] = {"stand_in_pipeline": True}
    if flags.drop_uploads:
        faults["upload_error_every"] = 2
    if flags.task_seconds:
        faults["slow_seconds"] = flags.task_seconds
    if flags.fail_tasks:
        faults["fail_task_name"] = "."
    env = {"PREFECT_ODM_ENGINE_FAULTS": json.dumps(faults)}
    holder: list[EngineProcess] = []

    def start(port: int | None = None) -> None:
        holder.append(
            start_engine(
                work, port=port, token=flags.token, max_parallel_tasks=flags.parallel, extra_env=env
            )
        )

    def restart() -> None:
        holder[-1].kill()
        start(holder[-1].port)

    def kill() -> None:
        holder[-1].kill()

    def stop() -> None:
        if holder[-1].alive():
            holder[-1].stop()

    start()
    return Node("engine", holder[-1].url, flags.token, kill, restart, stop, durable=True)


def start_nodeodm_node(work: Path, flags: Flags) -> Node:
    args = ["-q", str(flags.parallel), *flags.extra]
    if flags.drop_uploads:
        args.append("--test_drop_uploads")
    if flags.task_seconds:
        args += ["--test_seconds", str(int(flags.task_seconds))]
    if flags.fail_tasks:
        args.append("--test_fail_tasks")
    node = peers.start_nodeodm(work, args, token=flags.token)

    def restart() -> None:
        node.restart()

    return Node("nodeodm", node.url, flags.token, node.kill, restart, node.stop, durable=False)


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    """The backend under test."""
    return str(request.param)


@pytest.fixture
def start_node(backend: str, tmp_path: Path) -> Iterator[NodeFactory]:
    """Start nodes of ``backend`` (keyword flags of :class:`Flags`); all stopped afterwards."""
    if backend == "nodeodm":
        peers.require_node()  # fails, with a clear message, when node or npm is missing
    started: list[Node] = []

    def factory(**flags: Any) -> Node:
        work = tmp_path / f"{backend}-{len(started)}"
        start = start_engine_node if backend == "engine" else start_nodeodm_node
        node = start(work, Flags(**flags))
        started.append(node)
        return node

    yield factory
    for node in started:
        node.stop()
