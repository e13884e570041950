"""Submodels as deployment runs routed among clusters, with failover and the dead-letter queue.

The parent routes each pending submodel (:func:`prefect_odm.clusters.router.route`, every
decision adding its memory to the cluster it chose), starts its run on the chosen queue and
follows every run with one API call per poll. Every ``health_interval_seconds`` it reads each
cluster's state again; a cluster seen down (its queue not ready or paused, or no node answering
``/info``) for ``down_after_seconds`` has its runs cancelled there (``Cancelled`` at once, as
its worker may be gone; a run still alive sees it, cancels its node task and stops) and each
is routed again without that cluster. A run that
fails, crashes or times out is routed again without the cluster it ran on. After
``max_failovers`` such routes, or when no cluster is left, the submodel goes to the paused
dead-letter queue with its last error and the rest of the survey goes on.

A late finish on a cluster failed over is harmless: the submodel's result is stored under its
fingerprint, and a run that finds it reuses it instead of processing again.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from prefect import get_run_logger
from prefect.client.schemas.objects import FlowRun
from prefect_odm.tasks.artifacts import LiveSubmodelTable
from prefect_odm.tasks.deployment import (
    POLL_INTERVAL_SECONDS,
    ChildRunFeed,
    read_runs,
    result_of,
    state_text,
)
from prefect_odm.tasks.routing import ClusterSession, dead_letter, start_routed_run

from prefect_odm.clusters.capacity import tagged_cluster
from prefect_odm.clusters.records import RouteRecord
from prefect_odm.clusters.router import ClusterState, RouteDecision, route
from prefect_odm.clusters.routing import demand_for, record_of
from prefect_odm.errors import RoutingError
from prefect_odm.layout import OutputLayout
from prefect_odm.models import SplitPlan, SubmodelResult


@dataclass
class _Live:
    """A submodel's current run: its record in the summary and its flow run id."""

    record: RouteRecord
    run_id: str


