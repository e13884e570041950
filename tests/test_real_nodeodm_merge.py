"""A whole reconstruction on two real NodeODM 2.2.4 nodes in test mode, one failing every task,
through the merge: the products NodeODM returns (ODM's older ``shots.geojson`` without
``translation``, its canned GeoTIFFs and LAZ) are accepted, their cameras those of the images
every submodel is sent (``peers.canned_products_of``: test mode returns one folder for every
task). As shipped, the canned products are of other images (all 18 of brighton's for a
submodel of 12, a camera of 4000 x 2250 for 1600 x 900 photos): ``reconstruct`` refuses them."""

from __future__ import annotations

import peers
import pytest

from prefect_odm.models import ProcessingOptions

pytestmark = pytest.mark.integration

SPLIT, OVERLAP_M = 9, 20
"""brighton in two submodels of 12 images, 6 of them in both."""


def test_two_real_nodeodm_nodes_one_failing_complete_through_the_merge(
    prefect_api, brighton_images, tmp_path, odm_home
):
    from prefect_odm.flows import reconstruct

    peers.require_node()
    failing = peers.start_nodeodm(tmp_path / "failing", ["--test_fail_tasks"])
    healthy = peers.start_nodeodm(tmp_path / "healthy")
    shared = peers.images_of_every_submodel(brighton_images, SPLIT, OVERLAP_M)
    peers.canned_products_of(healthy.work, shared)
    try:
        manifest = reconstruct(
            images=str(brighton_images),
            output=str(tmp_path / "out"),
            nodes=[failing.url, healthy.url],
            options=ProcessingOptions(),
            split=SPLIT,
            split_overlap_m=OVERLAP_M,
        )
    finally:
        failing.stop()
        healthy.stop()
    assert {r.status for r in manifest.submodels} == {"completed"}
    assert len(manifest.submodels) >= 2
    assert {"orthophoto", "dsm"} <= set(manifest.products)
    # the camera calibration ran (on another node when the failing one took it) and every
    # submodel got its cameras.json, the node's (canned, made brighton's), as ODM's option
    import json
    from pathlib import Path

    survey_dir = Path(manifest.products["orthophoto"]).parents[1]
    plan = json.loads((survey_dir / "plan" / "plan.json").read_text())
    cameras = json.loads(plan["options"]["extra"]["cameras"])
    assert list(cameras) == ["dji fc300s 1600 900 perspective 0.5555"]


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
    peers.canned_products_of(
        healthy.work, peers.images_of_every_submodel(brighton_images, SPLIT, OVERLAP_M)
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(PREFECT_HOME=str(tmp_path / "ph"), PREFECT_ODM_HOME=str(tmp_path / "home"))
    out = tmp_path / "out"
    command = reconstruct_command(brighton_images, out, "--nodes", failing.url, healthy.url)
    command[command.index("--split") + 1] = str(SPLIT)  # split 5: no image in all 4 submodels
    command[command.index("--split-overlap-m") + 1] = str(OVERLAP_M)
    try:
        proc = subprocess.run(
            command,
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
    peers.canned_products_of(
        node.work, peers.images_of_every_submodel(brighton_images, SPLIT, OVERLAP_M)
    )
    try:
        with pytest.raises(MisplacedProductError) as caught:
            reconstruct(
                images=str(moved),
                output=str(tmp_path / "out"),
                nodes=[node.url],
                options=ProcessingOptions(),
                split=SPLIT,
                split_overlap_m=OVERLAP_M,
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


def _reconstruct_on(node_url: str, images, tmp_path, pipeline: str = "direct", split: str = "5"):
    """``prefect-odm reconstruct IMAGES --nodes NODE --pipeline PIPELINE --split SPLIT`` (the
    embedded API), its process."""
    import os
    import subprocess

    from odm_server import reconstruct_command

    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(PREFECT_HOME=str(tmp_path / "ph"), PREFECT_ODM_HOME=str(tmp_path / "home"))
    command = reconstruct_command(images, tmp_path / "out", "--nodes", node_url)
    command[command.index("--pipeline") + 1] = pipeline
    command[command.index("--split") + 1] = split
    return subprocess.run(
        command,
        env=env,
        capture_output=True,
        text=True,
        timeout=540,
    )


def test_canned_products_of_other_images_are_refused_by_reconstruct(brighton_images, tmp_path):
    """NodeODM's test mode returns the cameras of all 18 of brighton's images for a submodel
    sent 9 to 12 of them (its cameras.json made brighton's, so the calibration passes): the
    command refuses the submodel in one line naming it, the node, the task and the first
    foreign images, exits non-zero and merges nothing."""
    peers.require_node()
    node = peers.start_nodeodm(tmp_path / "node")
    peers.canned_products_of(node.work, [p.name for p in brighton_images.glob("*.JPG")])
    try:
        proc = _reconstruct_on(node.url, brighton_images, tmp_path)
    finally:
        node.stop()
    assert proc.returncode != 0, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("  submodel-00") and f" on {node.url} (task " in last, proc.stderr[
        -3000:
    ]
    assert " images it was not sent (DJI_00" in last, last
    assert "the node's products are of another survey" in last, last
    [survey] = (tmp_path / "out").iterdir()
    assert not list(survey.glob("merged/*"))
    assert not list(survey.glob("submodels/*/result.json"))


def test_a_calibration_of_another_camera_is_refused_by_reconstruct(brighton_images, tmp_path):
    """Test mode's canned cameras.json is brighton's camera at 4000 x 2250, not the 1600 x 900
    photos sent: the calibration (structure from motion, 4 submodels) is refused in one line
    naming the node and both camera ids, before any submodel runs."""
    peers.require_node()
    node = peers.start_nodeodm(tmp_path / "node")
    try:
        proc = _reconstruct_on(node.url, brighton_images, tmp_path, pipeline="sfm")
    finally:
        node.stop()
    assert proc.returncode != 0, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert "camera calibration" in last and node.url in last, proc.stderr[-3000:]
    assert f"describes {peers.CANNED_CAMERA}, no camera of the survey (dji fc300s 1600 900)" in last
    [survey] = (tmp_path / "out").iterdir()
    assert not list(survey.glob("merged/*"))
    assert not list(survey.glob("submodels/*/result.json"))


def test_one_submodel_of_another_camera_is_refused_by_reconstruct(brighton_images, tmp_path):
    """One submodel of all 18 images (no calibration runs for one submodel): test mode's canned
    products carry the same 18 file names, but its cameras.json is of brighton's originals at
    4000 x 2250, not the 1600 x 900 photos sent (a new user's trial merged them, exit 0, a
    0.5 m orthophoto of one point). Refused in one line naming the submodel, the node, the task
    and both camera ids; nothing stored, nothing merged."""
    peers.require_node()
    node = peers.start_nodeodm(tmp_path / "node")
    try:
        proc = _reconstruct_on(node.url, brighton_images, tmp_path, split="100")
    finally:
        node.stop()
    assert proc.returncode != 0, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert "submodel-000" in last and f" on {node.url} (task " in last, proc.stderr[-3000:]
    assert (
        f"returned a cameras.json of {peers.CANNED_CAMERA}, no camera of the images it was sent (dji fc300s 1600 900)"
        in last
    ), last
    [survey] = (tmp_path / "out").iterdir()
    assert not list(survey.glob("merged/*"))
    assert not list(survey.glob("submodels/*/result.json"))
