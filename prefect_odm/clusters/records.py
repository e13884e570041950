"""What a run routed to several clusters asks and records: its routing options (a flow
parameter) and the routing summary of its manifest (pure pydantic records).

The manifest keeps one :class:`RouteRecord` per routing decision, in the order they were made:
a submodel's first route, and one more per failover (its cluster went down, the submodel failed
or timed out there). A submodel that exhausted its failovers has a :class:`DeadLetterRecord`:
its run waits in the paused dead-letter work queue with its last error until
``prefect-odm requeue`` replays it.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

RouteOutcome = Literal[
    "waiting", "completed", "cached", "failed", "timed out", "failed over", "dead-letter"
]
"""What became of one routing decision."""


class RoutingOptions(BaseModel):
    """How a ``reconstruct`` run chooses among the clusters of a cluster directory.

    None of these is part of any fingerprint: a submodel processed on any cluster that runs the
    plan's engine has the same result.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    directory: str = Field(description="Name of the saved ClusterDirectoryBlock.")
    groups: list[str] = Field(
        default_factory=list,
        description="The user's groups (advisory: clusters serving other groups are left out).",
    )
    data_region: str | None = Field(
        None, description="Region of the images' storage (clusters next to it come first)."
    )
    local_region: str | None = Field(
        None, description="The user's own region (its clusters come after the data-near ones)."
    )
    submodel_timeout_seconds: float | None = Field(
        None,
        gt=0,
        description="Deadline of one submodel on its node, seconds; None: from the time model "
        "(clusters.deadlines, bounded); see deadlines.",
    )
    deadlines: bool = Field(
        True, description="Cancel a submodel's node task once its deadline passed ('timed out')."
    )
    max_failovers: int = Field(
        3, ge=0, description="Routes of one submodel after its first, before the dead-letter queue."
    )
    down_after_seconds: float = Field(
        15.0,
        ge=0,
        description="A cluster seen down (queue not ready or paused, or no node answering) "
        "this long is failed over.",
    )
    health_interval_seconds: float = Field(
        5.0, gt=0, description="How often a waiting parent reads every cluster's state, seconds."
    )
    split_area_m2: float | None = Field(
        None,
        gt=0,
        description="Area rule: a survey larger than this is split-merged even when one node "
        "holds it, into submodels of at most about this area (m^2); None: memory alone.",
    )


class RouteRecord(BaseModel):
    """One routing decision of a submodel and what became of it.

    ``cluster`` is ``None`` for the global overflow queue; ``ran_on`` is the cluster whose worker
    took the run (the one chosen, or the reader of the global queue that took it), ``None`` while
    none has.
    """

    submodel_id: str
    route: int = Field(1, ge=1, description="1 for the first route, 2 and up after failovers.")
    cluster: str | None
    work_queue: str
    reason: str = Field(description="Why this cluster or queue, in words.")
    eligible: list[str] = Field(default_factory=list, description="Clusters that could take it.")
    excluded: list[str] = Field(
        default_factory=list, description="Clusters left out by earlier failovers of it."
    )
    ran_on: str | None = None
    flow_run_id: str | None = None
    outcome: RouteOutcome = "waiting"
    error: str = Field("", description="Why it failed, timed out or was failed over.")


class DeadLetterRecord(BaseModel):
    """A submodel that exhausted its failovers: its run in the paused dead-letter queue."""

    submodel_id: str
    flow_run_id: str = Field(description="The run waiting in the dead-letter queue.")
    work_queue: str
    error: str = Field(description="Its last error.")
    tried: list[str] = Field(default_factory=list, description="Clusters it failed on.")


class RoutingSummary(BaseModel):
    """The routing of a run: the directory, every decision, the dead-letter entries and how
    the split was sized."""

    directory: str
    decisions: list[RouteRecord] = Field(default_factory=list)
    dead_letter: list[DeadLetterRecord] = Field(default_factory=list)
    split_basis: str = Field("", description="What sized the split (largest eligible node, area).")
