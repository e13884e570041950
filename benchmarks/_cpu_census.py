"""Where a benchmark's CPU went: the NodeODM nodes, the Prefect server and its PostgreSQL, the
flow, and the whole machine (other users included), sampled every second (``bench_city.py``).

A process's CPU seconds are kept at their last sample, so one that exits before the end still
counts up to its last second. The machine's busy share is ``1 - idle`` of ``psutil.cpu_times``
over the window, against all its cores.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable

import psutil


def _cpu(proc: psutil.Process) -> float:
    times = proc.cpu_times()
    return times.user + times.system


class CpuCensus:
    """CPU seconds by group (``groups``: name -> a function giving that group's pids now),
    sampled every ``every_seconds`` from :meth:`start` to :meth:`stop`."""

    def __init__(
        self, groups: dict[str, Callable[[], Iterable[int]]], every_seconds: float = 1.0
    ) -> None:
        """Nothing sampled before :meth:`start`."""
        self.groups = groups
        self.every_seconds = every_seconds
        self.seconds: dict[str, dict[int, float]] = {g: {} for g in groups}
        self._first: dict[int, float] = {}
        self._procs: dict[int, psutil.Process] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cpu-census", daemon=True)
        self.wall = 0.0

    def start(self) -> CpuCensus:
        """Start sampling (the machine's CPU times and load average read now)."""
        self._t0 = time.monotonic()
        self._sys0 = psutil.cpu_times()
        self.load_start = os.getloadavg()[0]
        self._thread.start()
        return self

    def stop(self) -> None:
        """Take a last sample and stop."""
        self._stop.set()
        self._thread.join()
        self._sample()
        self.wall = time.monotonic() - self._t0
        self._sys1 = psutil.cpu_times()
        self.load_end = os.getloadavg()[0]

    def _run(self) -> None:
        while not self._stop.wait(self.every_seconds):
            self._sample()

    def _sample(self) -> None:
        for name, pids in self.groups.items():
            for pid in pids():
                try:
                    proc = self._procs.get(pid) or self._procs.setdefault(pid, psutil.Process(pid))
                    now = _cpu(proc)
                except psutil.Error:
                    continue
                self._first.setdefault(pid, now)
                self.seconds[name][pid] = now - self._first[pid]

    def report(self, tasks: int) -> str:
        """One paragraph: CPU seconds per group (and per task), the machine's busy share."""
        cores = psutil.cpu_count() or 1
        total = sum(self._sys1) - sum(self._sys0)
        idle = (self._sys1.idle - self._sys0.idle) + (
            getattr(self._sys1, "iowait", 0.0) - getattr(self._sys0, "iowait", 0.0)
        )
        busy = 1.0 - idle / max(1e-9, total)
        parts = []
        for name, by_pid in self.seconds.items():
            seconds = sum(by_pid.values())
            parts.append(
                f"{name} {seconds:.1f} s ({seconds / max(1, tasks):.2f} s per task, "
                f"{len(by_pid)} processes)"
            )
        ours = sum(sum(v.values()) for v in self.seconds.values())
        return (
            f"  CPU over the flow's {self.wall:.0f} s on {cores} cores "
            f"({cores * self.wall:.0f} CPU-s available): "
            + "; ".join(parts)
            + f"; all of them {ours:.0f} CPU-s ({ours / max(1e-9, cores * self.wall):.2f} of the "
            f"machine); the machine busy {busy:.2f} (others included); load average "
            f"{self.load_start:.1f} -> {self.load_end:.1f}"
        )
