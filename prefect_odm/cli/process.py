"""The command's own process: it ends within seconds of SIGINT or SIGTERM, its children end with
it, and a slow Prefect start is one line.

* **Signals.** The first SIGINT or SIGTERM raises :class:`KeyboardInterrupt` in the main thread:
  the flow's submodel runners cancel their remote tasks and return their memory slots on the way
  out (``flows/reconstruct.py``). Should that take longer than :data:`STOP_GRACE_SECONDS`, or a
  second signal come, the process exits at once (exit status 128 + the signal's number); its
  children are then stopped by the watchdog.
* **Children.** Prefect's temporary API server (``SubprocessASGIServer``, a ``uvicorn`` child
  started on first use) and the built-in engine run in their own sessions, so a terminal's
  Ctrl-C (sent to the whole foreground group) reaches the command alone, and are handed to
  :func:`prefect_odm.engine.launch.guard_process`, so neither outlives a ``kill -9`` of the
  command.
* **A slow start.** Prefect raises ``RuntimeError("Timed out while attempting to connect to
  ephemeral Prefect API server...")`` when its server does not answer within
  ``PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS``; it becomes one
  :class:`~prefect_odm.errors.PrefectStartError` line.
* **The start-up preamble**, the same for every command that talks to Prefect:
  :func:`prefect_environment` before Prefect is imported, :func:`start_prefect` after.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Any

from prefect_odm.errors import PrefectStartError

STOP_GRACE_SECONDS = 20.0
"""How long the command may take to cancel remote tasks and return slots after a signal."""

PREFECT_TIMEOUT_TEXT = "Timed out while attempting to connect to ephemeral Prefect API server"
"""The start of Prefect 3's message when its temporary server does not answer in time."""


def install_signal_handlers(grace_seconds: float = STOP_GRACE_SECONDS) -> None:
    """Make SIGINT and SIGTERM end the command within ``grace_seconds`` (see the module text).

    Call from the main thread.
    """
    stopping = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        if stopping.is_set():
            os._exit(128 + signum)
        stopping.set()
        timer = threading.Timer(grace_seconds, os._exit, args=(128 + signum,))
        timer.daemon = True
        timer.start()
        print(
            f"prefect-odm: {signal.Signals(signum).name}: cancelling remote tasks and stopping",
            file=sys.stderr,
        )
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)


STARTUP_TIMEOUT_SECONDS = 120
"""How long a command waits for Prefect's temporary server to answer (Prefect's default is 20 s,
too short on a busy machine); ``PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS`` overrides it."""


def prefect_environment() -> bool:
    """Set the environment a command's Prefect starts with; call it before Prefect is imported
    (Prefect reads its settings then): the temporary server's start-up time-out
    (:data:`STARTUP_TIMEOUT_SECONDS`) and no telemetry (the machine may have no route out), each
    unless already set.

    Returns:
        Whether the command uses Prefect's temporary server (no ``PREFECT_API_URL``).
    """
    os.environ.setdefault(
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", str(STARTUP_TIMEOUT_SECONDS)
    )
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("DO_NOT_TRACK", "1")  # the SDK's own telemetry and its notice
    home = os.environ.get("PREFECT_HOME")
    if home:  # Prefect makes only the last folder of it, with a warning when its parent is missing
        Path(home).expanduser().mkdir(parents=True, exist_ok=True)
    return not os.environ.get("PREFECT_API_URL")


def start_prefect(verbose: bool) -> None:
    """Quiet Prefect's console unless ``verbose`` and start its temporary server unless
    ``PREFECT_API_URL`` names one (after :func:`prefect_environment`).

    Raises:
        PrefectStartError: the temporary server did not answer in time.
    """
    from prefect_odm.cli.console import quiet_prefect_console

    quiet_prefect_console(verbose)
    if not os.environ.get("PREFECT_API_URL"):
        start_embedded_api()


def prefect_start_error(exc: BaseException) -> PrefectStartError | None:
    """The one-line error for Prefect's start-up time-out, or None for any other error."""
    if not isinstance(exc, RuntimeError) or PREFECT_TIMEOUT_TEXT not in str(exc):
        return None
    waited = os.environ.get("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "20")
    return PrefectStartError(
        f"Prefect's temporary API server did not answer within {waited} s (a busy machine?): "
        "run again, raise PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS, or set "
        "PREFECT_API_URL to a running Prefect server"
    )


def start_embedded_api() -> None:
    """Start Prefect's temporary API server (once per process) and guard it.

    Raises:
        PrefectStartError: it did not answer in time.
    """
    import prefect.server.api.server as server_module

    from prefect_odm.engine.launch import guard_process

    _make_database_folder()
    server = server_module.SubprocessASGIServer()
    # Prefect starts the server in our process group, so a Ctrl-C in the terminal stopped it at
    # once and the graceful stop could neither record the runs' states nor give the memory
    # slots back (it then ran into its hard exit). Its own session leaves it to the command;
    # the guard below stops it when the command ends, however it ends.
    setattr(server_module, "subprocess", _OwnSessionSubprocess())  # noqa: B010
    try:
        server.start()
    except RuntimeError as exc:
        one_line = prefect_start_error(exc)
        if one_line is None:
            raise
        raise one_line from None
    finally:
        setattr(server_module, "subprocess", subprocess)  # noqa: B010
        process = server.server_process
        if process is not None and process.poll() is None:
            guard_process(process.pid)


def _make_database_folder() -> None:
    """Create the folder of the temporary server's SQLite database (``$PREFECT_HOME`` by default).

    Prefect does not: with ``PREFECT_HOME`` naming a folder that does not exist yet, its server
    died at start-up on "unable to open database file" and the command waited out the whole
    start-up time-out (120 s) before saying the server did not answer.
    """
    from prefect.settings import get_current_settings

    settings = get_current_settings()
    url = settings.server.database.connection_url
    text = url.get_secret_value() if url is not None else ""
    if text.startswith("sqlite") and ":///" in text:
        database = text.split(":///", 1)[1].split("?", 1)[0]
        if database and database != ":memory:":
            Path(database).expanduser().parent.mkdir(parents=True, exist_ok=True)
    Path(settings.home).expanduser().mkdir(parents=True, exist_ok=True)


class _OwnSessionSubprocess:
    """The ``subprocess`` module as Prefect's server module sees it while its temporary server
    starts: the same, but ``Popen`` starts the child in a new session (its own process group)."""

    def __getattr__(self, name: str) -> Any:
        return getattr(subprocess, name)

    @staticmethod
    def Popen(*args: Any, **kwargs: Any) -> subprocess.Popen[Any]:  # noqa: N802 - the module's name
        kwargs.setdefault("start_new_session", True)
        return subprocess.Popen(*args, **kwargs)


class EmbeddedAPIStart:
    """:func:`start_embedded_api` in a background thread; :meth:`join` raises its error."""

    def __init__(self) -> None:
        """Start the background thread at once (it runs :func:`start_embedded_api`)."""
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="prefect-api-start", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            start_embedded_api()
        except BaseException as exc:  # handed to the main thread by join()
            self.error = exc

    def join(self) -> None:
        """Wait for the start; re-raise its error in this thread."""
        self._thread.join()
        if self.error is not None:
            raise self.error
