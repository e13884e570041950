"""ScaleODM as a node backend, against a loopback double of its API (tests/scaleodm_double.py)
that reads and writes the moto S3 server the suite starts and processes on a real built-in
engine."""

from __future__ import annotations

import pytest
import rasterio
from scaleodm_double import ScaleODMDouble, Served

from prefect_odm.errors import NodeError
from prefect_odm.models import ProcessingOptions
from prefect_odm.nodes.client import NodeClient
from prefect_odm.nodes.scaleodm import ScaleODMClient, ScaleODMSettings

pytestmark = pytest.mark.integration


@pytest.fixture()
def scaleodm(tmp_path, s3_endpoint, monkeypatch):
    """A ScaleODM double (the first task killed for memory) over a built-in engine."""
    import s3fs

    from prefect_odm.engine.launch import start_engine

    fs = s3fs.S3FileSystem(skip_instance_cache=True)
    for bucket in ("survey-in", "survey-out"):
        if not fs.exists(bucket):
            fs.mkdir(bucket)
    monkeypatch.setenv("PREFECT_ODM_SCALEODM_STAGING", "s3://survey-out/scaleodm")
    monkeypatch.setenv("PREFECT_ODM_SCALEODM_S3_ENDPOINT", s3_endpoint)
    monkeypatch.setenv("PREFECT_ODM_SCALEODM_MEMORY_GIB", "16")
    monkeypatch.setenv("PREFECT_ODM_SCALEODM_MAX_PARALLEL_TASKS", "2")
    engine = start_engine(tmp_path / "engine", max_parallel_tasks=2)
    double = ScaleODMDouble(engine.url, oom_first=1)
    served = Served(double)
    try:
        yield double, served.url, fs, s3_endpoint
    finally:
        served.stop()
        engine.kill()


def test_scaleodm_answers_through_the_backend(scaleodm):
    double, url, _fs, _endpoint = scaleodm
    client = ScaleODMClient(f"scaleodm+{url}")
    info = client.info()
    assert info.total_memory_bytes is not None
    assert info.total_memory_bytes * 0.9 / 2**30 == pytest.approx(16.0)  # from configuration
    assert info.max_parallel_tasks == 2
    assert client.task_state("0b1f6c1a-0000-5000-8000-000000000000") is None  # never created
    with pytest.raises(NodeError, match="Unable to read imagery from readS3Path"):
        client.create_task("0b1f6c1a-0000-5000-8000-000000000001", [], {}, name="empty")


def test_scaleodm_settings_refuse_a_local_staging(monkeypatch):
    monkeypatch.setenv("PREFECT_ODM_SCALEODM_STAGING", "/tmp/somewhere")
    with pytest.raises(ValueError, match="PREFECT_ODM_SCALEODM_STAGING=s3://"):
        ScaleODMSettings.from_environment()


def test_survey_runs_through_scaleodm(prefect_api, scaleodm, brighton_images, odm_home):
    """Split, one ScaleODM task per submodel with its own S3 paths (the first killed for memory
    and retried with more), merge."""
    from prefect_odm.flows import reconstruct

    double, url, fs, endpoint = scaleodm
    images = sorted(brighton_images.glob("*.JPG"))
    for image in images:
        fs.put_file(str(image), f"survey-in/brighton/{image.name}")
    manifest = reconstruct(
        images="s3://survey-in/brighton",
        output="s3://survey-out/run",
        split=10,
        split_overlap_m=20,
        nodes=[f"scaleodm+{url}"],
        options=ProcessingOptions(pipeline="direct"),
    )
    submodels = manifest.submodels
    print(f"submodels {len(submodels)}, ScaleODM tasks {len(double.requests)}")
    assert len(submodels) >= 2 and all(r.status == "completed" for r in submodels)
    assert sorted(r.attempts for r in submodels) == [1] * (len(submodels) - 1) + [2]
    assert len(double.requests) == len(submodels) + 1  # one per submodel, one retried
    for asked in double.requests:
        read, write = asked["readS3Path"], asked["writeS3Path"]
        prefix = read.removesuffix("images/")
        assert read.startswith("s3://survey-out/scaleodm/") and write == prefix + "output/"
        assert asked["s3Endpoint"] == endpoint
        copied = fs.find(read.removeprefix("s3://"))
        assert 0 < len(copied) < len(images)  # the submodel's images only, copied in the bucket
    for r in submodels:
        assert r.node_url == f"scaleodm+{url}"
    for product in manifest.products.values():
        assert product.startswith("s3://survey-out/run/") and fs.exists(product)
    with fs.open(manifest.products["orthophoto"], "rb") as fh, rasterio.open(fh) as ds:
        assert ds.crs.to_epsg() == 32615 and ds.count == 4
        alpha = ds.read(4)
        print(f"merged orthophoto {ds.width} x {ds.height} px, coverage {(alpha > 0).mean():.2f}")
        assert (alpha > 0).mean() > 0.3


