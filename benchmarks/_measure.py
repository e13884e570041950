"""Shared measuring helpers for the benchmark scripts (imported as ``_measure``)."""

from __future__ import annotations

import resource
from pathlib import Path


def peak_mib() -> float:
    """This process's peak resident memory, MiB.

    ``VmHWM`` of /proc/self/status belongs to the process image, whereas ``ru_maxrss`` survives
    ``exec`` and would report the parent's peak in a freshly spawned child.
    """
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
