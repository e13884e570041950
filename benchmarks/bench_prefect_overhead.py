"""Prefect's own overheads that shape the test suite and small runs (Prefect 3.9.1, SQLite API).

Measures, against one temporary SQLite-backed API (``prefect_test_harness``):

* the heartbeat tail: N trivial sync flow runs with the default heartbeat (180 s) versus the
  heartbeat turned off (``PREFECT_FLOWS_HEARTBEAT_FREQUENCY=None``, the baseline);
* SQLite write contention: K trivial subflows started at once from a ThreadPoolTaskRunner versus
  the same K run one after the other (concurrent writes answer HTTP 503 and the client backs off).

Run: ``python benchmarks/bench_prefect_overhead.py [--runs 10] [--concurrent 4]``.
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10, help="sequential flow runs per variant")
    parser.add_argument("--concurrent", type=int, default=4, help="subflows started at once")
    args = parser.parse_args()

    from prefect import flow, task
    from prefect.cache_policies import NO_CACHE
    from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings
    from prefect.task_runners import ThreadPoolTaskRunner
    from prefect.testing.utilities import prefect_test_harness

    @flow(name="bench-trivial")
    def trivial(i: int) -> int:
        return i

    @task(cache_policy=NO_CACHE)
    def run_child(i: int) -> int:
        return trivial(i)

    @flow(name="bench-parallel", task_runner=ThreadPoolTaskRunner(max_workers=args.concurrent))
    def parallel(k: int) -> list[int]:
        return [f.result() for f in [run_child.submit(i) for i in range(k)]]

    @flow(name="bench-serial")
    def serial(k: int) -> list[int]:
        return [trivial(i) for i in range(k)]

    t0 = time.perf_counter()
    with prefect_test_harness(server_startup_timeout=120):
        startup = time.perf_counter() - t0
        trivial(-1)  # warm-up: client, flow registration
        timings: dict[str, float] = {}
        with temporary_settings({PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}):
            t = time.perf_counter()
            for i in range(args.runs):
                trivial(i)
            timings["heartbeat off"] = (time.perf_counter() - t) / args.runs
        with temporary_settings({PREFECT_FLOWS_HEARTBEAT_FREQUENCY: 180}):
            t = time.perf_counter()
            for i in range(args.runs):
                trivial(i)
            timings["heartbeat 180 s"] = (time.perf_counter() - t) / args.runs
        with temporary_settings({PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}):
            t = time.perf_counter()
            serial(args.concurrent)
            timings["serial subflows"] = time.perf_counter() - t
            t = time.perf_counter()
            parallel(args.concurrent)
            timings["concurrent subflows"] = time.perf_counter() - t

    base = timings["heartbeat off"]
    print(f"SQLite API start-up: {startup:.1f} s")
    print(f"trivial sync flow run, heartbeat off (baseline): {base:.2f} s per run")
    print(
        f"trivial sync flow run, heartbeat 180 s: {timings['heartbeat 180 s']:.2f} s per run "
        f"(ratio {timings['heartbeat 180 s'] / base:.2f}x baseline, tail "
        f"{timings['heartbeat 180 s'] - base:+.2f} s)"
    )
    print(
        f"{args.concurrent} subflows one after the other (baseline): "
        f"{timings['serial subflows']:.2f} s; "
        f"started at once: {timings['concurrent subflows']:.2f} s "
        f"(ratio {timings['concurrent subflows'] / timings['serial subflows']:.2f}x)"
    )


if __name__ == "__main__":
    main()
