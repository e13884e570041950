"""The command line's console: Prefect's console logging quiet unless ``--verbose``."""

from __future__ import annotations

import logging

QUIETED_LOGGERS = (
    "prefect",
    "prefect.flow_runs",
    "prefect.task_runs",
    "prefect.server",
    "uvicorn",
)
"""Loggers whose console handlers are silenced. Handlers that send to the Prefect API are kept
(the run's logs still reach the API and UI), and so are the ``prefect_odm`` loggers' handlers
(their run-log handler, and the one passing WARNING lines to the console as before)."""


def quiet_prefect_console(verbose: bool) -> None:
    """Silence the console handlers of :data:`QUIETED_LOGGERS` unless ``verbose``."""
    if verbose:
        return
    from prefect.logging.handlers import APILogHandler

    for name in QUIETED_LOGGERS:
        for handler in logging.getLogger(name).handlers:
            if not isinstance(handler, APILogHandler):
                handler.setLevel(logging.CRITICAL + 1)
