"""A real NodeODM 2.2.4 (OpenDroneMap's own node, test mode) on 127.0.0.1 for the tests.

It does what ``../shared/peers/start_nodeodm.sh`` does, without its ``npm ci`` (the shipped
``package-lock.json`` is missing): the code is copied into a work folder, its ``node_modules`` are
installed once per machine into a cache folder (``npm ci`` when a lock file is there, else
``npm install --omit=dev`` from ``package.json``; about 20-30 s) and linked into the work folder.
Every TCP listen and UDP bind is forced onto 127.0.0.1 by ``loopback_shim.js`` and each instance gets
its own UDP progress port (NodeODM hard-codes 6367).

Test mode runs no ODM: every task replays a canned log and returns the same canned products, so
tests assert on the protocol and the bookkeeping, never on pixels (``../shared/peers/README.md``).
Those products are of brighton's 18 images at 4000 x 2250 (``odm_report/shots.geojson``,
``cameras.json``): the flow refuses them for a submodel sent fewer images, and a calibration of
them for brighton's 1600 x 900 photos. :func:`canned_products_of` rewrites an instance's own copy
(``WORK/tests/processing_results``) to the cameras of the images a test's tasks are all sent.

When ``node`` or ``npm`` is missing the tests FAIL with a message saying so (``.ci/run`` installs
Debian's ``nodejs`` and ``npm``); they never skip.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _shared_dir() -> Path:
    """``../shared`` beside the repository; in a git worktree, beside its main checkout too."""
    candidates = [REPO / ".." / "shared"]
    dot_git = REPO / ".git"
    if dot_git.is_file():  # a worktree: "gitdir: MAIN/.git/worktrees/NAME"
        gitdir = Path(dot_git.read_text().split(":", 1)[1].strip())
        candidates.append(gitdir.parents[2] / ".." / "shared")
    for candidate in candidates:
        if candidate.is_dir():
            return candidate.resolve()
    return candidates[0].resolve()


SHARED = _shared_dir()
"""``../shared``: survey data (``data/``) and the real peers (``peers/``)."""
PEERS = SHARED / "peers"
NODEODM_SRC = PEERS / "nodeodm"
SHIM = PEERS / "loopback_shim.js"
NODEODM_VERSION = "2.2.4"
LOOPBACK = "127.0.0.1"


def _cache_dir() -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "prefect-odm-tests" / f"nodeodm-{NODEODM_VERSION}-modules"


def free_port(kind: int = socket.SOCK_STREAM) -> int:
    """A port free on 127.0.0.1 right now (``kind``: ``SOCK_STREAM`` for TCP, ``SOCK_DGRAM`` for UDP)."""
    with socket.socket(socket.AF_INET, kind) as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


def require_node() -> None:
    """Fail (never skip) when the peers, ``node`` or ``npm`` are missing."""
    assert NODEODM_SRC.is_dir(), f"NodeODM sources not found at {NODEODM_SRC} (../shared/peers)"
    missing = [tool for tool in ("node", "npm") if shutil.which(tool) is None]
    assert not missing, (
        f"{' and '.join(missing)} not found: the NodeODM tests need Debian's nodejs and npm "
        "packages (apt-get install nodejs npm; .ci/run installs them)"
    )


def node_modules() -> Path:
    """NodeODM's ``node_modules``, installed once per machine (a file lock guards the install).

    Raises:
        AssertionError: npm failed (its output is in the message).
    """
    require_node()
    cache = _cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (cache / ".ok").exists():
            shutil.rmtree(cache / "node_modules", ignore_errors=True)
            shutil.copy(NODEODM_SRC / "package.json", cache / "package.json")
            lock_file = NODEODM_SRC / "package-lock.json"
            if lock_file.exists():
                shutil.copy(lock_file, cache / "package-lock.json")
                cmd = ["npm", "ci", "--omit=dev"]
            else:
                cmd = ["npm", "install", "--omit=dev"]
            cmd += ["--no-audit", "--no-fund", "--loglevel=error"]
            res = subprocess.run(cmd, cwd=cache, capture_output=True, text=True, timeout=600)
            assert res.returncode == 0, f"{' '.join(cmd)} failed:\n{res.stdout}\n{res.stderr}"
            (cache / ".ok").touch()
    return cache / "node_modules"


def prepare_workdir(work: Path) -> Path:
    """Copy NodeODM into ``work`` (once) and link the cached ``node_modules`` into it."""
    modules = node_modules()
    work.mkdir(parents=True, exist_ok=True)
    if not (work / "index.js").exists():
        shutil.copytree(
            NODEODM_SRC, work, dirs_exist_ok=True, ignore=shutil.ignore_patterns("node_modules")
        )
        for path in [work, *work.rglob("*")]:
            if not path.is_symlink():
                path.chmod(path.stat().st_mode | 0o200)
    link = work / "node_modules"
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(modules)
    (work / "tmp").mkdir(exist_ok=True)
    (work / "tests" / "data").mkdir(parents=True, exist_ok=True)
    return work


class NodeODM:
    """One NodeODM process in test mode on 127.0.0.1.

    Args:
        work: the instance's own folder (NodeODM's paths are relative to its working directory).
        args: NodeODM flags, e.g. ``["--test_seconds", "5", "--token", "T", "-q", "1"]``.
        token: the token given with ``--token`` (kept for clients; also added to ``args``).
        port: TCP port (default: a free one); kept across :meth:`restart`.

    Attributes:
        url: ``http://127.0.0.1:PORT`` (no token).
    """

    def __init__(
        self,
        work: Path,
        args: list[str] | None = None,
        *,
        token: str | None = None,
        port: int | None = None,
    ) -> None:
        self.work = prepare_workdir(Path(work))
        self.args = list(args or [])
        self.token = token
        if token is not None:
            self.args += ["--token", token]
        self.port = port or free_port()
        self.url = f"http://{LOOPBACK}:{self.port}"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def node_url(self) -> str:
        """The URL with ``?token=`` when there is a token."""
        return f"{self.url}?token={self.token}" if self.token else self.url

    def start(self, timeout_seconds: float = 60) -> NodeODM:
        """Start the server and wait until ``/info`` answers.

        Raises:
            AssertionError: it exited or did not answer in time (with its last stderr lines).
        """
        env = {
            **os.environ,
            "NODE_OPTIONS": f"--require {SHIM}",
            "LOOPBACK_UDP_PORT": str(free_port(socket.SOCK_DGRAM)),
        }
        cmd = ["node", "index.js", "--test", "--port", str(self.port), *self.args]
        with (
            open(self.work / "stdout.log", "ab") as out,
            open(self.work / "stderr.log", "ab") as err,
        ):
            self.process = subprocess.Popen(cmd, cwd=self.work, env=env, stdout=out, stderr=err)
        deadline = time.monotonic() + timeout_seconds
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"NodeODM exited at start-up:\n{self._stderr_tail()}")
            if self._answers():
                return self
            time.sleep(0.25)
        self.stop()
        raise AssertionError(
            f"NodeODM did not answer /info in {timeout_seconds} s:\n{self._stderr_tail()}"
        )

    def _answers(self) -> bool:
        query = f"?token={self.token}" if self.token else ""
        try:
            with urllib.request.urlopen(f"{self.url}/info{query}", timeout=2) as res:
                body = json.loads(res.read())
        except (OSError, ValueError):
            return False
        return isinstance(body, dict) and ("version" in body or "error" in body)

    def _stderr_tail(self) -> str:
        path = self.work / "stderr.log"
        return (
            "\n".join(path.read_text(errors="replace").splitlines()[-20:]) if path.exists() else ""
        )

    def alive(self) -> bool:
        """True while the process runs."""
        return self.process is not None and self.process.poll() is None

    def stop(self, timeout_seconds: float = 15) -> None:
        """SIGTERM (NodeODM then writes its task table), SIGKILL when it does not end in time."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=timeout_seconds)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def kill(self) -> None:
        """SIGKILL, as a crash would: tasks created since the last table dump are lost."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def restart(self, timeout_seconds: float = 60) -> NodeODM:
        """Start again on the same folder and port (after :meth:`kill` or :meth:`stop`)."""
        self.kill()
        return self.start(timeout_seconds)


CANNED_CAMERA = "dji fc300s 4000 2250 perspective 0.5555"
"""The one camera of test mode's canned ``cameras.json``."""