@pytest.fixture()
def failing_node(request, tmp_path, s3_endpoint, monkeypatch, brighton_images):
    """The node under test with its first task failing as a container that exited 1: a ScaleODM
    double (Argo's ``Error (exit code 1)``) or a built-in engine (the same message injected).
    Yields ``(node URL, survey images, tasks created so far)``."""
    import json

    import s3fs

    from prefect_odm.engine.launch import start_engine
    from prefect_odm.settings import FAULTS_ENV

    if request.param == "engine":
        faults = {"fail_first_n_tasks": 1, "fail_message": "Error (exit code 1)"}
        env = {FAULTS_ENV: json.dumps(faults)}
        with start_engine(tmp_path / "engine", max_parallel_tasks=1, extra_env=env) as engine:
            yield engine.url, str(brighton_images), lambda: len(NodeClient(engine.url).task_list())
        return
    fs = s3fs.S3FileSystem(skip_instance_cache=True)
    for bucket in ("survey-in", "survey-out"):
        if not fs.exists(bucket):
            fs.mkdir(bucket)
    for image in sorted(brighton_images.glob("*.JPG")):
        fs.put_file(str(image), f"survey-in/brighton-fail/{image.name}")
    monkeypatch.setenv("PREFECT_ODM_SCALEODM_STAGING", "s3://survey-out/scaleodm-fail")
    monkeypatch.setenv("PREFECT_ODM_SCALEODM_S3_ENDPOINT", s3_endpoint)
    with start_engine(tmp_path / "engine", max_parallel_tasks=1) as engine:
        double = ScaleODMDouble(engine.url, fail_first=1)
        served = Served(double)
        try:
            yield (
                f"scaleodm+{served.url}",
                "s3://survey-in/brighton-fail",
                lambda: len(double.requests),
            )
        finally:
            served.stop()


@pytest.mark.parametrize("failing_node", ["scaleodm", "engine"], indirect=True)
def test_a_failed_task_takes_the_same_path_on_scaleodm_as_on_a_nodeodm_node(
    failing_node, tmp_path, odm_home
):
    """The runner classifies the failure alike (a processing failure, not retried on the one
    node, recorded against it), and a rerun (the UI's Retry, a dead-letter redrive) processes
    the submodel again: a NodeODM node restarts its task; ScaleODM, which cannot, gets a new one."""
    from prefect_odm.layout import OutputLayout
    from prefect_odm.nodes.cluster import connect_nodes
    from prefect_odm.nodes.runner import SubmodelRunner
    from prefect_odm.plan.planning import plan_split
    from prefect_odm.survey.scan import scan_images

    url, images, tasks_made = failing_node
    survey = scan_images(images)
    options = ProcessingOptions(pipeline="direct", orthophoto_resolution_cm=20)
    plan = plan_split(survey, split=10, split_overlap_m=20, options=options)
    sid = plan.submodels[0].id
    layout = OutputLayout(str(tmp_path / "out"), survey.fingerprint)

    def run():  # a fresh process's view: its own cluster
        cluster = connect_nodes([url])
        runner = SubmodelRunner(plan, survey, layout, cluster.pool, cluster.clients)
        runner.poll_interval_seconds = 0.3
        return runner.run(sid), cluster.pool.health.report()

    failed, health = run()
    assert (failed.status, failed.attempts, failed.node_url) == ("failed", 1, url)
    assert failed.error and "Error (exit code 1)" in failed.error, failed.error
    assert [(h.url, h.tasks_failed, h.health) for h in health] == [(url, 1, "suspected")]
    assert tasks_made() == 1
    again, _ = run()
    assert again.status == "completed", again.error
    if url.startswith("scaleodm+"):
        assert tasks_made() == 2 and again.task_uuid != failed.task_uuid and again.attempts == 2
    else:
        assert tasks_made() == 1 and again.task_uuid == failed.task_uuid  # restarted in place
