"""The built-in engine speaks NodeODM's HTTP API (docs: NODEODM_API.md) to pyodm and raw HTTP."""

from __future__ import annotations

import io
import json
import threading
import time
import zipfile
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import psutil
import pytest
import requests
from pyodm import Node
from pyodm.exceptions import NodeResponseError
from pyodm.types import TaskStatus

from prefect_odm.engine.launch import EngineProcess

from .conftest import (
    EngineFactory,
    init_task,
    real_pipeline_available,
    upload_task,
    wait_status,
)

pytestmark = pytest.mark.integration

UUID_A = "7f5e0a52-5d0c-4c6e-9a53-3f1b1c2d3e4f"
UUID_V5 = "2ed6657d-e927-568b-95e1-2665a8aea6a2"


# -- /info and /options ---------------------------------------------------------------------------


def test_info_reports_engine_memory_and_limits(engine_factory: EngineFactory) -> None:
    engine = engine_factory(max_parallel_tasks=2)
    info = requests.get(f"{engine.url}/info", timeout=10).json()
    assert set(info) == {
        "version",
        "taskQueueCount",
        "totalMemory",
        "availableMemory",
        "cpuCores",
        "maxImages",
        "maxParallelTasks",
        "engine",
        "engineVersion",
    }
    assert info["engine"] == "prefect-odm"
    import prefect_odm

    assert info["engineVersion"] == prefect_odm.__version__
    assert info["maxParallelTasks"] == 2
    assert info["maxImages"] is None
    assert info["taskQueueCount"] == 0
    assert info["totalMemory"] == psutil.virtual_memory().total
    assert 0 < info["availableMemory"] <= info["totalMemory"]
    assert info["cpuCores"] == psutil.cpu_count()
    assert Node.from_url(engine.url).version_greater_or_equal_than("1.4.0")


def test_options_list_shapes(engine: EngineProcess) -> None:
    options = requests.get(f"{engine.url}/options", timeout=10).json()
    by_name = {o["name"]: o for o in options}
    for required in ("orthophoto-resolution", "dsm", "dtm", "pipeline", "rerun-from"):
        assert required in by_name
    for option in options:
        assert set(option) == {"name", "type", "value", "domain", "help"}
        assert option["type"] in ("bool", "int", "float", "string", "enum")
        assert isinstance(option["value"], str)
        if option["type"] == "enum":
            assert isinstance(option["domain"], list)
    assert by_name["pipeline"]["domain"] == ["sfm", "direct"]


def test_method_sets_the_pipeline_default(engine_factory: EngineFactory) -> None:
    engine = engine_factory(method="direct")
    options = requests.get(f"{engine.url}/options", timeout=10).json()
    assert {o["name"]: o for o in options}["pipeline"]["value"] == "direct"


def test_unknown_route_is_404(engine: EngineProcess) -> None:
    assert requests.get(f"{engine.url}/no/such/route", timeout=10).status_code == 404


# -- the whole life cycle through pyodm -----------------------------------------------------------


def _pyodm_life_cycle(
    engine: EngineProcess, images: list[Path], tmp_path: Path, options: dict[str, Any]
) -> None:
    node = Node.from_url(engine.url)
    task = node.create_task([str(p) for p in images], options, name="life-cycle", task_uuid=UUID_A)
    assert task.uuid == UUID_A
    task.wait_for_completion(interval=0.2)
    info = task.info(with_output=0)
    assert info.status == TaskStatus.COMPLETED
    assert info.images_count == len(images)
    assert info.progress == 100
    assert info.processing_time > 0
    assert info.name == "life-cycle"
    assert {o["name"] for o in info.options} == set(options)
    assert info.output == task.output()
    assert task.output(-2) == info.output[-2:]

    out = tmp_path / "assets"
    task.download_assets(str(out))
    assert (out / "odm_orthophoto" / "odm_orthophoto.tif").stat().st_size > 0
    assert (out / "odm_georeferencing" / "odm_georeferenced_model.laz").stat().st_size > 0
    assert (out / "odm_dem" / "dsm.tif").stat().st_size > 0

    # restart from a later stage, in the same folder, with replaced options
    first_output = task.output()
    assert task.restart({**options, "rerun-from": "odm_orthophoto"})
    info = wait_status(engine.url, UUID_A, {40, 30}, timeout_seconds=120)
    assert info["status"]["code"] == 40, info
    assert {"name": "rerun-from", "value": "odm_orthophoto"} in info["options"]
    assert task.output() != first_output
    assert any("odm_orthophoto" in line for line in task.output())

    assert node.get_task(UUID_A).info().status == TaskStatus.COMPLETED
    listed = requests.get(f"{engine.url}/task/list", timeout=10).json()
    assert {"uuid": UUID_A} in listed
    assert task.remove()
    assert requests.get(f"{engine.url}/task/list", timeout=10).json() == []
    with pytest.raises(NodeResponseError, match="not found"):
        task.info()


