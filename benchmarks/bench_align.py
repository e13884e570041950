"""Benchmark: the joint alignment of 10, 100 and 400 submodels against one Umeyama per overlap.

Prints, per size: the wall time of ``align_submodels`` (one similarity per submodel, solved jointly
over all overlaps by robust least squares, with outlier rounds and residual records), and of the
named baseline, one closed-form Umeyama similarity per overlap on its shared cameras (what a
pairwise chain would do, without any joint solve, gauge or robustness), then their ratio; and the
largest overlap rms after the joint solve.

Blocks: synthetic, from ``tests/align_blocks.py``: a grid of submodels of 120 m squares with 25 m
overlap, shots every 20 m (about 48 cameras per submodel), each submodel off by a random
similarity (1 m, 0.3 deg, 0.2 %) plus 2 cm camera noise.

With ``--survey DIR`` (the survey folder of a real run, e.g. brighton made with
``prefect-odm reconstruct ../shared/data/brighton_beach_1600/images -o OUT --split 10
--split-overlap-m 20``; ``--survey reconstruct`` makes that run first, in a temporary folder), it
instead measures the alignment wired into the merge on that run, all in this process:

* the alignment's cost (``build_alignment``: cameras, refinement from the products, ground
  heights) against the named baseline, the merge itself (orthophoto, DSM and point cloud merges
  with the alignment applied), and their ratio (issue 11: at most 20 %);
* before and after alignment, per overlap: the orthophoto shift between neighbours (phase
  correlation on 50 m and 20 m tiles), the DSM disagreement p90 and the median height step;
* the issue's known transform (3 m shift, 1.5 m height, 1 deg tilt, 0.2 % scale) applied to the
  second submodel's products and cameras, then aligned again: how closely it is recovered.

Usage: python benchmarks/bench_align.py [--sizes 10 100 400] [--repeat 3]
       python benchmarks/bench_align.py --survey DIR|reconstruct
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the block generator
sys.path.insert(0, str(Path(__file__).resolve().parent))

from align_blocks import make_block  # noqa: E402
from bench_align_real import bench_survey  # noqa: E402

from prefect_odm.align import Similarity, align_submodels, shared_cameras, umeyama  # noqa: E402


def grid_shape(n: int) -> tuple[int, int]:
    """The most square ``nx`` x ``ny`` grid with ``nx * ny == n``."""
    ny = max(d for d in range(1, int(math.isqrt(n)) + 1) if n % d == 0)
    return n // ny, ny


def best_of(repeat: int, fn) -> float:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10, 100, 400])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--survey", help="a real run's survey folder, or 'reconstruct'")
    parser.add_argument(
        "--no-bowl", action="store_true", help="with --survey: planes only, no bowl per submodel"
    )
    args = parser.parse_args()
    if args.survey:
        bench_survey(args.survey, bowl=not args.no_bowl)
        return
    rng = np.random.default_rng(0)
    print(
        f"{'submodels':>9} {'overlaps':>8} {'cameras':>8} {'joint s':>9} {'pairwise s':>10} {'ratio':>6} {'rms m':>6}"
    )
    for n in args.sizes:
        block = make_block(*grid_shape(n))
        errors = {
            sid: Similarity.from_parameters(
                rng.normal(0, np.radians(0.3), 3),
                rng.normal(0, 0.002),
                rng.normal(0, 1.0, 3),
                block.centroid(sid),
            )
            for sid in block.members
        }
        tables = block.tables(errors, noise_m=0.02)
        pairs = shared_cameras(tables, min_shared=3)
        result = align_submodels(tables)
        joint = best_of(args.repeat, lambda tables=tables: align_submodels(tables))
        pairwise = best_of(
            args.repeat,
            lambda pairs=pairs: [umeyama(p.second_centres, p.first_centres) for p in pairs],
        )
        cams = sum(len(t.names) for t in tables)
        rms = max(o.rms_after_m for o in result.overlaps)
        print(
            f"{n:>9} {len(pairs):>8} {cams:>8} {joint:>9.3f} {pairwise:>10.4f} {joint / pairwise:>6.0f} {rms:>6.3f}"
        )


if __name__ == "__main__":
    main()
