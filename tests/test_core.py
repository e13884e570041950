"""Unit tests of the pure core pieces: fingerprints, layout, ownership, placement, import layering."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from typing import get_args

import numpy as np
import pytest

from prefect_odm.errors import (
    ImageHeaderError,
    InputError,
    PlanningError,
    PrefectODMError,
    TransientNodeError,
)
from prefect_odm.fingerprints import submodel_fingerprint, survey_fingerprint
from prefect_odm.layout import ODM_PRODUCT_PATHS, PRODUCT_FILES, OutputLayout, join
from prefect_odm.models import ProcessingOptions, ProductName
from prefect_odm.nodes.client import public_url, task_uuid
from prefect_odm.nodes.health import Health, HealthBook
from prefect_odm.nodes.pool import NodePool, PoolNode
from prefect_odm.nodes.products import VERIFIERS
from prefect_odm.ownership import Ownership
from prefect_odm.registry import (
    PRODUCTS,
    MergeMethod,
    ProductKind,
    VerifyRule,
    products_of_kind,
    required_products,
)


def test_fingerprints_ignore_order_and_see_options():
    ids = [f"sha256:{i:064x}" for i in range(5)]
    assert survey_fingerprint(ids) == survey_fingerprint(list(reversed(ids)))
    a = submodel_fingerprint(ids, ProcessingOptions().to_nodeodm(), "engine 1")
    b = submodel_fingerprint(ids[::-1], ProcessingOptions().to_nodeodm(), "engine 1")
    c = submodel_fingerprint(
        ids, ProcessingOptions(orthophoto_resolution_cm=3).to_nodeodm(), "engine 1"
    )
    d = submodel_fingerprint(ids, ProcessingOptions().to_nodeodm(), "engine 2")
    assert a == b
    assert len({a, c, d}) == 3


def test_task_uuid_is_deterministic_per_attempt():
    assert task_uuid("f" * 64, 0) == task_uuid("f" * 64, 0)
    assert task_uuid("f" * 64, 0) != task_uuid("f" * 64, 1)
    assert task_uuid("f" * 64, 0) != task_uuid("e" * 64, 0)


def test_public_url_drops_token():
    assert public_url("http://127.0.0.1:3000/?token=secret") == "http://127.0.0.1:3000"
    assert "secret" not in public_url("http://user:secret@127.0.0.1:3000/x?token=secret")


def test_layout_paths_are_under_the_survey_folder():
    layout = OutputLayout("s3://bucket/out/", "ab" * 32)
    assert layout.manifest == "s3://bucket/out/" + "ab" * 8 + "/manifest.json"
    assert layout.merged_product("orthophoto").endswith("/merged/odm_orthophoto.tif")
    assert layout.submodel_dir("submodel-001", "cd" * 32).endswith(
        "/submodels/submodel-001-" + "cd" * 6
    )


def test_registry_is_the_one_product_declaration():
    # The names agree with models.ProductName, in the same order.
    assert tuple(PRODUCTS) == get_args(ProductName)
    assert set(VERIFIERS) == set(get_args(VerifyRule))
    layout = OutputLayout("/out", "ab" * 32)
    for name, product in PRODUCTS.items():
        assert product.name == name
        # One verify rule with its check, one merge method, one kind.
        assert product.verify in get_args(VerifyRule) and callable(VERIFIERS[product.verify])
        assert product.merge in get_args(MergeMethod)
        assert product.kind in get_args(ProductKind)
        assert (product.kind == "point_cloud") == (product.verify == "point_cloud")
        # Layout paths come from the registry.
        assert product.odm_path.endswith("/" + product.file_name)
        assert PRODUCT_FILES[name] == product.file_name
        assert ODM_PRODUCT_PATHS[name] == product.odm_path
        assert layout.merged_product(name) == join(layout.merged_dir, product.file_name)
        assert layout.submodel_product("submodel-000", "cd" * 32, name) == join(
            layout.submodel_dir("submodel-000", "cd" * 32), product.file_name
        )
    assert len({p.file_name for p in PRODUCTS.values()}) == len(PRODUCTS)
    assert required_products() == tuple(n for n, p in PRODUCTS.items() if p.required)
    assert products_of_kind("raster") + products_of_kind("point_cloud") == tuple(PRODUCTS)


def test_errors_share_one_root_and_builtin_meaning():
    assert issubclass(InputError, PrefectODMError) and issubclass(InputError, ValueError)
    assert issubclass(TransientNodeError, PrefectODMError)
    assert issubclass(ImageHeaderError, InputError)


def test_ownership_nearest_core_camera_and_subset():
    cams = [(0.0, 0.0, "submodel-000"), (10.0, 0.0, "submodel-000"), (100.0, 0.0, "submodel-001")]
    own = Ownership.from_cameras(cams)
    assert own.submodel_ids == ("submodel-000", "submodel-001")
    owners = own.owner_of_points(np.array([1.0, 54.0, 56.0, 99.0]), np.zeros(4))
    assert list(owners) == ["submodel-000", "submodel-000", "submodel-001", "submodel-001"]
    only = Ownership.from_cameras(cams, only=["submodel-001"])
    assert set(only.owner_of_points(np.array([0.0]), np.array([0.0]))) == {"submodel-001"}
    grid = own.label_grid((10.0, 0.0, -5.0, 0.0, -10.0, 5.0), 1, 12)
    assert grid.shape == (1, 12) and grid[0, 0] == 0 and grid[0, -1] == 1


def test_pool_spreads_by_load_and_never_overcommits():
    big = PoolNode("http://127.0.0.1:1", memory_gib=16, max_parallel_tasks=2)
    small = PoolNode("http://127.0.0.1:2", memory_gib=8, max_parallel_tasks=2)
    pool = NodePool([big, small])
    with pool.lease(6, what="a") as n1:
        assert n1 is big  # both idle and healthy: the lower URL
        with pool.lease(6, what="b") as n2:
            assert n2 is small  # the less loaded node
            with pool.lease(4, what="c") as n3:
                assert n3 is big and big.used_memory_gib == 10  # 4 GiB do not fit on small
    assert big.used_memory_gib == 0 and small.running == 0
    with pytest.raises(PlanningError, match="largest node has 16.0 GiB"):
        with pool.lease(20, what="huge"):
            pass


def test_pool_places_on_a_suspected_node_last():
    clock = [0.0]
    book = HealthBook(clock=lambda: clock[0])
    bad = PoolNode("http://127.0.0.1:1", memory_gib=8, max_parallel_tasks=2)
    good = PoolNode("http://127.0.0.1:2", memory_gib=8, max_parallel_tasks=2)
    pool = NodePool([bad, good], health=book)
    pool.record(lambda b: b.task_failed(bad.key, elapsed_seconds=1.0, message="at once"))
    assert book.health(bad.key) is Health.SUSPECTED
    with pool.lease(1, what="a") as n1, pool.lease(1, what="b") as n2:
        assert n1 is good and n2 is good  # health first: the healthy node while it has room
    assert book.retry_elsewhere(bad.key, 0) and not book.retry_elsewhere(bad.key, 1)
    clock[0] = 1e6  # cool-down over: one probe task, then no more until it reports
    with pool.lease(1, what="probe", exclude=[good.key]) as probe:
        assert probe is bad and book.health(bad.key) is Health.PROBING
        with pytest.raises(TransientNodeError, match="within"):
            with pool.lease(1, what="second", exclude=[good.key], timeout_seconds=0.05):
                pass
    pool.record(lambda b: b.task_completed(bad.key))
    assert book.health(bad.key) is Health.HEALTHY
    assert [r.url for r in book.report()] == [bad.key, good.key]


def test_pool_waits_for_memory_then_places():
    node = PoolNode("http://127.0.0.1:1", memory_gib=10, max_parallel_tasks=4)
    pool = NodePool([node])
    peak = []
    lock = threading.Lock()

    def job() -> None:
        with pool.lease(6, what="x"):
            with lock:
                peak.append(node.used_memory_gib)
            time.sleep(0.05)

    threads = [threading.Thread(target=job) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert max(peak) <= 10 and len(peak) == 4


def test_pool_marks_nodes_down():
    pool = NodePool([PoolNode("a", 8, 1), PoolNode("b", 8, 1)])
    pool.mark_down("a")
    with pool.lease(1, what="x") as n:
        assert n.key == "b"
    pool.mark_down("b")
    with pytest.raises(TransientNodeError, match="all are down"):
        with pool.lease(1, what="x"):
            pass


def test_pool_task_slots_count_up_nodes_and_room_for_set_aside_ones():
    pool = NodePool([PoolNode("a", 8, 3), PoolNode("b", 8, 2), PoolNode("c", 0, 1, down=True)])
    assert pool.task_slots == 3 + 2 + 3  # c may come back as large as the largest
    pool.mark_down("a")
    assert pool.task_slots == 2 + 2 * 2
    assert NodePool([]).task_slots == 1


def test_core_imports_neither_prefect_nor_pyodm():
    code = (
        "import sys\n"
        "import prefect_odm, prefect_odm.models, prefect_odm.fingerprints, prefect_odm.layout,"
        " prefect_odm.ownership, prefect_odm.nodes.pool, prefect_odm.plan.planning, prefect_odm.plan.memory,"
        " prefect_odm.registry, prefect_odm.settings, prefect_odm.errors, prefect_odm.geo,"
        " prefect_odm.plan.partition, prefect_odm.plan.core_areas, prefect_odm.plan.coverage_gaps,"
        " prefect_odm.survey.flight_checks, prefect_odm.survey.exif, prefect_odm.survey.layouts, prefect_odm.nodes.backend,"
        " prefect_odm.run_policy, prefect_odm.nodes.health, prefect_odm.nodes.option_check,"
        " prefect_odm.nodes.capacity, prefect_odm.plan.checks, prefect_odm.nodes.messages,"
        " prefect_odm.align, prefect_odm.survey.gps_quality, prefect_odm.merge.balance,"
        " prefect_odm.merge.blend, prefect_odm.merge.reports, prefect_odm.merge.seams\n"
        "bad = [m for m in ('prefect', 'pyodm', 'rasterio', 'laspy', 'pycolmap') if m in sys.modules]\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_pool_large_submodel_is_not_starved_by_small_ones():
    node = PoolNode("n", memory_gib=10, max_parallel_tasks=10)
    pool = NodePool([node])
    order: list[str] = []
    lock = threading.Lock()
    holders = [pool.lease(4, what="s0"), pool.lease(4, what="s1")]
    for h in holders:
        h.__enter__()  # 8 of 10 GiB in use: the large one (8 GiB) must wait

    def job(name: str, gib: float) -> None:
        with pool.lease(gib, what=name):
            with lock:
                order.append(name)
            time.sleep(0.05)

    large = threading.Thread(target=job, args=("large", 8))
    large.start()
    time.sleep(0.1)
    smalls = [threading.Thread(target=job, args=(f"small{i}", 2)) for i in range(8)]
    for t in smalls:
        t.start()
        time.sleep(0.01)
    time.sleep(0.3)
    for h in holders:
        h.__exit__(None, None, None)
    large.join(5)
    for t in smalls:
        t.join(5)
    # Small ones passed the large one only while it could not start, at most MAX_PASSES times.
    from prefect_odm.nodes.pool import MAX_PASSES

    assert order.index("large") <= MAX_PASSES
    assert len(order) == 9


def test_pool_serves_the_largest_waiting_submodel_first_whatever_its_arrival():
    """A submodel delayed on its way to the pool (its Prefect bookkeeping caught in the API's
    503 back-off, issue 33) is still served before smaller ones that arrived earlier."""
    pool = NodePool([PoolNode("n", memory_gib=10, max_parallel_tasks=1)])
    order: list[str] = []
    lock = threading.Lock()
    busy = pool.lease(1, what="running")
    busy.__enter__()  # the only slot is taken: everyone below waits

    def job(name: str, images: int) -> None:
        with pool.lease(1, what=name, priority=-images):
            with lock:
                order.append(name)

    threads = [threading.Thread(target=job, args=(f"small{i}", 50 + i)) for i in range(3)]
    threads.append(threading.Thread(target=job, args=("largest", 100)))  # arrives last
    deadline = time.monotonic() + 30
    for i, t in enumerate(threads):
        t.start()  # one at a time: arrivals in this order
        while len(pool._waiting) <= i and time.monotonic() < deadline:
            time.sleep(0.01)
    assert [w.what for w in pool._waiting] == ["small0", "small1", "small2", "largest"]
    busy.__exit__(None, None, None)
    for t in threads:
        t.join(10)
    assert order == ["largest", "small2", "small1", "small0"]


def test_a_node_with_a_queue_takes_one_task_beyond_its_slots_with_its_memory():
    """The next submodel uploads while the node's slots are busy and waits in the node's own
    queue; its memory counts as if it ran, so the node is never overcommitted."""
    node = PoolNode("n", memory_gib=10, max_parallel_tasks=2, queue_depth=1)
    pool = NodePool([node])
    held = [pool.lease(3, what=f"s{i}") for i in range(3)]
    for h in held:
        h.__enter__()  # two running, one queued on the node
    assert node.running == 3 and node.used_memory_gib == 9
    with pytest.raises(TransientNodeError, match="no node had room"):
        with pool.lease(1, what="fourth", timeout_seconds=0.2):
            pass  # 2 slots + 1 queued are all taken, though 1 GiB is free
    held[0].__exit__(None, None, None)
    with pytest.raises(TransientNodeError, match="no node had room"):
        with pool.lease(5, what="too big", timeout_seconds=0.2):
            pass  # a place is free, 5 GiB are not (6 of 10 in use)
    with pool.lease(4, what="fits"):
        assert node.running == 3
    for h in held[1:]:
        h.__exit__(None, None, None)
    assert node.running == 0 and node.used_memory_gib == 0


def test_a_relative_output_is_recorded_absolute_and_old_records_are_rebased(tmp_path, monkeypatch):
    """An ``--output`` given relative: the layout's paths (so the manifest's and result.json's)
    are absolute, true from any working folder. A manifest an older version wrote, with paths
    relative to its writer's working folder, is read with its paths under its own run folder
    (the rerun reuses its merge from elsewhere instead of calling the products missing)."""
    from datetime import UTC, datetime

    from prefect_odm import storage
    from prefect_odm.models import Manifest, SubmodelResult
    from prefect_odm.run_policy import stored_manifest

    fp = "ab" * 32
    (tmp_path / "first").mkdir()
    monkeypatch.chdir(tmp_path / "first")
    layout = OutputLayout("out", fp)
    assert layout.root == str(tmp_path / "first" / "out")
    assert layout.merged_product("dsm") == str(
        tmp_path / "first" / "out" / fp[:16] / "merged" / "dsm.tif"
    )
    assert OutputLayout("s3://bucket/out", fp).root == "s3://bucket/out"
    dsm = tmp_path / "first" / "out" / fp[:16] / "merged" / "dsm.tif"
    dsm.parent.mkdir(parents=True)
    dsm.write_bytes(b"x" * 10)
    old = f"out/{fp[:16]}/merged/dsm.tif"  # as 0.2.0 wrote it, from the folder "first"
    sub = SubmodelResult(
        submodel_id="submodel-000", fingerprint="cd" * 32, status="completed",
        products={"dsm": f"out/{fp[:16]}/submodels/submodel-000-cdcdcdcdcdcd/dsm.tif",
                  "orthophoto": "elsewhere/odm_orthophoto.tif"},
    )  # fmt: skip
    manifest = Manifest(
        version="0.2.0", created=datetime.now(UTC), source="images", survey_fingerprint=fp,
        plan_fingerprint="p", merge_fingerprint="m", crs_epsg=32615, products={"dsm": old},
        product_sizes={"dsm": 10}, submodels=[sub],
    )  # fmt: skip
    storage.write_json_atomic(layout.manifest, manifest.model_dump(mode="json"))
    (tmp_path / "second").mkdir()
    monkeypatch.chdir(tmp_path / "second")  # the merged DSM is no longer at `old` from here
    read = stored_manifest(OutputLayout(str(tmp_path / "first" / "out"), fp), "m")
    assert read is not None and read.products == {"dsm": str(dsm)}
    assert read.submodels[0].products == {
        "dsm": str(dsm.parents[1] / "submodels" / "submodel-000-cdcdcdcdcdcd" / "dsm.tif"),
        "orthophoto": "elsewhere/odm_orthophoto.tif",  # outside a run folder: as written
    }
    from prefect_odm.run_policy import rebased_result

    assert rebased_result(read.submodels[0], layout) == read.submodels[0]  # absolute: unchanged
