"""Benchmark: how evenly the submodels of a plan share the work, with rebalanced cores.

For the real flight layouts in ``../shared/data/layouts`` (agung-2: 1,817 positions,
freetown-1: 1,452) at each ``--split`` and the default 50 m overlap, plans the positions twice
in the same process: the named baseline, equal cores (``balance_load=False``, what 0.2.0
planned), then rebalanced cores (the default). Prints, for both: submodels, core sizes, images
each submodel processes (core + overlap; min-max, largest over the mean), images processed per
image, inner against edge submodels (an edge submodel's core area reaches the survey's
boundary), planning time, and the ratio of the largest submodel rebalanced against equal.

Usage: python benchmarks/bench_plan_balance.py [--splits 50 100 200] [--overlap-m 50]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from prefect_odm.plan.planning import PositionPlan, plan_from_positions
from prefect_odm.survey.layouts import read_layout

LAYOUTS = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "layouts"


def _inner_edge(plan: PositionPlan) -> tuple[float, float]:
    """Mean load of inner and of edge submodels (edge: core area touches the clip boundary)."""
    assert plan.core_areas is not None and plan.clip is not None
    boundary = plan.clip.boundary
    loads = np.array([len(m) for m in plan.members], dtype=np.float64)
    edge = np.array([a.distance(boundary) < 1e-6 for a in plan.core_areas])
    inner = loads[~edge].mean() if (~edge).any() else float("nan")
    return float(inner), float(loads[edge].mean()) if edge.any() else float("nan")


def _row(label: str, plan: PositionPlan, n: int, seconds: float) -> str:
    cores = plan.core_counts()
    loads = np.array([len(m) for m in plan.members])
    inner, edge = _inner_edge(plan)
    return (
        f"  {label:<11} k={plan.k:<3} core {cores.min()}-{cores.max()}  "
        f"processed {loads.min()}-{loads.max()} (largest {loads.max() / loads.mean():.2f}x mean)  "
        f"{loads.sum() / n:.2f} per image  inner/edge {inner / edge:.2f}  {seconds:.2f} s"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--splits", type=int, nargs="+", default=[50, 100, 200])
    parser.add_argument("--overlap-m", type=float, default=50.0)
    args = parser.parse_args()
    for name in ("agung-2", "freetown-1"):
        x, y = read_layout(LAYOUTS / name).projected()
        for split in args.splits:
            print(f"{name}: {len(x)} positions, --split {split}, overlap {args.overlap_m:g} m")
            results = {}
            for label, balance in (("equal", False), ("rebalanced", True)):
                t0 = time.perf_counter()
                plan = plan_from_positions(
                    x, y, split=split, split_overlap_m=args.overlap_m, balance_load=balance
                )
                seconds = time.perf_counter() - t0
                results[label] = plan
                print(_row(label, plan, len(x), seconds))
            largest = {k: max(len(m) for m in p.members) for k, p in results.items()}
            print(
                f"  largest submodel rebalanced/equal: {largest['rebalanced'] / largest['equal']:.2f}"
            )


if __name__ == "__main__":
    main()
