"""Prefect blocks of prefect-odm (installed as ``prefect_odm.blocks``).

Registered through the ``prefect.collections`` entry point, so ``prefect block register -m
prefect_odm.blocks`` is not needed once the package is installed.
"""

from prefect_odm.blocks.clusters import ClusterDirectoryBlock, load_cluster_directory
from prefect_odm.blocks.nodes import NodeODM, NodeODMPool, load_pool_block

__all__ = [
    "ClusterDirectoryBlock",
    "NodeODM",
    "NodeODMPool",
    "load_cluster_directory",
    "load_pool_block",
]
