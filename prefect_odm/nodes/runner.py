"""Processing one submodel on a node pool, and the stored results that make reruns free.

A submodel's result lives at ``layout.submodel_result(id, fingerprint)``; it is written only
after its products were downloaded, verified and stored, so its presence means the submodel is
done. The same fingerprint on a later run is *reused* without touching any node.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field

from prefect_odm import progress, storage
from prefect_odm.errors import (
    DownloadError,
    NodeError,
    OutOfMemoryError,
    OutputValidationError,
    ProcessingFailedError,
    RunCancelledError,
    StaleTaskError,
    TransientNodeError,
)
from prefect_odm.fingerprints import submodel_fingerprint
from prefect_odm.layout import OutputLayout
from prefect_odm.models import ImageRecord, SplitPlan, Submodel, SubmodelResult, Survey
from prefect_odm.nodes.attempt import Options, PhaseClock, SubmodelAttempt, first_line
from prefect_odm.nodes.backend import (
    COMPLETED,
    STATUS_WORDS,
    NodeBackend,
    TaskState,
    differing_option,
)
from prefect_odm.nodes.option_stages import early_options, node_stages, rerun_from_stage
from prefect_odm.nodes.pool import NodePool
from prefect_odm.nodes.stored import (
    OUTPUTS,
    fetch_products,
    mark_upload,
    previous_results,
)
from prefect_odm.nodes.submodel_inputs import altitudes_by_identity, upload_files
from prefect_odm.nodes.task_lookup import TaskLookup
from prefect_odm.run_policy import load_stored_result

logger = logging.getLogger(__name__)


@dataclass
class SubmodelRunner:
    """Runs submodels of one plan on a pool of nodes.

    Args:
        plan: the split plan.
        survey: the scanned survey (image URLs by name).
        layout: where products and results are stored.
        pool: node placement.
        clients: node key (public URL) -> node (any :class:`~prefect_odm.nodes.backend.NodeBackend`).
        admit: context manager factory ``(submodel_id, memory_gib)`` held while a submodel runs
            (the Prefect global concurrency limit of memory slots); none by default.
        max_attempts: attempts per submodel (transient errors and out-of-memory retries).
        poll_interval_seconds: task status poll interval.
        upload_deadline_seconds: the upload of one submodel must finish within this time.
        oom_memory_factor: reservation growth after an out-of-memory failure.
        cancelled: when set, the remote task is cancelled and the run raises
            :class:`RunCancelledError` (slots and the node are released on the way out).
    """

    plan: SplitPlan
    survey: Survey
    layout: OutputLayout
    pool: NodePool
    clients: Mapping[str, NodeBackend]
    admit: Callable[[str, float], AbstractContextManager[object]] = lambda sid, gib: nullcontext()
    max_attempts: int = 4
    poll_interval_seconds: float = 1.0
    upload_deadline_seconds: float = 1800.0
    oom_memory_factor: float = 1.5
    log: Callable[[str], None] = logger.info
    cancelled: threading.Event = field(default_factory=threading.Event)

    def run(self, submodel_id: str, *, force: bool = False) -> SubmodelResult:
        """Process one submodel, or reuse its stored result.

        Order: a stored result of the same fingerprint is reused; else a finished task of an
        earlier run with the same early fingerprint is restarted from the first changed stage
        (``rerun-from``); else the submodel is processed from scratch, with retries.

        Returns:
            The result. Never raises for a node failure: a failed submodel comes back with
            ``status="failed"`` and the reason.

        Raises:
            RunCancelledError: :attr:`cancelled` was set (the remote task was cancelled).
        """
        submodel = self.plan.submodel(submodel_id)
        if not force:
            stored = load_stored_result(self.layout, submodel)
            if stored is not None:
                self.log(f"{submodel_id}: reused stored result {submodel.fingerprint[:12]}")
                progress.emit(
                    progress.SubmodelEvent(submodel_id=submodel_id, state="reused", fraction=1.0)
                )
                return stored.model_copy(update={"status": "reused"})
        start = time.monotonic()
        options: Options = self.plan.options.to_nodeodm()
        record = SubmodelAttempt(
            submodel, options, self._early_fingerprint(submodel, options), self._method(), start
        )
        if not force:
            for previous in previous_results(self.layout, submodel_id):
                if previous.early_fingerprint == record.early_fingerprint:
                    result = self._try_rerun_from(previous, record.with_new_clock())
                    if result is not None:
                        return result
        return self._process(record.with_new_clock())

    @property
    def _tasks(self) -> TaskLookup:
        """The task UUIDs of this runner's submodels and the nodes holding them."""
        return TaskLookup(self.layout, self.clients, self.pool, self.max_attempts, self.log)

    def _process(self, record: SubmodelAttempt) -> SubmodelResult:
        """Submit (or re-attach to) the submodel's task and collect it, retrying transient
        failures (on another node when one is down), out-of-memory failures (with a larger
        reservation) and, once, a processing failure on a node now suspected (on another,
        healthy node: :meth:`~prefect_odm.nodes.health.HealthBook.retry_elsewhere`), up to
        :attr:`max_attempts` times. Every outcome is recorded in the pool's health book."""
        submodel, clock = record.submodel, record.clock
        submodel_id = submodel.id
        memory_gib = submodel.estimated_memory_gib
        excluded: list[str] = []
        last: NodeError | None = None
        node_key: str | None = None
        uuid: str | None = None
        attempt = retries_elsewhere = 0
        # continue the attempt a killed run left; a failed download retries the same task
        uuid_attempt, holders = self._tasks.left_attempt(submodel)
        uuid_attempt -= 1
        for attempt in range(self.max_attempts):
            uuid_attempt += 0 if isinstance(last, DownloadError) else 1
            uuid_attempt, uuid, holder = self._tasks.usable_task_uuid(
                submodel, uuid_attempt, excluded, holders if attempt == 0 else None
            )
            pinned = [k for k in self.clients if k != holder] if holder else []
            leased_at, on_node = time.monotonic(), None  # the node of this attempt
            asked_at = leased_at
            try:
                with (
                    self.admit(submodel_id, memory_gib),
                    self.pool.lease(  # the most images first, as the run submits them
                        memory_gib,
                        what=submodel_id,
                        exclude=sorted(set(excluded) | set(pinned)),
                        priority=-len(submodel.image_names),
                    ) as node,
                ):
                    node_key = on_node = node.key
                    leased_at = time.monotonic()
                    clock.add("waiting_for_node", leased_at - asked_at)
                    self._run_on(self.clients[node.key], submodel, uuid, clock)
                # The task is done: its slot and memory go to the next submodel while this one
                # downloads (a node idled for every download, issue 14).
                products = fetch_products(
                    self.layout,
                    self.clients[node.key],
                    submodel,
                    uuid,
                    clock,
                    self._sent_images(submodel),
                )
                self.pool.record(lambda book: book.task_completed(node.key))
                return self._store(record.completed(products, node_key, uuid, attempt + 1))
            except StaleTaskError as exc:
                last = exc  # a half-made task of a killed run holds this UUID: take the next
                self.log(f"{submodel_id}: {first_line(exc)}; moving to the next task UUID")
            except OutOfMemoryError as exc:
                last = exc
                memory_gib *= self.oom_memory_factor
                self.log(
                    f"{submodel_id}: out of memory on {exc.node_url}; retrying with {memory_gib:.1f} GiB"
                )
            except TransientNodeError as exc:
                last = exc
                self._transient(submodel_id, exc, on_node, excluded, attempt)
            except (ProcessingFailedError, NodeError, OutputValidationError) as exc:
                last = (
                    exc
                    if isinstance(exc, NodeError)
                    else NodeError(str(exc), node_url=node_key, task_uuid=uuid)
                )
                if on_node is None or not self._retry_elsewhere(
                    submodel_id, exc, on_node, leased_at, retries_elsewhere
                ):
                    break
                excluded.append(on_node)
                retries_elsewhere += 1
        assert last is not None
        progress.emit(progress.SubmodelEvent(submodel_id=submodel.id, state="failed", fraction=1.0))
        return record.failed(last, node_key, uuid, attempt + 1)

    def _run_on(
        self, client: NodeBackend, submodel: Submodel, uuid: str, clock: PhaseClock
    ) -> None:
        """Create (or attach to) the task and wait for it; a cancelled run cancels it remotely.

        A run cancelled (or failing) by the time the submodel gets its node starts nothing on
        it: queued submodels used to upload their images only to cancel them (issue 14).
        """
        if self.cancelled.is_set():
            raise RunCancelledError(f"{submodel.id}: run cancelled before it started on a node")
        try:
            with clock.phase("upload"):
                self._create_or_attach(client, submodel, uuid)
            self._wait(client, submodel, uuid, clock)
        except (RunCancelledError, KeyboardInterrupt, SystemExit):
            self._cancel_remote(client, uuid)
            raise

    def _transient(
        self,
        submodel_id: str,
        exc: TransientNodeError,
        node_key: str | None,
        excluded: list[str],
        attempt: int,
    ) -> None:
        """Record a failed request, take a dead node out of the pool, back off."""
        if node_key is not None:
            self.pool.record(lambda book: book.request_failed(node_key, first_line(exc)))
            if not self._node_alive(node_key):
                self.pool.mark_down(node_key)
                excluded.append(node_key)
        self.log(
            f"{submodel_id}: transient failure ({exc}); attempt {attempt + 2} of {self.max_attempts}"
        )
        time.sleep(min(10.0, 0.5 * 2**attempt))

    def _retry_elsewhere(
        self, sid: str, exc: Exception, node_key: str, leased_at: float, retries: int
    ) -> bool:
        """Record a processing failure; whether the submodel is tried once more elsewhere (the
        node is now suspected and another node is healthy)."""
        if not isinstance(exc, ProcessingFailedError):
            return False
        elapsed = time.monotonic() - leased_at
        state = self.pool.record(lambda book: book.task_failed(node_key, elapsed, first_line(exc)))
        retry = self.pool.record(lambda book: book.retry_elsewhere(node_key, retries))
        if retry:
            self.log(
                f"{sid}: failed on {node_key} after {elapsed:.1f} s and the node is {state}; "
                "retrying once on another node"
            )
        return retry

    def _early_fingerprint(self, submodel: Submodel, options: Options) -> str:
        identity = {img.name: img.identity for img in self.survey.images}
        return submodel_fingerprint(
            [identity[n] for n in submodel.image_names],
            early_options(options),
            self.plan.engine_identity,
            altitudes_by_identity(self.plan, self.survey, submodel.image_names),
        )

    def _try_rerun_from(
        self, previous: SubmodelResult, record: SubmodelAttempt
    ) -> SubmodelResult | None:
        """Restart the finished task of an earlier fingerprint from the first changed stage.

        The task is looked for on every node of the pool, not only under the URL recorded: the
        built-in engine comes back on another port each run, with the same tasks.

        Returns ``None`` (process from scratch) when no node has that task finished.
        """
        assert previous.task_uuid is not None
        holder = self._tasks.locate(previous.task_uuid, ())
        if holder is None:
            return None
        client = self.clients[holder]
        submodel, options, clock = record.submodel, record.options, record.clock
        sid = submodel.id
        try:
            state = client.task_state(previous.task_uuid)
            if state is None or state.status != COMPLETED:
                return None
            if differing_option(state.options, previous.options) is not None:
                return None  # restarted with other options since: not the earlier result now
            stages = node_stages(client)
            stage = rerun_from_stage(previous.options, options, stages)
            if stage is None or stage == stages[0]:
                return None
            asked_at = time.monotonic()
            with (
                self.admit(sid, submodel.estimated_memory_gib),
                self.pool.lease(
                    submodel.estimated_memory_gib,
                    what=sid,
                    exclude=[k for k in self.clients if k != holder],
                    priority=-len(submodel.image_names),
                ),
            ):
                clock.add("waiting_for_node", time.monotonic() - asked_at)
                self.log(
                    f"{sid}: restarting task {previous.task_uuid} on {client.url} from {stage}"
                )
                progress.emit(
                    progress.SubmodelEvent(
                        submodel_id=sid, state=f"rerun from {stage}", fraction=0.1
                    )
                )
                if not client.restart(previous.task_uuid, {**options, "rerun-from": stage}):
                    return None
                self._wait(client, submodel, previous.task_uuid, clock)
            products = fetch_products(
                self.layout,
                client,
                submodel,
                previous.task_uuid,
                clock,
                self._sent_images(submodel),
            )
        except NodeError as exc:
            self.log(
                f"{sid}: rerun-from on {client.url} failed ({str(exc).splitlines()[0]}); processing from scratch"
            )
            return None
        return self._store(record.completed(products, holder, previous.task_uuid, 1, stage))

    def _sent_images(self, submodel: Submodel) -> list[ImageRecord]:
        """The survey's records of the images ``submodel`` sends its node."""
        names = set(submodel.image_names)
        return [image for image in self.survey.images if image.name in names]

    def _store(self, result: SubmodelResult) -> SubmodelResult:
        """Write the completed ``result``; its ``result.json`` last: its presence means every
        product is stored."""
        storage.write_json_atomic(
            self.layout.submodel_result(result.submodel_id, result.fingerprint),
            result.model_dump(mode="json"),
        )
        progress.emit(
            progress.SubmodelEvent(submodel_id=result.submodel_id, state="completed", fraction=1.0)
        )
        return result

    def _cancel_remote(self, client: NodeBackend, uuid: str) -> None:
        try:
            client.cancel(uuid)
            self.log(f"cancelled task {uuid} on {client.url}")
        except NodeError as exc:
            self.log(f"could not cancel task {uuid} on {client.url}: {str(exc).splitlines()[0]}")

    def _method(self) -> str:
        return str(self.plan.options.pipeline)

    def _node_alive(self, key: str) -> bool:
        try:
            self.clients[key].info()
            return True
        except NodeError:
            return False

    def _create_or_attach(self, client: NodeBackend, submodel: Submodel, uuid: str) -> None:
        """Submit the task, or re-attach to the task a killed run left (same UUID).

        Raises:
            StaleTaskError: the node's task under ``uuid`` holds other options than this
                submodel's: a rerun restarted it from a later stage with its own options
                (:meth:`_try_rerun_from`), so its products are no longer this fingerprint's.
        """
        sid = submodel.id
        state = client.task_state(uuid)
        if state is not None:
            differ = differing_option(state.options, self.plan.options.to_nodeodm())
            if differ is not None:
                name, held, wanted = differ
                raise StaleTaskError(
                    f"task {uuid} holds {name}={held!r}, not {wanted!r}: restarted with other "
                    "options since",
                    node_url=client.url,
                    task_uuid=uuid,
                )
        if state is None:
            mark_upload(self.layout, client, submodel, uuid)
            geo_url = self.layout.submodel_input(submodel.id, submodel.fingerprint, "geo.txt")
            files = upload_files(self.plan, self.survey, submodel.image_names, geo_url)
            progress.emit(
                progress.SubmodelEvent(
                    submodel_id=sid, state="uploading", fraction=0.0, node=client.url
                )
            )
            self.log(
                f"{sid}: uploading {len(submodel.image_names)} images"
                + (" and geo.txt" if len(files) > len(submodel.image_names) else "")
                + f" to {client.url} as task {uuid}"
            )
            client.create_task(
                uuid,
                files,
                self.plan.options.to_nodeodm(),
                name=f"{sid}-{submodel.fingerprint[:12]}",
                outputs=OUTPUTS,
                deadline_seconds=self.upload_deadline_seconds,
                progress=lambda done, total: progress.emit(
                    progress.SubmodelEvent(sid, state="uploading", fraction=0.1 * done / total)
                ),
            )
        elif state.status == COMPLETED:
            self.log(f"{sid}: task {uuid} already completed on {client.url}; downloading")
            progress.emit(
                progress.SubmodelEvent(
                    submodel_id=sid, state=progress.REATTACHED, fraction=0.9, node=client.url
                )
            )
        elif state.finished:
            # Failed or cancelled in an earlier run (this run's attempts use fresh UUIDs): the
            # operator asked again, so restart it; the node keeps the images, nothing is uploaded.
            self.log(
                f"{sid}: task {uuid} {STATUS_WORDS[state.status]} earlier; restarting on {client.url}"
            )
            if not client.restart(uuid):
                # A node that cannot restart a task (ScaleODM) gets a new one, as the retry asks.
                raise StaleTaskError(
                    f"task {uuid} {STATUS_WORDS[state.status]} earlier and the node cannot "
                    "restart it",
                    node_url=client.url,
                    task_uuid=uuid,
                )
        else:
            self.log(f"{sid}: re-attached to running task {uuid} on {client.url}")

    def _wait(self, client: NodeBackend, submodel: Submodel, uuid: str, clock: PhaseClock) -> None:
        """Wait for the task to complete, showing its progress.

        Raises:
            RunCancelledError: the run was cancelled while the task ran.
        """
        sid = submodel.id

        def on_progress(s: TaskState) -> None:
            if self.cancelled.is_set():
                raise RunCancelledError(f"{sid}: run cancelled")
            fraction = 0.1 + 0.85 * s.progress / 100.0
            progress.emit(
                progress.SubmodelEvent(
                    submodel_id=sid, state="processing", fraction=fraction, node=client.url
                )
            )

        with clock.phase("processing"):
            client.wait(
                uuid, poll_interval_seconds=self.poll_interval_seconds, on_progress=on_progress
            )