@dataclass
class RoutedChildren:
    """How a parent runs its pending submodels on the clusters of ``session``.

    Attributes:
        deployment: ``"flow/deployment"`` of the ``process_submodel`` deployment.
        session: the clusters (read at the run's start) and the routing summary.
        plan, layout: the run's plan and output layout.
        table: the live submodel table.
        force: process again even when stored results exist.
        megapixels: the survey's mean image size (the deadlines' time model).
        run_name: submodel id -> its runs' name.
    """

    deployment: str
    session: ClusterSession
    plan: SplitPlan
    layout: OutputLayout
    table: LiveSubmodelTable
    force: bool
    megapixels: float
    run_name: dict[str, str]
    parent_id: str
    live: dict[str, _Live] = field(default_factory=dict)
    results: dict[str, SubmodelResult] = field(default_factory=dict)
    tried: dict[str, list[str]] = field(default_factory=dict)
    down_since: dict[str, float] = field(default_factory=dict)

    def run(self, pending: list[str]) -> dict[str, SubmodelResult]:
        """Route and run every pending submodel; returns each one's result (a dead-lettered
        one is failed, its error naming the dead-letter run)."""
        states = list(self.session.states)
        by_size = sorted(pending, key=lambda s: (-self.plan.submodel(s).estimated_memory_gib, s))
        decisions: list[RouteDecision] = []
        for sid in by_size:
            gib = self.plan.submodel(sid).estimated_memory_gib
            try:
                decision = self._route(sid, states, ())
            except RoutingError as exc:
                self._dead_letter(sid, str(exc))
                continue
            decisions.append(decision)
            # each decision adds its memory to the cluster it chose
            states = [
                replace(s, memory_in_use_gib=s.memory_in_use_gib + gib)
                if s.name == decision.cluster
                else s
                for s in states
            ]
        self._start_all(decisions, 1, ())  # concurrently, from tasks of this run
        self._follow()
        return {sid: self.results[sid] for sid in pending}

    def _route(
        self, sid: str, states: Sequence[ClusterState], exclude: Sequence[str]
    ) -> RouteDecision:
        directory = self.session.directory
        return route(
            demand_for(self.plan.submodel(sid), self.session.options, self.plan.engine_identity),
            states,
            global_queue=directory.global_queue,
            overflow_fraction=directory.overflow_fraction,
            exclude=tuple(exclude),
        )

    def _parameters(self, sid: str, cluster: str | None) -> dict[str, Any]:
        return {
            "plan_url": self.layout.plan_json,
            "submodel_id": sid,
            "output": self.layout.root,
            "nodes": None,
            "force": self.force,
            "cluster_directory": self.session.options.directory,
            "cluster": cluster,
            "deadline_seconds": self.session.deadline_seconds(self.plan, sid, self.megapixels),
        }

    def _start_all(
        self, decisions: Sequence[RouteDecision], route_n: int, excluded: Sequence[str]
    ) -> None:
        """Start the runs of these decisions (their ``route_n``-th routes) at once."""
        futures = [
            start_routed_run.submit(
                self.deployment,
                d.submodel_id,
                self._parameters(d.submodel_id, d.cluster),
                d.work_queue,
                route_n,
                self.run_name[d.submodel_id],
            )
            for d in decisions
        ]
        for decision, future in zip(decisions, futures, strict=True):
            sid = decision.submodel_id
            record = record_of(decision, route_n, excluded)
            record.flow_run_id, _state = future.result()
            self.session.summary.decisions.append(record)
            self.live[sid] = _Live(record, record.flow_run_id)
            where = decision.cluster or f"{decision.work_queue} (overflow)"
            self.table.board.update(sid, cluster=where, route=decision.reason, state="waiting")
            get_run_logger().info("%s: routed to %s: %s", sid, where, decision.reason)
        self.table.publish()

    def _follow(self) -> None:
        """Poll every live run until none is left; fail over runs on clusters that went down."""
        feed = ChildRunFeed(self.table.board, self.table.publish)
        interval = self.session.options.health_interval_seconds
        next_health = time.monotonic() + interval
        while self.live:
            runs = read_runs({sid: live.run_id for sid, live in self.live.items()})
            feed(runs)
            for sid, run in runs.items():
                live = self.live.get(sid)
                if live is not None and live.run_id == str(run.id) and _final(run):
                    self._finished(sid, run)
            if self.live and time.monotonic() >= next_health:
                self._check_health(runs)
                next_health = time.monotonic() + interval
            if self.live:
                time.sleep(POLL_INTERVAL_SECONDS)

    def _finished(self, sid: str, run: FlowRun) -> None:
        live = self.live.pop(sid)
        record = live.record
        record.ran_on = tagged_cluster(run.tags or ()) or record.cluster
        assert run.state is not None
        if run.state.is_completed():
            record.outcome = "cached" if run.state.name == "Cached" else "completed"
            result = result_of(run, self.plan, sid, self.layout.root)
            self.results[sid] = result
            self.table.show_result(result, builtin=False)
            if record.ran_on:
                self.table.board.update(sid, cluster=_where(record))
            return
        error = state_text(run.state) or run.state.name or "failed"
        record.outcome = "timed out" if "timed out" in error else "failed"
        record.error = error
        if record.ran_on:
            self.tried.setdefault(sid, []).append(record.ran_on)
        self._fail_over(sid, error)

    def _fail_over(self, sid: str, error: str) -> None:
        """Route the submodel again without the clusters it failed on or that are down; the
        dead-letter queue when its failovers are used up or no cluster is left."""
        routes = sum(1 for r in self.session.summary.decisions if r.submodel_id == sid)
        if routes > self.session.options.max_failovers:
            self._dead_letter(sid, f"{error} (after {routes} routes)")
            return
        exclude = sorted(set(self.tried.get(sid, [])) | set(self._down_now()))
        try:
            decision = self._route(sid, self.session.states, exclude)
        except RoutingError as exc:
            self._dead_letter(sid, f"{error}; {exc}")
            return
        get_run_logger().warning("%s: failing over (%s)", sid, error)
        self._start_all([decision], routes + 1, exclude)

    def _down_now(self) -> list[str]:
        """Clusters seen down for at least ``down_after_seconds``."""
        wait = self.session.options.down_after_seconds
        now = time.monotonic()
        return [name for name, since in self.down_since.items() if now - since >= wait]

    def _check_health(self, runs: dict[str, FlowRun]) -> None:
        """Read every cluster again; cancel and route again the runs on clusters down long
        enough."""
        self.session.refresh()
        reasons = self.session.down_reasons()
        now = time.monotonic()
        self.down_since = {n: self.down_since.get(n, now) for n in reasons}
        down = set(self._down_now())
        for sid, live in list(self.live.items()):
            run = runs.get(sid)
            on = _on_cluster(live.record, run)
            if on is None or on not in down or (run is not None and _final(run)):
                continue
            why = f"cluster {on} down: {reasons[on]}"
            self.live.pop(sid)
            _cancel(live.run_id, why)
            live.record.outcome, live.record.error = "failed over", why
            live.record.ran_on = on
            self.tried.setdefault(sid, []).append(on)
            self._fail_over(sid, why)

    def _dead_letter(self, sid: str, error: str) -> None:
        tried = sorted(set(self.tried.get(sid, [])))
        entry = dead_letter(
            self.deployment,
            self.session.directory,
            self._parameters(sid, None),
            error,
            tried,
            self.parent_id,
        )
        self.session.summary.dead_letter.append(entry)
        for record in self.session.summary.decisions:
            if record.submodel_id == sid and record.outcome == "waiting":
                record.outcome = "dead-letter"
        submodel = self.plan.submodel(sid)
        text = f"dead-letter queue (run {entry.flow_run_id}): {error}"
        self.results[sid] = SubmodelResult(
            submodel_id=sid, fingerprint=submodel.fingerprint, status="failed", error=text
        )
        self.table.board.update(sid, state="dead-letter", error=error, cluster="dead-letter")
        self.table.publish()


def _final(run: FlowRun) -> bool:
    return run.state is not None and run.state.is_final()


def _where(record: RouteRecord) -> str:
    if record.cluster is None:
        return f"{record.ran_on} (from {record.work_queue})"
    return str(record.ran_on)


def _on_cluster(record: RouteRecord, run: FlowRun | None) -> str | None:
    """The cluster a live run is on: the one that took it (its tag), else the one whose own
    queue it waits in (``None``: waiting in the global queue)."""
    taken = tagged_cluster(run.tags or ()) if run is not None else None
    return taken or record.cluster


def _cancel(run_id: str, why: str) -> None:
    """Cancel a run on a cluster that went down, at once (``Cancelled``, forced: its worker may
    be gone). A run still alive watches its own state: it cancels its node task and stops."""
    from prefect.client.orchestration import get_client
    from prefect.states import Cancelled

    with get_client(sync_client=True) as client:
        client.set_flow_run_state(run_id, Cancelled(message=why), force=True)
