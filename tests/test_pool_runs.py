"""Submodels on a pool of real built-in engine nodes (several loopback ports), with faults
injected through the engine's hooks, through real Prefect."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import numpy as np
import pytest
import rasterio
from odm_server import reconstruct_command

from prefect_odm.engine.launch import EngineProcess, start_engine
from prefect_odm.errors import IncompleteRunError
from prefect_odm.models import MergeOptions, ProcessingOptions
from prefect_odm.nodes.client import RUNNING, NodeClient
from prefect_odm.settings import FAULTS_ENV

pytestmark = pytest.mark.integration

DIRECT = ProcessingOptions(pipeline="direct")


@contextmanager
def engines(tmp_path: Path, specs: list[dict]) -> Iterator[list[EngineProcess]]:
    """Start one engine per spec: ``{"faults": {...}, "parallel": n, "token": str}``."""
    with ExitStack() as stack:
        out = []
        for i, spec in enumerate(specs):
            env = {FAULTS_ENV: json.dumps(spec["faults"])} if spec.get("faults") else None
            out.append(
                stack.enter_context(
                    start_engine(
                        tmp_path / f"node{i}",
                        method="direct",
                        max_parallel_tasks=spec.get("parallel", 2),
                        token=spec.get("token"),
                        extra_env=env,
                    )
                )
            )
        yield out


def requests_of(engine: EngineProcess) -> list[dict]:
    path = engine.data_dir / "requests.log"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def count(engine: EngineProcess, method: str, prefix: str) -> int:
    return sum(
        1 for r in requests_of(engine) if r["method"] == method and r["path"].startswith(prefix)
    )


def accepted_uploads(engine: EngineProcess) -> list[list[str]]:
    """The files of each upload request the engine accepted (a request carries a batch)."""
    path = engine.data_dir / "uploads.log"
    lines = path.read_text().splitlines() if path.exists() else []
    return [json.loads(line)["files"] for line in lines]


def uploaded_files(engine: EngineProcess) -> int:
    """Files the engine stored from upload requests."""
    return sum(len(files) for files in accepted_uploads(engine))


def run_flow(
    images: Path, out: Path, nodes: list[str], options: ProcessingOptions = DIRECT, **kwargs
):
    from prefect_odm.flows import reconstruct

    return reconstruct(
        images=str(images),
        output=str(out),
        nodes=nodes,
        options=options,
        **{"split": 5, "split_overlap_m": 15, **kwargs},
    )


def start_cli_run(images: Path, out: Path, urls: list[str], api_url: str) -> subprocess.Popen:
    """``prefect-odm reconstruct`` as a user runs it, in its own session (stderr piped)."""
    cmd = reconstruct_command(images, out, "--nodes", *urls)
    env = dict(os.environ, PREFECT_API_URL=api_url)
    return subprocess.Popen(
        cmd,
        env=env,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_running(clients: list[NodeClient], proc: subprocess.Popen, at_least: int = 1) -> None:
    """Wait until the nodes report ``at_least`` RUNNING tasks (the run must still be alive)."""
    deadline = time.monotonic() + 120
    while True:
        running = [
            s
            for c in clients
            for u in c.task_list()
            if (s := c.task_state(u)) and s.status == RUNNING
        ]
        if len(running) >= at_least:
            return
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        assert time.monotonic() < deadline, "no task started on the nodes"
        time.sleep(0.2)


def test_memory_admission_never_overcommits_a_node_and_uses_both(
    prefect_api, brighton_images, tmp_path, odm_home
):
    """6 submodels, 2 nodes with memory for one large or two small submodels each."""
    from prefect_odm.layout import OutputLayout
    from prefect_odm.nodes.pool import NodePool, PoolNode
    from prefect_odm.nodes.runner import SubmodelRunner
    from prefect_odm.plan.planning import plan_split
    from prefect_odm.survey.scan import scan_images

    survey = scan_images(str(brighton_images))
    plan = plan_split(survey, split=3, split_overlap_m=10, min_submodel_images=2, options=DIRECT)
    assert len(plan.submodels) >= 6
    plan = plan.model_copy(
        update={
            "submodels": [
                sm.model_copy(update={"estimated_memory_gib": 4.0 if i % 3 == 0 else 2.0})
                for i, sm in enumerate(plan.submodels[:6])
            ]
        }
    )
    layout = OutputLayout(str(tmp_path / "out"), survey.fingerprint)
    with engines(tmp_path, [{"faults": {"slow_seconds": 1.5}, "parallel": 4}] * 2) as nodes:
        clients = {NodeClient(e.url).url: NodeClient(e.url) for e in nodes}
        pool = NodePool([PoolNode(key, memory_gib=4.0, max_parallel_tasks=2) for key in clients])
        runner = SubmodelRunner(plan, survey, layout, pool, clients, poll_interval_seconds=0.3)
        estimate = {sm.fingerprint[:12]: sm.estimated_memory_gib for sm in plan.submodels}
        peaks = {key: 0.0 for key in clients}
        stop = threading.Event()

        def watch() -> None:  # the nodes' own task lists: memory of RUNNING tasks per node
            while not stop.is_set():
                for key, client in clients.items():
                    used = 0.0
                    for uuid in client.task_list():
                        state = client.task_state(uuid)
                        if state is not None and state.status == RUNNING:
                            used += estimate[state.info["name"].rsplit("-", 1)[1]]
                    peaks[key] = max(peaks[key], used)
                time.sleep(0.1)

        watcher = threading.Thread(target=watch)
        watcher.start()
        try:
            threads = [threading.Thread(target=runner.run, args=(sm.id,)) for sm in plan.submodels]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        finally:
            stop.set()
            watcher.join()
        per_node = {key: len(c.task_list()) for key, c in clients.items()}
    assert all(peak <= 4.0 for peak in peaks.values()), peaks
    assert all(n > 0 for n in per_node.values()), per_node
    assert sum(per_node.values()) == len(plan.submodels)


def test_killed_flow_process_reattaches_without_duplicates(
    prefect_api, brighton_images, tmp_path, odm_home
):
    """Kill the flow process while tasks run (and others may be mid-upload): the rerun
    re-attaches to every committed task, and a submodel whose upload the kill cut takes its next
    UUID (the node keeps the cut upload's files under the old one) without re-sending anything
    under the old UUID; nothing committed is uploaded again."""
    with engines(tmp_path, [{"faults": {"slow_seconds": 6}}] * 2) as nodes:
        urls = [e.url for e in nodes]
        proc = start_cli_run(brighton_images, tmp_path / "out", urls, prefect_api)
        clients = [NodeClient(u) for u in urls]
        wait_running(clients, proc, at_least=2)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        committed_before = [s for c in clients for u in c.task_list() if (s := c.task_state(u))]
        inits_before = sum(count(e, "POST", "/task/new/init") for e in nodes)
        uploads_before = sum(uploaded_files(e) for e in nodes)
        manifest = run_flow(brighton_images, tmp_path / "out", urls)
        tasks = [u for c in clients for u in c.task_list()]
        inits = sum(count(e, "POST", "/task/new/init") for e in nodes)
        uploads_after = sum(uploaded_files(e) for e in nodes)
        plan = json.loads(
            Path(manifest.products["orthophoto"])
            .parents[1]
            .joinpath("plan", "plan.json")
            .read_text()
        )
        images_per_submodel_upload = sum(len(sm["image_names"]) for sm in plan["submodels"])
    assert len(committed_before) >= 2
    assert len(tasks) == len(manifest.submodels)  # one task per submodel, no duplicate
    # every committed task re-attached; every other submodel initialised exactly once more
    assert inits - inits_before == len(manifest.submodels) - len(committed_before)
    # only the images of submodels not committed before the kill are sent again
    committed_images = sum(s.images_count for s in committed_before)
    assert uploads_after - uploads_before == images_per_submodel_upload - committed_images
    assert all(r.status == "completed" for r in manifest.submodels)
    # Identical to an uninterrupted run on fresh nodes.
    with engines(tmp_path / "fresh", [{}, {}]) as fresh:
        clean = run_flow(brighton_images, tmp_path / "clean", [e.url for e in fresh])
    with (
        rasterio.open(manifest.products["orthophoto"]) as a,
        rasterio.open(clean.products["orthophoto"]) as b,
    ):
        assert a.transform == b.transform and np.array_equal(a.read(), b.read())


def test_node_killed_mid_task_its_submodel_finishes_elsewhere(
    prefect_api, brighton_images, tmp_path, odm_home
):
    with engines(tmp_path, [{"faults": {"slow_seconds": 8}, "parallel": 1}, {"parallel": 1}]) as (
        doomed,
        healthy,
    ):
        client = NodeClient(doomed.url)

        def kill_when_running() -> None:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                try:
                    if any(
                        (s := client.task_state(u)) and s.status == RUNNING
                        for u in client.task_list()
                    ):
                        doomed.kill()
                        return
                except Exception:
                    return
                time.sleep(0.1)

        killer = threading.Thread(target=kill_when_running)
        killer.start()
        manifest = run_flow(brighton_images, tmp_path / "out", [doomed.url, healthy.url])
        killer.join()
        assert not doomed.alive()
    assert all(r.status == "completed" for r in manifest.submodels)
    assert {r.node_url for r in manifest.submodels} == {NodeClient(healthy.url).url} or any(
        r.attempts > 1 and r.node_url == NodeClient(healthy.url).url for r in manifest.submodels
    )
    assert any(r.attempts > 1 for r in manifest.submodels)


def test_half_the_uploads_fail_with_http_500_and_the_run_succeeds(
    prefect_api, brighton_images, tmp_path, odm_home
):
    with engines(tmp_path, [{"faults": {"upload_error_every": 2}}]) as (node,):
        manifest = run_flow(brighton_images, tmp_path / "out", [node.url])
        requests_made = count(node, "POST", "/task/new/upload")
        batches = accepted_uploads(node)
        accepted, files = len(batches), sum(len(b) for b in batches)
    assert all(r.status == "completed" for r in manifest.submodels)
    # every second request answered 500 and was retried: about twice as many as accepted
    assert requests_made >= 2 * accepted - 1 and accepted >= len(manifest.submodels)
    plan = json.loads(
        Path(manifest.products["orthophoto"]).parents[1].joinpath("plan", "plan.json").read_text()
    )
    stored: dict[str, list[str]] = {}
    for line in (node.data_dir / "uploads.log").read_text().splitlines():
        entry = json.loads(line)
        stored.setdefault(entry["uuid"], []).extend(Path(f).name for f in entry["files"])
    # each task the run used holds its submodel's images, each stored once: a retried request
    # was never accepted twice
    images = {sm["id"]: sorted(sm["image_names"]) for sm in plan["submodels"]}
    for result in manifest.submodels:
        assert sorted(stored[str(result.task_uuid)]) == images[result.submodel_id]
    # a submodel whose upload failed for good (six 500s in a row) moved to a new task; only then
    # were images uploaded again, to that new task
    if all(r.attempts == 1 for r in manifest.submodels):
        assert files == sum(len(names) for names in images.values())
    assert all(len(names) == len(set(names)) for names in stored.values())


def test_engine_dying_mid_upload_gives_a_clear_error_not_a_hang(
    prefect_api, brighton_images, tmp_path, odm_home
):
    start = time.monotonic()
    with engines(tmp_path, [{"faults": {"die_after_uploads": 3}}]) as (node,):
        with pytest.raises(IncompleteRunError) as info:
            run_flow(brighton_images, tmp_path / "out", [node.url])
    assert "submodel-" in str(info.value)
    assert time.monotonic() - start < 300
    assert not list((tmp_path / "out").glob("*/merged"))


def test_out_of_memory_is_retried_with_a_larger_reservation(
    prefect_api, brighton_images, tmp_path, odm_home
):
    with engines(tmp_path, [{"faults": {"oom_first_n_tasks": 1}, "parallel": 1}]) as (node,):
        manifest = run_flow(brighton_images, tmp_path / "out", [node.url])
    assert all(r.status == "completed" for r in manifest.submodels)
    assert sorted(r.attempts for r in manifest.submodels)[-1] == 2


def test_permanent_failure_fails_the_run_or_leaves_a_listed_gap(
    prefect_api, brighton_images, tmp_path, odm_home
):
    faults = {
        "fail_task_name": "^submodel-001-",
        "fail_message": "Reconstruction failed: 2 images registered",
    }
    with engines(tmp_path, [{"faults": faults}]) as (node,):
        with pytest.raises(IncompleteRunError) as info:
            run_flow(brighton_images, tmp_path / "out", [node.url])
        assert "submodel-001" in str(info.value) and "2 images registered" in str(info.value)
        assert list(info.value.failed) == ["submodel-001"]
        partial = run_flow(brighton_images, tmp_path / "out", [node.url], allow_partial=True)
    assert list(partial.failed_submodels) == ["submodel-001"]
    assert "2 images registered" in partial.failed_submodels["submodel-001"]
    states = {r.submodel_id: r.status for r in partial.submodels}
    assert states.pop("submodel-001") == "failed" and set(states.values()) == {"reused"}
    report = Path(partial.products["orthophoto"]).parents[1] / "report" / "report.md"
    assert "submodel-001" in report.read_text()


def test_token_goes_only_to_its_node_and_is_never_written(
    prefect_api, brighton_images, tmp_path, odm_home, monkeypatch, caplog
):
    secret = "s3cr3t-t0ken-value"
    with engines(tmp_path, [{"token": secret}, {}]) as (locked, open_node):
        monkeypatch.setenv("PREFECT_ODM_NODE_TOKENS", json.dumps({locked.url: secret}))
        manifest = run_flow(brighton_images, tmp_path / "out", [locked.url, open_node.url])
        assert {r.status for r in manifest.submodels} == {"completed"}
        assert all("token" in r["query"] for r in requests_of(locked))
        assert not any("token" in r["query"] for r in requests_of(open_node))
    for path in (tmp_path / "out").rglob("*"):
        if path.is_file():
            assert secret.encode() not in path.read_bytes(), path
    assert secret not in caplog.text
    # Every log line the runs sent to the Prefect API, and their parameters.
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        logs = client.read_logs(limit=200)
        runs = client.read_flow_runs(limit=200)
    assert logs and all(secret not in log.message for log in logs)
    assert runs and all(secret not in json.dumps(run.parameters, default=str) for run in runs)


def test_killed_holder_memory_slots_come_back(prefect_api, tmp_path, odm_home):
    from prefect_odm.tasks.admission import ensure_memory_limit, reclaim_dead_holders, slots_status

    name = "prefect-odm-test-slots"
    ensure_memory_limit(name, 10)
    code = (
        "import time\n"
        "from prefect_odm.tasks.admission import memory_slots\n"
        f"with memory_slots({name!r}, 5.5, what='victim'):\n"
        "    print('held', flush=True)\n"
        "    time.sleep(600)\n"
    )
    env = dict(os.environ, PREFECT_API_URL=prefect_api)
    proc = subprocess.Popen(
        [sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    assert slots_status(name)["active_slots"] == 6
    proc.kill()
    proc.wait()
    assert reclaim_dead_holders(name) == 6
    status = slots_status(name)
    assert status["active_slots"] == 0 and status["holders"] == []


def test_a_hard_exit_during_the_release_leaves_the_slots_named_and_reclaimed(
    prefect_api, tmp_path, odm_home
):
    """The graceful stop's hard exit (``os._exit``, what the 20 s timer of ``cli/process.py``
    does) lands while the slots are being released: the ledger entry must still name them, and
    the next holder on this machine releases them (before, the entry was removed first and the
    slots stayed held with no holder for good)."""
    from prefect_odm.tasks.admission import ensure_memory_limit, memory_slots, slots_status

    name = "prefect-odm-test-slots-exit"
    ensure_memory_limit(name, 10)
    code = (
        "import os\n"
        "import prefect_odm.tasks.admission as admission\n"
        "admission._release = lambda lease: os._exit(130)  # the exit lands in the release\n"
        f"with admission.memory_slots({name!r}, 3.5, what='interrupted'):\n"
        "    raise KeyboardInterrupt\n"
    )
    env = dict(os.environ, PREFECT_API_URL=prefect_api)
    proc = subprocess.run([sys.executable, "-c", code], env=env, timeout=120)
    assert proc.returncode == 130
    status = slots_status(name)
    assert status["active_slots"] == 4, status
    assert [(h["slots"], h["what"], h["alive"]) for h in status["holders"]] == [
        (4, "interrupted", False)
    ]
    with memory_slots(name, 10.0, what="next run"):  # every slot free again for the next run
        assert slots_status(name)["active_slots"] == 10
    status = slots_status(name)
    assert status["active_slots"] == 0 and status["holders"] == []


def test_changing_only_orthophoto_resolution_restarts_tasks_from_that_stage(
    prefect_api, brighton_images, tmp_path, odm_home
):
    with engines(tmp_path, [{}]) as (node,):
        first = run_flow(brighton_images, tmp_path / "out", [node.url])
        finer = run_flow(
            brighton_images,
            tmp_path / "out",
            [node.url],
            options=ProcessingOptions(pipeline="direct", orthophoto_resolution_cm=10),
        )
        client = NodeClient(node.url)
        tasks = client.task_list()
        outputs = {u: "\n".join(client.output(u, 0)) for u in tasks}
        with rasterio.open(finer.products["orthophoto"]) as ds:
            finer_res = ds.res[0]  # before the next run merges into the same path
        # the first options again, forced: the first run's task UUIDs now hold the 10 cm
        # products, so they are not downloaded as this fingerprint's (they were: 10 cm products
        # stored as the 5 cm ones); new tasks are made
        again = run_flow(brighton_images, tmp_path / "out", [node.url], force=True)
    assert len(tasks) == len(first.submodels)  # no new task: the existing ones were restarted
    assert {r.rerun_from for r in finer.submodels} == {"odm_orthophoto"}
    assert {r.task_uuid for r in finer.submodels} == {r.task_uuid for r in first.submodels}
    assert all("odm_orthophoto" in text for text in outputs.values())
    assert finer_res == pytest.approx(0.10, rel=0.01)
    assert not {r.task_uuid for r in again.submodels} & {r.task_uuid for r in first.submodels}
    for result in again.submodels:
        with rasterio.open(result.products["orthophoto"]) as ds:
            assert ds.res[0] == pytest.approx(0.05, rel=0.01), result.submodel_id


def test_interrupting_the_run_cancels_remote_tasks_and_frees_slots(
    prefect_api, brighton_images, tmp_path, odm_home
):
    from prefect_odm.tasks.admission import DEFAULT_LIMIT_NAME, ledger

    from prefect_odm.nodes.client import CANCELED

    with engines(tmp_path, [{"faults": {"slow_seconds": 30}}]) as (node,):
        proc = start_cli_run(brighton_images, tmp_path / "out", [node.url], prefect_api)
        client = NodeClient(node.url)
        wait_running([client], proc)
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=120)
        assert proc.returncode != 0
        states = {u: client.task_state(u).status for u in client.task_list()}
    assert CANCELED in states.values(), states
    assert RUNNING not in states.values()
    assert ledger(DEFAULT_LIMIT_NAME) == []


def test_pool_block_supplies_nodes_tokens_and_memory(
    prefect_api, brighton_images, tmp_path, odm_home
):
    from prefect_odm.blocks import NodeODM, NodeODMPool
    from prefect_odm.flows import reconstruct
    from pydantic import SecretStr

    with engines(tmp_path, [{"token": "block-token"}, {}]) as (locked, open_node):
        NodeODMPool(
            nodes=[
                NodeODM(
                    url=locked.url,
                    token=SecretStr("block-token"),
                    memory_gib=3,
                    max_parallel_tasks=1,
                ),
                NodeODM(url=open_node.url, memory_gib=3, max_parallel_tasks=1),
            ]
        ).save("test-pool", overwrite=True)
        manifest = reconstruct(
            images=str(brighton_images),
            output=str(tmp_path / "out"),
            node_pool="test-pool",
            split=5,
            split_overlap_m=15,
            options=DIRECT,
        )
        used = {r.node_url for r in manifest.submodels}
        assert all("token" in r["query"] for r in requests_of(locked))
    assert {r.status for r in manifest.submodels} == {"completed"}
    assert used == {NodeClient(locked.url).url, NodeClient(open_node.url).url}


def test_a_node_that_fails_every_task_leaves_the_survey_to_the_healthy_one(
    prefect_api, brighton_images, tmp_path, odm_home
):
    faults = {"fail_first_n_tasks": 1000, "fail_message": "Injected failure: broken node"}
    with engines(tmp_path, [{"faults": faults}, {}]) as (broken, healthy):
        manifest = run_flow(brighton_images, tmp_path / "out", [broken.url, healthy.url])
        tried_on_broken = count(broken, "POST", "/task/new/init")
    bad, good = NodeClient(broken.url).url, NodeClient(healthy.url).url
    assert {r.status for r in manifest.submodels} == {"completed"}
    assert {r.node_url for r in manifest.submodels} == {good}
    records = {r.url: r for r in manifest.node_health}
    assert records[good].tasks_completed == len(manifest.submodels)
    assert records[bad].tasks_failed_fast == tried_on_broken >= 1
    assert records[bad].health in ("suspected", "probing")
    # Each submodel that failed on the broken node was retried once, on the healthy one.
    assert sum(r.attempts for r in manifest.submodels) == len(manifest.submodels) + tried_on_broken
    report = (
        tmp_path / "out" / manifest.survey_fingerprint[:16] / "report" / "report.md"
    ).read_text()
    assert f"| {bad} | {records[bad].health} | 0 |" in report
    assert f"| {good} | healthy | {len(manifest.submodels)} |" in report


def test_an_option_the_node_does_not_list_is_refused_before_any_upload(
    prefect_api, brighton_images, tmp_path, odm_home
):
    from prefect_odm.errors import InputError

    typo = ProcessingOptions(pipeline="direct", extra={"orthophoto-resolutoin": 2.0})
    with engines(tmp_path, [{}]) as (node,):
        with pytest.raises(InputError, match="orthophoto-resolutoin") as info:
            run_flow(brighton_images, tmp_path / "out", [node.url], options=typo)
        assert count(node, "POST", "/task/new") == 0
    assert "did you mean orthophoto-resolution" in str(info.value)
    assert not (tmp_path / "out").exists()  # refused before the plan is written


def test_upload_a_killed_run_began_is_never_sent_again_under_its_uuid(brighton_images, tmp_path):
    """A run killed after two of a submodel's images were sent left its upload mark and the
    node's pending upload under attempt 0's UUID; earlier runs left marks of tasks the node has
    since removed under the next 4 (as many as a run's attempts). The rerun sends nothing under
    those UUIDs and spends none of its attempts on them: it takes attempt 5's UUID, uploads
    each image once, and the node ends with one whole task."""
    import requests

    from prefect_odm.layout import OutputLayout
    from prefect_odm.nodes.backend import task_uuid
    from prefect_odm.nodes.pool import NodePool, PoolNode
    from prefect_odm.nodes.runner import SubmodelRunner
    from prefect_odm.plan.planning import plan_split
    from prefect_odm.survey.scan import scan_images

    survey = scan_images(str(brighton_images))
    plan = plan_split(survey, split=100, options=DIRECT)
    submodel = plan.submodels[0]
    layout = OutputLayout(str(tmp_path / "out"), survey.fingerprint)
    by_name = {img.name: img.url for img in survey.images}
    with engines(tmp_path, [{}]) as (node,):
        client = NodeClient(node.url)
        cut = task_uuid(submodel.fingerprint, 0)
        mark = Path(layout.submodel_upload_mark(submodel.id, submodel.fingerprint, cut))
        mark.parent.mkdir(parents=True)
        for attempt in range(5):  # what the killed and the earlier runs wrote before uploading
            mark.with_name(task_uuid(submodel.fingerprint, attempt)).write_text(client.url)
        client._init_task(cut, {}, name="killed", outputs=())
        for name in submodel.image_names[:2]:
            with open(by_name[name], "rb") as fh:
                requests.post(client._upload_url(cut), files={"images": (name, fh)}, timeout=30)
        uploads_before = uploaded_files(node)
        runner = SubmodelRunner(
            plan,
            survey,
            layout,
            NodePool([PoolNode(client.url, memory_gib=64.0, max_parallel_tasks=1)]),
            {client.url: client},
            poll_interval_seconds=0.3,
        )
        result = runner.run(submodel.id)
        tasks = client.task_list()
        state = client.task_state(tasks[0]) if tasks else None
        uploads = uploaded_files(node) - uploads_before
    assert result.status == "completed", result.error
    assert result.task_uuid == task_uuid(submodel.fingerprint, 5) and result.attempts == 1
    assert tasks == [result.task_uuid] and state is not None
    assert state.images_count == len(submodel.image_names) == uploads
    assert mark.parent.joinpath(result.task_uuid).is_file()


def test_inline_run_keeps_every_task_slot_of_the_pool_busy(
    prefect_api, brighton_images, tmp_path, odm_home
):
    """3 nodes with 2 task slots each and at least 6 submodels: the inline run has all 6 slots
    running at once (the flow's own task runner used to cap it at 4 whatever the pool). Each
    task is held 20 s on its node, so the six overlap however slowly a busy machine starts them
    (with 5 s, CI once saw the first task end before the sixth began: a peak of 5)."""
    with engines(tmp_path, [{"faults": {"slow_seconds": 20}, "parallel": 2}] * 3) as nodes:
        clients = [NodeClient(e.url) for e in nodes]
        peak, stop = [0], threading.Event()

        def watch() -> None:
            while not stop.is_set():
                running = 0
                for c in clients:
                    with contextlib.suppress(Exception):
                        running += sum(
                            1
                            for u in c.task_list()
                            if (s := c.task_state(u)) and s.status == RUNNING
                        )
                peak[0] = max(peak[0], running)
                time.sleep(0.1)

        watcher = threading.Thread(target=watch)
        watcher.start()
        try:
            manifest = run_flow(
                brighton_images,
                tmp_path / "out",
                [e.url for e in nodes],
                split=3,
                split_overlap_m=5,
                # submodels of 3 images barely overlap: the gates are not what this test is about
                merge_options=MergeOptions(accept_alignment=True),
            )
        finally:
            stop.set()
            watcher.join()
        per_node = [len(c.task_list()) for c in clients]
    assert len(manifest.submodels) >= 6
    assert all(r.status == "completed" for r in manifest.submodels)
    assert peak[0] == 6, (peak[0], per_node)


def test_a_node_starts_its_next_submodel_while_the_last_one_downloads(
    prefect_api, brighton_images, tmp_path, odm_home
):
    """One node with one task slot and a download held 8 s: the second task is created on the
    node before the download of the first can have ended (the slot is freed when the task
    completes and the next submodel is already waiting for it). Before, the node idled through
    every download, then through the next submodel's Prefect bookkeeping. Submodels are started
    largest first.

    Only the first pair is bound: a third submodel gets its thread when the first download
    ends (one running and one waiting per slot), so with downloads longer than tasks, as here
    (8 s against about 4 s), the node waits for that download and the third's bookkeeping; CI
    measured 9.4 s there. With tasks longer than downloads, as in real surveys, the next
    submodel is always waiting by the time a task completes."""
    faults = {"slow_download_seconds": 8}
    with engines(tmp_path, [{"faults": faults, "parallel": 1}]) as (node,):
        manifest = run_flow(
            brighton_images,
            tmp_path / "out",
            [node.url],
            split=6,
            split_overlap_m=5,
            merge_options=MergeOptions(accept_alignment=True),
        )
        tasks = json.loads((node.data_dir / "tasks.json").read_text())
    assert len(manifest.submodels) >= 3
    assert all(r.status == "completed" for r in manifest.submodels)
    records = sorted(tasks["tasks"], key=lambda t: t["date_created_ms"])
    assert len(records) == len(manifest.submodels)
    first, second = records[0], records[1]
    # the download of `first` answers 8 s after it was asked, at the earliest
    assert second["date_created_ms"] < first["finished_ms"] + 8000, (first, second)
    # two submodels are in flight at once (the slot and one waiting), so the first task is one
    # of the two largest
    sizes = sorted((t["images_count"] for t in records), reverse=True)
    assert records[0]["images_count"] >= sizes[1], sizes


def test_a_cancelled_run_starts_nothing_on_a_node(brighton_images, tmp_path):
    """A run that is cancelled, or failing, by the time a queued submodel gets its node uploads
    nothing there (queued submodels used to upload their images only to cancel them)."""
    from prefect_odm.errors import RunCancelledError
    from prefect_odm.layout import OutputLayout
    from prefect_odm.nodes.pool import NodePool, PoolNode
    from prefect_odm.nodes.runner import SubmodelRunner
    from prefect_odm.plan.planning import plan_split
    from prefect_odm.survey.scan import scan_images

    survey = scan_images(str(brighton_images))
    plan = plan_split(survey, split=100, options=DIRECT)
    layout = OutputLayout(str(tmp_path / "out"), survey.fingerprint)
    with engines(tmp_path, [{}]) as (node,):
        client = NodeClient(node.url)
        runner = SubmodelRunner(
            plan, survey, layout, NodePool([PoolNode(client.url, 64.0, 1)]), {client.url: client}
        )
        runner.cancelled.set()
        with pytest.raises(RunCancelledError, match="before it started on a node"):
            runner.run(plan.submodels[0].id)
        started = [r for r in requests_of(node) if r["path"].startswith("/task/new")]
        tasks = client.task_list()
    assert started == [] and tasks == []


def test_only_a_failed_prefect_api_call_retries_a_submodel():
    """``run_submodel`` is tried again when Prefect's API failed it (429, 5xx, no answer), never
    for the submodel's own failures or a cancelled run."""
    import httpx
    from prefect.states import Failed
    from prefect_odm.tasks.submodels import bookkeeping_failed, run_submodel

    from prefect_odm.errors import InputError, RunCancelledError

    request = httpx.Request("POST", "http://127.0.0.1:4200/api/task_runs/")

    def status(code: int) -> httpx.HTTPStatusError:
        response = httpx.Response(code, request=request)
        return httpx.HTTPStatusError(f"HTTP {code}", request=request, response=response)

    def retried(exc: BaseException) -> bool:
        return bookkeeping_failed(run_submodel, None, Failed(data=exc))  # type: ignore[arg-type]

    assert retried(status(503)) and retried(status(500)) and retried(status(429))
    assert retried(httpx.ConnectError("refused", request=request))
    assert not retried(status(404)) and not retried(status(422))
    assert not retried(RunCancelledError("cancelled")) and not retried(InputError("bad"))
    assert run_submodel.retries == 3 and run_submodel.retry_condition_fn is bookkeeping_failed


def test_a_set_aside_node_is_never_asked_for_a_killed_runs_task(brighton_images, tmp_path):
    """Looking for the task a killed run left asks only the nodes the pool has not set aside:
    a hung node held every look-up (8 task UUIDs) for its whole request time-out, which made a
    run with one hung node take minutes per submodel."""
    import socket

    from prefect_odm.layout import OutputLayout
    from prefect_odm.nodes.pool import NodePool, PoolNode
    from prefect_odm.nodes.runner import SubmodelRunner
    from prefect_odm.plan.planning import plan_split
    from prefect_odm.survey.scan import scan_images

    survey = scan_images(str(brighton_images))
    plan = plan_split(survey, split=100, options=DIRECT)
    layout = OutputLayout(str(tmp_path / "out"), survey.fingerprint)
    with (
        socket.socket(socket.AF_INET, socket.SOCK_STREAM) as hung,
        engines(tmp_path, [{}]) as (node,),
    ):
        hung.bind(("127.0.0.1", 0))
        hung.listen(64)
        hung_url = f"http://127.0.0.1:{hung.getsockname()[1]}"
        client = NodeClient(node.url)
        pool = NodePool([PoolNode(client.url, 64.0, 1), PoolNode(hung_url, 64.0, 1, down=True)])
        clients = {client.url: client, hung_url: NodeClient(hung_url, timeout_seconds=0.5)}
        runner = SubmodelRunner(plan, survey, layout, pool, clients, poll_interval_seconds=0.3)
        result = runner.run(plan.submodels[0].id)
        hung.setblocking(False)
        asked = 0
        while True:  # the connections the hung node's backlog holds: one per request to it
            try:
                hung.accept()[0].close()
                asked += 1
            except BlockingIOError:
                break
    assert result.status == "completed" and result.node_url == client.url
    assert asked == 0, f"{asked} requests went to the set-aside node"
    # where the time went: every phase timed once, together no more than the whole
    phases = result.phase_seconds
    assert set(phases) == {"waiting_for_node", "upload", "processing", "download", "store"}
    assert all(v >= 0 for v in phases.values()) and phases["processing"] > 0
    assert sum(phases.values()) <= result.duration_seconds + 0.01
