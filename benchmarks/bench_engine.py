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

``--quickstart OUT`` instead runs the README's Quickstart (brighton, ``--split 10
--split-overlap-m 20``) with each submodel calibrating its own camera and with the survey's
shared calibration, and brighton as one block, into ``OUT`` (what is there already is not run
again), and prints for each submodel and merge: its DSM's corner and cell against the
orthophoto's (aligned: every DSM cell edge on an orthophoto cell edge), the shares of the
orthophoto footprint (its coloured cells) the DSM covers, measured (its measured band,
``registry.DSM_MEASURED_BAND``) and filled, beside the share ODM's own cloud
(``reference/model.laz``) measures; its measured heights against ODM's cloud and against the
single block (|dz| median, p90, signed, tilt); ODM's tree-crown cells, the share ours measures and
the crown heights (``bench_crowns.crown_summary``); and both runs' wall times and their ratio
(``benchmarks/_quickstart.py``).

Usage::

    python benchmarks/bench_engine.py [--only brighton|seneca] [--threads 2] [--keep DIR]
        [--png DIR]
    python benchmarks/bench_engine.py --quickstart OUT
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


def _grid(path: Path) -> Any:
    import rasterio

    from prefect_odm.grid import Grid

    with rasterio.open(path) as src:
        t = src.transform
        return Grid(left=t.c, top=t.f, resolution_m=t.a, width=src.width, height=src.height)


def dsm_against_orthophoto(dsm_path: Path, ortho_path: Path, reference: Any) -> str:
    """One line: the DSM's grid against the orthophoto's and the footprint shares (module
    docstring). ``reference``: ODM's cloud ``(n, 3)`` UTM metres, or None."""
    import numpy as np
    import rasterio
    from rasterio.enums import Resampling

    from prefect_odm.registry import DSM_MEASURED_BAND, DSM_MEASURED_DESCRIPTION

    dsm_grid, ortho_grid = _grid(dsm_path), _grid(ortho_path)
    with rasterio.open(dsm_path) as src:
        z = src.read(1)
        has_height = z != src.nodata
        band = src.count >= 2 and src.descriptions[1] == DSM_MEASURED_DESCRIPTION
        measured = src.read(DSM_MEASURED_BAND) == 1 if band else has_height
    with rasterio.open(ortho_path) as src:
        # the orthophoto's alpha on the DSM grid: a DSM cell whose centre is coloured
        window = src.window(*dsm_grid.bounds)
        alpha = src.read(
            src.count, window=window, out_shape=z.shape, resampling=Resampling.nearest,
            boundless=True, fill_value=0,
        )  # fmt: skip
    footprint = alpha == 255
    area = max(1, int(footprint.sum()))
    line = (
        f"DSM {dsm_grid.resolution_m:.4f} m from ({dsm_grid.left:.3f}, {dsm_grid.top:.3f}); "
        f"orthophoto {ortho_grid.resolution_m:.4f} m from ({ortho_grid.left:.3f}, "
        f"{ortho_grid.top:.3f}); cell ratio {dsm_grid.resolution_m / ortho_grid.resolution_m:.3f}, "
        f"aligned {dsm_grid.is_aligned_with(ortho_grid)}; of the orthophoto footprint "
        f"({area * dsm_grid.pixel_area_m2:.0f} m2): height {100 * has_height[footprint].sum() / area:.1f}%, "
        f"measured {100 * measured[footprint].sum() / area:.1f}%, "
        f"filled {100 * (has_height & ~measured)[footprint].sum() / area:.1f}%"
        + ("" if band else " (no measured band: every height counts as measured)")
    )
    if reference is not None:
        col = np.floor((reference[:, 0] - dsm_grid.left) / dsm_grid.resolution_m).astype(int)
        row = np.floor((dsm_grid.top - reference[:, 1]) / dsm_grid.resolution_m).astype(int)
        ok = (col >= 0) & (col < z.shape[1]) & (row >= 0) & (row < z.shape[0])
        odm = np.zeros(z.shape, dtype=bool)
        odm[row[ok], col[ok]] = True
        line += f"; ODM's cloud measures {100 * odm[footprint].sum() / area:.1f}%"
    return line


def quickstart(out: Path, threads: int, png: Path | None = None) -> None:
    """The Quickstart's figures (``benchmarks/_quickstart.py``): the single block, then the
    Quickstart with each submodel calibrating its own camera and with the shared calibration,
    each submodel and merge against ODM's cloud and the single block, and the run times."""
    import _quickstart
    import bench_crowns
    import laspy
    import numpy as np

    brighton = DATA / "brighton_beach_1600" / "images"
    single_task = out / "single" / "brighton-dense"
    single_seconds = None
    if not (single_task / PRODUCTS["dsm"].odm_path).exists():
        options = {**CASES["dense"], "dsm": True, "dtm": True, "max-concurrency": threads}
        result = run_case(out / "single", "brighton-dense", brighton, options)
        if result["error"]:
            raise SystemExit(f"single block failed: {result['error']}")
        single_seconds = result["seconds"]
    single = single_task / PRODUCTS["dsm"].odm_path
    seconds = {
        mode: _quickstart.run_quickstart(brighton, out / mode, extra)
        for mode, extra in _quickstart.MODES.items()
    }
    las = laspy.read(DATA / "brighton_beach_1600" / "reference" / "model.laz")
    reference = np.column_stack([las.x, las.y, las.z])
    dsm_name, ortho_name = PRODUCTS["dsm"].file_name, PRODUCTS["orthophoto"].file_name
    print(f"\n== single block ({single_seconds or 0:.1f} s; 0: not run now) ==")
    for line in _quickstart.dz_lines(single, reference, None):
        print(f"single: {line}")
    print(f"single: {bench_crowns.crown_summary(single)}")
    for mode in _quickstart.MODES:
        survey = sorted((out / mode).glob("*/merged/dsm.tif"))[-1].parents[1]
        print(f"\n== Quickstart, {mode} camera calibration ==")
        folders = [f for f in sorted((survey / "submodels").iterdir()) if (f / dsm_name).exists()]
        for folder in [*folders, survey / "merged"]:
            name = folder.name
            print(
                f"{name}: {dsm_against_orthophoto(folder / dsm_name, folder / ortho_name, reference)}"
            )
            for line in _quickstart.dz_lines(folder / dsm_name, reference, single):
                print(f"{name}: {line}")
            print(f"{name}: {bench_crowns.crown_summary(folder / dsm_name)}")
        if png is not None:
            for path in _quickstart.render(survey, reference, png, mode):
                print(f"wrote {path}")
    own, shared = seconds["own"], seconds["shared"]
    times = ", ".join(
        f"{m} " + ("not run now" if t is None else f"{t[0]:.1f} s (CPU {t[1]:.1f} s)")
        for m, t in seconds.items()
    )
    ratio = ""
    if own and shared:
        ratio = f"; shared / own: wall {shared[0] / own[0]:.2f}, CPU {shared[1] / own[1]:.2f}"
    print(f"\nQuickstart ({threads} threads in the engine's tasks): {times}{ratio}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=["brighton", "seneca"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--keep", type=Path, help="keep the task folders here")
    parser.add_argument("--png", type=Path, help="write the PNG renderings here")
    parser.add_argument("--cases", default="", help="comma-separated subset of the runs")
    parser.add_argument(
        "--quickstart", type=Path, help="the Quickstart's DSM/orthophoto figures (run into DIR)"
    )
    args = parser.parse_args()
    if args.quickstart is not None:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        quickstart(args.quickstart, args.threads, args.png)
        return
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