@pytest.mark.skipif(not real_pipeline_available(), reason="prefect_odm.engine.pipeline missing")
def test_pyodm_life_cycle_real_direct_pipeline(
    engine_factory: EngineFactory, brighton_image_files: list[Path], tmp_path: Path
) -> None:
    """The real 'direct' pipeline on all 18 brighton images, through pyodm end to end."""
    engine = engine_factory(real=True, method="direct")
    _pyodm_life_cycle(
        engine,
        brighton_image_files,
        tmp_path,
        {"orthophoto-resolution": 20, "dsm": True, "pipeline": "direct"},
    )
    _assert_georeferenced(tmp_path / "assets")


def _assert_georeferenced(assets: Path) -> None:
    import laspy
    import rasterio

    for name in ("odm_orthophoto/odm_orthophoto.tif", "odm_dem/dsm.tif"):
        with rasterio.open(assets / name) as ds:
            assert ds.crs is not None and ds.crs.to_epsg() == 32615, name  # brighton: UTM 15N
            assert ds.width > 10 and ds.height > 10
    with laspy.open(assets / "odm_georeferencing" / "odm_georeferenced_model.laz") as las:
        assert las.header.point_count > 0


@pytest.mark.slow
@pytest.mark.skipif(not real_pipeline_available(), reason="prefect_odm.engine.pipeline missing")
def test_real_sfm_pipeline_through_pyodm(
    engine_factory: EngineFactory, brighton_image_files: list[Path], tmp_path: Path
) -> None:
    """Structure from motion (pycolmap) on brighton through the engine (about a minute)."""
    engine = engine_factory(real=True)
    node = Node.from_url(engine.url)
    task = node.create_task(
        [str(p) for p in brighton_image_files],
        {"orthophoto-resolution": 20, "dsm": True, "pipeline": "sfm", "resize-to": 1024},
        name="sfm",
    )
    task.wait_for_completion(interval=1)
    info = task.info()
    assert info.status == TaskStatus.COMPLETED, info.last_error
    task.download_assets(str(tmp_path / "assets"))
    _assert_georeferenced(tmp_path / "assets")


def test_pyodm_life_cycle_stand_in_pipeline(
    engine: EngineProcess, few_images: list[Path], tmp_path: Path
) -> None:
    _pyodm_life_cycle(engine, few_images, tmp_path, {"orthophoto-resolution": 10, "dsm": True})


def test_pyodm_cancel_then_restart(engine_factory: EngineFactory, few_images: list[Path]) -> None:
    engine = engine_factory(faults={"slow_seconds": 30})
    task = Node.from_url(engine.url).create_task([str(p) for p in few_images], name="slow")
    wait_status(engine.url, task.uuid, {20})
    with pytest.raises(NodeResponseError, match="Task cannot be restarted"):
        task.restart()
    assert task.cancel()
    assert task.info().status == TaskStatus.CANCELED
    assert task.restart()
    assert task.info().status in (TaskStatus.QUEUED, TaskStatus.RUNNING)
    assert task.cancel()


# -- chunked upload over raw HTTP -----------------------------------------------------------------


