"""The survey's camera calibration: one structure-from-motion task whose ``cameras.json`` every
submodel then gets as ODM's ``cameras`` option (which images: :mod:`prefect_odm.plan.calibration`).

The task runs on a node of the pool like a submodel (the plan's options plus ``end-with
opensfm``, the images and the plan's ``geo.txt`` when it corrected the altitudes, all.zip limited
to ``cameras.json``), under a UUID drawn from the calibration's fingerprint, so a run killed
while it calibrates re-attaches to the same task. The file is stored at
``layout.calibration_file(fingerprint, "cameras.json")`` and reused by any later run with the
same fingerprint. On NodeODM the option is the JSON text itself: ODM's ``--cameras`` takes a
path or the text (``opendm/config.py`` ``path_or_json_string``), NodeODM has no file upload for
it, and ODM's own split-merge hands the text to its submodels (``get_submodel_argv`` reads the
file's contents).
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from prefect_odm import storage
from prefect_odm.errors import NodeError, ProcessingFailedError, TransientNodeError
from prefect_odm.layout import OutputLayout
from prefect_odm.models import ImageRecord, SplitPlan, Survey
from prefect_odm.nodes.backend import COMPLETED, NodeBackend, task_uuid
from prefect_odm.nodes.option_stages import early_options
from prefect_odm.nodes.pool import NodePool
from prefect_odm.nodes.submodel_inputs import plan_altitudes, upload_files
from prefect_odm.plan.calibration import (
    CALIBRATION_END_WITH,
    calibration_fingerprint,
    calibration_images,
)
from prefect_odm.plan.memory import estimate_peak_memory_gib
from prefect_odm.plan.planning import memory_model_for
from prefect_odm.product_identity import camera_mismatch

CAMERAS_JSON = "cameras.json"


def run_calibration(
    plan: SplitPlan,
    survey: Survey,
    layout: OutputLayout,
    pool: NodePool,
    clients: Mapping[str, NodeBackend],
    log: Callable[[str], None],
) -> str:
    """The ``cameras.json`` text calibrated once for the plan's submodels (stored, or made).

    A task that fails is tried on another node (a fresh UUID), as many times as the pool has
    nodes.

    Raises:
        ProcessingFailedError: the calibration task failed on every node tried, or gave no
            camera (the message starts with "camera calibration" and names the node).
        TransientNodeError: the last node tried stopped answering.
    """
    names = calibration_images(plan, survey)
    altitudes = plan_altitudes(plan, names)
    fp = calibration_identity(plan, survey, names, altitudes)
    stored = layout.calibration_file(fp, CAMERAS_JSON)
    if storage.exists(stored):
        log(f"camera calibration: reused {fp[:12]} ({len(names)} images)")
        return storage.read_bytes(stored).decode("utf-8")
    options = {**plan.options.to_nodeodm(), "end-with": CALIBRATION_END_WITH}
    megapixels = max(im.width * im.height / 1e6 for im in survey.images)
    memory = estimate_peak_memory_gib(
        len(names), megapixels, options, model=memory_model_for(plan.engine_identity)
    )
    failed: list[str] = []
    for attempt in range(max(1, len(pool.nodes))):
        try:
            text = _calibrate_on(plan, survey, layout, pool, clients, (fp, names, attempt),
                                 options, memory, failed, log)  # fmt: skip
        except (ProcessingFailedError, TransientNodeError) as exc:
            if attempt + 1 >= max(1, len(pool.nodes)):
                raise
            log(f"{str(exc).splitlines()[0]}; trying another node")
            continue
        storage.write_bytes_atomic(stored, text.encode("utf-8"))
        return text
    raise AssertionError("unreachable")  # the loop returns or raises


def _calibrate_on(
    plan: SplitPlan,
    survey: Survey,
    layout: OutputLayout,
    pool: NodePool,
    clients: Mapping[str, NodeBackend],
    what: tuple[str, list[str], int],
    options: dict[str, Any],
    memory_gib: float,
    failed: list[str],
    log: Callable[[str], None],
) -> str:
    """One attempt (``what`` = fingerprint, images, attempt number) on a node not in
    ``failed``; a node whose task fails is added to ``failed``."""
    fp, names, attempt = what
    uuid = task_uuid(fp, attempt)
    with pool.lease(memory_gib, what="camera calibration", exclude=failed) as node:
        client = clients[node.key]
        try:
            state = client.task_state(uuid)
            if state is None:
                log(f"camera calibration: {len(names)} images on {client.url} as task {uuid}")
                geo = layout.calibration_file(fp, "geo.txt")
                files = upload_files(plan, survey, names, geo)
                client.create_task(
                    uuid, files, options, name=f"calibration-{fp[:12]}", outputs=[CAMERAS_JSON]
                )
            elif state.finished and state.status != COMPLETED and not client.restart(uuid):
                raise client.classify_failure(state)
            client.wait(uuid)
            by_name = {image.name: image for image in survey.images}
            return _downloaded_cameras(client, uuid, [by_name[n] for n in names])
        except NodeError as exc:
            failed.append(node.key)
            if isinstance(exc, TransientNodeError):
                raise
            raise ProcessingFailedError(
                f"camera calibration ({len(names)} images, task {uuid} on {client.url}) "
                f"failed: {str(exc).splitlines()[0]}"
            ) from exc


def _downloaded_cameras(client: NodeBackend, uuid: str, images: Sequence[ImageRecord]) -> str:
    """The ``cameras.json`` of the finished task ``uuid``, checked to hold a camera object of
    one of ``images``' cameras (:func:`~prefect_odm.product_identity.foreign_cameras`).

    Raises:
        ProcessingFailedError: no file, not JSON, no camera, or cameras none of which is one of
            the survey's (naming the node's ids and the survey's); the message is the reason
            alone, :func:`_calibrate_on` puts the task and the node before it.
    """
    with tempfile.TemporaryDirectory(prefix="calibration-") as folder:
        path = client.download(uuid, Path(folder)) / CAMERAS_JSON
        if not path.is_file():
            raise ProcessingFailedError(f"the task returned no {CAMERAS_JSON}")
        text = path.read_text(encoding="utf-8")
    try:
        cameras = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ProcessingFailedError(f"its {CAMERAS_JSON} is not JSON") from exc
    if not isinstance(cameras, dict) or not cameras:
        raise ProcessingFailedError(f"its {CAMERAS_JSON} has no camera")
    mismatch = camera_mismatch(cameras, images)
    if mismatch:
        raise ProcessingFailedError(
            f"its {CAMERAS_JSON} describes {mismatch[0]}, no camera of the survey "
            f"({mismatch[1]}): the node's products are of another survey"
        )
    return json.dumps(cameras, sort_keys=True, separators=(",", ":"))


def calibration_identity(
    plan: SplitPlan, survey: Survey, names: list[str], altitudes_m: dict[str, float]
) -> str:
    """The fingerprint a survey's calibration is stored under: its images, the engine and the
    options of the stages before georeferencing only (the calibration ends with structure from
    motion: a rerun that changes only ``orthophoto-resolution`` or a DEM option reuses it)."""
    options = early_options(plan.options.to_nodeodm())
    return calibration_fingerprint(plan, survey, names, altitudes_m, options)
