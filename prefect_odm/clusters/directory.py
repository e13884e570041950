"""The cluster directory: every processing cluster a team runs, as pydantic records.

A *cluster* is a fleet of processing nodes (NodeODM, ClusterODM or built-in engines) with the
Prefect work queue its workers read. The directory is saved in a ``ClusterDirectoryBlock``
(:mod:`prefect_odm.blocks.clusters`) and read by the router, ``prefect-odm clusters`` and
``prefect-odm capacity serve``.

The topology it describes: one Prefect work pool with a queue per cluster plus a global overflow
queue (``global_queue``); each cluster's workers are started with
``--work-queue <own> --work-queue <global>`` so that Prefect's queue priorities give their own
queue first. A pool per cluster works too (``work_pool`` differs per cluster), but then no
worker reads a shared overflow queue, and the router keeps every submodel on a cluster queue.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, Field, field_validator, model_validator

NAME_PATTERN = r"^[a-z0-9][a-z0-9-]{0,62}$"
"""Cluster and queue names: lowercase letters, digits and dashes (they become tags and URLs)."""

OVERFLOW_FRACTION = 0.8
"""A cluster takes new submodels while its memory in use is under this share of its capacity."""

GLOBAL_QUEUE = "global"
"""The overflow queue every cluster's workers read after their own."""

DEAD_LETTER_QUEUE = "dead-letter"
"""The paused work queue of submodels that exhausted their retries and failovers."""


class ClusterSpec(BaseModel):
    """One processing cluster: its nodes, where it is, what it costs and who may use it."""

    name: str = Field(pattern=NAME_PATTERN, description="The cluster's name, e.g. 'eu-large'.")
    nodes: list[str] = Field(
        default_factory=list,
        description="NodeODM-API node URLs (no token in them); empty when node_pool is given.",
    )
    node_pool: str | None = Field(
        None, description="Name of a saved NodeODM Pool block holding the nodes and tokens."
    )
    region: str | None = Field(None, description="Where the cluster runs, e.g. 'eu-west-1'.")
    data_regions: list[str] = Field(
        default_factory=list,
        description="Regions of data storage the cluster sits next to (reads without egress).",
    )
    cost_per_node_hour: float = Field(
        0.0, ge=0, description="Cost of one node for one hour, any currency, the same for all."
    )
    memory_gib: float | None = Field(
        None, gt=0, description="Memory cap of the whole cluster, GiB; default: the nodes' /info."
    )
    largest_node_gib: float | None = Field(
        None, gt=0, description="Memory of the largest node, GiB; default: the nodes' /info."
    )
    node_count: int | None = Field(
        None, ge=1, description="Nodes in the cluster, for its cost; default: the nodes listed."
    )
    engine_identity: str | None = Field(
        None,
        description="Engine identity of its nodes (part of the submodel fingerprint); "
        "default: from /info.",
    )
    work_pool: str = Field(description="Prefect work pool its workers poll.")
    work_queue: str | None = Field(
        None, pattern=NAME_PATTERN, description="Its own work queue; default: the cluster name."
    )
    groups: list[str] = Field(
        default_factory=list,
        description="User groups it serves (advisory: the router keeps to it; enforcement is "
        "the caller's or Prefect Cloud's access lists); empty: everyone.",
    )
    reads_global: bool = Field(
        True, description="Its workers read the global overflow queue after their own."
    )

    @property
    def queue(self) -> str:
        """The cluster's own work queue."""
        return self.work_queue or self.name

    @property
    def memory_limit_name(self) -> str:
        """The Prefect global concurrency limit whose slots stand for this cluster's GiB (one
        memory limit per cluster)."""
        return f"prefect-odm-memory-gib-{self.name}"

    @field_validator("nodes")
    @classmethod
    def _no_token_in_url(cls, urls: list[str]) -> list[str]:
        for url in urls:
            if re.search(r"[?&]token=", url):
                raise ValueError(f"node {url.split('?')[0]}: put the token in a NodeODM block")
        return urls


class ClusterDirectory(BaseModel):
    """Every cluster a team runs, the shared overflow queue and the overflow rule."""

    clusters: list[ClusterSpec] = Field(description="The clusters, in any order.")
    global_queue: str = Field(
        GLOBAL_QUEUE, pattern=NAME_PATTERN, description="Overflow queue read after each own queue."
    )
    dead_letter_queue: str = Field(
        DEAD_LETTER_QUEUE,
        pattern=NAME_PATTERN,
        description="Paused queue of submodels that exhausted their retries and failovers.",
    )
    overflow_fraction: float = Field(
        OVERFLOW_FRACTION,
        gt=0,
        le=1,
        description="A cluster takes new submodels while under this share of its memory.",
    )

    @model_validator(mode="after")
    def _unique(self) -> ClusterDirectory:
        names = [c.name for c in self.clusters]
        queues = [(c.work_pool, c.queue) for c in self.clusters]
        if len(set(names)) != len(names):
            raise ValueError(f"cluster names repeat: {sorted(names)}")
        if len(set(queues)) != len(queues):
            raise ValueError("two clusters share one work queue")
        special = {self.global_queue, self.dead_letter_queue}
        clash = [c.name for c in self.clusters if c.queue in special]
        if clash:
            raise ValueError(f"cluster {clash[0]}: its queue is the global or dead-letter queue")
        return self

    def get(self, name: str) -> ClusterSpec:
        """The cluster called ``name``.

        Raises:
            KeyError: no such cluster (the message lists the known ones).
        """
        for cluster in self.clusters:
            if cluster.name == name:
                return cluster
        raise KeyError(f"no cluster {name!r}; known: {', '.join(c.name for c in self.clusters)}")
