"""The engine's task table survives crashes (SIGKILL), stops (SIGTERM) and self-inflicted deaths."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import psutil
import pytest
import requests

from prefect_odm.engine.store import COMPLETED, PENDING, QUEUED, TaskRecord, TaskStore
from prefect_odm.engine.supervisor import Supervisor, describe_failure
from prefect_odm.engine.task_files import build_zip

from .conftest import EngineFactory, init_task, upload_task, wait_status

UUID_A = "0b7c6c5e-4f38-4c1e-8a5d-6b1f3e2d9c10"
UUID_B = "1c8d7d6f-5049-4d2f-9b6e-7c2041f3ad21"


def _pid_of(data_dir: Path, uuid: str) -> int:
    table = json.loads((data_dir / "tasks.json").read_text())
    return int(next(t["pid"] for t in table["tasks"] if t["uuid"] == uuid))


def _wait_gone(pid: int, timeout_seconds: float) -> bool:
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


@pytest.mark.integration
@pytest.mark.parametrize("how", ["kill", "stop"])
def test_completed_task_survives_engine_restart(
    engine_factory: EngineFactory, few_images: list[Path], how: str
) -> None:
    engine = engine_factory()
    upload_task(engine.url, few_images, uuid=UUID_A, name="keep me")
    before = wait_status(engine.url, UUID_A, {40})
    output_before = requests.get(f"{engine.url}/task/{UUID_A}/output", timeout=10).json()
    getattr(engine, how)()

    again = engine_factory(data_dir=engine.data_dir)
    after = requests.get(f"{again.url}/task/{UUID_A}/info", timeout=10).json()
    assert after == before  # status, progress 100, processing time and options all kept
    assert requests.get(f"{again.url}/task/{UUID_A}/output", timeout=10).json() == output_before
    res = requests.get(f"{again.url}/task/{UUID_A}/download/all.zip", timeout=30)
    assert res.status_code == 200 and res.headers["Content-Type"] == "application/zip"
    assert requests.get(f"{again.url}/task/list", timeout=10).json() == [{"uuid": UUID_A}]


@pytest.mark.integration
def test_task_created_just_before_sigkill_is_not_lost(
    engine_factory: EngineFactory, few_images: list[Path]
) -> None:
    """NodeODM forgets tasks created since its last hourly save; this engine must not."""
    engine = engine_factory(faults={"slow_seconds": 60})
    upload_task(engine.url, few_images[:1], uuid=UUID_A)
    upload_task(engine.url, few_images[:1], uuid=UUID_B)  # queued behind A
    engine.kill()
    again = engine_factory(data_dir=engine.data_dir)
    listed = requests.get(f"{again.url}/task/list", timeout=10).json()
    assert listed == [{"uuid": UUID_A}, {"uuid": UUID_B}]


@pytest.mark.integration
@pytest.mark.parametrize("how", ["kill", "stop"])
def test_running_task_is_requeued_and_finishes_after_restart(
    engine_factory: EngineFactory, few_images: list[Path], how: str
) -> None:
    engine = engine_factory(faults={"slow_seconds": 2})
    upload_task(engine.url, few_images, uuid=UUID_A)
    wait_status(engine.url, UUID_A, {20})
    pid = _pid_of(engine.data_dir, UUID_A)
    getattr(engine, how)()
    # the orphaned task process notices its engine is gone and ends its process group
    assert _wait_gone(pid, 5), "task process outlived its engine"

    again = engine_factory(data_dir=engine.data_dir, faults={"slow_seconds": 2})
    info = requests.get(f"{again.url}/task/{UUID_A}/info", timeout=10).json()
    assert info["status"]["code"] in (10, 20)
    done = wait_status(again.url, UUID_A, {40, 30}, timeout_seconds=60)
    assert done["status"] == {"code": 40}
    output = requests.get(f"{again.url}/task/{UUID_A}/output", timeout=10).json()
    if how == "kill":
        assert any("engine restarted while this task ran" in line for line in output)
    assert sum("run 2 of task" in line for line in output) == 1


@pytest.mark.integration
def test_pending_chunked_upload_survives_restart(
    engine_factory: EngineFactory, few_images: list[Path]
) -> None:
    engine = engine_factory()
    url = engine.url
    res = init_task(url, "resumed", UUID_A)
    assert res == {"uuid": UUID_A}
    for path in few_images[:2]:
        requests.post(
            f"{url}/task/new/upload/{UUID_A}",
            files={"images": (path.name, path.read_bytes())},
            timeout=30,
        )
    engine.kill()
    again = engine_factory(data_dir=engine.data_dir)
    path = few_images[2]
    up = requests.post(
        f"{again.url}/task/new/upload/{UUID_A}",
        files={"images": (path.name, path.read_bytes())},
        timeout=30,
    ).json()
    assert up == {"success": True}
    assert requests.post(f"{again.url}/task/new/commit/{UUID_A}", timeout=10).json() == {
        "uuid": UUID_A
    }
    info = wait_status(again.url, UUID_A, {40})
    assert info["imagesCount"] == 3 and info["name"] == "resumed"


@pytest.mark.integration
def test_engine_dying_mid_upload_keeps_stored_files(
    engine_factory: EngineFactory, few_images: list[Path]
) -> None:
    engine = engine_factory(faults={"die_after_uploads": 2})
    url = engine.url
    requests.post(f"{url}/task/new/init", headers={"set-uuid": UUID_A}, timeout=10)
    path = few_images[0]
    ok = requests.post(
        f"{url}/task/new/upload/{UUID_A}",
        files={"images": (path.name, path.read_bytes())},
        timeout=30,
    )
    assert ok.json() == {"success": True}
    with pytest.raises(requests.ConnectionError):
        requests.post(
            f"{url}/task/new/upload/{UUID_A}",
            files={"images": (few_images[1].name, few_images[1].read_bytes())},
            timeout=30,
        )
    engine.process.wait(timeout=10)
    assert engine.process.returncode == 70
    again = engine_factory(data_dir=engine.data_dir)
    images = engine.data_dir / "tasks" / UUID_A / "images"
    assert sorted(p.name for p in images.iterdir()) == sorted(p.name for p in few_images[:2])
    assert requests.post(f"{again.url}/task/new/commit/{UUID_A}", timeout=10).json() == {
        "uuid": UUID_A
    }
    assert wait_status(again.url, UUID_A, {40})["imagesCount"] == 2


@pytest.mark.integration
def test_engine_dying_mid_task_requeues_it(
    engine_factory: EngineFactory, few_images: list[Path]
) -> None:
    engine = engine_factory(faults={"die_after_task_seconds": 1, "slow_seconds": 5})
    upload_task(engine.url, few_images[:1], uuid=UUID_A)
    engine.process.wait(timeout=20)
    assert engine.process.returncode == 70
    again = engine_factory(data_dir=engine.data_dir)
    assert wait_status(again.url, UUID_A, {40, 30})["status"] == {"code": 40}


# -- units: the table, the clean-up, the failure text ---------------------------------------------


def test_store_round_trip_and_atomic_writes(tmp_path: Path) -> None:
    store = TaskStore(tmp_path)
    stop = threading.Event()
    torn: list[str] = []

    def reader() -> None:
        while not stop.is_set():
            if store.path.exists():
                try:
                    json.loads(store.path.read_text())
                except json.JSONDecodeError as exc:
                    torn.append(str(exc))

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for i in range(60):
            store.add(TaskRecord(uuid=f"u{i}", name=f"task {i}", date_created_ms=i))
            store.update(f"u{i}", status=QUEUED, progress=float(i) / 2)
    finally:
        stop.set()
        thread.join()
    assert torn == []
    reloaded = TaskStore(tmp_path)
    assert [t.to_dict() for t in reloaded.all()] == [t.to_dict() for t in store.all()]
    assert reloaded.get("u7").progress == 3.5  # type: ignore[union-attr]
    assert len(reloaded.all()) == 60
    assert not list(tmp_path.glob(".tasks.json.*"))


def test_cleanup_deletes_old_pending_uploads_and_finished_tasks(tmp_path: Path) -> None:
    store = TaskStore(tmp_path)
    old_ms = int(time.time() * 1000) - 3 * 3600 * 1000
    new_ms = int(time.time() * 1000)
    for uuid, status, created, finished in [
        ("old-pending", PENDING, old_ms, None),
        ("new-pending", PENDING, new_ms, None),
        ("old-done", COMPLETED, old_ms, old_ms),
        ("old-queued", QUEUED, old_ms, None),
    ]:
        store.add(
            TaskRecord(
                uuid=uuid, name=uuid, date_created_ms=created, status=status, finished_ms=finished
            )
        )
        (store.task_dir(uuid) / "images").mkdir(parents=True)
    removed = Supervisor(store, cleanup_hours=2).cleanup()
    assert sorted(removed) == ["old-done", "old-pending"]
    assert sorted(t.uuid for t in TaskStore(tmp_path).all()) == ["new-pending", "old-queued"]
    assert not store.task_dir("old-pending").exists()
    assert Supervisor(store, cleanup_hours=0).cleanup() == []


def test_describe_failure() -> None:
    oom = describe_failure(-9, None, ["a", "b"])
    assert oom.startswith("Not enough memory") and "137" in oom and oom.endswith("a\nb")
    plain = describe_failure(1, {"ok": False, "error": "ValueError: no GPS"}, [])
    assert plain == "ValueError: no GPS (exit code 1)"
    assert "exit code 137" in describe_failure(137, {"memory": True, "error": "x"}, [])


def test_build_zip_refuses_paths_outside(tmp_path: Path) -> None:
    (tmp_path / "odm_dem").mkdir()
    (tmp_path / "odm_dem" / "dsm.tif").write_bytes(b"x")
    (tmp_path / "secret.txt").write_text("no")
    path = build_zip(tmp_path / ".", ["odm_dem", "../", "/etc/passwd", "missing"])
    import zipfile

    assert zipfile.ZipFile(path).namelist() == ["odm_dem/dsm.tif"]


@pytest.mark.integration
def test_interrupted_run_resumes_from_its_stage(
    engine_factory: EngineFactory, few_images: list[Path], tmp_path: Path
) -> None:
    """A run the engine lost mid-stage restarts at that stage, reusing the finished ones."""
    data_dir = tmp_path / "crashed"
    store = TaskStore(data_dir)
    task_dir = store.task_dir(UUID_A)
    (task_dir / "images").mkdir(parents=True)
    for path in few_images[:2]:
        (task_dir / "images" / path.name).write_bytes(path.read_bytes())
    (task_dir / "stand_in").mkdir()
    for stage in ("dataset", "opensfm", "odm_dem"):
        (task_dir / "stand_in" / f"{stage}.done").write_text("{}")
    (task_dir / "stage.txt").write_text("odm_orthophoto\n")
    store.add(
        TaskRecord(
            uuid=UUID_A,
            name="crashed",
            date_created_ms=int(time.time() * 1000),
            status=20,
            images_count=2,
            started_ms=int(time.time() * 1000),
            pid=None,
            queue_seq=1,
        )
    )
    del store
    engine = engine_factory(data_dir=data_dir)
    assert wait_status(engine.url, UUID_A, {40, 30})["status"] == {"code": 40}
    output = requests.get(f"{engine.url}/task/{UUID_A}/output", timeout=10).json()
    assert "[engine] resuming from stage odm_orthophoto" in output
    assert "Skipping opensfm stage (rerun-from odm_orthophoto)" in output
    assert "Running odm_orthophoto stage" in output
    # a later restart without options starts from the beginning again
    assert requests.post(
        f"{engine.url}/task/restart", data={"uuid": UUID_A}, timeout=10
    ).json() == {"success": True}
    wait_status(engine.url, UUID_A, {40, 30})
    output = requests.get(f"{engine.url}/task/{UUID_A}/output", timeout=10).json()
    assert "Running dataset stage" in output and not any("resuming" in x for x in output)


@pytest.mark.integration
def test_second_engine_on_the_same_data_dir_is_refused(engine_factory: EngineFactory) -> None:
    from prefect_odm.errors import NodeError

    engine = engine_factory()
    with pytest.raises(NodeError, match="in use by another engine"):
        engine_factory(data_dir=engine.data_dir)
    assert engine.alive()


# -- a torn task table: recovered, never a refusal to start ---------------------------------------


def _table_with_tasks(data_dir: Path, count: int) -> TaskStore:
    store = TaskStore(data_dir)
    for i in range(count):
        uuid = f"00000000-0000-4000-8000-{i:012d}"
        store.add(TaskRecord(uuid=uuid, name=f"task {i}", date_created_ms=i))
        store.task_dir(uuid).mkdir()
        store.update(uuid, status=COMPLETED, progress=100.0)
    return store


@pytest.mark.parametrize("cut_fraction", [0.0, 0.01, 0.3, 0.5, 0.77, 0.999])
def test_torn_table_keeps_every_task_it_can_and_sets_the_rest_aside(
    tmp_path: Path, cut_fraction: float
) -> None:
    store = _table_with_tasks(tmp_path, 8)
    latest = {t.uuid: t.to_dict() for t in store.all()}
    text = store.path.read_bytes()
    cut = int(len(text) * cut_fraction)
    store.path.write_bytes(text[:cut])
    # a record's object ends at the first "\n  }" after its uuid (indent 1, keys sorted)
    ends = {u: text.index(b"\n  }", text.index(f'"uuid": "{u}"'.encode())) + 4 for u in latest}
    complete_before_cut = {u for u, end in ends.items() if end <= cut}

    recovered = TaskStore(tmp_path)  # never raises for a torn table

    kept = {t.uuid: t.to_dict() for t in recovered.all()}
    lost_file = tmp_path / "lost.json"
    lost = json.loads(lost_file.read_text()) if lost_file.exists() else []
    lost_uuids = {row["uuid"] for row in lost}
    assert set(kept) | lost_uuids == set(latest)  # every task is either kept or listed lost
    assert not set(kept) & lost_uuids
    for uuid in complete_before_cut:
        assert kept[uuid] == latest[uuid]  # a record whole before the cut is kept as it was
    for uuid in set(kept) - complete_before_cut:
        assert kept[uuid]["name"] == latest[uuid]["name"]  # from the backup
    for row in lost:
        assert "torn" in row["reason"] and (tmp_path / "lost" / row["uuid"]).is_dir()
        assert not store.task_dir(row["uuid"]).exists()
    # the recovered table was written back whole
    assert json.loads(store.path.read_text())["tasks"]
    assert len(TaskStore(tmp_path).all()) == len(kept)


@pytest.mark.integration
def test_engine_starts_on_a_torn_table(
    engine_factory: EngineFactory, few_images: list[Path]
) -> None:
    engine = engine_factory()
    upload_task(engine.url, few_images, uuid=UUID_A, name="keep me")
    upload_task(engine.url, few_images, uuid=UUID_B, name="cut off")
    wait_status(engine.url, UUID_A, {40})
    wait_status(engine.url, UUID_B, {40})
    engine.stop()
    table = engine.data_dir / "tasks.json"
    text = table.read_text()
    table.write_text(text[: text.index(UUID_B) + 10])  # B's record cut in the middle

    again = engine_factory(data_dir=engine.data_dir)
    listed = {t["uuid"] for t in requests.get(f"{again.url}/task/list", timeout=10).json()}
    assert UUID_A in listed
    info = requests.get(f"{again.url}/task/{UUID_A}/info", timeout=10).json()
    assert info["status"]["code"] == 40
    if UUID_B not in listed:  # not in the backup either: its folder is set aside with a reason
        lost = json.loads((engine.data_dir / "lost.json").read_text())
        assert [row["uuid"] for row in lost] == [UUID_B]


@pytest.mark.integration
def test_truncated_archive_is_downloaded_again_never_resubmitted(
    engine_factory: EngineFactory, few_images: list[Path], tmp_path: Path
) -> None:
    """A node serving a cut all.zip: each try is a download (the task stays the one task)."""
    from prefect_odm.errors import DownloadError
    from prefect_odm.nodes.client import NodeClient

    engine = engine_factory()
    upload_task(engine.url, few_images, uuid=UUID_A, name="cut archive")
    wait_status(engine.url, UUID_A, {40})
    archive = engine.data_dir / "tasks" / UUID_A / "all.zip"
    whole = archive.read_bytes()
    archive.write_bytes(whole[: len(whole) // 2])
    client = NodeClient(engine.url)
    with pytest.raises(DownloadError, match="failed 2 times") as raised:
        client.download(UUID_A, tmp_path / "cut", max_retries=1)
    assert engine.url in str(raised.value) and UUID_A in str(raised.value)
    assert not list((tmp_path / "cut").glob("*.part")) and not list(
        (tmp_path / "cut").rglob("*.tif")
    )
    archive.write_bytes(whole)  # the node serves it whole again: the same task downloads
    dest = client.download(UUID_A, tmp_path / "whole")
    assert any(dest.rglob("*.tif"))
    assert client.task_list() == [UUID_A]


def test_hostile_archive_names_the_node_and_writes_nothing(tmp_path: Path) -> None:
    import zipfile

    from prefect_odm.errors import NodeError
    from prefect_odm.nodes.client import _safe_extract

    path = tmp_path / "all.zip"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("odm_orthophoto/odm_orthophoto.tif", b"II*\0")
        zf.writestr("../outside.txt", b"x")
    dest = tmp_path / "dest"
    dest.mkdir()
    with zipfile.ZipFile(path) as zf, pytest.raises(NodeError) as raised:
        _safe_extract(zf, dest, "http://127.0.0.1:3000", UUID_A)
    message = str(raised.value)
    assert "'../outside.txt' would leave" in message and "node http://127.0.0.1:3000" in message
    assert UUID_A in message and not any(dest.iterdir()) and not (tmp_path / "outside.txt").exists()
