"""Benchmark of the built-in engine's pipeline: sparse (fast-orthophoto), dense and direct.

Runs, each in a fresh child process (so peak memory is per run):

* brighton_beach_1600, all 18 images: ``sparse`` (sfm with ``fast-orthophoto``, the baseline),
  ``dense`` (sfm, ODM's default ``pc-quality`` medium), ``dense-high`` (``pc-quality`` high) and
  ``direct``;
* seneca_1200, the 50 images nearest the survey centre: ``sparse``, ``dense`` and ``direct``.

Prints wall time, CPU time (all threads; on a shared machine it shows the work better than the
wall time), time per stage, peak resident memory (``ru_maxrss`` of the child) and per image,
registered images and points, and the ratio of each run's time to the baseline ``sparse`` run of
the same survey (measured in the same process tree). For brighton it also prints the DSM and
orthophoto accuracy against ODM's reference point cloud and, for the dense runs, the figures of
``tests/engine/dense_figures.py`` (absolute DSM median / p90 |dz|, tilt, measured share of the
footprint, points/m², object heights against ODM's); ``--png DIR`` renders hillshades of the
DSMs and the dense cloud from above.

Usage::

    python benchmarks/bench_engine.py [--only brighton|seneca] [--threads 2] [--keep DIR]
        [--png DIR]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from prefect_odm.registry import PRODUCTS, REPORT_FOLDER

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / ".." / "shared" / "data"
SENECA_SUBSET = 50


def _seneca_subset(count: int) -> list[Path]:
    """The ``count`` seneca images nearest the mean GPS position (deterministic)."""
    import numpy as np

    from prefect_odm.engine.camera import read_images

    folder = DATA / "seneca_1200" / "images"
    metas = read_images(folder)
    lat = np.array([m.latitude_deg for m in metas])
    lon = np.array([m.longitude_deg for m in metas])
    north = (lat - lat.mean()) * 111_320.0
    east = (lon - lon.mean()) * 111_320.0 * np.cos(np.radians(lat.mean()))
    nearest = np.argsort(np.hypot(north, east), kind="stable")[:count]
    return [folder / metas[i].name for i in sorted(nearest)]


def _test_pipeline() -> Any:
    """``tests/engine/test_pipeline.py``, whose task-folder and accuracy helpers the benchmark
    shares."""
    folder = str(REPO / "tests" / "engine")
    if folder not in sys.path:
        sys.path.insert(0, folder)
    import test_pipeline

    return test_pipeline


def _child(task: str, options: dict[str, Any], queue: Any) -> None:
    from prefect_odm.engine import pipeline

    lines: list[str] = []
    started = time.perf_counter()
    error = None
    try:
        pipeline.run(Path(task), options, log=lines.append)
    except Exception as exc:  # reported to the parent, which prints it
        error = f"{type(exc).__name__}: {exc}"
    seconds = time.perf_counter() - started
    usage = resource.getrusage(resource.RUSAGE_SELF)
    queue.put(
        {
            "seconds": seconds,
            "cpu_seconds": usage.ru_utime + usage.ru_stime,
            "peak_mib": usage.ru_maxrss / 1024.0,
            "error": error,
            "log": lines[-5:],
        }
    )


def run_case(
    root: Path, name: str, images: list[Path] | Path, options: dict[str, Any]
) -> dict[str, Any]:
    task = _test_pipeline().make_task(root, images, name)
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    process = context.Process(target=_child, args=(str(task), options, queue))
    process.start()
    result = queue.get()
    process.join()
    result["task"] = task
    report_path = task / REPORT_FOLDER / "engine.json"
    result["report"] = json.loads(report_path.read_text()) if report_path.exists() else {}
    return result


def brighton_accuracy(task: Path) -> str:
    helpers = _test_pipeline()
    median_abs, median_signed, _ = helpers.dsm_median_abs_diff_m(task / PRODUCTS["dsm"].odm_path)
    offset, corr = helpers.orthophoto_offset_m(task / PRODUCTS["orthophoto"].odm_path)
    return (
        f"DSM median |diff| {median_abs:.2f} m (signed {median_signed:+.2f}); "
        f"orthophoto offset {offset:.2f} m (r={corr:.2f})"
    )


CASES: dict[str, dict[str, Any]] = {
    "sparse": {"pipeline": "sfm", "fast-orthophoto": True},
    "dense": {"pipeline": "sfm", "fast-orthophoto": False, "pc-quality": "medium"},
    "dense-high": {"pipeline": "sfm", "fast-orthophoto": False, "pc-quality": "high"},
    "direct": {"pipeline": "direct"},
}
"""Run name -> its options (besides ``dsm``, ``dtm`` and ``max-concurrency``); the first is the
baseline."""


def _print_result(
    survey: str, name: str, result: dict[str, Any], baseline: float, args: Any
) -> None:
    report = result["report"]
    if result["error"]:
        print(f"{name:>10}: FAILED after {result['seconds']:.1f} s: {result['error']}")
        return
    stages = ", ".join(f"{k} {v:.1f}" for k, v in report["stage_seconds"].items())
    print(
        f"{name:>10}: {result['seconds']:6.1f} s  ratio to sparse "
        f"{result['seconds'] / baseline:.3f}  CPU {result['cpu_seconds']:.1f} s  "
        f"peak {result['peak_mib']:.0f} MiB ({result['peak_mib'] / report['images']:.0f} "
        f"MiB/image)  registered {report['registered_images']}/{report['images']}  "
        f"points {report['points']}  GSD {report['gsd_cm']:.2f} cm  "
        f"DEM {report['dem_resolution_cm']:.1f} cm"
    )
    print(f"            stages (s): {stages}")
    if survey != "brighton":
        return
    print(f"            {brighton_accuracy(result['task'])}")
    if report.get("dense", {}).get("dense"):
        figures = _dense_figures()
        for line in figures.dense_figures(result["task"]).lines():
            print(f"            {line}")
        if args.png:
            for path in figures.render_pngs(result["task"], args.png, name):
                print(f"            wrote {path}")


def _dense_figures() -> Any:
    _test_pipeline()  # puts tests/engine on the path
    import dense_figures

    return dense_figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=["brighton", "seneca"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--keep", type=Path, help="keep the task folders here")
    parser.add_argument("--png", type=Path, help="write the PNG renderings here")
    parser.add_argument("--cases", default="", help="comma-separated subset of the runs")
    args = parser.parse_args()
    root = args.keep or Path(tempfile.mkdtemp(prefix="bench_engine_"))
    root.mkdir(parents=True, exist_ok=True)
    cases = []
    if args.only in (None, "brighton"):
        cases.append(("brighton", DATA / "brighton_beach_1600" / "images"))
    if args.only in (None, "seneca"):
        cases.append((f"seneca{SENECA_SUBSET}", _seneca_subset(SENECA_SUBSET)))
    try:
        for survey, images in cases:
            count = len(images) if isinstance(images, list) else len(list(images.iterdir()))
            names = [n for n in CASES if not args.cases or n in args.cases.split(",")]
            if survey != "brighton":
                names = [n for n in names if n != "dense-high"]
            results = {}
            for name in names:  # the baseline first
                options = {**CASES[name], "dsm": True, "dtm": True}
                options["max-concurrency"] = args.threads
                results[name] = run_case(root, f"{survey}-{name}", images, options)
            baseline = results[names[0]]["seconds"]
            print(
                f"\n== {survey}: {count} images, {args.threads} threads "
                f"(baseline: {names[0]} {baseline:.1f} s) =="
            )
            for name, result in results.items():
                _print_result(survey, name, result, baseline, args)
    finally:
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
