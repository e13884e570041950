"""The command line's console: Prefect's console logging quiet unless ``--verbose``, and the
live progress of a run (rich on a terminal, plain lines otherwise)."""

from __future__ import annotations

import logging
import os
import sys
import threading
from typing import TextIO

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from prefect_odm.progress import (
    MergeEvent,
    PlanEvent,
    ProgressEvent,
    StageEvent,
    SubmodelBoard,
    SubmodelEvent,
    SubmodelRunEvent,
    WarningEvent,
)

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


PIPED_WIDTH = 200
"""Columns of a table printed into a pipe or a file (rich's default there is 80, which broke the
``clusters`` and ``plan`` tables' rows over several lines)."""


def table_console(file: TextIO | None = None) -> Console:
    """A console for a command's tables and paths: the terminal's width on a terminal, else
    :data:`PIPED_WIDTH` columns (``COLUMNS`` overrides both); long lines are never folded."""
    stream = file or sys.stdout
    piped = not stream.isatty() and "COLUMNS" not in os.environ
    return Console(file=file, soft_wrap=True, width=PIPED_WIDTH if piped else None)


def quiet_prefect_console(verbose: bool) -> None:
    """Silence the console handlers of :data:`QUIETED_LOGGERS` unless ``verbose``."""
    if verbose:
        return
    from prefect.logging.handlers import APILogHandler

    for name in QUIETED_LOGGERS:
        for handler in logging.getLogger(name).handlers:
            if not isinstance(handler, APILogHandler):
                handler.setLevel(logging.CRITICAL + 1)


_BEFORE_THE_PLAN = ("starting Prefect", "scan", "plan")
"""Stages whose lines wait for the plan (a refusal there prints its one line alone)."""


class LiveProgress:
    """The command line's view of a run, fed by :mod:`prefect_odm.progress` events.

    On a terminal: a live screen (rich) with the stage, the counts of done / failed / running /
    waiting submodels, the merge's progress, and one line per submodel in flight (node, state,
    the node's progress, elapsed time). Elsewhere (piped, a log file): one plain line per change
    of stage, per change of a submodel's state, and per merged product, so logs stay readable.

    Args:
        console: where to draw (the command line's stderr console).
    """

    def __init__(self, console: Console) -> None:
        """Start with no submodel planned, in the ``starting Prefect`` stage (nothing is drawn
        until the block is entered)."""
        self.console = console
        self.terminal = console.is_terminal
        self.stage = "starting Prefect"
        self.merge = ""
        self.board = SubmodelBoard([])
        self._lock = threading.Lock()
        self._live: Live | None = None
        self._planned = False
        self._held: list[str] = []

    def __enter__(self) -> LiveProgress:
        """Start drawing (a live panel on a terminal; plain lines elsewhere)."""
        if self.terminal:
            self._live = Live(
                get_renderable=self.render,
                console=self.console,
                refresh_per_second=4,
                transient=False,
            )
            self._live.start()
        return self

    def __exit__(self, *exc: object) -> None:
        """Stop the live panel, leaving its last state on the screen."""
        if self._live is not None:
            self._live.stop()

    def listen(self, event: ProgressEvent) -> None:
        """Take one progress event (the :func:`prefect_odm.progress.subscribe` listener)."""
        with self._lock:
            match event:
                case StageEvent(name=name):
                    self.stage = name
                    # a stage after the plan (the survey's calibration comes before the
                    # final plan) means the plan passed its refusals: lines flow from here
                    self._planned = self._planned or name not in _BEFORE_THE_PLAN
                    self._line(f"stage: {self.stage}")
                case PlanEvent(submodels=submodels):
                    self._planned = True
                    self.board = SubmodelBoard(list(submodels))
                    self._line(f"plan: {len(submodels)} submodels")
                case SubmodelEvent():
                    self._submodel(event)
                case MergeEvent():
                    self._merge(event)
                case WarningEvent(text=text):
                    # Plan warnings (bad GPS, heavy overlap) before compute: shown on a
                    # terminal too.
                    self.console.print(f"warning: {text}", markup=False, highlight=False)
                case SubmodelRunEvent():
                    pass  # flow runs per submodel: the live table's, not the console's

    def _submodel(self, event: SubmodelEvent) -> None:
        sid = event.submodel_id
        before = self.board.rows[sid].state if sid in self.board.rows else None
        self.board.apply(event)
        row = self.board.rows[sid]
        if row.state != before:
            node = f" on {row.node}" if row.node else ""
            self._line(f"{sid}: {row.state}{node}; {self.board.counts().summary()}")

    def _merge(self, event: MergeEvent) -> None:
        product, done, total = event.product, event.done, event.total
        self.merge = f"merge {product} {done}/{total}"
        if done == total or done == 0:
            self._line(self.merge)

    def _line(self, text: str) -> None:
        """A plain line, only when the output is not a terminal. Lines before the plan is known
        are held back until then, or until a stage after the plan starts (``calibration``): a run
        refused at its edge (bad input, before the plan) prints its one error line and nothing
        else."""
        if self.terminal:
            return
        self._held.append(text)
        if self._planned:
            for line in self._held:
                self.console.print(line, markup=False, highlight=False, soft_wrap=True)
            self._held.clear()

    def render(self) -> RenderableType:
        """The live screen: a header line and one line per submodel in flight."""
        with self._lock:
            counts = self.board.counts()
            header = f"[bold]{self.stage}[/bold]  {counts.summary()}"
            if self.merge:
                header += f"  {self.merge}"
            table = Table.grid(padding=(0, 2))
            for _ in range(5):
                table.add_column()
            for row in self.board.in_flight():
                table.add_row(
                    row.submodel_id,
                    row.node or "-",
                    row.state,
                    f"{100.0 * row.fraction:5.1f}%",
                    _elapsed(row.elapsed_seconds()),
                )
        return Group(Text.from_markup(header), table)


def _elapsed(seconds: float) -> str:
    """``m:ss`` (``h:mm:ss`` past an hour)."""
    s = int(seconds)
    return (
        f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"
    )
