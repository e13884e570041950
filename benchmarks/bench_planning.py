"""Benchmark: split planning of 100,000 and 1,000,000 camera positions.

Prints, per size: wall time and peak traced memory (numpy + Python allocations, tracemalloc) of
``plan_from_positions`` (balanced bisection + Voronoi core areas + overlap in metres), and of the
named baseline, a plain scikit-learn ``KMeans`` (n_init=1, random_state=0, k = n / split) on the
same points in the same process; then the time ratio and the cluster-size spread of both (what
OpenDroneMap's own split gets from unbalanced k-means).

Positions: a synthetic city-scale survey made of lawnmower blocks (15 m shots, 40 m lines,
0.5 m GPS noise), in metres.

Usage: python benchmarks/bench_planning.py [--sizes 100000 1000000] [--split 100]
       [--overlap-m 50] [--kmeans-max-iter N] [--kmeans-init k-means++|random] [--no-memory]

At 1,000,000 points a full KMeans (k-means++ init of 10,000 centres, up to 300 iterations)
takes far too long on 2 cores; run that size with ``--kmeans-init random --kmeans-max-iter 10``
and read the ratio as a lower bound.
"""

from __future__ import annotations

import argparse
import gc
import os
import resource
import time
import tracemalloc

import numpy as np

from prefect_odm.plan.planning import plan_from_positions


def synthetic_survey(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``n`` positions in lawnmower blocks of 400 shots (20 per line, 20 lines), metres."""
    rng = np.random.default_rng(seed)
    block = np.array([(j * 15.0, i * 40.0) for i in range(20) for j in range(20)])
    blocks = -(-n // len(block))
    side = int(np.ceil(np.sqrt(blocks)))
    offsets = np.array([(b % side * 300.0, b // side * 800.0) for b in range(blocks)])
    xy = (offsets[:, None, :] + block[None, :, :]).reshape(-1, 2)[:n]
    xy = xy + rng.normal(0.0, 0.5, size=xy.shape)
    return xy[:, 0] + 500_000.0, xy[:, 1] + 4_000_000.0


def _timed(fn):
    gc.collect()
    t0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    _timed.cpu = time.process_time() - c0  # type: ignore[attr-defined]
    return out, time.perf_counter() - t0


def _peak_mib(fn) -> float:
    gc.collect()
    tracemalloc.start()
    try:
        fn()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--split", type=int, default=100)
    parser.add_argument("--overlap-m", type=float, default=50.0)
    parser.add_argument("--kmeans-max-iter", type=int, default=300)
    parser.add_argument(
        "--kmeans-init",
        default="k-means++",
        choices=["k-means++", "random"],
        help="random + a low max-iter gives a LOWER BOUND of KMeans time at 1M points",
    )
    parser.add_argument("--no-memory", action="store_true", help="skip the tracemalloc runs")
    args = parser.parse_args()
    from sklearn.cluster import KMeans

    print(f"cpus={os.cpu_count()} split={args.split} overlap_m={args.overlap_m}", flush=True)
    for n in args.sizes:
        x, y = synthetic_survey(n)
        k = max(1, round(n / args.split))

        def ours(x=x, y=y):
            return plan_from_positions(x, y, split=args.split, split_overlap_m=args.overlap_m)

        def baseline(x=x, y=y, k=k):
            return KMeans(
                n_clusters=k,
                n_init=1,
                random_state=0,
                max_iter=args.kmeans_max_iter,
                init=args.kmeans_init,
            ).fit(np.column_stack([x, y]))

        plan, t_ours = _timed(ours)
        counts = plan.core_counts()
        print(
            f"n={n:>9,d} ours: {t_ours:7.2f} s ({_timed.cpu:.2f} CPU-s)  {plan.k} submodels, core images "
            f"min {counts.min()} max {counts.max()}, "
            f"overlap images mean {plan.overlap_counts().mean():.1f}",
            flush=True,
        )
        km, t_km = _timed(baseline)
        km_counts = np.bincount(km.labels_, minlength=k)
        print(
            f"            sklearn KMeans(k={k}, init={args.kmeans_init}, "
            f"max_iter={args.kmeans_max_iter}, ran {km.n_iter_} iterations): {t_km:7.2f} s "
            f"({_timed.cpu:.2f} CPU-s, all cores)  "
            f"cluster sizes min {km_counts.min()} max {km_counts.max()} "
            f"(no core areas, no overlap)",
            flush=True,
        )
        print(f"            time ratio KMeans / ours = {t_km / t_ours:.1f}x", flush=True)
        if not args.no_memory:
            m_ours = _peak_mib(ours)
            m_km = _peak_mib(baseline)
            print(
                f"            peak traced memory: ours {m_ours:.0f} MiB, KMeans {m_km:.0f} MiB",
                flush=True,
            )
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"process max RSS {rss:.0f} MiB")


if __name__ == "__main__":
    main()