def test_chunked_upload_renames_duplicates_and_refuses_escaping_names(
    engine: EngineProcess, few_images: list[Path]
) -> None:
    url = engine.url
    res = init_task(url, "chunks", UUID_A)
    assert res == {"uuid": UUID_A}
    # pending uploads are not tasks yet
    assert requests.get(f"{url}/task/list", timeout=10).json() == []
    assert requests.get(f"{url}/task/{UUID_A}/info", timeout=10).json() == {
        "error": f"{UUID_A} not found"
    }
    data = few_images[0].read_bytes()
    for _ in range(2):  # the same name twice: renamed, not rejected
        up = requests.post(
            f"{url}/task/new/upload/{UUID_A}",
            files={"images": (few_images[0].name, data)},
            timeout=30,
        )
        assert up.status_code == 200 and up.json() == {"success": True}
    up = requests.post(
        f"{url}/task/new/upload/{UUID_A}",
        files=[("images", (p.name, p.read_bytes())) for p in few_images[1:]],
        timeout=30,
    )
    assert up.json() == {"success": True}

    for bad in ("../../evil.jpg", "..\\evil.jpg", "/etc/evil.jpg", "..", "C:evil.jpg"):
        up = requests.post(
            f"{url}/task/new/upload/{UUID_A}", files={"images": (bad, b"x")}, timeout=10
        )
        body = up.json()
        assert "Invalid file name" in body["error"] and body["noRetry"] is True, (bad, body)
    assert not list(engine.data_dir.rglob("evil.jpg"))

    empty = requests.post(
        f"{url}/task/new/upload/{UUID_A}", files={"other": (None, "1")}, timeout=10
    ).json()
    assert empty == {"error": "Need at least 1 file.", "noRetry": True}

    assert requests.post(f"{url}/task/new/commit/{UUID_A}", timeout=10).json() == {"uuid": UUID_A}
    images = sorted(p.name for p in (engine.data_dir / "tasks" / UUID_A / "images").iterdir())
    stem = few_images[0].stem
    assert images == sorted(
        [few_images[0].name, f"{stem}_1{few_images[0].suffix}"] + [p.name for p in few_images[1:]]
    )
    info = wait_status(url, UUID_A, {40})
    assert info["imagesCount"] == len(few_images) + 1
    # uploads to a committed task are refused
    late = requests.post(
        f"{url}/task/new/upload/{UUID_A}", files={"images": ("late.jpg", data)}, timeout=10
    ).json()
    assert "error" in late


def test_upload_and_commit_to_unknown_uuid(engine: EngineProcess) -> None:
    up = requests.post(
        f"{engine.url}/task/new/upload/{UUID_A}", files={"images": ("a.jpg", b"x")}, timeout=10
    ).json()
    assert set(up) == {"error"}
    assert set(requests.post(f"{engine.url}/task/new/commit/{UUID_A}", timeout=10).json()) == {
        "error"
    }


def test_commit_without_images_is_an_error(engine: EngineProcess) -> None:
    uuid = requests.post(
        f"{engine.url}/task/new/init", files={"name": (None, "x")}, timeout=10
    ).json()["uuid"]
    assert "error" in requests.post(f"{engine.url}/task/new/commit/{uuid}", timeout=10).json()


def test_set_uuid_malformed_or_duplicate(engine: EngineProcess, few_images: list[Path]) -> None:
    url = engine.url
    for bad in ("not-a-uuid", "7f5e0a52-5d0c-4c6e-9a53-3f1b1c2d3e4", "../" + UUID_A):
        res = init_task(url, "x", bad)
        assert res == {"error": f"Invalid set-uuid: {bad}"}
    # a UUIDv5 (what prefect-odm derives from fingerprints) is accepted
    assert upload_task(url, few_images[:1], uuid=UUID_V5) == UUID_V5
    dup = init_task(url, "x", UUID_V5)
    assert dup == {"error": f"Invalid set-uuid: {UUID_V5}"}


