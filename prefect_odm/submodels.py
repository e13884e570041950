"""Processing one submodel on a node pool, and the stored results that make reruns free.

A submodel's result lives at ``layout.submodel_result(id, fingerprint)``; it is written only
after its products were downloaded, verified and stored, so its presence means the submodel is
done. The same fingerprint on a later run is *reused* without touching any node.
"""

from __future__ import annotations

import logging
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from prefect_odm import progress, storage
from prefect_odm.errors import (
    NodeError,
    OutOfMemoryError,
    OutputValidationError,
    ProcessingFailedError,
    StorageError,
    TransientNodeError,
)
from prefect_odm.layout import OutputLayout
from prefect_odm.models import SplitPlan, Submodel, SubmodelResult, Survey
from prefect_odm.nodeodm import COMPLETED, NodeClient, TaskState, task_uuid
from prefect_odm.pool import NodePool
from prefect_odm.products import find_odm_products

logger = logging.getLogger(__name__)

OUTPUTS = ["odm_orthophoto", "odm_dem", "odm_georeferencing", "odm_report"]
"""Folders asked for in all.zip (NodeODM ``outputs``): the products and the report only."""


def load_stored_result(layout: OutputLayout, submodel: Submodel) -> SubmodelResult | None:
    """The stored result of this submodel and fingerprint when it is complete, else ``None``."""
    url = layout.submodel_result(submodel.id, submodel.fingerprint)
    try:
        if not storage.exists(url):
            return None
        result = SubmodelResult.model_validate(storage.read_json(url))
    except (StorageError, ValueError, OSError):
        return None
    if result.status not in ("completed", "reused") or result.fingerprint != submodel.fingerprint:
        return None
    if not all(storage.exists(u) for u in result.products.values()):
        return None
    return result


