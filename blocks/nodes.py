"""Blocks describing NodeODM processing nodes and pools of them."""

from __future__ import annotations

from prefect.blocks.core import Block
from pydantic import Field, SecretStr


class NodeODM(Block):
    """One NodeODM-API processing node (NodeODM, ClusterODM, or prefect-odm's built-in engine)."""

    _block_type_name = "NodeODM Node"
    _block_type_slug = "nodeodm-node"
    _description = "A NodeODM-API processing node: URL, token, memory and parallel task slots."

    url: str = Field(
        description="Base URL of the node, e.g. http://10.0.0.5:3000 (no token in it)."
    )
    token: SecretStr | None = Field(
        default=None, description="The node's token, sent only to this node."
    )
    memory_gib: float | None = Field(
        default=None,
        gt=0,
        description="Memory this library may use on the node, GiB; default: 90% of /info totalMemory.",
    )
    max_parallel_tasks: int | None = Field(
        default=None,
        ge=1,
        description="Tasks run at once on the node; default: /info maxParallelTasks.",
    )
    labels: list[str] = Field(
        default_factory=list, description="Free labels, e.g. 'gpu' or 'large'."
    )


class NodeODMPool(Block):
    """A named group of NodeODM nodes that a run places submodels on."""

    _block_type_name = "NodeODM Pool"
    _block_type_slug = "nodeodm-pool"
    _description = "A pool of NodeODM nodes; each submodel is placed on the best-fitting node."

    nodes: list[NodeODM] = Field(description="The nodes of the pool.")
    concurrency_limit_name: str = Field(
        default="prefect-odm-memory-gib",
        description="Prefect global concurrency limit whose slots stand for the pool's memory in GiB.",
    )
