"""A whole reconstruction on two real NodeODM 2.2.4 nodes in test mode, one failing every task,
through the merge: the products NodeODM returns (ODM's older ``shots.geojson`` without
``translation``, its canned GeoTIFFs and LAZ) are accepted."""

from __future__ import annotations

import peers
import pytest

from prefect_odm.models import ProcessingOptions

pytestmark = pytest.mark.integration


def test_two_real_nodeodm_nodes_one_failing_complete_through_the_merge(
    prefect_api, brighton_images, tmp_path, odm_home
):
    from prefect_odm.flows import reconstruct

    peers.require_node()
    failing = peers.start_nodeodm(tmp_path / "failing", ["--test_fail_tasks"])
    healthy = peers.start_nodeodm(tmp_path / "healthy")
    try:
        manifest = reconstruct(
            images=str(brighton_images),
            output=str(tmp_path / "out"),
            nodes=[failing.url, healthy.url],
            options=ProcessingOptions(),
            split=9,
            split_overlap_m=20,
        )
    finally:
        failing.stop()
        healthy.stop()
    assert {r.status for r in manifest.submodels} == {"completed"}
    assert len(manifest.submodels) >= 2
    assert {"orthophoto", "dsm"} <= set(manifest.products)
    # the camera calibration ran (on another node when the failing one took it) and every
    # submodel got its cameras.json, NodeODM's canned one, as ODM's cameras option
    import json
    from pathlib import Path

    survey_dir = Path(manifest.products["orthophoto"]).parents[1]
    plan = json.loads((survey_dir / "plan" / "plan.json").read_text())
    cameras = json.loads(plan["options"]["extra"]["cameras"])
    assert list(cameras) == ["dji fc300s 4000 2250 perspective 0.5555"]


def test_the_same_on_the_embedded_api_from_the_command_line(brighton_images, tmp_path):
    """``prefect-odm reconstruct --nodes`` with no ``PREFECT_API_URL`` (Prefect's temporary
    server in the command's process) on the same two real nodes."""
    import json
    import os
    import subprocess

    from odm_server import reconstruct_command

    peers.require_node()
    failing = peers.start_nodeodm(tmp_path / "failing", ["--test_fail_tasks"])
    healthy = peers.start_nodeodm(tmp_path / "healthy")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(PREFECT_HOME=str(tmp_path / "ph"), PREFECT_ODM_HOME=str(tmp_path / "home"))
    out = tmp_path / "out"
    try:
        proc = subprocess.run(
            reconstruct_command(brighton_images, out, "--nodes", failing.url, healthy.url),
            env=env,
            capture_output=True,
            text=True,
            timeout=540,
        )
    finally:
        failing.stop()
        healthy.stop()
    assert proc.returncode == 0, proc.stderr[-3000:]
    [manifest_path] = out.glob("*/manifest.json")
    manifest = json.loads(manifest_path.read_text())
    assert {s["status"] for s in manifest["submodels"]} == {"completed"}
    assert {"orthophoto", "dsm"} <= set(manifest["products"])


def test_canned_products_of_a_survey_elsewhere_are_refused_before_the_merge(
    prefect_api, brighton_images, tmp_path, odm_home
):
    """NodeODM's test mode returns brighton's products wherever the survey is: brighton's images
    moved 0.5 degrees north (55.6 km) complete on the node, and the merge refuses them in one
    line before reading them, every submodel's products stored for a rerun."""
    import pytest
    from exif_gps_edit import in_capture_order, set_gps
    from prefect_odm.flows import reconstruct

    from prefect_odm.errors import MisplacedProductError

    moved = tmp_path / "moved"
    moved.mkdir()
    for meta in in_capture_order(brighton_images):
        data = (brighton_images / meta.name).read_bytes()
        (moved / meta.name).write_bytes(
            set_gps(data, meta.latitude + 0.5, meta.longitude, meta.altitude_m)
        )
    peers.require_node()
    node = peers.start_nodeodm(tmp_path / "node")
    try:
        with pytest.raises(MisplacedProductError) as caught:
            reconstruct(
                images=str(moved),
                output=str(tmp_path / "out"),
                nodes=[node.url],
                options=ProcessingOptions(),
                split=9,
                split_overlap_m=20,
            )
    finally:
        node.stop()
    message = str(caught.value)
    assert message.startswith("submodel-000: ")
    assert "odm_orthophoto.tif lies 55." in message
    assert "km from its images (EPSG:32615 product, survey EPSG:32615)" in message
    assert "run the same command again" in message
    assert "\n" not in message
    [survey] = (tmp_path / "out").iterdir()
    assert len(list(survey.glob("submodels/*/result.json"))) >= 2
    assert not list(survey.glob("merged/*"))
