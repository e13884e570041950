"""Benchmark: a synthetic survey over a 150 m slope in 10 submodels, merged (issue 11).

Renders ``tests/synthetic_survey.py``'s survey (144 nadir images 70 m above a plane rising
150 m west to east, GPS noise ``--gps-sigma-m`` per axis) and reconstructs it with the built-in
engine in three ways, each through the ``reconstruct`` flow into its own output:

* ``direct``: the direct pipeline, heights above ground in XMP ``Camera:AboveGroundAltitude``
  (its DSM follows the cameras' ground heights);
* ``direct-plane`` (the named baseline: what the direct pipeline did before, one plane per
  submodel): the same images without the height above ground, so only DJI's RelativeAltitude
  (above take-off) is there;
* ``sfm``: structure from motion (pycolmap), minutes on 2 cores.

Prints per run: the merged DSM's range against the truth's over the same cells (and the error
in %), median and p99 |DSM - truth|, the step |dz(a) - dz(b)| between neighbouring cells owned
by different submodels (max, p99) against the same between cells of one submodel, the wall time,
and each run's range error over the baseline's.

Usage: python benchmarks/bench_slope.py [--work DIR] [--runs direct direct-plane sfm]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the survey generator

from synthetic_survey import SlopeFigures, SlopeSurvey, slope_figures, write_slope_survey  # noqa: E402

RUNS = ("direct", "direct-plane", "sfm")


def run_one(name: str, work: Path, gps_sigma_m: float) -> tuple[SlopeFigures, float, int]:
    """Write the survey for run ``name``, reconstruct and merge it; (figures, seconds, submodels)."""
    from prefect_odm.flows import reconstruct

    from prefect_odm.models import ProcessingOptions

    survey = SlopeSurvey(gps_sigma_m=gps_sigma_m, above_ground_tag=name != "direct-plane")
    images = work / f"images-{'plane' if name == 'direct-plane' else 'agl'}"
    if not images.exists():
        write_slope_survey(images, survey)
    pipeline = "sfm" if name == "sfm" else "direct"
    start = time.perf_counter()
    manifest = reconstruct(
        images=str(images),
        output=str(work / f"out-{name}"),
        split=14,
        split_overlap_m=10,
        options=ProcessingOptions(pipeline=pipeline),
    )
    seconds = time.perf_counter() - start
    dsm = Path(manifest.products["dsm"])
    figures = slope_figures(dsm, dsm.parents[1] / "plan" / "plan.json", survey)
    return figures, seconds, len(manifest.submodels)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=None, help="folder for images and outputs")
    parser.add_argument("--runs", nargs="+", choices=RUNS, default=list(RUNS))
    parser.add_argument("--gps-sigma-m", type=float, default=0.5)
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="bench-slope-"))
    work.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("PREFECT_ODM_HOME", str(work / "home"))
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    print(f"work folder {work}; GPS noise {args.gps_sigma_m} m per axis")
    results: dict[str, SlopeFigures] = {}
    for name in args.runs:
        f, seconds, submodels = run_one(name, work, args.gps_sigma_m)
        results[name] = f
        print(
            f"{name:>12}: {submodels} submodels, {seconds:.0f} s; range {f.range_m:.2f} m vs "
            f"truth {f.truth_range_m:.2f} m ({f.range_error_pct:.2f} %); |dz| median "
            f"{f.median_abs_dz_m:.3f} p99 {f.p99_abs_dz_m:.3f} m; seam step max "
            f"{f.seam_step_max_m:.3f} p99 {f.seam_step_p99_m:.3f} m ({f.seam_pairs} pairs; "
            f"inside p99 {f.inner_step_p99_m:.3f} m); largest level step between neighbours "
            f"(median across their seam) {f.seam_offset_max_m:.3f} m",
            flush=True,
        )
    base = results.get("direct-plane")
    if base is not None:
        for name, f in results.items():
            if name != "direct-plane":
                ratio = f.range_error_pct / base.range_error_pct if base.range_error_pct else 0.0
                print(f"{name}: range error / direct-plane baseline's = {ratio:.4f}")


if __name__ == "__main__":
    main()