def test_single_shot_task_new(engine: EngineProcess, few_images: list[Path]) -> None:
    files = [("images", (p.name, p.read_bytes())) for p in few_images]
    files.append(("name", (None, "single-shot")))
    files.append(("options", (None, json.dumps([{"name": "dsm", "value": True}]))))
    res = requests.post(
        f"{engine.url}/task/new", files=files, headers={"set-uuid": UUID_A}, timeout=30
    ).json()
    assert res == {"uuid": UUID_A}
    info = wait_status(engine.url, UUID_A, {40})
    assert info["name"] == "single-shot" and info["imagesCount"] == len(few_images)
    none = requests.post(
        f"{engine.url}/task/new", files={"name": (None, "empty")}, timeout=10
    ).json()
    assert "error" in none
    assert requests.get(f"{engine.url}/task/list", timeout=10).json() == [{"uuid": UUID_A}]


# -- options --------------------------------------------------------------------------------------


def test_invalid_options_give_a_per_option_error_list(engine: EngineProcess) -> None:
    bad = [
        {"name": "pipeline", "value": "magic"},
        {"name": "orthophoto-resolution", "value": -3},
        {"name": "dsm", "value": "perhaps"},
        {"name": "resize-to", "value": "big"},
    ]
    res = requests.post(
        f"{engine.url}/task/new/init", files={"options": (None, json.dumps(bad))}, timeout=10
    ).json()
    assert set(res) == {"error"}
    errors = json.loads(res["error"])
    assert sorted(e["name"] for e in errors) == sorted(o["name"] for o in bad)
    assert all(e["error"] for e in errors)
    garbage = requests.post(
        f"{engine.url}/task/new/init", files={"options": (None, "{not json")}, timeout=10
    ).json()
    assert "error" in garbage


def test_unknown_options_are_dropped_and_reported(
    engine: EngineProcess, few_images: list[Path]
) -> None:
    options = [{"name": "dsm", "value": "true"}, {"name": "fast-orthophoto", "value": True}]
    uuid = upload_task(engine.url, few_images[:1], options=options)
    info = wait_status(engine.url, uuid, {40})
    assert info["options"] == [{"name": "dsm", "value": True}]
    output = requests.get(f"{engine.url}/task/{uuid}/output", timeout=10).json()
    assert any("ignored unknown options: fast-orthophoto" in line for line in output)


# -- info, output, download -----------------------------------------------------------------------


def test_info_output_and_download_shapes(engine: EngineProcess, few_images: list[Path]) -> None:
    url = engine.url
    uuid = upload_task(url, few_images, name="shapes")
    info = wait_status(url, uuid, {40})
    assert set(info) == {
        "uuid",
        "name",
        "dateCreated",
        "processingTime",
        "status",
        "options",
        "imagesCount",
        "progress",
    }
    assert info["status"] == {"code": 40}
    assert abs(info["dateCreated"] - time.time() * 1000) < 120_000
    lines = requests.get(f"{url}/task/{uuid}/output", timeout=10).json()
    assert len(lines) > 3
    assert (
        requests.get(f"{url}/task/{uuid}/output", params={"line": 2}, timeout=10).json()
        == (lines[2:])
    )
    assert (
        requests.get(f"{url}/task/{uuid}/output", params={"line": -2}, timeout=10).json()
        == (lines[-2:])
    )
    tail = requests.get(f"{url}/task/{uuid}/info", params={"with_output": -3}, timeout=10).json()
    assert tail["output"] == lines[-3:]

    res = requests.get(f"{url}/task/{uuid}/download/all.zip", timeout=30)
    assert res.status_code == 200
    assert res.headers["Content-Type"] == "application/zip"
    assert int(res.headers["Content-Length"]) == len(res.content)
    assert "Accept-Ranges" not in res.headers
    names = zipfile.ZipFile(io.BytesIO(res.content)).namelist()
    assert "odm_orthophoto/odm_orthophoto.tif" in names and "task_output.txt" in names
    assert not any(n.startswith("images/") for n in names)

    assert requests.get(f"{url}/task/{uuid}/download/other.zip", timeout=10).json() == {
        "error": "Invalid asset"
    }
    unknown = requests.get(f"{url}/task/{UUID_A}/info", timeout=10).json()
    assert unknown == {"error": f"{UUID_A} not found"}


