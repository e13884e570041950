"""Issue 30's acceptance runs: a narrow split overlap on several built-in engines, through the
merge, as a user runs it, with the seams measured.

Starts ``--engines`` built-in engine nodes on 127.0.0.1 and runs ``prefect-odm reconstruct``
against them (``--nodes``) on Prefect's temporary server, as a user does, on one of:

* ``--survey brighton``: ``../shared/data/brighton_beach_1600/images`` (18 photos);
* ``--survey grid``: the issue's synthetic grid, rendered here (``tests/synthetic_survey.py``):
  ``--grid LINES PER_LINE`` nadir images (20 x 30 = 600 by default) 36 m between lines and 27 m
  between shots, 320 x 240 px with a 150 x 113 m footprint, over flat textured ground, with
  EXIF GPS and DJI XMP.

It prints the command's exit status and last line, the time of each stage (``scan``, ``plan``,
``process``, ``merge``, from the manifest), the plan's seams (shared images and what ties them),
the alignment's gates, and, per overlap, the orthophoto shift between the two submodels after
the applied alignment (phase correlation on 20 m tiles, ``merge.overlaps.ortho_shifts`` with
the manifest's corrections; 64 px tiles where the orthophotos are coarser than 31 cm) and its
median over the overlaps (the figure issue 30's acceptance holds to 0.2 m); beside it the
applied stage's feature-match figures from ``report.md``. A run the plan refuses prints its
one line and how long the refusal took.

The baseline, in the same process: ``prefect-odm plan`` of the same survey and split (the
decision alone); the ratio is the plan's share of the whole run.

Usage::

    python benchmarks/bench_narrow_overlap.py --survey brighton --split 6 --split-overlap-m 10
        [--pipeline sfm|direct] [--engines 2] [--work DIR] [--option cameras={}]
    python benchmarks/bench_narrow_overlap.py --survey grid --split 25 --split-overlap-m 10
        --pipeline direct --engines 6
    python benchmarks/bench_narrow_overlap.py --figures OUT/<survey fingerprint>
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import numpy as np
import rasterio

REPO = Path(__file__).resolve().parents[1]
BRIGHTON = REPO.parent / "shared" / "data" / "brighton_beach_1600" / "images"
sys.path.insert(0, str(REPO / "tests"))

from synthetic_survey import SlopeSurvey, write_slope_survey  # noqa: E402

from prefect_odm.align.report import AlignmentReport  # noqa: E402
from prefect_odm.engine.launch import start_engine  # noqa: E402
from prefect_odm.merge.overlaps import ortho_shifts  # noqa: E402
from prefect_odm.models import Manifest, SplitPlan  # noqa: E402


def grid(lines: int, per_line: int) -> SlopeSurvey:
    """The issue's grid: 36 x 27 m spacing, 150 m wide footprints (320 px at 100 m, f 213 px)."""
    return SlopeSurvey(
        lines=lines, per_line=per_line, line_spacing_m=36.0, shot_spacing_m=27.0,
        height_m=100.0, rise_m=0.0, width_px=320, height_px=240, focal_px=213.0,
    )  # fmt: skip


