"""Bookkeeping that does not grow with the city (issue 33): the memory limit created once per
process, the live submodel table sent at a bounded rate."""

from __future__ import annotations

import contextvars
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from prefect.client.orchestration import get_client
from prefect_odm.tasks import admission, artifacts

from prefect_odm.progress import SubmodelBoard


def test_concurrent_flows_create_the_memory_limit_once(
    prefect_api: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Eight submodel flows of one process starting together ask the API once (they each read
    "not found" and created it: a duplicate-key error in the server's log for all but one);
    another size asks again and resizes the limit."""
    asked: list[int] = []
    real = admission._ensure_limit

    def counted(name: str, limit_gib: int) -> None:
        asked.append(limit_gib)
        real(name, limit_gib)

    monkeypatch.setattr(admission, "_ensure_limit", counted)
    name = "prefect-odm-test-created-once"
    contexts = [contextvars.copy_context() for _ in range(8)]  # the session's API, as subflows
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda c: c.run(admission.ensure_memory_limit, name, 12), contexts))
    assert asked == [12]
    admission.ensure_memory_limit(name, 20)
    assert asked == [12, 20]
    with get_client(sync_client=True) as client:
        limit = client.read_global_concurrency_limit_by_name(name)
    assert limit.limit == 20 and limit.active


def test_the_live_table_is_sent_at_a_bounded_rate_and_ends_right(prefect_api: str) -> None:
    """A burst of 100 changes (20 submodels, 5 states each) is a few updates, not 100; the
    table the UI reads at the end is the board's last state."""
    import json

    from prefect import flow

    ids = [f"submodel-{i:03d}" for i in range(20)]

    @flow
    def burst() -> tuple[int, object]:
        live = artifacts.LiveSubmodelTable(SubmodelBoard(ids), "submodels-bookkeeping")
        for state in ("queued", "uploading", "running", "downloading", "completed"):
            for sid in ids:
                live.board.update(sid, state=state)
                live.publish()
        live.publish(now=True)
        return live.sent, live.table_id

    sent, table_id = burst()
    assert 1 <= sent <= 3
    from uuid import UUID

    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterId

    # By id: the session's one server holds every test's artifacts, more than one page of them.
    with get_client(sync_client=True) as client:
        found = client.read_artifacts(
            artifact_filter=ArtifactFilter(id=ArtifactFilterId(any_=[UUID(str(table_id))]))
        )
    (table,) = found
    data = table.data if isinstance(table.data, list) else json.loads(str(table.data))
    assert {row["state"] for row in data} == {"completed"}


def test_publishing_never_waits_for_a_send_in_flight(prefect_api: str) -> None:
    """Every submodel's state change publishes the table: a publish returns while a send is
    held up in the API (it used to send in the caller, under the board's lock, and the
    submodels' runs queued behind it, issue 33); the held send and the last publish go out."""
    from prefect import flow

    ids = ["submodel-000", "submodel-001"]
    release = threading.Event()

    @flow
    def held() -> tuple[bool, int]:
        live = artifacts.LiveSubmodelTable(SubmodelBoard(ids), "submodels-held")
        send = live._send
        calls = []

        def slow() -> None:
            calls.append(1)
            release.wait(60)
            send()

        live._send = slow  # type: ignore[method-assign]
        live._sent_at = 0.0  # a send is due at once
        live.board.update("submodel-000", state="uploading")
        first = threading.Thread(target=live.publish)  # a submodel's run, whose send is held
        first.start()
        while not calls:  # the timer's send has begun and is held
            time.sleep(0.05)
        caller = threading.Thread(target=lambda: [live.publish() for _ in range(3)])
        caller.start()
        caller.join(30)
        returned = not caller.is_alive()
        release.set()
        caller.join()
        first.join()
        live.board.update("submodel-001", state="completed")
        live.publish(now=True)
        return returned, len(calls)

    returned, sends = held()
    assert returned
    assert sends >= 2