def test_outputs_limit_the_zip(engine: EngineProcess, few_images: list[Path]) -> None:
    uuid = upload_task(
        engine.url,
        few_images[:1],
        extra_fields={"outputs": json.dumps(["odm_orthophoto", "../../etc"])},
    )
    wait_status(engine.url, uuid, {40})
    res = requests.get(f"{engine.url}/task/{uuid}/download/all.zip", timeout=30)
    names = zipfile.ZipFile(io.BytesIO(res.content)).namelist()
    assert names == ["odm_orthophoto/odm_orthophoto.tif"]


def test_asset_not_ready_and_queue(engine_factory: EngineFactory, few_images: list[Path]) -> None:
    engine = engine_factory(faults={"slow_seconds": 30})
    first = upload_task(engine.url, few_images[:1], name="first")
    second = upload_task(engine.url, few_images[:1], name="second")
    info = wait_status(engine.url, first, {20})
    assert info["processingTime"] >= 0
    queued = requests.get(f"{engine.url}/task/{second}/info", timeout=10).json()
    assert queued["status"] == {"code": 10} and queued["processingTime"] == -1
    assert requests.get(f"{engine.url}/info", timeout=10).json()["taskQueueCount"] == 2
    assert requests.get(f"{engine.url}/task/{first}/download/all.zip", timeout=10).json() == {
        "error": "Asset not ready"
    }
    restart = requests.post(f"{engine.url}/task/restart", data={"uuid": second}, timeout=10).json()
    assert restart == {"success": False, "error": "Task cannot be restarted"}
    for uuid in (second, first):
        assert requests.post(
            f"{engine.url}/task/cancel", files={"uuid": (None, uuid)}, timeout=10
        ).json() == {"success": True}
    # cancelling a cancelled task succeeds, as on NodeODM
    again = requests.post(f"{engine.url}/task/cancel", data={"uuid": first}, timeout=10).json()
    assert again == {"success": True}


# -- cancel kills the process group ---------------------------------------------------------------


def test_cancel_kills_the_task_process_within_5_seconds(
    engine_factory: EngineFactory, few_images: list[Path]
) -> None:
    engine = engine_factory(faults={"slow_seconds": 60})
    uuid = upload_task(engine.url, few_images[:1])
    wait_status(engine.url, uuid, {20})
    table = json.loads((engine.data_dir / "tasks.json").read_text())
    pid = next(t["pid"] for t in table["tasks"] if t["uuid"] == uuid)
    assert pid and psutil.pid_exists(pid)
    assert psutil.Process(pid).ppid() == engine.pid
    started = time.monotonic()
    res = requests.post(f"{engine.url}/task/cancel", data={"uuid": uuid}, timeout=10).json()
    assert res == {"success": True}
    while psutil.pid_exists(pid) and time.monotonic() - started < 5:
        time.sleep(0.05)
    assert not psutil.pid_exists(pid), "task process still alive 5 s after cancel"
    info = requests.get(f"{engine.url}/task/{uuid}/info", timeout=10).json()
    assert info["status"] == {"code": 50}


def test_remove_running_task(engine_factory: EngineFactory, few_images: list[Path]) -> None:
    engine = engine_factory(faults={"slow_seconds": 60})
    uuid = upload_task(engine.url, few_images[:1])
    wait_status(engine.url, uuid, {20})
    res = requests.post(f"{engine.url}/task/remove", data={"uuid": uuid}, timeout=10).json()
    assert res == {"success": True}
    assert not (engine.data_dir / "tasks" / uuid).exists()
    assert requests.post(f"{engine.url}/task/remove", data={"uuid": uuid}, timeout=10).json() == {
        "success": False,
        "error": f"{uuid} not found",
    }


# -- token ----------------------------------------------------------------------------------------


