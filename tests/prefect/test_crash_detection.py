"""Dead runs are seen as dead: with the automation made by ``prefect-odm automations create``, a
flow run SIGKILLed mid-run is shown Crashed within minutes (heartbeat every 30 s here)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PROBE = """
import time
from prefect import flow

@flow(name="odm-crash-probe")
def probe():
    time.sleep(900)

probe()
"""


def _probe_run():
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName

    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(
            flow_filter=FlowFilter(name=FlowFilterName(any_=["odm-crash-probe"]))
        )
    return runs[0] if runs else None


def test_killed_flow_run_is_marked_crashed(prefect_server, tmp_path):
    from prefect.client.orchestration import get_client

    from prefect_odm.cli.ops import CRASH_AUTOMATION_NAME

    window_seconds = 45
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "prefect_odm.cli",
            "automations",
            "create",
            "--heartbeat-window-seconds",
            str(window_seconds),
        ],
        env=prefect_server.env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    try:
        script = tmp_path / "probe.py"
        script.write_text(PROBE)
        env = {**prefect_server.env, "PREFECT_FLOWS_HEARTBEAT_FREQUENCY": "30"}
        proc = subprocess.Popen(
            [sys.executable, str(script)],
            env=env,
            start_new_session=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            deadline = time.monotonic() + 60
            run = None
            while time.monotonic() < deadline:
                run = _probe_run()
                if run is not None and run.state is not None and run.state.type.value == "RUNNING":
                    break
                time.sleep(0.5)
            assert run is not None and run.state.type.value == "RUNNING"
            time.sleep(3)  # the first heartbeat (sent at start) reaches the server
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        killed = time.monotonic()
        while time.monotonic() - killed < 600:
            run = _probe_run()
            if run.state.type.value == "CRASHED":
                break
            time.sleep(2)
        seen_seconds = time.monotonic() - killed
        assert run.state.type.value == "CRASHED", run.state
        assert "heartbeat" in (run.state.message or "")
        print(f"\ncrash seen {seen_seconds:.0f} s after SIGKILL (window {window_seconds} s)")
        assert seen_seconds < 600
    finally:
        # later tests' runs send a heartbeat only every 180 s: do not crash them
        with get_client(sync_client=True) as client:
            for automation in client.read_automations_by_name(CRASH_AUTOMATION_NAME):
                client.delete_automation(automation.id)
