"""In-process progress events: the command line's progress bar listens, flows and tasks emit.

Events are small dictionaries (``kind`` plus fields); emitting with no listener costs nothing.
A listener that raises is dropped from nothing and breaks nothing: its error is logged.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)

Listener = Callable[[dict[str, Any]], None]

_lock = threading.Lock()
_listeners: list[Listener] = []


def subscribe(listener: Listener) -> Callable[[], None]:
    """Register ``listener``; returns a function that unregisters it."""
    with _lock:
        _listeners.append(listener)

    def unsubscribe() -> None:
        with _lock:
            if listener in _listeners:
                _listeners.remove(listener)

    return unsubscribe


def emit(kind: str, **fields: Any) -> None:
    """Send an event to every listener (e.g. ``emit("submodel", id="submodel-001", state="running")``)."""
    with _lock:
        listeners = list(_listeners)
    event = {"kind": kind, **fields}
    for listener in listeners:
        try:
            listener(event)
        except Exception:  # a broken progress bar must not break a reconstruction
            logger.exception("progress listener failed on %s", kind)
