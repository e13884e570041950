"""Start the built-in engine as a child process on a loopback port (the embedded default).

>>> with start_engine(Path("/tmp/engine")) as engine:   # doctest: +SKIP
...     pyodm.Node.from_url(engine.url)

Children end with the process that started them, however it ends (SIGKILL included): each one
is handed to a watchdog (:func:`guard_process`, ``python -m prefect_odm.engine watch``), a small
process of its own session that holds the read end of a pipe whose write end only this process
has. The kernel closes that pipe when this process dies; the watchdog reads end-of-file and
stops every guarded process still alive (SIGTERM, then SIGKILL after 10 s). An engine that a
killed run of an older version left on the same data folder is found by its lock file and
stopped before a new one starts (:func:`stop_stale_engine`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import IO

from prefect_odm.errors import NodeError

logger = logging.getLogger(__name__)

LOG_FILE = "engine.log"
LOCK_FILE = "engine.lock"
LOOPBACK = "127.0.0.1"
STOP_GRACE_SECONDS = 10.0
"""How long a stopped child has between SIGTERM and SIGKILL."""


class _Watchdog:
    """The watchdog child of this process (one per process, started on first use)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._process: subprocess.Popen[bytes] | None = None
        self._owner_pid = 0

    def guard(self, pid: int) -> None:
        import psutil

        try:
            created = psutil.Process(pid).create_time()
        except psutil.Error:
            return
        with self._lock:
            if self._process is None or self._owner_pid != os.getpid() or self._process.poll():
                self._process = subprocess.Popen(
                    [sys.executable, "-m", "prefect_odm.engine", "watch"],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    start_new_session=True,  # a Ctrl-C or a kill of our group leaves it up
                )
                self._owner_pid = os.getpid()
            assert self._process.stdin is not None
            self._process.stdin.write(f"{pid} {created!r}\n".encode())
            self._process.stdin.flush()


_WATCHDOG = _Watchdog()


def guard_process(pid: int) -> None:
    """Stop process ``pid`` when this process dies, however it dies (see the module's text).

    Args:
        pid: a child that must not outlive this process (the engine, Prefect's API server).
    """
    _WATCHDOG.guard(pid)


def watch(stdin: IO[bytes], grace_seconds: float = STOP_GRACE_SECONDS) -> int:
    """The watchdog's loop: read ``PID CREATE_TIME`` lines until end-of-file, then stop those
    processes still alive (only the very process: a reused pid has another creation time).

    Returns:
        0.
    """
    import psutil

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    guarded: list[tuple[int, float]] = []
    for line in stdin:
        with contextlib.suppress(ValueError):
            pid_text, created_text = line.split()
            guarded.append((int(pid_text), float(created_text)))
    alive = []
    for pid, created in guarded:
        with contextlib.suppress(psutil.Error):
            proc = psutil.Process(pid)
            if abs(proc.create_time() - created) < 0.01:
                proc.terminate()
                alive.append(proc)
    _gone, left = psutil.wait_procs(alive, timeout=grace_seconds)
    for proc in left:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    return 0


def _started_by(cmdline: list[str]) -> int | None:
    """The ``--parent-pid`` of an engine's command line (None: started by hand)."""
    with contextlib.suppress(ValueError, IndexError):
        return int(cmdline[cmdline.index("--parent-pid") + 1])
    return None


def _runs_since(pid: int, engine_created: float) -> bool:
    """Whether ``pid`` runs and was started before the engine (not a reused pid)."""
    import psutil

    try:
        return bool(psutil.Process(pid).create_time() <= engine_created + 0.01)
    except psutil.Error:
        return False


