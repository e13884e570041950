"""How the cluster reads a node (capacity, token, options) and which products a run merges:
node fakes for the rules, the built-in engine on loopback for the token message."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from prefect_odm.errors import InputError, NodeError
from prefect_odm.models import ProcessingOptions
from prefect_odm.nodes.backend import NodeInfo, NodeOption, NodeSettings
from prefect_odm.nodes.capacity import memory_for_auto_split
from prefect_odm.nodes.cluster import check_node_options, connect_nodes
from prefect_odm.run_policy import asked_products

CLUSTERODM_INFO = {
    "version": "1.5.3",
    "taskQueueCount": 0,
    "totalMemory": 99_999_999_999,
    "availableMemory": 99_999_999_999,
    "cpuCores": 99_999_999_999,
    "maxImages": 99_999_999_999,
    "maxParallelTasks": 99_999_999_999,
    "engine": "odm",
    "engineVersion": "3.5.4",
}
NODE_OPTIONS = [
    {"name": "dsm", "type": "bool", "value": "false", "domain": "bool"},
    {"name": "dtm", "type": "bool", "value": "false", "domain": "bool"},
    {"name": "orthophoto-resolution", "type": "float", "value": "5", "domain": "float > 0.0"},
]


class FakeNode:
    """What :func:`connect_nodes` and :func:`check_node_options` ask of a node."""

    def __init__(self, url: str, info: dict[str, Any], error: Exception | None = None) -> None:
        self.url = url
        self._info = info
        self._error = error

    def info(self) -> NodeInfo:
        if self._error is not None:
            raise self._error
        return NodeInfo.from_json(self._info)

    def options(self) -> list[NodeOption]:
        return [NodeOption.from_json(o) for o in NODE_OPTIONS]


def connect(infos: dict[str, dict[str, Any]], **kw: Any):
    return connect_nodes(
        list(infos), client_factory=lambda url, token: FakeNode(url, infos[url]), **kw
    )


def test_clusterodm_placeholders_are_unknown_never_this_machines_memory(monkeypatch):
    import psutil

    def no_psutil() -> None:
        raise AssertionError("the flow machine's memory must not stand in for a node's")

    monkeypatch.setattr(psutil, "virtual_memory", no_psutil)
    url = "http://127.0.0.1:3000"
    cluster = connect({url: CLUSTERODM_INFO})
    (node,) = cluster.pool.nodes
    assert math.isinf(node.memory_gib) and node.max_parallel_tasks == 1
    assert cluster.memory_by_node == {url: None} and cluster.node_memory_gib == []
    with pytest.raises(InputError, match=rf"{url}.*memory_gib in the pool block"):
        memory_for_auto_split(cluster.memory_by_node)
    zero = connect({url: {**CLUSTERODM_INFO, "totalMemory": 0, "maxParallelTasks": -1}})
    assert zero.memory_by_node == {url: None} and zero.pool.nodes[0].max_parallel_tasks == 1


def test_pool_block_memory_wins_and_plausible_info_is_used():
    proxy, real = "http://127.0.0.1:3000", "http://127.0.0.1:3001"
    info = {**CLUSTERODM_INFO, "totalMemory": 16 * 2**30, "maxParallelTasks": 2}
    cluster = connect(
        {proxy: CLUSTERODM_INFO, real: info},
        settings={proxy: NodeSettings(memory_gib=12.0, max_parallel_tasks=3)},
    )
    assert cluster.memory_by_node == {proxy: 12.0, real: 14.4}
    assert [(n.memory_gib, n.max_parallel_tasks) for n in cluster.pool.nodes] == [
        (12.0, 3),
        (14.4, 2),
    ]
    assert memory_for_auto_split(cluster.memory_by_node) == [12.0, 14.4]


def test_refused_token_is_one_line_naming_the_node_and_where_to_set_it():
    url = "http://127.0.0.1:3000"
    refused = NodeError(
        "GET /info: Invalid authentication token: token does not match.", node_url=url
    )
    with pytest.raises(InputError) as info:
        connect_nodes([url], client_factory=lambda u, t: FakeNode(u, {}, refused))
    text = str(info.value)
    assert "\n" not in text and text.count(url) == 1 and not text.endswith(url)
    assert "pool block" in text and "PREFECT_ODM_NODE_TOKEN" in text and "; node" not in text


def test_refused_token_of_the_built_in_engine(tmp_path: Path, monkeypatch):
    from prefect_odm.engine.launch import start_engine

    monkeypatch.delenv("PREFECT_ODM_NODE_TOKEN", raising=False)
    monkeypatch.delenv("PREFECT_ODM_NODE_TOKENS", raising=False)
    with start_engine(tmp_path / "node", token="right", method="direct") as engine:
        with pytest.raises(InputError) as info:
            connect_nodes([engine.url], tokens={engine.url: "wrong"})
    text = str(info.value)
    assert "refused the token" in text and "; node" not in text and "\n" not in text


def test_options_are_checked_against_each_node_one_line_per_bad_option():
    url = "http://127.0.0.1:3000"
    clients = {url: FakeNode(url, CLUSTERODM_INFO)}
    good = ProcessingOptions(pipeline="direct").to_nodeodm()
    check_node_options(clients, good)  # ``pipeline``: the built-in engine's, ignored elsewhere
    bad = {**good, "orthophoto-resolution": -1, "dms": True}
    with pytest.raises(InputError) as info:
        check_node_options(clients, bad)
    lines = str(info.value).splitlines()
    assert lines[0] == f"2 option(s) not accepted by {url} (from its /options):"
    assert "orthophoto-resolution=-1" in lines[1] and "dms=True" in lines[2]
    assert "did you mean" in lines[2] and "dsm" in lines[2]


def test_only_asked_products_are_merged():
    returned = {"orthophoto": "o.tif", "dsm": "dsm.tif", "dtm": "dtm.tif", "point_cloud": "p.laz"}
    default = ProcessingOptions().to_nodeodm()
    assert asked_products(returned, default) == {
        "orthophoto": "o.tif",
        "dsm": "dsm.tif",
        "point_cloud": "p.laz",
    }
    with_dtm = ProcessingOptions(dtm=True).to_nodeodm()
    assert asked_products(returned, with_dtm) == returned
