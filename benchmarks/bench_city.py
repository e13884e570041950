"""City scale: a synthetic survey at real flight positions on K engine nodes (issue 14).

Builds a survey of N images at the real flight positions of ``../shared/data/layouts/freetown-1``
(1,817 positions; tiled eastwards, each copy 50 m beyond the last, for more), every image a copy
of one seneca photo with its EXIF GPS rewritten (the pixels do not matter to orchestration).
Starts K built-in engine nodes (``direct`` pipeline) and a ``prefect server`` on a real
PostgreSQL (``--sqlite`` for SQLite), runs ``prefect-odm reconstruct`` against them as a user
does, samples the nodes every half second, and prints:

* node utilisation: the share of samples, while submodels remained, in which each node ran a task;
* overhead per submodel outside the node: the submodel's duration minus its task's processing
  time on the node (median, p90), and the median of each phase the run records per submodel
  (``phase_seconds`` in the manifest: waiting for a node, upload, processing, download, store);
* Prefect API errors seen by the run (retried ``503``/``429`` answers in its log);
* the flow process's peak memory (RSS) and CPU seconds per image;
* merge time; and, for several ``--images`` values, how CPU per image grows against the smallest
  run (the baseline, run in the same process).

    python benchmarks/bench_city.py --images 600 1800 --nodes 4 [--split 100] [--sqlite]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np
import psutil
import requests
from PIL import Image
from PIL.TiffImagePlugin import IFDRational

from prefect_odm.engine.launch import EngineProcess, start_engine
from prefect_odm.layouts import read_layout

REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data"
TEMPLATE = DATA / "seneca_1200" / "images" / "IMG_0446.jpg"
sys.path.insert(0, str(REPO / "tests"))  # the real servers the tests start

from odm_server import prefect_server_process  # noqa: E402
from postgres_server import start_postgres  # noqa: E402


def _dms(value: float) -> tuple[IFDRational, IFDRational, IFDRational]:
    v = abs(value)
    d = int(v)
    m = int((v - d) * 60)
    s = (v - d - m / 60) * 3600
    return IFDRational(d, 1), IFDRational(m, 1), IFDRational(round(s * 10000), 10000)


def _with_gps(template: bytes, lat: float, lon: float, alt_m: float, taken: datetime) -> bytes:
    """``template`` (a JPEG) with its EXIF GPS and capture time replaced; the pixels are not
    re-encoded (the new EXIF segment is spliced in place of the old)."""
    exif = Image.open(io.BytesIO(template)).getexif()
    gps = exif.get_ifd(0x8825)
    gps.update(
        {
            1: "N" if lat >= 0 else "S",
            2: _dms(lat),
            3: "E" if lon >= 0 else "W",
            4: _dms(lon),
            5: b"\x00",
            6: IFDRational(round(alt_m * 1000), 1000),
        }
    )
    exif.get_ifd(0x8769)[0x9003] = taken.strftime("%Y:%m:%d %H:%M:%S")
    payload = exif.tobytes()
    out, i = bytearray(template[:2]), 2
    while i < len(template):
        marker = template[i + 1]
        if marker == 0xDA:  # start of scan: the rest is image data
            out += template[i:]
            break
        length = struct.unpack(">H", template[i + 2 : i + 4])[0]
        segment = template[i : i + 2 + length]
        if marker == 0xE1 and segment[4:10] == b"Exif\x00\x00":
            segment = b"\xff\xe1" + struct.pack(">H", len(payload) + 2) + payload
        out += segment
        i += 2 + length
    return bytes(out)


def build_survey(n: int, folder: Path) -> None:
    """``n`` images at freetown-1's positions and capture times, tiled eastwards (each copy of
    the flight a day later)."""
    layout = read_layout(DATA / "layouts" / "freetown-1")
    lat, lon = layout.latitude, layout.longitude
    alt = np.where(
        np.isfinite(layout.altitude_m), layout.altitude_m, np.nanmedian(layout.altitude_m)
    )
    start = datetime(2026, 1, 1, 9, 0, 0)
    times = [t or start + timedelta(seconds=2 * i) for i, t in enumerate(layout.capture_time)]
    width_deg = float(lon.max() - lon.min()) + 50.0 / (111_320.0 * np.cos(np.radians(lat.mean())))
    template = TEMPLATE.read_bytes()
    folder.mkdir(parents=True)
    for i in range(n):
        k, copy = i % len(lat), i // len(lat)
        taken = times[k] + timedelta(days=copy)
        data = _with_gps(
            template, float(lat[k]), float(lon[k]) + copy * width_deg, float(alt[k]), taken
        )
        (folder / f"IMG_{i:05d}.jpg").write_bytes(data)


@dataclass
class Samples:
    """Per node: how many samples saw it running a task, out of the samples taken."""

    busy: dict[str, int] = field(default_factory=dict)
    taken: int = 0


def sample_nodes(nodes: list[EngineProcess], stop: threading.Event, out: Samples) -> None:
    while not stop.wait(0.5):
        out.taken += 1
        for node in nodes:
            try:
                uuids = [t["uuid"] for t in requests.get(f"{node.url}/task/list", timeout=5).json()]
                running = any(
                    requests.get(f"{node.url}/task/{u}/info", timeout=5).json()["status"]["code"]
                    == 20
                    for u in uuids
                )
            except (requests.RequestException, KeyError, ValueError):
                running = False
            out.busy[node.url] = out.busy.get(node.url, 0) + int(running)


def processing_seconds(nodes: list[EngineProcess]) -> dict[str, float]:
    """Task UUID -> processing time on its node, seconds."""
    out: dict[str, float] = {}
    for node in nodes:
        for task in requests.get(f"{node.url}/task/list", timeout=10).json():
            info = requests.get(f"{node.url}/task/{task['uuid']}/info", timeout=10).json()
            out[task["uuid"]] = float(info.get("processingTime", 0)) / 1000.0
    return out


@contextmanager
def prefect_api(work: Path, sqlite: bool) -> Iterator[str]:
    """A ``prefect server`` on 127.0.0.1 (on PostgreSQL unless ``sqlite``); its API URL."""
    with ExitStack() as stack:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
        env.update(
            {
                "PREFECT_HOME": str(work / "prefect-home"),
                "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
                "PREFECT_UI_ENABLED": "false",
            }
        )
        if not sqlite:
            pg = stack.enter_context(start_postgres(work / "pg"))
            pg.sql("postgres", "CREATE DATABASE prefect")
            env["PREFECT_API_DATABASE_CONNECTION_URL"] = pg.url("prefect")
        api_url = stack.enter_context(prefect_server_process(work / "prefect-home", env))
        yield api_url


def run_once(n: int, k: int, split: int, sqlite: bool, work: Path) -> dict[str, float]:
    images = work / f"images-{n}"
    t0 = time.perf_counter()
    build_survey(n, images)
    print(f"\n{n} images at freetown-1 positions written in {time.perf_counter() - t0:.1f} s")
    with ExitStack() as stack:
        api_url = stack.enter_context(prefect_api(work / f"api-{n}", sqlite))
        nodes = [
            stack.enter_context(start_engine(work / f"node-{n}-{i}", method="direct"))
            for i in range(k)
        ]
        env = {k_: v for k_, v in os.environ.items() if not k_.startswith("PREFECT_")}
        env.update(
            {
                "PREFECT_API_URL": api_url,
                "PREFECT_HOME": str(work / f"client-home-{n}"),
                "PREFECT_ODM_HOME": str(work / f"odm-home-{n}"),
            }
        )
        cmd = [sys.executable, "-m", "prefect_odm.cli", "reconstruct", str(images)]
        cmd += ["--output", str(work / f"out-{n}"), "--split", str(split), "--pipeline", "direct"]
        cmd += ["--nodes", *[node.url for node in nodes]]
        # every image is one photo at another position: the products cannot be aligned, and
        # orchestration is what this measures
        cmd += ["--accept-alignment"]
        samples, stop = Samples(), threading.Event()
        sampler = threading.Thread(target=sample_nodes, args=(nodes, stop, samples), daemon=True)
        log = work / f"run-{n}.log"
        started = time.perf_counter()
        with open(log, "wb") as out:
            proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
            sampler.start()
            watched = psutil.Process(proc.pid)
            peak_rss = 0
            cpu_seconds = 0.0
            while proc.poll() is None:
                try:
                    peak_rss = max(peak_rss, watched.memory_info().rss)
                    times = watched.cpu_times()
                    cpu_seconds = times.user + times.system
                except psutil.Error:
                    pass
                time.sleep(0.2)
        wall = time.perf_counter() - started
        stop.set()
        sampler.join()
        text = log.read_text(errors="replace")
        if proc.returncode != 0:
            print(text[-3000:])
            raise SystemExit(f"reconstruct failed with exit code {proc.returncode}")
        manifest = json.loads(next((work / f"out-{n}").glob("*/manifest.json")).read_text())
        on_node = processing_seconds(nodes)
    submodels = manifest["submodels"]
    overhead = [
        s["duration_seconds"] - on_node.get(s["task_uuid"], 0.0)
        for s in submodels
        if s["status"] == "completed"
    ]
    busy = [samples.busy.get(node.url, 0) / max(1, samples.taken) for node in nodes]
    api_errors = text.count("retryable status code") + text.count("retryable exception")
    merge_seconds = float(manifest.get("timings_seconds", {}).get("merge", float("nan")))
    print(f"  {len(submodels)} submodels on {k} nodes, wall {wall:.0f} s")
    print(
        "  node utilisation (share of samples running a task): "
        + ", ".join(f"{b:.2f}" for b in busy)
        + f"; mean {statistics.fmean(busy):.2f}"
    )
    print(
        f"  overhead per submodel outside the node: median {statistics.median(overhead):.1f} s, "
        f"p90 {float(np.percentile(overhead, 90)):.1f} s"
    )
    phases = sorted({k for s in submodels for k in s.get("phase_seconds", {})})
    if phases:
        print(
            "  phases per submodel (median s): "
            + ", ".join(
                f"{p} {statistics.median(s.get('phase_seconds', {}).get(p, 0.0) for s in submodels):.1f}"
                for p in phases
            )
        )
    print(f"  Prefect API errors retried: {api_errors}")
    print(
        f"  flow process: peak RSS {peak_rss / 2**20:.0f} MiB, CPU {cpu_seconds:.1f} s "
        f"({1000 * cpu_seconds / n:.1f} ms per image); merge {merge_seconds:.1f} s"
    )
    return {"cpu_per_image": cpu_seconds / n, "wall": wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, nargs="+", default=[1800])
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--split", type=int, default=100)
    parser.add_argument("--sqlite", action="store_true", help="SQLite behind the Prefect server")
    parser.add_argument("--work", type=Path, default=None, help="keep everything in this folder")
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="bench-city-"))
    print(f"work folder: {work}")
    results = {n: run_once(n, args.nodes, args.split, args.sqlite, work) for n in args.images}
    base_n = min(results)
    for n, r in sorted(results.items()):
        ratio = r["cpu_per_image"] / results[base_n]["cpu_per_image"]
        print(f"flow CPU per image at {n}: {ratio:.2f}x that at {base_n} (baseline)")


if __name__ == "__main__":
    main()
