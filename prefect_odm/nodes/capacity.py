"""A node's capacity from its ``/info``, with the values no real machine reports made unknown.

Pure core (no I/O). ``/info`` is trusted only where it is plausible:

* ClusterODM answers for a whole cluster with the sentinel ``99999999999`` for ``totalMemory``,
  ``availableMemory``, ``cpuCores`` and (with no limit set) ``maxParallelTasks``
  (ClusterODM ``libs/proxy.js``, ``/info`` handler, HEAD 69181e2); it also reports ``engine`` and
  ``engineVersion`` as ``"?"`` when no node is online, and NodeODM in test mode reports
  ``engineVersion`` ``"?"``.
* Zero, negative, non-numeric or missing values are unknown, not zero.

Unknown values are ``None``: the caller decides (memory from the pool block, or an error for
``--split auto``); nothing here guesses.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from prefect_odm.errors import InputError

SENTINEL_MIN = 99_999_999_999
"""ClusterODM's "unlimited" placeholder; any value at least this large is treated as unknown."""
MAX_PLAUSIBLE_MEMORY_BYTES = 64 * 1024**4
"""64 TiB: more memory than any one node has today; larger reports are unknown."""
MAX_PLAUSIBLE_CPU_CORES = 16_384
MAX_PLAUSIBLE_PARALLEL_TASKS = 100_000
UNKNOWN_TEXT = ("", "?")


@dataclass(frozen=True)
class NodeCapacity:
    """What a node can take, each value ``None`` when unknown.

    Attributes:
        total_memory_bytes: ``totalMemory`` in bytes.
        available_memory_bytes: ``availableMemory`` in bytes (at most ``total_memory_bytes``).
        cpu_cores: ``cpuCores``.
        max_parallel_tasks: ``maxParallelTasks`` (tasks the node runs at once).
        max_images: ``maxImages`` (``None`` there means unlimited, and stays ``None`` here).
        queue_count: ``taskQueueCount`` (tasks queued or running), 0 when missing.
        engine: ``engine`` and ``engineVersion`` joined by a space, or ``None`` when either is
            unknown (``"?"``, empty or missing).
        unknown: names of the ``/info`` fields that were present but not plausible, for messages.
    """

    total_memory_bytes: int | None
    available_memory_bytes: int | None
    cpu_cores: int | None
    max_parallel_tasks: int | None
    max_images: int | None
    queue_count: int
    engine: str | None
    unknown: tuple[str, ...] = ()

    @property
    def total_memory_gib(self) -> float | None:
        """``total_memory_bytes`` in GiB (2**30 bytes), or ``None``."""
        return None if self.total_memory_bytes is None else self.total_memory_bytes / 1024**3


def plausible_count(value: Any, upper: float) -> int | None:
    """``value`` as a positive integer below ``upper`` and below the sentinel, else ``None``.

    >>> plausible_count(99_999_999_999, 1e15), plausible_count(-1, 10), plausible_count("8", 10)
    (None, None, 8)
    """
    if isinstance(value, bool) or value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    if not math.isfinite(number) or number <= 0 or number >= min(upper, SENTINEL_MIN):
        return None
    return int(number)


def node_capacity(info: Mapping[str, Any]) -> NodeCapacity:
    """Sanitise a node's ``/info`` answer (NodeODM API, memory in bytes).

    Args:
        info: the JSON object of ``GET /info``.

    Returns:
        The capacity, with implausible values as ``None`` and their field names in ``unknown``.
    """
    checks = {
        "totalMemory": MAX_PLAUSIBLE_MEMORY_BYTES,
        "availableMemory": MAX_PLAUSIBLE_MEMORY_BYTES,
        "cpuCores": MAX_PLAUSIBLE_CPU_CORES,
        "maxParallelTasks": MAX_PLAUSIBLE_PARALLEL_TASKS,
        "maxImages": SENTINEL_MIN,
    }
    values = {key: plausible_count(info.get(key), upper) for key, upper in checks.items()}
    unknown = tuple(k for k, v in values.items() if v is None and info.get(k) is not None)
    total, available = values["totalMemory"], values["availableMemory"]
    if total is not None and available is not None and available > total:
        available = None
        unknown += ("availableMemory",)
    engine = str(info.get("engine") or "").strip()
    version = str(info.get("engineVersion") or "").strip()
    known_engine = engine not in UNKNOWN_TEXT and version not in UNKNOWN_TEXT
    return NodeCapacity(
        total_memory_bytes=total,
        available_memory_bytes=available,
        cpu_cores=values["cpuCores"],
        max_parallel_tasks=values["maxParallelTasks"],
        max_images=values["maxImages"],
        queue_count=plausible_count(info.get("taskQueueCount"), SENTINEL_MIN) or 0,
        engine=f"{engine} {version}" if known_engine else None,
        unknown=unknown,
    )


USABLE_MEMORY_FRACTION = 0.9
"""Share of a node's reported memory that placement may plan with (the rest is the OS's)."""


def node_memory_gib(
    capacity: NodeCapacity,
    configured_gib: float | None,
    *,
    usable_fraction: float = USABLE_MEMORY_FRACTION,
) -> float | None:
    """The memory to plan with on one node, GiB (2**30 bytes).

    Args:
        capacity: the node's sanitised ``/info``.
        configured_gib: the pool block's memory for the node; it wins when given.
        usable_fraction: share of the reported total to use.

    Returns:
        ``configured_gib``, else ``usable_fraction`` of the reported total rounded to 0.01 GiB,
        else ``None`` (unknown: never the memory of the machine running the flow).
    """
    if configured_gib is not None:
        return configured_gib
    total = capacity.total_memory_gib
    return None if total is None else round(total * usable_fraction, 2)


def node_task_slots(capacity: NodeCapacity, configured: int | None) -> int:
    """Tasks to run at once on the node: the pool block's number, else ``maxParallelTasks``,
    else 1 (a proxy that reports no real limit gets one slot unless the block says more)."""
    return configured or capacity.max_parallel_tasks or 1


def memory_for_auto_split(memory_gib_by_node: Mapping[str, float | None]) -> list[float]:
    """Every node's planning memory, for ``--split auto`` (which sizes submodels by it).

    Args:
        memory_gib_by_node: node public URL -> :func:`node_memory_gib`.

    Returns:
        The memories in the mapping's order.

    Raises:
        InputError: some node's memory is unknown; the message names them and what to set.
    """
    unknown = [url for url, gib in memory_gib_by_node.items() if gib is None]
    if unknown:
        raise InputError(
            "--split auto needs each node's memory, but "
            f"{', '.join(unknown)} reported none that is plausible (a proxy such as ClusterODM "
            "reports a placeholder): set the node's memory_gib in the pool block, or give --split N"
        )
    return [gib for gib in memory_gib_by_node.values() if gib is not None]
