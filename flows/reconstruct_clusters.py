"""What ``reconstruct`` does when it routes its submodels among the clusters of a cluster
directory (``routing``, or ``PREFECT_ODM_CLUSTER_DIRECTORY``): read the clusters, plan for
their engine and largest node (and the optional area rule), then process the submodels as
routed deployment runs (:mod:`prefect_odm.tasks.routed_children`) or inline
(:func:`prefect_odm.flows.reconstruct_inline.run_inline_routed`).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from prefect import get_run_logger
from prefect.runtime import flow_run
from prefect_odm.blocks import load_pool_block
from prefect_odm.flows.reconstruct_inline import InlineClusters, run_inline_routed
from prefect_odm.tasks.artifacts import LiveSubmodelTable
from prefect_odm.tasks.routed_children import RoutedChildren
from prefect_odm.tasks.routing import ClusterSession, open_clusters

from prefect_odm.clusters.records import RoutingOptions
from prefect_odm.clusters.routing import area_split, demand_for, split_memory_gib
from prefect_odm.layout import OutputLayout
from prefect_odm.models import (
    NodeHealthRecord,
    ProcessingOptions,
    SplitPlan,
    SubmodelResult,
    Survey,
)
from prefect_odm.nodes.backend import NodeSettings
from prefect_odm.nodes.cluster import connect_nodes
from prefect_odm.nodes.refs import submodel_run_name
from prefect_odm.settings import get_settings


def routing_from(routing: RoutingOptions | None) -> RoutingOptions | None:
    """The run's routing: the parameter, else ``PREFECT_ODM_CLUSTER_DIRECTORY``, else none."""
    if routing is not None:
        return routing
    name = get_settings().cluster_directory
    return RoutingOptions(directory=name) if name else None


def open_session(
    routing: RoutingOptions, options: ProcessingOptions | None, workers: bool
) -> ClusterSession:
    """Read every cluster and check the run's options on the preferred cluster's nodes
    (before the plan is written: a bad option leaves nothing behind). ``workers``: the
    submodels run as deployment runs on the clusters' workers (else inline).

    Raises:
        InputError: no such directory, a pool block missing, or an option a node refuses.
        RoutingError: no cluster may take the survey.
    """
    session = open_clusters(routing, workers)
    first = session.directory.get(session.usable[0].name)
    urls, settings = _cluster_nodes(first.name, session)
    connect_nodes(urls, settings=settings).check_options(
        (options or ProcessingOptions()).to_nodeodm()
    )
    states = ", ".join(
        f"{s.name} ({'down' if s.down else f'{s.memory_in_use_gib:.1f}/{s.memory_capacity_gib} GiB'})"
        for s in session.states
    )
    get_run_logger().info("clusters of %s: %s", routing.directory, states)
    return session


def _cluster_nodes(name: str, session: ClusterSession) -> tuple[list[str], dict[str, NodeSettings]]:
    """A cluster's node URLs and their settings (tokens, memory, task slots) from its
    directory entry (its ``NodeODM Pool`` block when it names one)."""
    spec = session.directory.get(name)
    if spec.node_pool:
        return load_pool_block(spec.node_pool)
    return list(spec.nodes), {}


def planning_memory(session: ClusterSession) -> tuple[str, list[float]]:
    """The engine identity the plan is made for and the largest node of each usable cluster
    running it (``--split auto`` and the one-task-or-split-merge choice)."""
    identity = session.engine_identity
    memory = split_memory_gib(session.usable, identity)
    largest = max(memory)
    owner = next(s.name for s in session.usable if s.largest_node_gib == largest)
    session.summary.split_basis = (
        f"engine {identity}; largest node {largest:.1f} GiB (cluster {owner}) of the clusters "
        f"running it: {', '.join(s.name for s in session.usable if s.engine_identity == identity)}"
    )
    return identity, memory


def with_area_rule(
    plan: SplitPlan, survey: Survey, session: ClusterSession, replan: Callable[[int], SplitPlan]
) -> SplitPlan:
    """The plan under the area rule: replanned with a smaller split when its submodels would
    cover more than ``split_area_m2`` each (a survey one node holds is then split-merged)."""
    area_m2 = sum(s.area_m2 for s in plan.submodels)
    asked = area_split(len(survey.images), area_m2, plan.split, session.options.split_area_m2)
    if asked is None:
        if session.options.split_area_m2 is not None:
            session.summary.split_basis += f"; area rule {session.options.split_area_m2:g} m² kept"
        return plan
    session.summary.split_basis += (
        f"; area rule {session.options.split_area_m2:g} m² over {area_m2:.0f} m²: "
        f"split {plan.split} -> {asked}"
    )
    return replan(asked)


def mean_megapixels(survey: Survey) -> float:
    """The survey's mean image size, MP."""
    return float(np.mean([im.width * im.height / 1e6 for im in survey.images]))


def process_routed(
    session: ClusterSession,
    plan: SplitPlan,
    layout: OutputLayout,
    survey: Survey,
    pending: list[str],
    live: LiveSubmodelTable,
    *,
    force: bool,
    deployment: str | None,
) -> tuple[dict[str, SubmodelResult], list[NodeHealthRecord]]:
    """The pending submodels' results, routed as deployment runs (``deployment``) or inline;
    and the nodes' health records of an inline run."""
    megapixels = mean_megapixels(survey)
    if deployment is not None:
        names = {
            sid: submodel_run_name(survey.source, plan.survey_fingerprint, sid) for sid in pending
        }
        children = RoutedChildren(
            deployment, session, plan, layout, live, force, megapixels, names, str(flow_run.id)
        )
        return children.run(pending), []
    return _inline(session, plan, layout, pending, live, force, megapixels)


def _inline(
    session: ClusterSession,
    plan: SplitPlan,
    layout: OutputLayout,
    pending: list[str],
    live: LiveSubmodelTable,
    force: bool,
    megapixels: float,
) -> tuple[dict[str, SubmodelResult], list[NodeHealthRecord]]:
    """Connect every usable cluster running the plan's engine and run the submodels inline."""
    directory = session.directory
    clusters = {}
    for state in session.usable:
        if state.engine_identity == plan.engine_identity:
            urls, settings = _cluster_nodes(state.name, session)
            clusters[state.name] = (urls, connect_nodes(urls, settings=settings))
    on = InlineClusters(
        directory=session.options.directory,
        clusters=clusters,
        states=[s for s in session.states if s.name in clusters],
        global_queue=directory.global_queue,
        overflow_fraction=directory.overflow_fraction,
        max_failovers=session.options.max_failovers,
        deadline=lambda sid: session.deadline_seconds(plan, sid, megapixels),
    )
    results = run_inline_routed(
        on,
        lambda sid: demand_for(plan.submodel(sid), session.options, plan.engine_identity),
        pending,
        plan,
        layout,
        live,
        force,
        session.summary,
    )
    return results, [r for _, c in clusters.values() for r in c.pool.health.report()]


def dead_lettered(session: ClusterSession | None) -> set[str]:
    """The submodels of the run that went to the dead-letter queue."""
    return set() if session is None else {d.submodel_id for d in session.summary.dead_letter}