def seam_figures(survey_dir: Path) -> None:
    """The plan's seams, the gates and the orthophoto shifts after the applied alignment."""
    manifest = Manifest.model_validate_json((survey_dir / "manifest.json").read_text())
    plan = SplitPlan.model_validate_json((survey_dir / "plan" / "plan.json").read_text())
    ties: dict[str, int] = {}
    for p in plan.neighbours:
        ties[p.tied_by] = ties.get(p.tied_by, 0) + 1
    shared = sorted(p.shared_images for p in plan.neighbours)
    print(f"plan: {len(plan.submodels)} submodels at {plan.split_overlap_m:g} m, "
          f"{len(plan.neighbours)} seams, shared images {shared[0]}-{shared[-1]}, tied by {ties}")  # fmt: skip
    report: AlignmentReport | None = manifest.alignment
    if report is None:
        print("alignment: none (the merge did not align)")
        return
    print(f"alignment: {len(report.failures)} gates failed, accepted: {report.accepted}, "
          f"refinement: {'yes' if report.refinement is not None else 'no'}")  # fmt: skip
    # a fresh output folder holds one version of each submodel: submodels/<id>-<options hash>/
    orthos = {
        d.name.rsplit("-", 1)[0]: d / "odm_orthophoto.tif"
        for d in sorted((survey_dir / "submodels").iterdir())
    }
    # 20 m tiles, or 64 pixels where the orthophotos are coarser (the phase correlation's least)
    res_m = 0.0
    for path in orthos.values():
        with rasterio.open(path) as ds:
            res_m = max(res_m, float(ds.res[0]))
    tile_m = max(20.0, 64 * res_m)
    started = time.perf_counter()
    shifts = ortho_shifts(orthos, corrections=report.raster_corrections(), tile_m=tile_m)
    took = time.perf_counter() - started
    for (a, b), sh in sorted(shifts.items()):
        print(f"  {a}|{b}: orthophoto shift {sh.magnitude_m:.3f} m "
              f"({sh.dx_m:+.3f}, {sh.dy_m:+.3f}) over {sh.tiles} tiles of {tile_m:.0f} m")  # fmt: skip
    if not shifts:
        print(f"orthophoto shift: no overlap has enough clear {tile_m:.0f} m tiles")
        return
    final = report.final_stage()
    for seam in final.seams if final is not None else []:
        if seam.orthophoto is not None:
            o = seam.orthophoto
            print(f"  {seam.overlap}: feature matches (report.md) median displacement "
                  f"{float(np.hypot(*o.shift_m)):.3f} m ({o.shift_m[0]:+.3f}, "
                  f"{o.shift_m[1]:+.3f}), median length {o.median_m:.3f} m, {o.matches} matches")  # fmt: skip
    median = statistics.median(sh.magnitude_m for sh in shifts.values())
    worst = max(sh.magnitude_m for sh in shifts.values())
    print(f"orthophoto shift between submodels: median {median:.3f} m, max {worst:.3f} m "
          f"over {len(shifts)} of {len(plan.neighbours)} seams ({tile_m:.0f} m tiles, measured "
          f"in {took:.1f} s)")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--survey", choices=["brighton", "grid"], default="brighton")
    parser.add_argument("--grid", type=int, nargs=2, default=[20, 30], metavar=("LINES", "PER"))
    parser.add_argument("--split", default="6")
    parser.add_argument("--split-overlap-m", default="10")
    parser.add_argument("--pipeline", choices=["sfm", "direct"], default="sfm")
    parser.add_argument("--engines", type=int, default=2)
    parser.add_argument("--option", action="append", default=[], metavar="NAME=VALUE",
                        help="passed on to plan and reconstruct (cameras={}: no shared calibration)")  # fmt: skip
    parser.add_argument("--work", help="keep everything here (default: a temporary folder)")
    parser.add_argument("--figures", metavar="SURVEY_DIR", help="only print a run's seam figures")
    args = parser.parse_args()
    if args.figures:
        seam_figures(Path(args.figures))
        return
    work = Path(args.work or tempfile.mkdtemp(prefix="bench-narrow-"))
    work.mkdir(parents=True, exist_ok=True)
    if args.survey == "grid":
        images = work / f"grid-{args.grid[0]}x{args.grid[1]}"
        if not images.exists():
            t0 = time.perf_counter()
            write_slope_survey(images, grid(*args.grid))
            print(f"{args.grid[0] * args.grid[1]} grid images written in "
                  f"{time.perf_counter() - t0:.1f} s to {images}")  # fmt: skip
    else:
        images = BRIGHTON
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(PREFECT_HOME=str(work / "prefect-home"), PREFECT_ODM_HOME=str(work / "odm-home"),
               PREFECT_SERVER_ANALYTICS_ENABLED="false")  # fmt: skip
    asked = ["--split", args.split, "--split-overlap-m", args.split_overlap_m,
             "--pipeline", args.pipeline]  # fmt: skip
    for option in args.option:
        asked += ["--option", option]
    cli = [sys.executable, "-m", "prefect_odm.cli"]
    t0 = time.perf_counter()
    planned = subprocess.run([*cli, "plan", str(images), *asked, "--output", str(work / "plan")],
                             env=env, capture_output=True, text=True)  # fmt: skip
    plan_s = time.perf_counter() - t0
    said = (planned.stdout + planned.stderr).strip().splitlines()
    print(f"baseline: prefect-odm plan {plan_s:.1f} s, exit {planned.returncode}: "
          f"{said[-1] if said else ''}")  # fmt: skip
    out = work / "out"
    with ExitStack() as stack:
        nodes = [stack.enter_context(start_engine(work / f"engine-{i}", max_parallel_tasks=1))
                 for i in range(args.engines)]  # fmt: skip
        cmd = [*cli, "reconstruct", str(images), "--output", str(out), *asked,
               "--nodes", *[n.url for n in nodes]]  # fmt: skip
        print("$ prefect-odm " + " ".join(cmd[3:]), flush=True)
        t0 = time.perf_counter()
        done = subprocess.run(cmd, env=env, capture_output=True, text=True)
        run_s = time.perf_counter() - t0
    (work / "reconstruct.log").write_text(done.stdout + done.stderr)
    lines = (done.stdout + done.stderr).strip().splitlines()
    print(f"reconstruct: exit {done.returncode} in {run_s:.1f} s "
          f"(plan alone {plan_s / run_s:.1%} of it): {lines[-1] if lines else ''}")  # fmt: skip
    manifests = list(out.glob("*/manifest.json"))
    if done.returncode != 0 or not manifests:
        return
    manifest = json.loads(manifests[0].read_text())
    stages = ", ".join(f"{k} {v:.1f} s" for k, v in manifest["timings_seconds"].items())
    statuses = [s["status"] for s in manifest["submodels"]]
    print(f"{len(statuses)} submodels {sorted(set(statuses))}; stages: {stages}")
    print(f"survey folder: {manifests[0].parent}")
    seam_figures(manifests[0].parent)


if __name__ == "__main__":
    main()
