"""The cluster directory as a Prefect block (every cluster a team runs; see
:mod:`prefect_odm.clusters.directory`)."""

from __future__ import annotations

from typing import cast

from prefect.blocks.core import Block
from pydantic import Field, ValidationError

from prefect_odm.clusters.directory import (
    DEAD_LETTER_QUEUE,
    GLOBAL_QUEUE,
    NAME_PATTERN,
    OVERFLOW_FRACTION,
    ClusterDirectory,
    ClusterSpec,
)
from prefect_odm.errors import InputError


class ClusterDirectoryBlock(Block):
    """Every processing cluster a team runs: nodes, region, cost, memory, work queue, groups.

    Tokens stay in the ``NodeODM Pool`` blocks each cluster names; this block holds none.
    """

    _block_type_name = "prefect-odm Cluster Directory"
    _block_type_slug = "prefect-odm-cluster-directory"
    _description = "The processing clusters the router chooses among, and the overflow rule."

    clusters: list[ClusterSpec] = Field(description="The clusters, in any order.")
    global_queue: str = Field(
        GLOBAL_QUEUE, pattern=NAME_PATTERN, description="Overflow queue read after each own queue."
    )
    dead_letter_queue: str = Field(
        DEAD_LETTER_QUEUE, pattern=NAME_PATTERN, description="Paused queue of dead submodels."
    )
    overflow_fraction: float = Field(
        OVERFLOW_FRACTION,
        gt=0,
        le=1,
        description="Share of memory under which a cluster takes work.",
    )

    def directory(self) -> ClusterDirectory:
        """The block's contents as the pure :class:`ClusterDirectory` (validated: unique names
        and queues)."""
        return ClusterDirectory(
            clusters=self.clusters,
            global_queue=self.global_queue,
            dead_letter_queue=self.dead_letter_queue,
            overflow_fraction=self.overflow_fraction,
        )


def load_cluster_directory(name: str) -> ClusterDirectory:
    """The directory saved in the :class:`ClusterDirectoryBlock` called ``name``.

    Raises:
        InputError: no such block, or its clusters repeat a name or queue.
    """
    try:
        block = ClusterDirectoryBlock.load(name)
    except ValueError as exc:
        raise InputError(f"no cluster directory block named {name!r}") from exc
    try:
        return cast(ClusterDirectoryBlock, block).directory()
    except ValidationError as exc:
        said = "; ".join(str(e["msg"]).removeprefix("Value error, ") for e in exc.errors())
        raise InputError(f"cluster directory {name!r}: {said}") from None
