"""The built-in engine's NodeODM records: options as listed, given and typed, and the JSON answers.

The shapes are NodeODM 2.2.x's (``NODEODM_API.md``, NodeODM's ``libs/Task.js`` ``getInfo`` and
``libs/odmInfo.js``), written down once so that the option list, the task table, the supervisor
and the HTTP routes agree on them and mypy checks each key where it is written and where it is
read. Only the engine's own answers are typed this strictly: what a client reads from a node of
unknown make (:mod:`prefect_odm.nodes.backend`) is open JSON until it is checked.
"""

from __future__ import annotations

from typing import NotRequired  # pydantic validates these on Python 3.11

from pydantic import JsonValue
from typing_extensions import TypedDict

OptionValue = bool | int | float | str | None
"""A typed option value: NodeODM's ``bool``, ``int``, ``float``, ``enum`` and ``string`` types
(``enum`` and ``string`` as text); None for an empty default that does not convert."""

TypedOptions = dict[str, OptionValue]
"""Option name -> typed value, every known option (defaults filled in)."""


class OptionEntry(TypedDict):
    """One entry of ``/options`` as NodeODM lists it (and of a pipeline's ``OPTIONS``)."""

    name: str
    type: str
    """``bool``, ``int``, ``float``, ``enum`` or ``string``."""
    value: str
    """The default, as text (``"true"``, ``"5"``, ``""``)."""
    domain: str | list[str]
    """The allowed values of an enum, else a domain text (``"float > 0.0"``, ``"integer"``)."""
    help: str


class ClientOption(TypedDict):
    """One ``{"name", "value"}`` item of a client's ``options`` field, before validation."""

    name: str
    value: JsonValue


class GivenOption(TypedDict):
    """One known option as the client gave it, its value converted to the option's type."""

    name: str
    value: OptionValue


class TaskStatus(TypedDict):
    """A task's ``status`` object: the status code, and why a failed task failed."""

    code: int
    errorMessage: NotRequired[str]


class TaskInfo(TypedDict):
    """The ``/task/{uuid}/info`` answer (times in milliseconds, ``progress`` in percent)."""

    uuid: str
    name: str
    dateCreated: int
    processingTime: int
    status: TaskStatus
    options: list[GivenOption]
    imagesCount: int
    progress: float
    output: NotRequired[list[str]]
    """The task's console lines from the asked line on (only with ``?with_output=N``)."""


class InfoAnswer(TypedDict):
    """The ``/info`` answer (memory in bytes; ``maxImages`` None when unlimited)."""

    version: str
    taskQueueCount: int
    totalMemory: int
    availableMemory: int
    cpuCores: int
    maxImages: int | None
    maxParallelTasks: int
    engine: str
    engineVersion: str


class UuidAnswer(TypedDict):
    """The answer of ``/task/new/init`` and ``/task/new/commit/{uuid}``."""

    uuid: str


class ActionAnswer(TypedDict):
    """The answer of ``/task/cancel``, ``/task/remove`` and ``/task/restart``."""

    success: bool
    error: NotRequired[str]


class ErrorAnswer(TypedDict):
    """A refused request: HTTP 200 with ``error`` (``noRetry``: the same request cannot succeed)."""

    error: str
    noRetry: NotRequired[bool]
