"""The submodels of an inline ``reconstruct`` run: concurrent ``run_submodel`` tasks in this
process, on one cluster of nodes (:func:`run_inline`) or routed among the clusters of a cluster
directory with failover (:func:`run_inline_routed`).

Inline there are no workers and no queues: a submodel the router sends to the global overflow
queue runs on the eligible cluster with the most room left now, and a submodel that failed on a
cluster (its nodes went down, it failed or timed out there) is routed again without it, up to
``max_failovers`` times; then it is a failed submodel, as without a directory.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from prefect.futures import PrefectConcurrentFuture, PrefectFuture, as_completed
from prefect.task_runners import ThreadPoolTaskRunner
from prefect_odm.tasks.admission import embedded_api_advice
from prefect_odm.tasks.artifacts import LiveSubmodelTable
from prefect_odm.tasks.clusters import sharing_cluster
from prefect_odm.tasks.submodels import InlineCluster, run_submodel

from prefect_odm import progress
from prefect_odm.clusters.records import RouteRecord, RoutingSummary
from prefect_odm.clusters.router import (
    ClusterState,
    RouteDecision,
    SubmodelDemand,
    has_room,
    route,
)
from prefect_odm.errors import RoutingError
from prefect_odm.layout import OutputLayout
from prefect_odm.models import SplitPlan, SubmodelResult
from prefect_odm.nodes.cluster import Cluster


def follow_progress(
    live: LiveSubmodelTable, pending: Sequence[str], builtin: bool
) -> Callable[[progress.ProgressEvent], None]:
    """A progress listener that puts the pending submodels' events on the board (published on
    each change of state)."""

    def follow(event: progress.ProgressEvent) -> None:
        if isinstance(event, progress.SubmodelRunEvent) and event.submodel_id in pending:
            if live.board.update(event.submodel_id, runs=event.runs):
                live.publish()
        elif isinstance(event, progress.SubmodelEvent) and event.submodel_id in pending:
            row = live.board.rows.get(event.submodel_id)
            before = row.state if row else None
            live.board.apply(replace(event, node="built-in engine" if builtin else event.node))
            if row is not None and row.state != before:
                live.publish()

    return follow


def _largest_first(plan: SplitPlan, pending: Sequence[str]) -> list[str]:
    """Largest first (Graham's longest-processing-time rule): a big submodel started last would
    keep one node busy while the others idle."""
    images = {s.id: len(s.image_names) for s in plan.submodels}
    return sorted(pending, key=lambda sid: (-images[sid], sid))


def run_inline(
    cluster: Cluster,
    urls: list[str],
    pending: list[str],
    plan: SplitPlan,
    layout: OutputLayout,
    live: LiveSubmodelTable,
    force: bool,
    builtin: bool = False,
) -> dict[str, SubmodelResult]:
    """One ``run_submodel`` task per pending submodel, all placing work through ``cluster``;
    the board follows their progress events (the table is published on each change of state).

    Raises:
        InputError: an option is not accepted by some node (checked before any upload).
    """
    cluster.check_options(plan.options.to_nodeodm())
    unsubscribe = progress.subscribe(follow_progress(live, pending, builtin))
    # As many submodels in flight as the pool has task slots (the flow's own runner would hold
    # them to its 4 workers whatever the nodes, issue 14), and one more per node waiting for a
    # slot: its Prefect bookkeeping and node look-ups are done by the time a slot frees, so the
    # node starts its next task at once. The pool's leases still decide which node and how
    # much memory each gets, first come first served.
    workers = min(len(pending), cluster.pool.task_slots + len(cluster.pool.nodes))
    if (advice := embedded_api_advice(workers)) is not None:
        progress.emit(progress.WarningEvent(text=advice))
    order = _largest_first(plan, pending)
    with (
        sharing_cluster(cluster),
        ThreadPoolTaskRunner[SubmodelResult](max_workers=workers) as runner,
    ):
        futures: list[PrefectFuture[SubmodelResult]] = [
            runner.submit(
                run_submodel,
                parameters={
                    "plan_url": layout.plan_json,
                    "submodel_id": sid,
                    "output": layout.root,
                    "nodes": urls,
                    "force": force,
                },
            )
            for sid in order
        ]
        by_future = dict(zip(futures, order, strict=True))
        try:
            results: dict[str, SubmodelResult] = {}
            for future in as_completed(futures):
                result = future.result()
                results[by_future[future]] = result
                live.show_result(result, builtin)
            return results
        except BaseException:
            # Cancelled or interrupted: every runner cancels its remote task and returns
            # its slots before the run ends.
            cluster.cancelled.set()
            for f in futures:
                f.wait(timeout=60)
            raise
        finally:
            unsubscribe()


@dataclass(frozen=True)
class InlineClusters:
    """The clusters an inline run routes among: each usable one's nodes, connected here.

    Attributes:
        directory: the cluster directory block's name.
        clusters: cluster name -> its nodes (URLs without tokens) and placement pool.
        states: the router's view of every cluster connected.
        global_queue, overflow_fraction: the directory's.
        max_failovers: routes of one submodel after its first.
        deadline: submodel id -> its deadline on its node (seconds; ``None``: none).
    """

    directory: str
    clusters: dict[str, tuple[list[str], Cluster]]
    states: list[ClusterState]
    global_queue: str
    overflow_fraction: float
    max_failovers: int
    deadline: Callable[[str], float | None]


def _inline_choice(decision: RouteDecision, states: Sequence[ClusterState], gib: float) -> str:
    """The cluster an inline run uses for a decision: the chosen one, or for the global queue
    the reader with the most room left (no worker takes it inline)."""
    if decision.cluster is not None:
        return decision.cluster
    readers = [s for s in states if s.name in decision.eligible and s.reads_global]
    roomy = [s for s in readers if has_room(s, gib, 1.0)] or readers
    return min(roomy, key=lambda s: (s.used_fraction(), s.cost_per_node_hour, s.name)).name


def run_inline_routed(
    on: InlineClusters,
    demand: Callable[[str], SubmodelDemand],
    pending: list[str],
    plan: SplitPlan,
    layout: OutputLayout,
    live: LiveSubmodelTable,
    force: bool,
    summary: RoutingSummary,
) -> dict[str, SubmodelResult]:
    """Route every pending submodel among ``on``'s clusters and run it there, failing over a
    submodel that failed on one (see the module); decisions go to ``summary``.

    Raises:
        RoutingError: some submodel has no eligible cluster at its first route.
    """
    runner = _RoutedInline(on, demand, plan, layout, live, force, summary)
    return runner.run(pending)


@dataclass(frozen=True)
class _Flight:
    """A submodel's run in flight: its id, its route's record and its task's future."""

    sid: str
    record: RouteRecord
    future: PrefectFuture[SubmodelResult]


class _RoutedInline:
    """The state of :func:`run_inline_routed` (states, live futures, failovers)."""

    def __init__(
        self,
        on: InlineClusters,
        demand: Callable[[str], SubmodelDemand],
        plan: SplitPlan,
        layout: OutputLayout,
        live: LiveSubmodelTable,
        force: bool,
        summary: RoutingSummary,
    ) -> None:
        self.on, self.demand, self.plan, self.layout = on, demand, plan, layout
        self.live, self.force, self.summary = live, force, summary
        self.states = list(on.states)
        self.tried: dict[str, list[str]] = {}

    def _decide(self, sid: str, route_n: int) -> tuple[RouteRecord, str]:
        """Route ``sid`` (without the clusters it failed on); its record and the cluster."""
        exclude = sorted(set(self.tried.get(sid, [])))
        decision = route(
            self.demand(sid),
            self.states,
            global_queue=self.on.global_queue,
            overflow_fraction=self.on.overflow_fraction,
            exclude=exclude,
        )
        gib = self.plan.submodel(sid).estimated_memory_gib
        name = _inline_choice(decision, self.states, gib)
        self.states = [
            replace(s, memory_in_use_gib=s.memory_in_use_gib + gib) if s.name == name else s
            for s in self.states
        ]
        record = RouteRecord(
            submodel_id=sid,
            route=route_n,
            cluster=decision.cluster,
            work_queue=decision.work_queue,
            reason=decision.reason,
            eligible=list(decision.eligible),
            excluded=exclude,
            ran_on=name,
        )
        self.summary.decisions.append(record)
        where = name if decision.cluster else f"{name} (from {decision.work_queue})"
        self.live.board.update(sid, cluster=where, route=decision.reason)
        return record, name

    def _submit(
        self, pool: ThreadPoolTaskRunner[SubmodelResult], sid: str, name: str
    ) -> PrefectFuture[SubmodelResult]:
        urls = self.on.clusters[name][0]
        at = InlineCluster(self.on.directory, name, self.on.deadline(sid))
        return pool.submit(
            run_submodel,
            parameters={
                "plan_url": self.layout.plan_json,
                "submodel_id": sid,
                "output": self.layout.root,
                "nodes": urls,
                "force": self.force,
                "on": at,
            },
        )

    def run(self, pending: list[str]) -> dict[str, SubmodelResult]:
        clusters = [c for _, c in self.on.clusters.values()]
        slots = sum(c.pool.task_slots + len(c.pool.nodes) for c in clusters)
        unsubscribe = progress.subscribe(follow_progress(self.live, pending, False))
        results: dict[str, SubmodelResult] = {}
        with (
            sharing_cluster(*clusters),
            ThreadPoolTaskRunner[SubmodelResult](max_workers=max(1, slots)) as pool,
        ):
            flights: dict[concurrent.futures.Future[Any], _Flight] = {}

            def launch(sid: str, record: RouteRecord, name: str) -> None:
                future = self._submit(pool, sid, name)
                flights[_wrapped(future)] = _Flight(sid, record, future)

            try:
                for sid in _largest_first(self.plan, pending):
                    launch(sid, *self._decide(sid, 1))
                while flights:
                    done, _ = concurrent.futures.wait(
                        list(flights), return_when=concurrent.futures.FIRST_COMPLETED
                    )
                    for key in done:
                        flight = flights.pop(key)
                        result = flight.future.result()
                        follow = self._outcome(flight.sid, flight.record, result)
                        if follow is None:
                            results[flight.sid] = result
                            self.live.show_result(result, builtin=False)
                        else:
                            launch(flight.sid, *follow)
                return results
            except BaseException:
                for cluster in clusters:
                    cluster.cancelled.set()
                concurrent.futures.wait(list(flights), timeout=60)
                raise
            finally:
                unsubscribe()

    def _outcome(
        self, sid: str, record: RouteRecord, result: SubmodelResult
    ) -> tuple[RouteRecord, str] | None:
        """Record the result; a failed submodel's next route (record, cluster), or ``None``
        when it is done or has no failover left (its result stays failed)."""
        if result.status != "failed":
            record.outcome = "cached" if result.status == "reused" else "completed"
            return None
        error = result.error or "failed"
        record.outcome = "timed out" if "timed out" in error else "failed"
        record.error = error
        assert record.ran_on is not None
        self.tried.setdefault(sid, []).append(record.ran_on)
        routes = sum(1 for r in self.summary.decisions if r.submodel_id == sid)
        if routes > self.on.max_failovers:
            return None
        try:
            return self._decide(sid, routes + 1)
        except RoutingError:
            return None


def _wrapped(future: PrefectFuture[SubmodelResult]) -> concurrent.futures.Future[Any]:
    """The concurrent future under a thread-pool task runner's Prefect future (its result is
    the task run's final state; the Prefect future's ``result()`` gives the return value)."""
    assert isinstance(future, PrefectConcurrentFuture)
    return future.wrapped_future
