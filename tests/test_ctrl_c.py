"""Ctrl-C in a terminal during a run on Prefect's temporary server (issue 30, item 5).

A terminal sends SIGINT to the whole foreground process group. Prefect started its temporary
server in the command's group, so the server died with the keystroke and the graceful stop ran
into its 20 s hard exit, unable to record states or give slots back. The server and the built-in
engine now run in their own sessions: the command alone gets the signal, stops gracefully
(``prefect-odm: interrupted``, not the hard exit), and leaves no slot held and no process behind.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
from odm_server import reconstruct_command


def test_ctrl_c_on_the_temporary_server_stops_gracefully_and_frees_every_slot(
    brighton_images: Path, tmp_path: Path
) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env.update(
        PREFECT_HOME=str(tmp_path / "prefect-home"),
        PREFECT_ODM_HOME=str(tmp_path / "odm-home"),
        PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="180",
    )
    cmd = reconstruct_command(brighton_images, tmp_path / "out", "--force")
    stderr_path = tmp_path / "stderr.txt"
    with open(stderr_path, "w") as stderr:
        proc = subprocess.Popen(
            cmd, env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=stderr
        )
        deadline = time.monotonic() + 600
        while "processing on" not in stderr_path.read_text():
            assert proc.poll() is None, stderr_path.read_text()[-3000:]
            assert time.monotonic() < deadline, "no submodel reached processing"
            time.sleep(0.2)
        children = psutil.Process(proc.pid).children(recursive=True)
        assert any("uvicorn" in " ".join(c.cmdline()) for c in children)  # the temporary server
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in the terminal does
        code = proc.wait(timeout=120)
    said = stderr_path.read_text()
    assert code == 130, said[-3000:]
    # The graceful stop finished (the hard exit prints nothing after the SIGINT line).
    assert said.rstrip().endswith("prefect-odm: interrupted"), said[-3000:]
    # Nothing of the run is left running: not the server, not the engine, not the watchdog.
    time.sleep(2)
    left = [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
    assert left == [], [c.cmdline() for c in left]
    shown = subprocess.run(
        [sys.executable, "-m", "prefect_odm.cli", "slots"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert shown.returncode == 0, shown.stderr[-2000:]
    assert ": 0 of " in shown.stdout and "pid " not in shown.stdout, shown.stdout
