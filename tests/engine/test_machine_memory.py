"""The memory the built-in engine reports: the machine's, or its cgroup's limit when smaller
(a pod's ``resources.limits.memory``), read from cgroup folders laid out as the kernel lays them
out (the machine running the tests has no limit of its own to read)."""

from __future__ import annotations

from pathlib import Path

import psutil

from prefect_odm.engine.machine_memory import cgroup_memory_limit_bytes, usable_memory_bytes

GIB = 2**30


def _tree(root: Path, files: dict[str, str], membership: str) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    proc = root / "proc-self-cgroup"
    proc.write_text(membership)
    return proc


def test_cgroup_v2_takes_the_smallest_limit_on_the_way_to_the_root(tmp_path):
    root = tmp_path / "cgroup"
    proc = _tree(
        root,
        {
            "kubepods/memory.max": f"{16 * GIB}\n",
            "kubepods/pod1/memory.max": f"{8 * GIB}\n",
            "kubepods/pod1/c1/memory.max": "max\n",
        },
        "0::/kubepods/pod1/c1\n",
    )
    assert cgroup_memory_limit_bytes(root, proc) == 8 * GIB


def test_cgroup_v2_in_a_container_reads_its_namespace_root(tmp_path):
    """Inside a container the process sees itself at ``/`` and its limit at the mount's root."""
    root = tmp_path / "cgroup"
    proc = _tree(root, {"memory.max": f"{4 * GIB}\n"}, "0::/\n")
    assert cgroup_memory_limit_bytes(root, proc) == 4 * GIB


def test_cgroup_v1_unlimited_and_limited(tmp_path):
    root = tmp_path / "cgroup"
    membership = "4:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n"
    proc = _tree(
        root, {"memory/docker/abc/memory.limit_in_bytes": "9223372036854771712\n"}, membership
    )
    assert cgroup_memory_limit_bytes(root, proc) is None
    (root / "memory/docker/abc/memory.limit_in_bytes").write_text(f"{3 * GIB}\n")
    assert cgroup_memory_limit_bytes(root, proc) == 3 * GIB


def test_no_cgroup_file_system_means_the_machine_memory(tmp_path):
    proc = tmp_path / "nothing"
    assert cgroup_memory_limit_bytes(tmp_path / "none", proc) is None
    total = psutil.virtual_memory().total
    assert usable_memory_bytes(tmp_path / "none", proc) == total
    root = tmp_path / "cgroup"
    small = _tree(root, {"memory.max": f"{GIB}\n"}, "0::/\n")
    assert usable_memory_bytes(root, small) == min(total, GIB)
