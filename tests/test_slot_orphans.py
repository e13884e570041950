"""Slots that no ledger entry names are found and freed on Prefect's temporary server (issue 30).

On the temporary server every holder is a process of this machine, and each writes its ledger
entry before it asks for slots; so slots the server counts beyond the living entries belong to
nobody (a holder killed between the grant and its entry, the graceful stop's hard exit). Each
process here starts its own temporary server on one ``PREFECT_HOME``, as separate CLI runs do.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

NAME = "prefect-odm-test-orphans"


@pytest.fixture
def temporary_server_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env["PREFECT_HOME"] = str(tmp_path / "prefect-home")
    env["PREFECT_ODM_HOME"] = str(tmp_path / "odm-home")
    env["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
    env["PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"] = "180"  # a loaded 2-core machine
    return env


def _python(code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )


def test_slots_granted_to_a_holder_killed_before_its_entry_are_freed_by_the_next_run(
    temporary_server_env: dict[str, str],
) -> None:
    # A holder that got its slots and died before any entry said so (what a hard exit between
    # the grant and the entry leaves): 4 of 10 slots held, nothing on this machine names them.
    orphan = (
        "import os\n"
        "from prefect.concurrency.sync import concurrency\n"
        "from prefect_odm.tasks.admission import ensure_memory_limit\n"
        f"ensure_memory_limit({NAME!r}, 10)\n"
        "from prefect.server.api.server import SubprocessASGIServer\n"
        f"with concurrency({NAME!r}, occupy=4, strict=True):\n"
        "    SubprocessASGIServer().stop()  # what the CLI's guard does when its process ends\n"
        "    os._exit(137)\n"
    )
    killed = _python(orphan, temporary_server_env)
    assert killed.returncode == 137, killed.stderr[-2000:]
    shown = subprocess.run(
        [sys.executable, "-m", "prefect_odm.cli", "slots", "--name", NAME],
        env=temporary_server_env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert shown.returncode == 0, shown.stderr[-2000:]
    assert f"{NAME}: 4 of 10 GiB slots in use" in shown.stdout
    assert "4 slots held by no process on this machine" in shown.stdout

    next_run = (
        "from prefect_odm.tasks.admission import memory_slots, slots_status\n"
        f"with memory_slots({NAME!r}, 10.0, what='next run'):\n"
        f"    print('during', slots_status({NAME!r})['active_slots'])\n"
        f"status = slots_status({NAME!r})\n"
        "print('after', status['active_slots'], len(status['holders']))\n"
    )
    done = _python(next_run, temporary_server_env)
    assert done.returncode == 0, done.stderr[-2000:]
    # Every slot free again: the next run takes all 10 (it would wait for ever on 6).
    assert "during 10" in done.stdout and "after 0 0" in done.stdout, done.stdout


def test_living_holders_are_never_taken_for_orphans(temporary_server_env: dict[str, str]) -> None:
    holder = (
        "import sys, time\n"
        "from prefect_odm.tasks.admission import ensure_memory_limit, memory_slots\n"
        f"ensure_memory_limit({NAME!r}, 10)\n"
        f"with memory_slots({NAME!r}, 5.5, what='holder'):\n"
        "    print('held', flush=True)\n"
        "    sys.stdin.readline()\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", holder],
        env=temporary_server_env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
        other = (
            "from prefect_odm.tasks.admission import reclaim_dead_holders, slots_status\n"
            f"print('released', reclaim_dead_holders({NAME!r}))\n"
            f"print('active', slots_status({NAME!r})['active_slots'])\n"
        )
        seen = _python(other, temporary_server_env)
        assert seen.returncode == 0, seen.stderr[-2000:]
        assert "released 0" in seen.stdout and "active 6" in seen.stdout, seen.stdout
    finally:
        assert proc.stdin is not None
        proc.stdin.write("\n")
        proc.stdin.close()
        proc.wait(timeout=120)
    assert proc.returncode == 0