def stop_stale_engine(data_dir: Path, grace_seconds: float = STOP_GRACE_SECONDS) -> int | None:
    """Stop an engine left on ``data_dir`` by a command that died; returns its pid, or None.

    The engine holds ``data_dir/engine.lock`` (with its pid in it) while it runs, and an engine
    started by :func:`start_engine` carries its starter's pid (``--parent-pid``). When the lock
    is held by an engine whose starter is gone, the engine is stopped (SIGTERM, then SIGKILL)
    so that a new one can take the folder. (Engines end with their starter since they watch
    it; this cleans up after older versions and engines that did not stop in time.)

    Raises:
        NodeError: the folder is in use by an engine whose starter still runs, or by one
            started by hand (``prefect-odm engine serve``).
    """
    import fcntl

    import psutil

    path = Path(data_dir) / LOCK_FILE
    if not path.exists():
        return None
    with open(path, "a+") as handle:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.seek(0)
            text = handle.read().strip()
        else:
            return None  # nobody holds it
    try:
        proc = psutil.Process(int(text))
        cmdline = proc.cmdline()
    except (ValueError, psutil.Error):
        return None
    starter = _started_by(cmdline)
    if starter is None:
        raise NodeError(
            f"{data_dir} is in use by another engine process, started by hand "
            f"(pid {proc.pid}); stop it or give this run its own data folder"
        )
    if _runs_since(starter, proc.create_time()):
        raise NodeError(
            f"{data_dir} is in use by another engine process (pid {proc.pid}) of a running "
            f"command (pid {starter})"
        )
    logger.warning("stopping engine pid %d left on %s by a killed run", proc.pid, data_dir)
    proc.terminate()
    try:
        proc.wait(timeout=grace_seconds)
    except psutil.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=grace_seconds)
    return proc.pid