def test_token_is_required_on_every_route(
    engine_factory: EngineFactory, few_images: list[Path]
) -> None:
    engine = engine_factory(token="s3cret")
    url = engine.url
    routes = [
        ("get", "/info"),
        ("get", "/options"),
        ("get", "/task/list"),
        ("post", "/task/new/init"),
        ("post", f"/task/new/upload/{UUID_A}"),
        ("post", f"/task/new/commit/{UUID_A}"),
        ("post", "/task/new"),
        ("get", f"/task/{UUID_A}/info"),
        ("get", f"/task/{UUID_A}/output"),
        ("get", f"/task/{UUID_A}/download/all.zip"),
        ("post", "/task/cancel"),
        ("post", "/task/remove"),
        ("post", "/task/restart"),
    ]
    for method, route in routes:
        for params in ({}, {"token": "wrong"}, {"token": "s3crét"}):
            res = requests.request(method, url + route, params=params, timeout=10)
            assert res.status_code == 200, route
            assert res.json()["error"].startswith("Invalid authentication token: "), route
    # a header is not a token
    res = requests.get(f"{url}/info", headers={"token": "s3cret"}, timeout=10).json()
    assert "error" in res
    uuid = upload_task(url, few_images[:1], token="s3cret")
    assert wait_status(url, uuid, {40}, token="s3cret")["imagesCount"] == 1
    node = Node.from_url(engine.node_url)
    assert node.info().engine == "prefect-odm"
    assert node.get_task(uuid).info().status == TaskStatus.COMPLETED


# -- extra files ----------------------------------------------------------------------------------


def write_zip(path: Path, members: dict[str, str]) -> Path:
    """A zip at ``path`` holding each member name with its text; returns ``path``."""
    with zipfile.ZipFile(path, "w") as zf:
        for name, text in members.items():
            zf.writestr(name, text)
    return path


def test_extra_files_are_routed_and_seed_zip_unpacked(
    engine: EngineProcess, few_images: list[Path], tmp_path: Path
) -> None:
    seed = write_zip(
        tmp_path / "seed.zip", {"opensfm/reconstruction.json": "[]", "submodels/a.txt": "a"}
    )
    gcp = tmp_path / "my_gcps.txt"
    gcp.write_text("EPSG:32615\n")
    geo = tmp_path / "geo.txt"
    geo.write_text("EPSG:4326\n")
    align = tmp_path / "align.laz"
    align.write_bytes(b"laz")
    uuid = upload_task(engine.url, [*few_images[:1], seed, gcp, geo, align])
    task_dir = engine.data_dir / "tasks" / uuid
    info = wait_status(engine.url, uuid, {40})
    assert info["imagesCount"] == 1
    assert (task_dir / "opensfm" / "reconstruction.json").read_text() == "[]"
    assert (task_dir / "submodels" / "a.txt").exists()
    assert not (task_dir / "seed.zip").exists()
    assert (task_dir / "gcp_list.txt").read_text() == "EPSG:32615\n"
    assert (task_dir / "geo.txt").exists() and (task_dir / "align.laz").exists()
    assert sorted(p.name for p in (task_dir / "images").iterdir()) == [few_images[0].name]


def test_seed_zip_escaping_the_task_folder_is_refused(
    engine: EngineProcess, few_images: list[Path], tmp_path: Path
) -> None:
    seed = write_zip(tmp_path / "seed.zip", {"../../outside.txt": "x"})
    res = requests.post(f"{engine.url}/task/new/init", timeout=10).json()
    uuid = res["uuid"]
    for path in (few_images[0], seed):
        requests.post(
            f"{engine.url}/task/new/upload/{uuid}",
            files={"images": (path.name, path.read_bytes())},
            timeout=30,
        )
    commit = requests.post(f"{engine.url}/task/new/commit/{uuid}", timeout=10).json()
    assert "Unsafe path" in commit["error"]
    assert not list(engine.data_dir.parent.rglob("outside.txt"))