def canned_products_of(
    work: Path, names: Iterable[str], camera: tuple[str, int, int] = ("dji fc300s", 1600, 900)
) -> None:
    """Make the canned products of the instance in ``work`` those of ``names``: its
    ``shots.geojson`` keeps only their cameras, its ``cameras.json`` becomes ``camera``'s
    (``(make model, width px, height px)``, OpenSfM's id, the canned intrinsics), both made
    from the shipped files at each call. NodeODM reads the folder when a task finishes, so this
    works before or after :meth:`NodeODM.start`, and again between runs.

    Raises:
        AssertionError: a name has no camera among the canned ones (brighton's 18).
    """
    results = prepare_workdir(work) / "tests" / "processing_results"
    canned_results = NODEODM_SRC / "tests" / "processing_results"  # as shipped, every call
    shots_path = results / "odm_report" / "shots.geojson"
    shots = json.loads((canned_results / "odm_report" / "shots.geojson").read_text())
    wanted = set(names)
    canned = {f["properties"]["filename"] for f in shots["features"]}
    assert wanted <= canned, f"no canned camera of {sorted(wanted - canned)}"
    shots["features"] = [f for f in shots["features"] if f["properties"]["filename"] in wanted]
    shots_path.write_text(json.dumps(shots))
    cameras_path = results / "cameras.json"
    [entry] = json.loads((canned_results / "cameras.json").read_text()).values()
    label, width, height = camera
    focal = CANNED_CAMERA.rsplit(" ", 1)[1]
    entry.update(width=width, height=height)
    cameras_path.write_text(json.dumps({f"{label} {width} {height} perspective {focal}": entry}))


def start_nodeodm(
    work: Path, args: list[str] | None = None, *, token: str | None = None, port: int | None = None
) -> NodeODM:
    """Start a NodeODM in test mode in ``work`` and return it (stop it with :meth:`NodeODM.stop`)."""
    return NodeODM(work, args, token=token, port=port).start()


def images_of_every_submodel(images: Path, split: int, split_overlap_m: float) -> list[str]:
    """The images every submodel of the plan of ``images`` (``--split``, ``--split-overlap-m``)
    holds: canned products of these (:func:`canned_products_of`) are of images each task is
    sent."""
    from prefect_odm.plan.planning import plan_split
    from prefect_odm.survey.scan import scan_images

    plan = plan_split(scan_images(str(images)), split=split, split_overlap_m=split_overlap_m)
    shared = set.intersection(*(set(sm.image_names) for sm in plan.submodels))
    return sorted(name.rsplit("/", 1)[-1] for name in shared)
