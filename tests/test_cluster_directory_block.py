"""The cluster directory saved as a Prefect block on a real Prefect server and read back."""

from __future__ import annotations

import pytest
from prefect_odm.blocks import ClusterDirectoryBlock, load_cluster_directory

from prefect_odm.clusters.directory import ClusterSpec
from prefect_odm.errors import InputError

pytestmark = pytest.mark.integration


def test_the_directory_block_round_trips_and_refuses_what_it_cannot_use(prefect_api: str) -> None:
    a = ClusterSpec(name="a", work_pool="odm", nodes=["http://127.0.0.1:3001"], region="eu",
                    cost_per_node_hour=1.0, memory_gib=32.0, groups=["city"])  # fmt: skip
    b = ClusterSpec(name="b", work_pool="odm", node_pool="fleet-b", cost_per_node_hour=0.4)
    ClusterDirectoryBlock(clusters=[a, b]).save("test-clusters", overwrite=True)
    directory = load_cluster_directory("test-clusters")
    assert [c.name for c in directory.clusters] == ["a", "b"]
    assert directory.get("a") == a and directory.get("b").queue == "b"
    assert (directory.global_queue, directory.overflow_fraction) == ("global", 0.8)
    with pytest.raises(InputError, match="no cluster directory block named 'missing'"):
        load_cluster_directory("missing")
    ClusterDirectoryBlock(clusters=[a, a]).save("test-clusters-bad", overwrite=True)
    with pytest.raises(InputError, match="cluster directory 'test-clusters-bad': .*names repeat"):
        load_cluster_directory("test-clusters-bad")