def test_max_images_and_max_upload(engine_factory: EngineFactory) -> None:
    engine = engine_factory(max_images=2, max_upload_mb=0.5)
    url = engine.url
    assert requests.get(f"{url}/info", timeout=10).json()["maxImages"] == 2
    uuid = requests.post(f"{url}/task/new/init", timeout=10).json()["uuid"]
    big = requests.post(
        f"{url}/task/new/upload/{uuid}", files={"images": ("big.jpg", b"0" * 600_000)}, timeout=10
    ).json()
    assert "too large" in big["error"] and big["noRetry"] is True
    for i in range(3):
        requests.post(
            f"{url}/task/new/upload/{uuid}", files={"images": (f"{i}.jpg", b"0" * 10)}, timeout=10
        )
    commit = requests.post(f"{url}/task/new/commit/{uuid}", timeout=10).json()
    assert "Too many images" in commit["error"]


# -- webhook --------------------------------------------------------------------------------------


class _Hook(BaseHTTPRequestHandler):
    received: list[dict[str, Any]] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        length = int(self.headers["Content-Length"])
        _Hook.received.append(json.loads(self.rfile.read(length)))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def test_webhook_posts_task_info_on_completed_and_failed(
    engine_factory: EngineFactory, few_images: list[Path]
) -> None:
    _Hook.received = []
    server = HTTPServer(("127.0.0.1", 0), _Hook)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        hook = f"http://127.0.0.1:{server.server_port}/hook"
        engine = engine_factory(faults={"fail_task_name": "^bad"})
        good = upload_task(engine.url, few_images[:1], name="good", extra_fields={"webhook": hook})
        bad = upload_task(
            engine.url, few_images[:1], name="bad-one", extra_fields={"webhook": hook}
        )
        plain = upload_task(engine.url, few_images[:1], name="no-hook")
        wait_status(engine.url, bad, {30})
        wait_status(engine.url, plain, {40})
        deadline = time.monotonic() + 10
        while len(_Hook.received) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)
        by_uuid = {body["uuid"]: body for body in _Hook.received}
        assert len(_Hook.received) == 2 and set(by_uuid) == {good, bad}
        assert by_uuid[good]["status"] == {"code": 40}
        assert by_uuid[bad]["status"]["code"] == 30
        assert "Injected failure" in by_uuid[bad]["status"]["errorMessage"]
    finally:
        server.shutdown()


# -- failures -------------------------------------------------------------------------------------


def test_failed_task_carries_error_message_and_last_lines(
    engine_factory: EngineFactory, few_images: list[Path]
) -> None:
    engine = engine_factory(faults={"fail_task_name": "doomed", "fail_message": "bad pixels"})
    uuid = upload_task(engine.url, few_images[:1], name="doomed")
    info = wait_status(engine.url, uuid, {30})
    message = info["status"]["errorMessage"]
    assert "bad pixels" in message and "Last output lines" in message
    with pytest.raises(NodeResponseError, match="Asset not ready"):
        Node.from_url(engine.url).get_task(uuid).get(f"/task/{uuid}/download/all.zip")


@pytest.mark.parametrize("mode", ["sigkill", "memoryerror"])
def test_out_of_memory_is_reported_with_exit_code_137(
    engine_factory: EngineFactory, few_images: list[Path], mode: str
) -> None:
    engine = engine_factory(faults={"oom_first_n_tasks": 1, "oom_mode": mode})
    uuid = upload_task(engine.url, few_images[:1])
    info = wait_status(engine.url, uuid, {30})
    message = info["status"]["errorMessage"]
    assert "not enough memory" in message.lower() and "137" in message
    assert "simulating out of memory" in message  # the last output lines are included
    # the second run is not hit by the fault: a restart succeeds
    assert requests.post(f"{engine.url}/task/restart", data={"uuid": uuid}, timeout=10).json() == {
        "success": True
    }
    assert wait_status(engine.url, uuid, {40, 30})["status"] == {"code": 40}


