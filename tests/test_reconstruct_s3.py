"""The reconstruct flow with images and outputs in object storage (a moto S3 server on loopback)."""

from __future__ import annotations

import pytest
import rasterio

from prefect_odm.models import ProcessingOptions

pytestmark = pytest.mark.integration


def test_reconstruct_reads_and_writes_s3(prefect_api, s3_endpoint, brighton_images, odm_home):
    import s3fs
    from prefect_odm.flows import reconstruct

    fs = s3fs.S3FileSystem()
    fs.mkdir("reconstruct-s3-in")
    fs.mkdir("reconstruct-s3-out")
    for image in sorted(brighton_images.glob("*.JPG")):
        fs.put_file(str(image), f"reconstruct-s3-in/brighton/{image.name}")
    manifest = reconstruct(
        images="s3://reconstruct-s3-in/brighton",
        output="s3://reconstruct-s3-out/run",
        split=10,
        split_overlap_m=20,
        options=ProcessingOptions(pipeline="direct"),
    )
    assert len(manifest.submodels) >= 2
    for url in manifest.products.values():
        assert url.startswith("s3://reconstruct-s3-out/run/") and fs.exists(url)
    assert fs.exists(manifest.products["orthophoto"].rsplit("/merged/", 1)[0] + "/manifest.json")
    with fs.open(manifest.products["orthophoto"], "rb") as fh, rasterio.open(fh) as ds:
        assert ds.crs.to_epsg() == 32615 and ds.count == 4
