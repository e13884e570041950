"""Which task UUID an attempt of a submodel uses, and which node already holds it.

A submodel's task UUIDs are UUIDv5 of its fingerprint and an attempt number
(:func:`~prefect_odm.nodes.backend.task_uuid`); an upload mark (``uploads/<uuid>``, written
before a task is created) says a UUID may be a task on some node. :class:`TaskLookup` picks the
attempt a killed run left, re-attaches to a task where a node has it, and passes over a UUID
whose upload began on no node that has it now. Moved out of :mod:`prefect_odm.nodes.runner`
unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from prefect_odm.layout import OutputLayout
from prefect_odm.models import Submodel
from prefect_odm.nodes import backend
from prefect_odm.nodes.backend import NodeBackend, task_uuid
from prefect_odm.nodes.pool import NodePool
from prefect_odm.nodes.stored import upload_marked

Holders = Mapping[str, Sequence[str]] | None
"""Task UUID -> node keys holding it, just asked (None: nobody was asked)."""


@dataclass(frozen=True)
class TaskLookup:
    """The task UUIDs of a runner's submodels and the nodes holding them.

    Args:
        layout: where the upload marks are stored.
        clients: node key -> node.
        pool: node placement (its set-aside nodes are not asked).
        max_attempts: the runner's attempts per submodel (twice as many UUIDs are looked at).
        log: where a passed-over UUID is said.
    """

    layout: OutputLayout
    clients: Mapping[str, NodeBackend]
    pool: NodePool
    max_attempts: int
    log: Callable[[str], None]

    def left_attempt(self, submodel: Submodel) -> tuple[int, Holders]:
        """The attempt a killed run left (:func:`~prefect_odm.nodes.backend.live_attempt`) and
        the node keys holding each of its UUIDs. Only UUIDs with an upload mark (written before
        every task is created) can be tasks: a first run asks no node, a rerun each node once
        (it listed every node twice per submodel, 4,000 ``/task/list`` at 100 x 20, issue 33)."""
        fp = submodel.fingerprint
        attempt_of = {
            uuid: a
            for a in range(2 * self.max_attempts)
            if upload_marked(self.layout, submodel, uuid := task_uuid(fp, a))
        }
        if not attempt_of:
            return 0, None
        found = backend.find_tasks(self.answering(), sorted(attempt_of))
        holders = {u: [key for key, held in sorted(found) if held == u] for u in attempt_of}
        return backend.preferred_attempt(found, attempt_of), holders

    def usable_task_uuid(
        self, submodel: Submodel, uuid_attempt: int, excluded: Sequence[str], holders: Holders
    ) -> tuple[int, str, str | None]:
        """``(uuid_attempt, task UUID, node key holding it or None)`` for this attempt: a task
        a killed run left on some node is re-attached there, never duplicated; a UUID a run
        began uploading that no node has is passed over. ``holders``: :meth:`left_attempt`'s."""
        uuid = task_uuid(submodel.fingerprint, uuid_attempt)
        holder = self.holder(submodel, uuid, excluded, holders)
        while holder is None and upload_marked(self.layout, submodel, uuid):
            # An earlier run began an upload under this UUID and no node has the task (cut
            # by a kill, or removed by the node since): its files may wait on the node, so
            # the next UUID is taken, without counting as an attempt.
            self.log(
                f"{submodel.id}: an earlier run began an upload as task {uuid}, which no node "
                "has; taking the next task UUID"
            )
            uuid_attempt += 1
            uuid = task_uuid(submodel.fingerprint, uuid_attempt)
            holder = self.holder(submodel, uuid, excluded, holders)
        return uuid_attempt, uuid, holder

    def holder(
        self, sm: Submodel, uuid: str, excluded: Sequence[str], holders: Holders
    ) -> str | None:
        """The node holding task ``uuid``: from ``holders`` when it has the UUID, none without
        an upload mark, else asked (:meth:`locate`)."""
        if holders is not None and uuid in holders:
            return next((k for k in holders[uuid] if k not in excluded), None)
        return self.locate(uuid, excluded) if upload_marked(self.layout, sm, uuid) else None

    def locate(self, uuid: str, excluded: Sequence[str]) -> str | None:
        """The node (key) that already has task ``uuid`` running or finished, if any answers so.

        Nodes the pool has set aside are not asked: a hung node would hold every look-up for
        its whole request time-out (30 s per UUID), and a task on it could not be reached.
        """
        asked = {k: c for k, c in self.answering().items() if k not in excluded}
        # cancelled too: restarted where its images are
        holders = sorted(key for key, _uuid in backend.find_tasks(asked, [uuid]))
        return holders[0] if holders else None

    def answering(self) -> dict[str, NodeBackend]:
        """The clients of the nodes the pool has not set aside (down or silent at the start)."""
        down = self.pool.down_keys()
        return {key: client for key, client in self.clients.items() if key not in down}