def test_pyodm_upload_retries_through_http_500(
    engine_factory: EngineFactory, few_images: list[Path]
) -> None:
    engine = engine_factory(faults={"upload_error_every": 2})
    node = Node.from_url(engine.url)
    task = node.create_task(
        [str(p) for p in few_images],
        parallel_uploads=1,
        max_retries=5,
        retry_timeout=0,
        progress_callback=lambda _: None,
    )
    task.wait_for_completion(interval=0.2)
    assert task.info().images_count == len(few_images)
    bad = requests.post(
        f"{engine.url}/task/new/upload/{task.uuid}", files={"images": ("x.jpg", b"x")}, timeout=10
    )
    bad2 = requests.post(
        f"{engine.url}/task/new/upload/{task.uuid}", files={"images": ("x.jpg", b"x")}, timeout=10
    )
    assert sorted([bad.status_code, bad2.status_code]) == [200, 500]


def test_parallel_tasks_and_fifo_queue(
    engine_factory: EngineFactory, few_images: list[Path]
) -> None:
    engine = engine_factory(max_parallel_tasks=2, faults={"slow_seconds": 2})
    uuids = [upload_task(engine.url, few_images[:1], name=f"t{i}") for i in range(4)]
    wait_status(engine.url, uuids[1], {20})
    codes = [
        requests.get(f"{engine.url}/task/{u}/info", timeout=10).json()["status"]["code"]
        for u in uuids
    ]
    assert codes == [20, 20, 10, 10]
    for uuid in uuids:
        wait_status(engine.url, uuid, {40})
    table = json.loads((engine.data_dir / "tasks.json").read_text())
    by_uuid = {t["uuid"]: t for t in table["tasks"]}
    starts = [by_uuid[u]["started_ms"] for u in uuids]
    assert starts[2] <= starts[3]  # FIFO: the third task started before the fourth


def test_engine_command_line_refuses_bad_faults(tmp_path: Path) -> None:
    from prefect_odm.engine.__main__ import main

    assert main(["serve", "--data-dir", str(tmp_path), "--faults", "{bad json"]) == 2
    assert main(["serve", "--data-dir", str(tmp_path), "--faults", '{"no_such_key": 1}']) == 2


def test_fault_configuration() -> None:
    from prefect_odm.engine.faults import Faults, InjectedFailure
    from prefect_odm.errors import InputError

    assert not Faults.from_json(None).active
    faults = Faults.from_json('{"fail_first_n_tasks": 1, "upload_error_every": 3}')
    assert faults.to_dict() == {"fail_first_n_tasks": 1, "upload_error_every": 3}
    assert [faults.upload_should_fail(i) for i in range(1, 7)] == [False, False, True] * 2
    with pytest.raises(InjectedFailure, match="Injected failure"):
        faults.before_processing(name="x", run_ordinal=1, log=lambda _: None)
    faults.before_processing(name="x", run_ordinal=2, log=lambda _: None)
    with pytest.raises(InputError):
        Faults.from_json('{"oom_mode": "explode"}')
    with pytest.raises(InputError):
        Faults.from_json("[1, 2]")


def test_task_new_with_zipurl(engine: EngineProcess, few_images: list[Path]) -> None:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        for path in few_images[:2]:
            zf.write(path, f"photos/{path.name}")
    payload = buffer.getvalue()

    class ZipHandler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            self.send_response(200)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args: Any) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), ZipHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        zipurl = f"http://127.0.0.1:{server.server_port}/images.zip"
        res = requests.post(
            f"{engine.url}/task/new",
            files={"zipurl": (None, zipurl), "name": (None, "from zip")},
            timeout=30,
        ).json()
        info = wait_status(engine.url, res["uuid"], {40})
        assert info["imagesCount"] == 2
        bad = requests.post(
            f"{engine.url}/task/new", files={"zipurl": (None, "file:///etc/passwd")}, timeout=10
        ).json()
        assert "Invalid zipurl" in bad["error"]
        assert requests.get(f"{engine.url}/task/list", timeout=10).json() == [{"uuid": res["uuid"]}]
    finally:
        server.shutdown()