@dataclass
class SubmodelRunner:
    """Runs submodels of one plan on a pool of nodes.

    Args:
        plan: the split plan.
        survey: the scanned survey (image URLs by name).
        layout: where products and results are stored.
        pool: node placement.
        clients: node key (public URL) -> client.
        max_attempts: attempts per submodel (transient errors and out-of-memory retries).
        poll_interval_seconds: task status poll interval.
        upload_deadline_seconds: the upload of one submodel must finish within this time.
        oom_memory_factor: reservation growth after an out-of-memory failure.
    """

    plan: SplitPlan
    survey: Survey
    layout: OutputLayout
    pool: NodePool
    clients: Mapping[str, NodeClient]
    max_attempts: int = 4
    poll_interval_seconds: float = 1.0
    upload_deadline_seconds: float = 1800.0
    oom_memory_factor: float = 1.5
    log: Callable[[str], None] = logger.info

    def run(self, submodel_id: str, *, force: bool = False) -> SubmodelResult:
        """Process one submodel, or reuse its stored result. Never raises for a node failure:
        a failed submodel comes back with ``status="failed"`` and the reason."""
        submodel = self.plan.submodel(submodel_id)
        if not force:
            stored = load_stored_result(self.layout, submodel)
            if stored is not None:
                self.log(f"{submodel_id}: reused stored result {submodel.fingerprint[:12]}")
                progress.emit("submodel", id=submodel_id, state="reused", fraction=1.0)
                return stored.model_copy(update={"status": "reused"})
        start = time.monotonic()
        memory_gib = submodel.estimated_memory_gib
        excluded: list[str] = []
        last: NodeError | None = None
        node_key: str | None = None
        uuid: str | None = None
        for attempt in range(self.max_attempts):
            uuid = task_uuid(submodel.fingerprint, attempt)
            try:
                with self.pool.lease(memory_gib, what=submodel_id, exclude=excluded) as node:
                    node_key = node.key
                    products = self._run_on_node(self.clients[node.key], submodel, uuid)
                result = SubmodelResult(
                    submodel_id=submodel_id,
                    fingerprint=submodel.fingerprint,
                    status="completed",
                    products=products,
                    node_url=node_key,
                    task_uuid=uuid,
                    attempts=attempt + 1,
                    duration_seconds=round(time.monotonic() - start, 3),
                    method=self._method(),
                )
                storage.write_json_atomic(
                    self.layout.submodel_result(submodel_id, submodel.fingerprint), result.model_dump(mode="json")
                )
                progress.emit("submodel", id=submodel_id, state="completed", fraction=1.0)
                return result
            except OutOfMemoryError as exc:
                last = exc
                memory_gib *= self.oom_memory_factor
                self.log(f"{submodel_id}: out of memory on {exc.node_url}; retrying with {memory_gib:.1f} GiB")
            except TransientNodeError as exc:
                last = exc
                if node_key is not None and not self._node_alive(node_key):
                    self.pool.mark_down(node_key)
                    excluded.append(node_key)
                self.log(f"{submodel_id}: transient failure ({exc}); attempt {attempt + 2} of {self.max_attempts}")
                time.sleep(min(10.0, 0.5 * 2**attempt))
            except (ProcessingFailedError, NodeError, OutputValidationError) as exc:
                last = exc if isinstance(exc, NodeError) else NodeError(str(exc), node_url=node_key, task_uuid=uuid)
                break
        assert last is not None
        progress.emit("submodel", id=submodel_id, state="failed", fraction=1.0)
        return SubmodelResult(
            submodel_id=submodel_id,
            fingerprint=submodel.fingerprint,
            status="failed",
            node_url=last.node_url or node_key,
            task_uuid=last.task_uuid or uuid,
            attempts=attempt + 1,
            duration_seconds=round(time.monotonic() - start, 3),
            error=str(last).split("\n")[0],
            last_output=last.last_output,
        )

    def _method(self) -> str:
        return str(self.plan.options.pipeline)

    def _node_alive(self, key: str) -> bool:
        try:
            self.clients[key].info()
            return True
        except NodeError:
            return False

    def _run_on_node(self, client: NodeClient, submodel: Submodel, uuid: str) -> dict[str, str]:
        """Create or re-attach to the task, wait, download, verify and store the products."""
        sid = submodel.id
        state = client.task_state(uuid)
        if state is None:
            by_name = {img.name: img.url for img in self.survey.images}
            files = [by_name[name] for name in submodel.image_names]
            progress.emit("submodel", id=sid, state="uploading", fraction=0.0)
            self.log(f"{sid}: uploading {len(files)} images to {client.url} as task {uuid}")
            client.create_task(
                uuid,
                files,
                self.plan.options.to_nodeodm(),
                name=f"{sid}-{submodel.fingerprint[:12]}",
                outputs=OUTPUTS,
                deadline_seconds=self.upload_deadline_seconds,
                progress=lambda done, total: progress.emit(
                    "submodel", id=sid, state="uploading", fraction=0.1 * done / total
                ),
            )
        elif state.status == COMPLETED:
            self.log(f"{sid}: task {uuid} already completed on {client.url}; downloading")
        elif state.finished:
            raise client.classify_failure(state)
        else:
            self.log(f"{sid}: re-attached to running task {uuid} on {client.url}")

        def on_progress(s: TaskState) -> None:
            progress.emit("submodel", id=sid, state="processing", fraction=0.1 + 0.85 * s.progress / 100.0)

        client.wait(uuid, poll_interval_seconds=self.poll_interval_seconds, on_progress=on_progress)
        progress.emit("submodel", id=sid, state="downloading", fraction=0.95)
        with tempfile.TemporaryDirectory(prefix=f"prefect-odm-{sid}-") as tmp:
            extracted = client.download(uuid, Path(tmp))
            found = find_odm_products(extracted, require=("orthophoto", "dsm", "point_cloud"))
            stored: dict[str, str] = {}
            for product, path in sorted(found.items()):
                url = self.layout.submodel_product(sid, submodel.fingerprint, product)
                storage.put_file(path, url)
                stored[product] = url
            report = extracted / "odm_report"
            for extra in sorted(report.glob("*")) if report.is_dir() else []:
                if extra.is_file():
                    storage.put_file(extra, f"{self.layout.submodel_dir(sid, submodel.fingerprint)}/report/{extra.name}")
        return stored
