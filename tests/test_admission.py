"""Memory admission on a real Prefect server: slots taken by each thread itself (issue 33).

Prefect's ``concurrency()`` queues every acquisition of a process on one limit behind the
first: a submodel waiting for slots held every other one back, whether it fitted or not.
"""

from __future__ import annotations

import contextvars
import os
import subprocess
import sys
import threading
import time

import pytest
from prefect.concurrency.asyncio import (
    AcquireConcurrencySlotTimeoutError,
    ConcurrencySlotAcquisitionError,
)
from prefect_odm.tasks.admission import ensure_memory_limit, ledger, memory_slots, slots_status


def test_a_submodel_waiting_on_a_full_limit_does_not_hold_back_one_that_fits(prefect_api, odm_home):
    name = "prefect-odm-test-admission-fits"
    ensure_memory_limit(name, 10)
    large_in = threading.Event()
    errors: list[BaseException] = []

    def large() -> None:
        try:
            with memory_slots(name, 8.0, what="large", timeout_seconds=120):
                large_in.set()
        except BaseException as exc:  # reported below
            errors.append(exc)

    with memory_slots(name, 4.0, what="holder"):
        # in this test's Prefect settings (a task runner's threads get them the same way)
        waiter = threading.Thread(target=contextvars.copy_context().run, args=(large,))
        waiter.start()  # 4 + 8 > 10: it waits
        deadline = time.monotonic() + 60
        while not [e for e in ledger(name) if e.what == "large"] and time.monotonic() < deadline:
            time.sleep(0.05)  # its entry is written just before it asks
        time.sleep(1.0)  # and its request is in
        # Under Prefect's queue this one (2 slots, 4 + 2 <= 10) waited behind the large one
        # until its own time-out; it must be granted while the large one still waits.
        with memory_slots(name, 2.0, what="small", timeout_seconds=60):
            assert not large_in.is_set()
            assert slots_status(name)["active_slots"] == 6
    waiter.join(timeout=120)
    assert not errors and large_in.is_set()
    status = slots_status(name)
    assert status["active_slots"] == 0 and status["holders"] == []


def test_two_processes_share_one_limit(prefect_api, odm_home):
    name = "prefect-odm-test-admission-shared"
    ensure_memory_limit(name, 10)
    holder = (
        "import sys\n"
        "from prefect_odm.tasks.admission import memory_slots\n"
        f"with memory_slots({name!r}, 6.0, what='other process'):\n"
        "    print('held', flush=True)\n"
        "    sys.stdin.readline()\n"
    )
    env = dict(os.environ, PREFECT_API_URL=prefect_api)
    proc = subprocess.Popen(
        [sys.executable, "-c", holder],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
        with pytest.raises(AcquireConcurrencySlotTimeoutError):
            with memory_slots(name, 6.0, what="here", timeout_seconds=3):
                pass  # 6 + 6 > 10: the other process's slots count here too
        assert [e.what for e in ledger(name)] == ["other process"]  # no entry left by the wait
        with memory_slots(name, 4.0, what="here"):
            assert slots_status(name)["active_slots"] == 10
    finally:
        assert proc.stdin is not None
        proc.stdin.write("\n")
        proc.stdin.close()
        proc.wait(timeout=120)
    assert proc.returncode == 0
    with memory_slots(name, 6.0, what="here", timeout_seconds=60):
        assert slots_status(name)["active_slots"] == 6


def test_a_missing_limit_fails_and_leaves_no_entry(prefect_api, odm_home):
    name = "prefect-odm-test-admission-missing"
    with pytest.raises(ConcurrencySlotAcquisitionError, match="must be created"):
        with memory_slots(name, 1.0, what="nobody"):
            pytest.fail("ran without a limit")
    assert ledger(name) == []


def test_one_thread_renews_every_lease_of_the_process(prefect_api, odm_home):
    name = "prefect-odm-test-admission-renewal"
    ensure_memory_limit(name, 10)
    before = set(threading.enumerate())
    entered = [memory_slots(name, 1.0, what=f"holder {i}") for i in range(5)]
    for held in entered:
        held.__enter__()
    try:
        started = [t.name for t in set(threading.enumerate()) - before]
        assert slots_status(name)["active_slots"] == 5
    finally:
        for held in reversed(entered):
            held.__exit__(None, None, None)
    # concurrency() started a renewal thread (and a cancel-scope watcher) per holder
    assert len([n for n in started if "renewal" in n]) <= 1, started
    assert slots_status(name)["active_slots"] == 0


def test_held_leases_are_renewed_on_the_server(prefect_api, odm_home, monkeypatch, caplog):
    from prefect.client.orchestration import SyncPrefectClient
    from prefect_odm.tasks import slot_leases

    name = "prefect-odm-test-admission-renewed"
    ensure_memory_limit(name, 10)
    monkeypatch.setattr(slot_leases, "RENEWAL_FRACTION", 0.02)  # every 1.2 s of a 60 s lease
    renewed: list[object] = []
    real = SyncPrefectClient.renew_concurrency_lease

    def counted(self: SyncPrefectClient, lease_id: object, lease_duration: float) -> object:
        answer = real(self, lease_id=lease_id, lease_duration=lease_duration)
        renewed.append(lease_id)
        return answer

    monkeypatch.setattr(SyncPrefectClient, "renew_concurrency_lease", counted)
    with memory_slots(name, 2.0, what="long holder"):
        deadline = time.monotonic() + 60
        while len(renewed) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
    assert len(renewed) >= 2 and len(set(renewed)) == 1  # the server took both renewals
    assert "could not renew" not in caplog.text
    assert slots_status(name)["active_slots"] == 0


def test_the_temporary_api_advice_names_a_server_beyond_its_measured_load(monkeypatch):
    from prefect_odm.tasks import admission

    most = admission.EMBEDDED_API_MAX_IN_FLIGHT
    monkeypatch.setattr(admission, "on_temporary_server", lambda: True)
    assert admission.embedded_api_advice(most) is None
    advice = admission.embedded_api_advice(most + 1)
    assert advice is not None and "PREFECT_API_URL" in advice and f"beyond {most}" in advice
    monkeypatch.setattr(admission, "on_temporary_server", lambda: False)
    assert admission.embedded_api_advice(10 * most) is None  # a server: nothing to say
