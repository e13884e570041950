"""``kill -9`` of ``prefect-odm reconstruct`` at every stage, then a rerun: nothing lost, nothing
stuck.

One chain per kind of node, on brighton (18 images, ``--pipeline direct``, two submodels): each
run of the chain is killed with SIGKILL at the next stage (scan, plan, upload, processing,
download, merge, before the manifest), found by watching the run's log and files, never by
sleeping; the last run finishes. After each kill no process of the run is left (the built-in
engine, Prefect's temporary server and the watchdog end on their own); at the end the products
are byte-identical to those of a clean run, each node holds one task per submodel, and no
memory slot is held.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
import requests

from prefect_odm.cli.process import STOP_GRACE_SECONDS
from prefect_odm.engine.launch import EngineProcess, start_engine

pytestmark = [pytest.mark.integration, pytest.mark.slow]

RUN_ARGS = ["--pipeline", "direct", "--split", "9", "--split-overlap-m", "20", "--verbose"]
STAGE_SECONDS = 240.0
"""Deadline for a stage point to appear (a busy 2-core machine)."""


@dataclass
class Home:
    """The folders of one chain of runs: output, temporary files and prefect-odm home, and the
    Prefect home (shared by the module's runs: a fresh one costs its database migrations)."""

    root: Path
    prefect_home: Path

    @property
    def output(self) -> Path:
        return self.root / "out"

    @property
    def tmp(self) -> Path:
        return self.root / "tmp"

    @property
    def odm_home(self) -> Path:
        return self.root / "odm-home"

    @property
    def engine_data(self) -> Path:
        return self.odm_home / "engine" / "data"

    def env(self) -> dict[str, str]:
        self.tmp.mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
        env.update(
            PREFECT_ODM_HOME=str(self.odm_home),
            PREFECT_HOME=str(self.prefect_home),
            TMPDIR=str(self.tmp),
            PYTHONUNBUFFERED="1",
        )
        return env


def _start(images: Path, home: Home, nodes: list[str]) -> tuple[subprocess.Popen[bytes], Path]:
    log = home.root / f"run-{time.monotonic_ns()}.log"
    args = [sys.executable, "-m", "prefect_odm.cli", *RUN_ARGS[-1:], "reconstruct"]
    args += [str(images), "--output", str(home.output), *RUN_ARGS[:-1]]
    if nodes:
        args += ["--nodes", *nodes]
    with open(log, "wb") as fh:
        proc = subprocess.Popen(args, stdout=fh, stderr=subprocess.STDOUT, env=home.env())
    return proc, log


def _text(log: Path) -> str:
    return log.read_text(encoding="utf-8", errors="replace")


def _stage_points(home: Home, engine_data: Path) -> dict[str, Callable[[Path], bool]]:
    """Stage -> a test on the run's log that is true once the run is inside that stage."""
    tasks = engine_data / "tasks"
    return {
        "scan": lambda log: "Beginning flow run" in _text(log),
        "plan": lambda log: "scan_survey" in _text(log) and "Finished in state" in _text(log),
        "upload": lambda log: any(tasks.glob("*/images/*")) or any(tasks.glob("*/*.JPG")),
        # a task of this run (its UUID in the run's log) is processing: a task an earlier run
        # left processing on an external node counts only once this run has attached to it
        "processing": lambda log: bool(
            (names := [p.parent.name for p in tasks.glob("*/stage.txt")])
            and any(name in _text(log) for name in names)
        ),
        "download": lambda log: any(home.tmp.glob("prefect-odm-submodel-*/*")),
        "merge": lambda log: any(home.tmp.glob("prefect-odm-merge-*")),
        "manifest": lambda log: any(home.output.glob("*/report/report.md")),
    }


def _leftovers(home: Home) -> list[str]:
    """Processes of the chain still alive: anything naming its folders or with its Prefect home."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline", "status"]):
        try:
            if proc.info["status"] == psutil.STATUS_ZOMBIE or proc.pid == os.getpid():
                continue
            cmdline = " ".join(proc.info["cmdline"] or [])
            mine = str(home.root) in cmdline
            if not mine and "python" in cmdline:
                mine = proc.environ().get("PREFECT_HOME") == str(home.prefect_home)
            if mine:
                found.append(f"{proc.pid}: {cmdline[:160]}")
        except psutil.Error:
            continue
    return found


def _wait_nothing_left(home: Home, timeout_seconds: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_seconds
    while _leftovers(home) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _leftovers(home), _leftovers(home)


def _kill_at(
    images: Path,
    home: Home,
    nodes: list[str],
    point: Callable[[Path], bool],
    how: signal.Signals = signal.SIGKILL,
) -> bool:
    """Run and signal the command once ``point`` holds; False when it finished first.

    After SIGTERM the command must end by itself within its grace period (exit 130 or 143).
    """
    proc, log = _start(images, home, nodes)
    deadline = time.monotonic() + STAGE_SECONDS
    while proc.poll() is None and not point(log):
        assert time.monotonic() < deadline, _text(log)[-3000:]
        time.sleep(0.02)
    if proc.poll() is not None:
        return False
    proc.send_signal(how)
    if how == signal.SIGKILL:
        proc.wait()
        return True
    try:
        code = proc.wait(timeout=STOP_GRACE_SECONDS + 10)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError(f"no end {STOP_GRACE_SECONDS} s after {how.name}") from None
    assert code in (130, 143), (code, _text(log)[-3000:])
    return True


def _finish(images: Path, home: Home, nodes: list[str]) -> dict[str, str]:
    """Run to the end; product -> SHA-256 of its file."""
    proc, log = _start(images, home, nodes)
    assert proc.wait(timeout=900) == 0, _text(log)[-4000:]
    [manifest] = home.output.glob("*/manifest.json")
    products = json.loads(manifest.read_text())["products"]
    return {
        name: hashlib.sha256(Path(url.removeprefix("file://")).read_bytes()).hexdigest()
        for name, url in products.items()
    }


def _active_slots(home: Home) -> int:
    with sqlite3.connect(home.prefect_home / "prefect.db") as db:
        rows = db.execute("SELECT active_slots FROM concurrency_limit_v2").fetchall()
    return sum(int(r[0]) for r in rows)


@pytest.fixture(scope="module")
def prefect_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The Prefect home of every run of this module."""
    return tmp_path_factory.mktemp("prefect-home")


@pytest.fixture(scope="module")
def clean_products(
    brighton_images: Path, tmp_path_factory: pytest.TempPathFactory, prefect_home: Path
) -> dict:
    """The products of one clean run (its own output, prefect-odm home and engine)."""
    home = Home(tmp_path_factory.mktemp("clean"), prefect_home)
    products = _finish(brighton_images, home, [])
    _wait_nothing_left(home)
    return products


@pytest.fixture
def external_engine(tmp_path: Path) -> Iterator[EngineProcess]:
    """A built-in engine started on its own, used as an external node (it outlives the runs)."""
    engine = start_engine(tmp_path / "external-engine", max_parallel_tasks=2)
    yield engine
    engine.stop()


def _one_task_per_submodel(names: list[str], submodels: int) -> None:
    by_submodel = [n.split("-")[1] for n in names]
    assert len(names) == submodels and sorted(set(by_submodel)) == sorted(by_submodel), names


def test_kill_at_every_stage_with_the_built_in_engine(
    brighton_images: Path, tmp_path: Path, clean_products: dict, prefect_home: Path
) -> None:
    home = Home(tmp_path / "chain", prefect_home)
    home.root.mkdir()
    killed = []
    for stage, point in _stage_points(home, home.engine_data).items():
        if _kill_at(brighton_images, home, [], point):
            killed.append(stage)
        _wait_nothing_left(home)  # the engine, Prefect's server and the watchdog end too
    assert killed == list(_stage_points(home, home.engine_data))
    assert _finish(brighton_images, home, []) == clean_products
    _wait_nothing_left(home)
    table = json.loads((home.engine_data / "tasks.json").read_text())["tasks"]
    # The upload the kill cut stays uncommitted (status 0) under a UUID the rerun passed over,
    # as NodeODM keeps it, until the engine's clean-up of stale uploads (cleanup_hours).
    committed = [t for t in table if t["status"] != 0]
    cut = {t["uuid"] for t in table if t["status"] == 0}
    assert all(t["status"] == 40 for t in committed), table
    _one_task_per_submodel([t["name"] for t in committed], submodels=2)
    passed_over = {p.name for p in home.output.glob("*/submodels/*/uploads/*")}
    assert cut <= passed_over - {t["uuid"] for t in committed}, table
    assert _active_slots(home) == 0


def _statuses(engine: EngineProcess) -> list[int]:
    listed = requests.get(f"{engine.url}/task/list", timeout=10).json()
    return [
        requests.get(f"{engine.url}/task/{t['uuid']}/info", timeout=10).json()["status"]["code"]
        for t in listed
    ]


def test_kill_at_the_node_stages_with_an_external_node(
    brighton_images: Path,
    tmp_path: Path,
    clean_products: dict,
    external_engine: EngineProcess,
    prefect_home: Path,
) -> None:
    """Kills at upload and download, and a SIGTERM while processing: the command ends within
    its grace period after cancelling its remote task."""
    home = Home(tmp_path / "chain", prefect_home)
    home.root.mkdir()
    nodes = [external_engine.url]
    points = _stage_points(home, external_engine.data_dir)
    assert _kill_at(brighton_images, home, nodes, points["upload"])
    _wait_nothing_left(home)
    assert _kill_at(brighton_images, home, nodes, points["processing"], signal.SIGTERM)
    assert 50 in _statuses(external_engine)  # the running task was cancelled on the node
    _wait_nothing_left(home)
    assert _kill_at(brighton_images, home, nodes, points["download"])
    _wait_nothing_left(home)
    assert _finish(brighton_images, home, nodes) == clean_products
    listed = requests.get(f"{external_engine.url}/task/list", timeout=10).json()
    names = [
        requests.get(f"{external_engine.url}/task/{t['uuid']}/info", timeout=10).json()["name"]
        for t in listed
    ]
    _one_task_per_submodel(names, submodels=2)
    assert _active_slots(home) == 0
    assert set(_statuses(external_engine)) == {40}
