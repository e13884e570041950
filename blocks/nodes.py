"""Blocks describing NodeODM processing nodes and pools of them."""

from __future__ import annotations

from typing import Any, cast

from prefect.blocks.core import Block, schema_extra
from pydantic import ConfigDict, Field, SecretStr

from prefect_odm.errors import InputError
from prefect_odm.nodes.backend import NodeSettings


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


def _pool_schema_extra(schema: dict[str, Any], model: type[Block]) -> None:
    """Prefect's block schema, with every field of ``nodes`` secret (``nodes.*``).

    Prefect hides a secret field of a nested model only where the path has no list in it: the
    ``nodes.token`` it finds for ``list[NodeODM]`` matches nothing in the stored data, and the
    tokens came back in clear from ``/block_documents`` and on the Blocks page (issue 16). The
    wildcard hides the node list in API answers and the UI; ``Block.load`` still gets it whole.
    """
    schema_extra(schema, model)
    schema["secret_fields"] = sorted({*schema.get("secret_fields", []), "nodes.*"})


class NodeODMPool(Block):
    """A named group of NodeODM nodes that a run places submodels on.

    Its ``nodes`` (URLs and tokens) are secret: the Prefect UI and API show them obfuscated.
    """

    model_config = ConfigDict(json_schema_extra=_pool_schema_extra)

    _block_type_name = "NodeODM Pool"
    _block_type_slug = "nodeodm-pool"
    _description = "A pool of NodeODM nodes; each submodel is placed on the best-fitting node."

    nodes: list[NodeODM] = Field(description="The nodes of the pool.")
    concurrency_limit_name: str = Field(
        default="prefect-odm-memory-gib",
        description="Prefect global concurrency limit whose slots stand for the pool's memory in GiB.",
    )

    def node_settings(self) -> dict[str, NodeSettings]:
        """Node public URL -> what the block says of it (token, memory, task slots), in the
        block's order."""
        from prefect_odm.nodes.client import public_url

        return {
            public_url(n.url): NodeSettings(
                token=n.token.get_secret_value() if n.token else None,
                memory_gib=n.memory_gib,
                max_parallel_tasks=n.max_parallel_tasks,
            )
            for n in self.nodes
        }


def load_pool_block(name: str) -> tuple[list[str], dict[str, NodeSettings]]:
    """Node URLs and settings from a saved :class:`NodeODMPool` block.

    Returns:
        (node public URLs, URL -> settings), ready for :func:`prefect_odm.nodes.cluster.connect_nodes`.

    Raises:
        InputError: no such block.
    """
    try:
        pool = NodeODMPool.load(name)
    except ValueError as exc:
        raise InputError(f"no NodeODM pool block named {name!r}") from exc
    # Block.load is sync here (called outside an event loop); the union is Prefect's
    # sync/async dispatch.
    settings = cast(NodeODMPool, pool).node_settings()
    return list(settings), settings
