"""What the submodel runner keeps in the output storage for a submodel, beside its
``result.json``: the results of earlier fingerprints (for ``rerun-from``), the marks of uploads
begun under a task UUID, and the products and report files of a finished task.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Sequence
from pathlib import Path

from prefect_odm import progress, storage
from prefect_odm.errors import ForeignProductsError, StaleTaskError, StorageError
from prefect_odm.layout import OutputLayout
from prefect_odm.models import CaptureMetadata, Submodel, SubmodelResult
from prefect_odm.nodes.attempt import PhaseClock
from prefect_odm.nodes.backend import NodeBackend
from prefect_odm.nodes.products import find_odm_products
from prefect_odm.product_identity import (
    camera_mismatch,
    foreign_images,
    foreign_products_message,
    shot_names,
)
from prefect_odm.registry import PRODUCTS, REPORT_FILES, REPORT_FOLDER

OUTPUTS = [
    *dict.fromkeys(p.odm_path.split("/", 1)[0] for p in PRODUCTS.values()),
    REPORT_FOLDER,
    REPORT_FILES["cameras"],
]
"""What all.zip is asked to hold (NodeODM ``outputs``): the products' folders, the report and
the camera models (``odm_orthophoto``, ``odm_dem``, ``odm_georeferencing``, ``odm_report``,
``cameras.json``, as ODM's own split-merge asks its nodes, ``opendm/remote.py``)."""

REQUIRED_PRODUCTS = tuple(name for name, p in PRODUCTS.items() if p.required)
"""Products a finished submodel must return (orthophoto, DSM, point cloud)."""


def previous_results(layout: OutputLayout, submodel_id: str) -> list[SubmodelResult]:
    """Completed stored results of earlier fingerprints of this submodel id (any options)."""
    pattern = layout.submodel_results_glob(submodel_id)
    try:
        fs, path = storage.filesystem(pattern)
        found = sorted(fs.glob(path))
    except (StorageError, OSError):
        return []
    out = []
    for item in found:
        try:
            result = SubmodelResult.model_validate(storage.read_json(fs.unstrip_protocol(item)))
        except (StorageError, ValueError, OSError):
            continue
        if result.status == "completed" and result.task_uuid and result.node_url:
            out.append(result)
    return out


def upload_marked(layout: OutputLayout, submodel: Submodel, uuid: str) -> bool:
    """Whether a run began an upload under ``uuid`` (:func:`mark_upload`)."""
    return storage.exists(layout.submodel_upload_mark(submodel.id, submodel.fingerprint, uuid))


def mark_upload(layout: OutputLayout, client: NodeBackend, submodel: Submodel, uuid: str) -> None:
    """Record that an upload under ``uuid`` begins; refuse a UUID a run began before.

    No node has ``uuid`` as a task here, and the runner passes over marked UUIDs that no node
    has, so a mark found here was written since (a second process on the same submodel): the
    node may keep that upload's files (NodeODM 2.2.4 and the engine do), and uploading again
    under the UUID would add every image a second time.

    Raises:
        StaleTaskError: a run began an upload under ``uuid``.
        StorageError: the mark cannot be written (the output location).
    """
    mark = layout.submodel_upload_mark(submodel.id, submodel.fingerprint, uuid)
    if storage.exists(mark):
        raise StaleTaskError(
            "an earlier run began an upload under this UUID and never committed it",
            node_url=client.url,
            task_uuid=uuid,
        )
    storage.write_bytes_atomic(mark, f"{client.url}\n".encode())


def fetch_products(
    layout: OutputLayout,
    client: NodeBackend,
    submodel: Submodel,
    uuid: str,
    clock: PhaseClock,
    images: Sequence[CaptureMetadata] = (),
) -> dict[str, str]:
    """Download, verify and store a completed task's products and report files.

    ``images`` are the records of the images the task was sent (their cameras' make, model and
    size); with none, the task's ``cameras.json`` is not checked.

    Returns:
        Product name -> stored URL.

    Raises:
        DownloadError: the download failed.
        ForeignProductsError: the task's cameras include images it was not sent, or its
            ``cameras.json`` describes none of their cameras (nothing of it is stored).
        OutputValidationError: a required product is missing or unreadable.
    """
    sid = submodel.id
    progress.emit(progress.SubmodelEvent(submodel_id=sid, state="downloading", fraction=0.95))
    with tempfile.TemporaryDirectory(prefix=f"prefect-odm-{sid}-") as tmp:
        with clock.phase("download"):
            extracted = client.download(uuid, Path(tmp))
            refuse_foreign_products(extracted, client, submodel, uuid)
            refuse_foreign_cameras(extracted, client, submodel, uuid, images)
            found = find_odm_products(extracted, require=REQUIRED_PRODUCTS)
        stored: dict[str, str] = {}
        with clock.phase("store"):
            for product, path in sorted(found.items()):
                url = layout.submodel_product(sid, submodel.fingerprint, product)
                storage.put_file(path, url)
                stored[product] = url
            report = extracted / REPORT_FOLDER
            extras = sorted(report.glob("*")) if report.is_dir() else []
            for extra in [*extras, extracted / REPORT_FILES["cameras"]]:
                if extra.is_file():
                    storage.put_file(
                        extra, layout.submodel_report_file(sid, submodel.fingerprint, extra.name)
                    )
    return stored


def refuse_foreign_products(
    extracted: Path, client: NodeBackend, submodel: Submodel, uuid: str
) -> None:
    """Refuse a task's downloaded products whose ``odm_report/shots.geojson`` holds cameras of
    images the submodel did not send (:mod:`prefect_odm.product_identity`); a folder without
    the file, or with one that is not GeoJSON, is left to the product checks.

    Raises:
        ForeignProductsError: one line naming the submodel, the node, the task and the first
            foreign image names.
    """
    path = extracted / REPORT_FOLDER / REPORT_FILES["shots"]
    try:
        returned = shot_names(path.read_bytes())
    except (OSError, ValueError):
        return
    foreign = foreign_images(returned, submodel.image_names)
    if foreign:
        raise ForeignProductsError(
            foreign_products_message(submodel.id, client.url, uuid, foreign),
            node_url=client.url,
            task_uuid=uuid,
        )


def refuse_foreign_cameras(
    extracted: Path,
    client: NodeBackend,
    submodel: Submodel,
    uuid: str,
    images: Sequence[CaptureMetadata],
) -> None:
    """Refuse a task's downloaded products whose ``cameras.json`` describes no camera of the
    images it was sent (make, model and image size, :func:`~prefect_odm.product_identity.
    foreign_cameras`): products of the same file names taken by another camera or at another
    size (NodeODM's test mode returns brighton's 18 images reconstructed at 4000 x 2250 for
    every task). A folder without the file, or one that is not a JSON object, is left as it is.

    Raises:
        ForeignProductsError: one line naming the submodel, the node, the task and the ids.
    """
    path = extracted / REPORT_FILES["cameras"]
    if not images:
        return
    try:
        cameras = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return
    if not isinstance(cameras, dict) or not cameras:
        return
    mismatch = camera_mismatch(cameras, images)
    if mismatch:
        raise ForeignProductsError(
            f"{submodel.id} on {client.url} (task {uuid}) returned a cameras.json of "
            f"{mismatch[0]}, no camera of the images it was sent ({mismatch[1]}): the node's "
            "products are of another survey",
            node_url=client.url,
            task_uuid=uuid,
        )
