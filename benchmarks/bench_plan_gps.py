"""Benchmark: ``plan_split`` of a city-sized survey, GPS checks included.

Builds the synthetic survey of ``bench_plan_read.py`` (brighton_beach_1600's 18 scanned records
copied onto tiles 300 m apart; every tile shares the 18 capture times, so the whole survey is
one flight for the GPS checks) and prints, per size, the wall and CPU time of ``plan_split``
(CPU time: what a loaded shared machine does not inflate), of its GPS checks alone
(``plan.checks.gps_warnings``) and the process's peak RSS so far. The named baselines, run in
the same process: with the overlap unset, ``plan_split`` given the width it chose (one width
planned, no widening search); and scipy's exact ``theilslopes`` (the 0.x altitude trend,
O(n^2) pairwise slopes) on the same flight's altitudes at ``--baseline-images`` (it cannot run
at 50,000: 1.25e9 slopes, about 10 GiB per array), against our ``theil_sen_slope`` there.

Usage: python benchmarks/bench_plan_gps.py [--images 20000 50000] [--split 100]
       [--baseline-images 8000] [--overlap-m M]
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

import numpy as np

from prefect_odm.plan.checks import gps_warnings
from prefect_odm.plan.planning import plan_split
from prefect_odm.survey.gps_quality import theil_sen_slope
from prefect_odm.survey.scan import scan_images

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_plan_read import DATA, synthetic_survey  # noqa: E402


def rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, nargs="+", default=[20000, 50000])
    parser.add_argument("--split", type=int, default=100)
    parser.add_argument("--baseline-images", type=int, default=8000)
    parser.add_argument(
        "--overlap-m",
        type=float,
        default=None,
        help="--split-overlap-m (default: unset, the planner widens it until every seam ties,"
        " as `prefect-odm plan` does; 20 m is refused at 20,000 images)",
    )
    args = parser.parse_args()
    base = scan_images(str(DATA / "brighton_beach_1600" / "images"))
    print(f"after scanning brighton: peak RSS {rss_mib():.0f} MiB")
    for n in args.images:
        survey = synthetic_survey(base, n)
        t0, c0 = time.perf_counter(), time.process_time()
        plan = plan_split(survey, split=args.split, split_overlap_m=args.overlap_m)
        t_plan, c_plan = time.perf_counter() - t0, time.process_time() - c0
        width = plan.split_overlap_m
        if args.overlap_m is None:  # the named baseline: one width planned, no widening search
            t0, c0 = time.perf_counter(), time.process_time()
            plan_split(survey, split=args.split, split_overlap_m=width)
            t_one, c_one = time.perf_counter() - t0, time.process_time() - c0
            print(
                f"n={n:>6} baseline plan_split given {width:g} m: {t_one:6.2f} s wall, "
                f"{c_one:6.2f} CPU-s; unset / given {c_plan / c_one:.2f}x CPU",
                flush=True,
            )
        x = np.arange(n, dtype=float)
        t0 = time.perf_counter()
        found, _ = gps_warnings([(im.name, im) for im in survey.images], x, x)
        t_gps = time.perf_counter() - t0
        print(
            f"n={n:>6} plan_split {t_plan:6.2f} s wall, {c_plan:6.2f} CPU-s ({len(plan.submodels)} submodels, "
            f"overlap {plan.split_overlap_m:g} m asked {plan.split_overlap_asked_m}, "
            f"{len(plan.gps_warnings)} GPS warnings); GPS checks alone {t_gps:5.2f} s "
            f"({len(found)} warnings); peak RSS so far {rss_mib():.0f} MiB",
            flush=True,
        )
    from scipy.stats import theilslopes

    m = args.baseline_images
    rng = np.random.default_rng(0)
    h = 300.0 + 0.001 * np.arange(m) + rng.normal(0.0, 1.0, m)
    before = rss_mib()
    t0 = time.perf_counter()
    exact = theilslopes(h, np.arange(m), alpha=0.95)
    t_exact = time.perf_counter() - t0
    after = rss_mib()
    t0 = time.perf_counter()
    ours = theil_sen_slope(h)
    t_ours = time.perf_counter() - t0
    print(
        f"baseline at n={m}: scipy theilslopes {t_exact:.2f} s (peak RSS {before:.0f} -> "
        f"{after:.0f} MiB) slope {exact.slope:.6f} [{exact.low_slope:.6f}, "
        f"{exact.high_slope:.6f}]; ours {t_ours:.3f} s slope {ours[0]:.6f} "
        f"[{ours[1]:.6f}, {ours[2]:.6f}]; time ratio {t_exact / t_ours:.0f}x"
    )


if __name__ == "__main__":
    main()
