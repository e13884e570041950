"""Benchmark: ``prefect-odm plan`` of a city-sized folder, as a user times it (issue 33).

Writes N small geotagged JPEGs (80 x 60 pixels, seneca's EXIF with the GPS and capture time of
``../shared/data/layouts/freetown-1``'s positions, tiled eastwards as ``bench_city.py`` tiles
them) into ``--work``, then runs ``prefect-odm plan FOLDER -o OUT`` in a child process twice:
the first scan (every file hashed and decoded) and the rescan (the identity cache of a fresh
``PREFECT_ODM_HOME``), printing wall, CPU (user + system) and peak RSS of each. Then, in this
process, the same steps timed one by one on the rescan: ``scan_images``, ``plan_split`` and
``write_plan_files`` (plan.json, survey.json, plan.geojson, plan.png), so the output says what
a user's ``plan`` is spent on. The named baseline, same run: ``plan_split`` given the overlap
it chose (one width planned, no widening search).

Usage: python benchmarks/bench_plan_cli.py [--images 50000] [--split 100] [--work DIR]
"""

from __future__ import annotations

import argparse
import io
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_city import DATA, TEMPLATE, _with_gps  # noqa: E402

from prefect_odm.survey.layouts import read_layout  # noqa: E402


def small_template() -> bytes:
    """seneca's photo at 80 x 60 pixels with its EXIF kept (a header like a real camera's)."""
    with Image.open(TEMPLATE) as im:
        exif = im.info["exif"]
        small = im.resize((80, 60))
    out = io.BytesIO()
    small.save(out, "JPEG", quality=70, exif=exif)
    return out.getvalue()


def build_folder(n: int, folder: Path) -> None:
    """``n`` images at freetown-1's positions and times (its median altitude), tiled eastwards."""
    layout = read_layout(DATA / "layouts" / "freetown-1")
    lat, lon = layout.latitude, layout.longitude
    alt = float(np.nanmedian(layout.altitude_m))
    start = datetime(2026, 1, 1, 9, 0, 0)
    times = [t or start + timedelta(seconds=2 * i) for i, t in enumerate(layout.capture_time)]
    width_deg = float(lon.max() - lon.min()) + 50.0 / (111_320.0 * np.cos(np.radians(lat.mean())))
    template = small_template()
    folder.mkdir(parents=True)
    for i in range(n):
        k, copy = i % len(lat), i // len(lat)
        data = _with_gps(
            template,
            float(lat[k]),
            float(lon[k]) + copy * width_deg,
            alt,
            times[k] + timedelta(days=copy),
        )
        (folder / f"IMG_{i:05d}.jpg").write_bytes(data)


def run_cli(folder: Path, out: Path, split: int, env: dict[str, str]) -> tuple[float, float, float]:
    """Wall s, CPU s (user + system) and peak RSS MiB of one ``prefect-odm plan`` child."""
    cli = str(Path(sys.executable).with_name("prefect-odm"))
    cmd = [cli, "plan", str(folder), "-o", str(out)]
    cmd += ["--split", str(split)]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    err = proc.stderr.read().decode() if proc.stderr else ""
    if proc.returncode != 0:
        raise SystemExit(f"prefect-odm plan failed ({proc.returncode}): {err[-2000:]}")
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


def timed(label: str, fn, *args, **kwargs):  # type: ignore[no-untyped-def]
    t0, c0 = time.perf_counter(), time.process_time()
    value = fn(*args, **kwargs)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    print(f"  {label:<42} {wall:7.2f} s wall {cpu:7.2f} CPU-s", flush=True)
    return value, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=50000)
    parser.add_argument("--split", type=int, default=100)
    parser.add_argument("--work", type=Path, default=None, help="kept when given")
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="bench_plan_cli_"))
    folder = work / "images"
    home = work / "odm-home"
    env = dict(os.environ, PREFECT_ODM_HOME=str(home))
    try:
        if not folder.exists():
            t0 = time.perf_counter()
            build_folder(args.images, folder)
            print(f"wrote {args.images} images in {time.perf_counter() - t0:.0f} s")
        shutil.rmtree(home, ignore_errors=True)
        print(f"load average {os.getloadavg()[0]:.1f}")
        for label in ("first scan", "rescan"):
            wall, cpu, rss = run_cli(folder, work / "plan", args.split, env)
            print(
                f"prefect-odm plan, {label}: {wall:.2f} s wall, {cpu:.2f} CPU-s, "
                f"peak RSS {rss:.0f} MiB",
                flush=True,
            )
        os.environ["PREFECT_ODM_HOME"] = str(home)
        from prefect_odm.plan.picture import write_plan_files
        from prefect_odm.plan.planning import plan_split
        from prefect_odm.survey.scan import scan_images

        print("the same steps in this process (rescan):")
        survey, _ = timed("scan_images (identity cache)", scan_images, str(folder))
        plan, c_plan = timed("plan_split (overlap unset)", plan_split, survey, split=args.split)
        width = plan.split_overlap_m
        _, c_one = timed(
            f"baseline: plan_split given {width:g} m",
            plan_split,
            survey,
            split=args.split,
            split_overlap_m=width,
        )
        timed(
            "write_plan_files (json, geojson, png)",
            write_plan_files,
            str(work / "p2"),
            plan,
            survey,
        )
        print(
            f"{len(survey.images)} images, {len(plan.submodels)} submodels, overlap {width:g} m "
            f"(asked {plan.split_overlap_asked_m}); plan_split unset / given: "
            f"{c_plan / c_one:.2f}x CPU; peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB"
        )
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