def free_port() -> int:
    """A TCP port that is free on 127.0.0.1 right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


class EngineProcess:
    """A running engine server process.

    Attributes:
        url: base URL (``http://127.0.0.1:PORT``; the token, if any, is not in it).
        port: TCP port.
        token: the token every request needs, or None.
        data_dir: the engine's data folder.
        process: the :class:`subprocess.Popen` of the server.
    """

    def __init__(
        self,
        process: subprocess.Popen[bytes],
        *,
        port: int,
        data_dir: Path,
        token: str | None,
        log: IO[bytes],
    ) -> None:
        """Wrap a started server process (see the class attributes; ``log`` is its console log,
        closed when it stops)."""
        self.process = process
        self.port = port
        self.url = f"http://{LOOPBACK}:{port}"
        self.data_dir = data_dir
        self.token = token
        self._log = log

    @property
    def pid(self) -> int:
        """Process id of the server."""
        return self.process.pid

    @property
    def node_url(self) -> str:
        """URL with ``?token=`` when there is a token (the form ``pyodm.Node.from_url`` takes)."""
        if self.token:
            return f"{self.url}?{urllib.parse.urlencode({'token': self.token})}"
        return self.url

    def alive(self) -> bool:
        """True while the server process runs."""
        return self.process.poll() is None

    def stop(self, timeout_seconds: float = 15) -> int:
        """SIGTERM the server and wait; SIGKILL it when it does not end in time.

        Returns:
            The server's exit code.
        """
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout_seconds)
            except subprocess.TimeoutExpired:
                logger.warning(
                    "engine %s did not stop in %s s; killing it", self.url, timeout_seconds
                )
                self.process.kill()
                self.process.wait()
        self._log.close()
        return int(self.process.returncode)

    def kill(self) -> int:
        """SIGKILL the server (as a crash would) and reap it; returns its exit code."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self._log.close()
        return int(self.process.returncode)

    def __enter__(self) -> EngineProcess:
        """The process itself; it is stopped when the block ends."""
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Stop the engine (:meth:`stop`), however the block ended."""
        self.stop()

    def __repr__(self) -> str:
        """The URL, process id and data folder (never the token)."""
        return f"EngineProcess(url={self.url!r}, pid={self.pid}, data_dir={str(self.data_dir)!r})"


def _answers_info(url: str, token: str | None) -> bool:
    query = f"?{urllib.parse.urlencode({'token': token})}" if token else ""
    try:
        with urllib.request.urlopen(f"{url}/info{query}", timeout=2) as res:
            body = json.loads(res.read().decode("utf-8"))
    except (OSError, ValueError, urllib.error.URLError):
        return False
    return isinstance(body, dict) and "engine" in body


def _tail(path: Path, lines: int = 20) -> list[str]:
    try:
        return path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:]
    except OSError:
        return []


def start_engine(
    data_dir: Path,
    *,
    port: int | None = None,
    token: str | None = None,
    method: str | None = None,
    max_parallel_tasks: int = 1,
    extra_env: dict[str, str] | None = None,
    startup_timeout_seconds: float = 30,
    max_images: int | None = None,
    max_upload_mb: float | None = None,
    cleanup_hours: float | None = None,
    memory_gib: float | None = None,
) -> EngineProcess:
    """Start ``python -m prefect_odm.engine serve`` on 127.0.0.1 and wait until ``/info`` answers.

    The server's own log is appended to ``data_dir/engine.log``.

    Args:
        data_dir: the engine's data folder (created when missing); reuse it to find old tasks.
        port: TCP port; None picks a free one (retried on a clash).
        token: token required on every request, or None.
        method: default reconstruction method (``"sfm"`` or ``"direct"``); None: the pipeline's.
        max_parallel_tasks: task processes run at once.
        extra_env: environment variables added for the server (e.g. ``PREFECT_ODM_ENGINE_FAULTS``).
        startup_timeout_seconds: how long to wait for ``/info``.
        max_images: most images per task (None: unlimited).
        max_upload_mb: largest uploaded file in MiB (None: unlimited).
        cleanup_hours: delete finished tasks and uncommitted uploads after this many hours
            (None: the server's default of 48; 0: never).
        memory_gib: the memory its ``/info`` reports, GiB (None: the machine's or its cgroup's).

    Returns:
        The running engine.

    Raises:
        NodeError: the server exited or did not answer in time (with its last log lines).
    """
    data_dir = Path(data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    stop_stale_engine(data_dir)
    attempts = 1 if port is not None else 3
    last_error: NodeError | None = None
    for _ in range(attempts):
        chosen = port if port is not None else free_port()
        args = _serve_args(
            chosen,
            data_dir,
            token=token,
            method=method,
            max_parallel_tasks=max_parallel_tasks,
            max_images=max_images,
            max_upload_mb=max_upload_mb,
            cleanup_hours=cleanup_hours,
        )
        if memory_gib is not None:
            args += ["--memory-gib", str(memory_gib)]
        env = dict(os.environ)
        env.update(extra_env or {})
        started = _start_once(args, chosen, data_dir, token, env, startup_timeout_seconds)
        if isinstance(started, EngineProcess):
            return started
        last_error, port_clash = started
        if port is not None or not port_clash:
            break  # only a port clash is worth another try
    assert last_error is not None
    raise last_error


def _serve_args(
    port: int,
    data_dir: Path,
    *,
    token: str | None,
    method: str | None,
    max_parallel_tasks: int,
    max_images: int | None,
    max_upload_mb: float | None,
    cleanup_hours: float | None,
) -> list[str]:
    """The command line of ``python -m prefect_odm.engine serve`` on 127.0.0.1:``port``."""
    args = [
        sys.executable,
        "-m",
        "prefect_odm.engine",
        "serve",
        "--host",
        LOOPBACK,
        "--port",
        str(port),
        "--data-dir",
        str(data_dir),
        "--max-parallel-tasks",
        str(max_parallel_tasks),
        "--parent-pid",
        str(os.getpid()),
    ]
    if token:
        args += ["--token", token]
    if method:
        args += ["--method", method]
    if max_images is not None:
        args += ["--max-images", str(max_images)]
    if max_upload_mb is not None:
        args += ["--max-upload-mb", str(max_upload_mb)]
    if cleanup_hours is not None:
        args += ["--cleanup-hours", str(cleanup_hours)]
    return args


def _start_once(
    args: list[str],
    port: int,
    data_dir: Path,
    token: str | None,
    env: dict[str, str],
    startup_timeout_seconds: float,
) -> EngineProcess | tuple[NodeError, bool]:
    """Start the server once and wait until ``/info`` answers.

    Returns:
        The running engine, or ``(error, port_clash)``: why it failed (with the last lines of
        its log) and whether it exited because the port was taken (worth another port).
    """
    log_path = data_dir / LOG_FILE
    log = open(log_path, "ab")  # noqa: SIM115 - owned by EngineProcess
    process = subprocess.Popen(
        args,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        # A Ctrl-C reaches the command alone, which cancels the engine's tasks and stops it; the
        # guard below stops it should the command die first.
        start_new_session=True,
    )
    engine = EngineProcess(process, port=port, data_dir=data_dir, token=token, log=log)
    guard_process(process.pid)
    deadline = time.monotonic() + startup_timeout_seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            break
        if _answers_info(engine.url, token):
            logger.info("built-in engine running at %s (pid %d)", engine.url, engine.pid)
            return engine
        time.sleep(0.1)
    if process.poll() is None:
        engine.kill()
        timed_out = NodeError(
            f"the built-in engine did not answer within {startup_timeout_seconds} s",
            node_url=engine.url,
            last_output=_tail(log_path),
        )
        return timed_out, False
    log.close()
    tail = _tail(log_path)
    exited = NodeError(
        f"the built-in engine exited with code {process.returncode} at start-up",
        node_url=engine.url,
        last_output=tail,
    )
    return exited, any("address already in use" in x.lower() for x in tail)
