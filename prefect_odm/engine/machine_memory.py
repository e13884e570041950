"""The memory this process may use: the machine's, or less where a cgroup limits it.

In a container (a Kubernetes pod with ``resources.limits.memory``, ``docker run --memory``) the
machine's total (``psutil``, like NodeODM's ``os.totalmem()``) is the host's, and a planner that
packs submodels by it gets the node killed for memory. The kernel's own limit is read instead,
the smallest on the way from this process's cgroup to the root:

- cgroup v2: ``memory.max`` (``max`` when unlimited) in each folder of the unified hierarchy,
  from ``/proc/self/cgroup``'s ``0::PATH`` up;
- cgroup v1: ``memory.limit_in_bytes`` in each folder of the memory controller's hierarchy,
  from the ``memory`` line's path up (an unlimited one reads about ``2**63``).

Source: the kernel's cgroup documentation (``Documentation/admin-guide/cgroup-v2.rst``,
"memory.max"; ``cgroup-v1/memory.rst``, "limit_in_bytes").
"""

from __future__ import annotations

from pathlib import Path

import psutil

CGROUP_ROOT = Path("/sys/fs/cgroup")
"""Where the cgroup hierarchies are mounted."""

PROC_CGROUP = Path("/proc/self/cgroup")
"""This process's cgroup membership, one ``ID:CONTROLLERS:PATH`` line per hierarchy."""


def _read_limit_bytes(path: Path) -> int | None:
    """A limit file's value in bytes; None when absent, unreadable, ``max`` or unlimited."""
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    if not text.isdigit():
        return None  # "max": no limit
    value = int(text)
    return value if 0 < value < 2**62 else None  # v1's unlimited is about 2**63


def _memberships(proc_cgroup: Path) -> dict[str, str]:
    """Controller (``""`` for the v2 unified hierarchy) -> this process's cgroup path."""
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return {}
    found: dict[str, str] = {}
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) == 3:
            for controller in parts[1].split(",") if parts[1] else [""]:
                found[controller] = parts[2]
    return found


def _up_from(base: Path, cgroup_path: str) -> list[Path]:
    """``base/cgroup_path`` and every folder above it up to ``base`` (the container's view
    of its own cgroup is often the namespace root, so ``base`` is always included)."""
    parts = [p for p in cgroup_path.split("/") if p]
    return [base.joinpath(*parts[:n]) for n in range(len(parts), -1, -1)]


def cgroup_memory_limit_bytes(
    cgroup_root: Path = CGROUP_ROOT, proc_cgroup: Path = PROC_CGROUP
) -> int | None:
    """The smallest memory limit of this process's cgroups, bytes; None when none is set.

    Args:
        cgroup_root: where the hierarchies are mounted (a test gives a folder of its own).
        proc_cgroup: the membership file (``/proc/self/cgroup``).

    Returns:
        The limit in bytes, or None (no cgroup limit, or no cgroup file system).
    """
    member = _memberships(proc_cgroup)
    limits: list[int] = []
    if "" in member:
        for folder in _up_from(cgroup_root, member[""]):
            limit = _read_limit_bytes(folder / "memory.max")
            if limit is not None:
                limits.append(limit)
    v1 = cgroup_root / "memory"
    if "memory" in member or v1.is_dir():
        for folder in _up_from(v1, member.get("memory", "/")):
            limit = _read_limit_bytes(folder / "memory.limit_in_bytes")
            if limit is not None:
                limits.append(limit)
    return min(limits) if limits else None


def usable_memory_bytes(cgroup_root: Path = CGROUP_ROOT, proc_cgroup: Path = PROC_CGROUP) -> int:
    """The memory this process may use, bytes: the machine's total, or a smaller cgroup limit.

    Args:
        cgroup_root: see :func:`cgroup_memory_limit_bytes`.
        proc_cgroup: see :func:`cgroup_memory_limit_bytes`.
    """
    total = int(psutil.virtual_memory().total)
    limit = cgroup_memory_limit_bytes(cgroup_root, proc_cgroup)
    return total if limit is None else min(total, limit)
