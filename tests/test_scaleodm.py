"""ScaleODM as a node backend, against a loopback double of its API (tests/scaleodm_double.py)
that reads and writes the moto S3 server the suite starts and processes on a real built-in
engine."""

from __future__ import annotations

import pytest
import rasterio
from scaleodm_double import ScaleODMDouble, Served

from prefect_odm.errors import NodeError
from prefect_odm.models import ProcessingOptions
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
