"""Core log lines in the Prefect UI: the ``prefect_odm`` loggers send what they log inside a flow
or task run to that run's logs.

The core logs with ``logging.getLogger(__name__)`` and knows nothing of Prefect. Prefect's
``PREFECT_LOGGING_EXTRA_LOGGERS`` would attach its API handler only when set before Prefect is
imported, leave the loggers' level alone (so INFO lines are never made: the root logger is at
WARNING), and warn about every line logged outside a run (the engine's threads, the command
line). Instead, importing the glue (``prefect_odm.tasks``, so every flow) attaches
:class:`CoreRunLogHandler`, a subclass of Prefect's ``APILogHandler`` that drops lines logged
outside any run, and lets the ``prefect_odm`` loggers make INFO lines. The console is unchanged:
lines reach the root logger's handlers (Prefect's console, pytest's capture) only at the level
they reached them before (the root logger's level, WARNING by default).
"""

from __future__ import annotations

import logging

from prefect.context import FlowRunContext, TaskRunContext
from prefect.logging.handlers import APILogHandler

CORE_LOGGER = "prefect_odm"
"""The logger every core module's logger descends from."""

RUN_LOG_LEVEL = logging.INFO
"""Lines at this level and above reach the run's logs."""


class CoreRunLogHandler(APILogHandler):
    """Prefect's API log handler for the core's loggers: a line logged inside a flow or task run
    goes to that run's logs; a line logged outside any run is dropped without a warning."""

    def emit(self, record: logging.LogRecord) -> None:
        """Send ``record`` to its run's logs; drop it when it was logged outside any run."""
        if getattr(record, "flow_run_id", None) is None and not _in_run():
            return
        super().emit(record)


class _ToRootHandlers(logging.Handler):
    """Passes a record to the root logger's handlers when it reaches the root logger's level:
    what propagation did before the core loggers were opened to INFO."""

    def emit(self, record: logging.LogRecord) -> None:
        root = logging.getLogger()
        if record.levelno >= root.getEffectiveLevel():
            root.callHandlers(record)


def _in_run() -> bool:
    return FlowRunContext.get() is not None or TaskRunContext.get() is not None


def send_core_logs_to_runs() -> None:
    """Attach :class:`CoreRunLogHandler` to the ``prefect_odm`` logger (once per process).

    A level set on the ``prefect_odm`` logger by the application is respected (lines below it
    are not made); unset, the logger makes INFO lines for the runs and passes to the root
    handlers only those at the root logger's level. The command line's console quieting leaves
    both handlers alone.
    """
    logger = logging.getLogger(CORE_LOGGER)
    if any(isinstance(h, CoreRunLogHandler) for h in logger.handlers):
        return
    logger.addHandler(CoreRunLogHandler(level=RUN_LOG_LEVEL))
    if logger.level == logging.NOTSET:
        # A root logger at DEBUG still gets the DEBUG lines it got before.
        logger.setLevel(min(RUN_LOG_LEVEL, logging.getLogger().getEffectiveLevel()))
        if logger.propagate:
            logger.propagate = False
            logger.addHandler(_ToRootHandlers())
