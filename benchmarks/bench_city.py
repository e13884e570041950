"""City scale: a synthetic survey at real flight positions on K engine nodes (issue 14).

Builds a survey of N images at the real flight positions of ``../shared/data/layouts/freetown-1``
(1,817 positions; tiled eastwards, each copy 50 m beyond the last, for more), every image a copy
of one seneca photo with its EXIF GPS rewritten (the pixels do not matter to orchestration).
Starts K built-in engine nodes (``direct`` pipeline) and a ``prefect server`` on a real
PostgreSQL (``--sqlite`` for SQLite; ``--embedded``: no server, the run starts Prefect's
temporary API itself), runs ``prefect-odm reconstruct`` against them as a user
does, samples the nodes every half second, and prints:

* node utilisation while work remained: the share of the time from the first task's start to
  the last task's end in which each node ran a task (from the tasks each engine records in its
  ``tasks.json``), the share of task-slot seconds busy while submodels waited (until the last
  task started), and how long a node idled between two of its tasks;
* time per submodel outside the node: the submodel's run (the runner's duration) minus its task's processing
  time on the node (median, p90), its wait for memory slots and a node apart, and the median of each
  phase the run records per submodel (``phase_seconds`` in the manifest: waiting for a node,
  upload, processing, download, store); and how much longer the runner's processing phase is
  than the node's (the start after the commit and noticing the end: the polling);
* Prefect API errors seen by the run (retried ``503``/``429`` answers, logged by the client at
  DEBUG, which the run is given);
* the flow process's peak memory (RSS), peak threads and CPU seconds per image;
* merge time; and, for several ``--images`` values, how CPU per image grows against the smallest
  run (the baseline, run in the same process).

``--from-work DIR`` prints the figures of a run kept with ``--work`` again, without running.

    python benchmarks/bench_city.py --images 600 1800 --nodes 4 [--split 100] [--sqlite | --embedded]
        [--nodeodm-test-seconds 20 --slots 2]
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
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import psutil
from PIL import Image
from PIL.TiffImagePlugin import IFDRational

from prefect_odm.engine.launch import start_engine
from prefect_odm.survey.layouts import read_layout

REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data"
TEMPLATE = DATA / "seneca_1200" / "images" / "IMG_0446.jpg"
sys.path.insert(0, str(REPO / "tests"))  # the real servers the tests start

sys.path.insert(0, str(REPO / "benchmarks"))
from _cpu_census import CpuCensus  # noqa: E402
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
    """``n`` images at freetown-1's positions and capture times (at its median altitude), tiled
    eastwards (each copy of the flight a day later)."""
    layout = read_layout(DATA / "layouts" / "freetown-1")
    lat, lon = layout.latitude, layout.longitude
    # one altitude for all: freetown-1's terrain-following GPS altitudes tilt the altitude
    # priors past the plan's 2-degree gate (issue 31), and orchestration is what is measured
    alt = np.full(len(lat), float(np.nanmedian(layout.altitude_m)))
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
class NodeTasks:
    """One node's tasks as its engine recorded them: (started, finished) in seconds since epoch."""

    node: str
    spans: list[tuple[float, float]] = field(default_factory=list)
    processing_seconds: dict[str, float] = field(default_factory=dict)


def node_tasks(data_dir: Path) -> NodeTasks:
    """A node's task spans and per-task processing time, from its engine's ``tasks.json`` or,
    for an external node, what :class:`NodeWatcher` saw of it (``watched.json``)."""
    watched = data_dir / "watched.json"
    if watched.is_file():
        return NodeTasks(str(data_dir), **json.loads(watched.read_text()))
    records = json.loads((data_dir / "tasks.json").read_text())["tasks"]
    out = NodeTasks(str(data_dir))
    for t in records:
        if t.get("started_ms") and t.get("finished_ms"):
            out.spans.append((t["started_ms"] / 1000.0, t["finished_ms"] / 1000.0))
        out.processing_seconds[t["uuid"]] = float(t.get("processing_time_ms") or 0) / 1000.0
    out.spans.sort()
    return out


class NodeWatcher:
    """Polls external nodes (``/task/list``, ``/task/{uuid}/info``) every half second: a task's
    span runs from the first poll that sees it running to the first that sees it end (within
    half a second of the node's own times), its processing time is the node's ``processingTime``.
    """

    def __init__(self, urls: list[str], folders: list[Path]) -> None:
        import threading

        self.urls, self.folders = urls, folders
        self.seen: list[dict[str, list[float]]] = [{} for _ in urls]
        self.processing: list[dict[str, float]] = [{} for _ in urls]
        self.requests = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> NodeWatcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        for i, folder in enumerate(self.folders):
            folder.mkdir(parents=True, exist_ok=True)
            spans = sorted((v[0], v[1]) for v in self.seen[i].values() if len(v) == 2)
            data = {"spans": spans, "processing_seconds": self.processing[i]}
            (folder / "watched.json").write_text(json.dumps(data))

    def _run(self) -> None:
        import httpx

        with httpx.Client(timeout=10.0) as http:
            while not self._stop.wait(0.5):
                for i, url in enumerate(self.urls):
                    try:
                        self._poll(http, i, url)
                    except (httpx.HTTPError, ValueError, KeyError):
                        continue

    def _poll(self, http: Any, i: int, url: str) -> None:
        now = time.time()
        self.requests += 1
        for item in http.get(f"{url}/task/list").json():
            uuid = item["uuid"]
            span = self.seen[i].setdefault(uuid, [])
            if len(span) == 2:
                continue
            self.requests += 1
            info = http.get(f"{url}/task/{uuid}/info").json()
            code = int(info["status"]["code"])
            if code == 20 and not span:  # RUNNING
                span.append(now)
            elif code in (30, 40, 50):  # FAILED, COMPLETED, CANCELED
                span.extend([now] * (2 - len(span)))
                self.processing[i][uuid] = float(info.get("processingTime") or 0) / 1000.0


NODE_PIDS: list[int] = []
"""The NodeODM processes started (for the CPU census)."""


def _descendants(root: int, but: int | None = None) -> list[int]:
    """Pids below ``root`` (recursively), leaving out ``but`` and its own descendants."""
    try:
        procs = psutil.Process(root).children(recursive=True)
    except psutil.Error:
        return []
    skip = {but, *(_descendants(but) if but else [])}
    return [p.pid for p in procs if p.pid not in skip]


@contextmanager
def nodeodm_test_node(work: Path, test_seconds: int, slots: int) -> Iterator[str]:
    """A real NodeODM 2.2.4 in test mode (``../shared/peers/start_nodeodm.sh``); its URL."""
    script = REPO.parent / "shared" / "peers" / "start_nodeodm.sh"
    args = [str(script), str(work), "--test_seconds", str(test_seconds), "-q", str(slots)]
    url, pid = subprocess.run(args, check=True, capture_output=True, text=True).stdout.split()
    NODE_PIDS.append(int(pid))
    try:
        yield url
    finally:
        os.kill(int(pid), 15)


def busy_share(spans: list[tuple[float, float]], start: float, end: float) -> float:
    """The share of [start, end] covered by at least one span."""
    covered, reach = 0.0, start
    for a, b in spans:
        a, b = max(a, reach), min(b, end)
        if b > a:
            covered += b - a
            reach = b
    return covered / max(1e-9, end - start)


def slot_busy_share(
    spans: list[tuple[float, float]], slots: int, start: float, end: float
) -> float:
    """The share of the node's task-slot seconds in [start, end] in which a task ran."""
    covered = sum(max(0.0, min(b, end) - max(a, start)) for a, b in spans)
    return min(1.0, covered / max(1e-9, slots * (end - start)))


def idle_gaps(spans: list[tuple[float, float]]) -> list[float]:
    """Seconds between one task finishing on a node and the next starting there."""
    return [max(0.0, b[0] - a[1]) for a, b in zip(spans, spans[1:], strict=False)]


@contextmanager
def prefect_api(work: Path, sqlite: bool, embedded: bool = False) -> Iterator[str | None]:
    """A ``prefect server`` on 127.0.0.1 (on PostgreSQL unless ``sqlite``); its API URL.
    ``embedded``: none (``None``), the run starts Prefect's temporary server itself."""
    if embedded:
        yield None
        return
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


def run_once(
    n: int,
    k: int,
    split: int,
    api: str,
    work: Path,
    nodeodm: tuple[int, int] | None = None,
    no_merge: bool = False,
    upload_requests: int | None = None,
) -> dict[str, float]:
    """One run on ``k`` built-in engines, or (``nodeodm``: test seconds, slots) on ``k``
    NodeODM test-mode nodes watched by :class:`NodeWatcher`; ``no_merge``: the flow is
    stopped (SIGTERM) once every submodel's result is stored; ``upload_requests``: the run's
    ``PREFECT_ODM_NODE_UPLOAD_REQUESTS`` (None: its default)."""
    images = work / f"images-{n}"
    t0 = time.perf_counter()
    build_survey(n, images)
    print(f"\n{n} images at freetown-1 positions written in {time.perf_counter() - t0:.1f} s")
    with ExitStack() as stack:
        api_url = stack.enter_context(
            prefect_api(work / f"api-{n}", api == "sqlite", api == "embedded")
        )
        folders = [work / f"node-{n}-{i}" for i in range(k)]
        watcher: NodeWatcher | None = None
        if nodeodm is None:
            urls = [stack.enter_context(start_engine(f, method="direct")).url for f in folders]
        else:
            urls = [
                stack.enter_context(nodeodm_test_node(work / f"nodeodm-{n}-{i}", *nodeodm))
                for i in range(k)
            ]
            watcher = stack.enter_context(NodeWatcher(urls, folders))
        env = {k_: v for k_, v in os.environ.items() if not k_.startswith("PREFECT_")}
        env.update(
            {
                "PREFECT_HOME": str(work / f"client-home-{n}"),
                "PREFECT_ODM_HOME": str(work / f"odm-home-{n}"),
                # the client logs its retried 503/429 answers only at DEBUG (issue 33)
                "PREFECT_LOGGING_LOGGERS_PREFECT_CLIENT_LEVEL": "DEBUG",
            }
        )
        if api_url is not None:
            env["PREFECT_API_URL"] = api_url
        if upload_requests is not None:
            env["PREFECT_ODM_NODE_UPLOAD_REQUESTS"] = str(upload_requests)
        # whose threads the peak holds (benchmarks/thread_census/sitecustomize.py)
        census = work / f"threads-{n}"
        env["BENCH_THREAD_CENSUS"] = str(census)
        env["PYTHONPATH"] = os.pathsep.join(
            [str(REPO / "benchmarks" / "thread_census"), *filter(None, [env.get("PYTHONPATH")])]
        )
        cmd = [sys.executable, "-m", "prefect_odm.cli", "reconstruct", str(images)]
        cmd += ["--output", str(work / f"out-{n}"), "--split", str(split)]
        cmd += ["--pipeline", "direct"] if nodeodm is None else []
        cmd += ["--nodes", *urls]
        # every image is one photo at another position: the products cannot be aligned, and
        # orchestration is what this measures
        cmd += ["--accept-alignment"]
        log = work / f"run-{n}.log"
        started = time.perf_counter()
        with open(log, "wb") as out:
            proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
            watched = psutil.Process(proc.pid)
            cpu = CpuCensus(
                {
                    "nodes": lambda: [p for p in NODE_PIDS if psutil.pid_exists(p)],
                    "flow": lambda: [proc.pid, *_descendants(proc.pid)],
                    "server and PostgreSQL": lambda: _descendants(os.getpid(), but=proc.pid),
                }
            ).start()
            peak_rss = peak_threads = 0
            cpu_seconds = 0.0
            stopped = False
            next_check = time.monotonic() + 2.0
            while proc.poll() is None:
                if no_merge and not stopped and time.monotonic() >= next_check:
                    next_check = time.monotonic() + 2.0
                    if _all_completed(work / f"out-{n}"):
                        proc.terminate()
                        stopped = True
                try:
                    peak_rss = max(peak_rss, watched.memory_info().rss)
                    peak_threads = max(peak_threads, watched.num_threads())
                    times = watched.cpu_times()
                    cpu_seconds = times.user + times.system
                except psutil.Error:
                    pass
                time.sleep(0.2)
        wall = time.perf_counter() - started
        cpu.stop()
        text = log.read_text(errors="replace")
        done = (nodeodm is not None or stopped) and _all_completed(work / f"out-{n}")
        if proc.returncode != 0 and not done:
            print(text[-3000:])
            raise SystemExit(f"reconstruct failed with exit code {proc.returncode}")
        if stopped:
            print("  every submodel completed; the flow was stopped before the merge (--no-merge)")
        elif proc.returncode != 0:  # test mode's canned products lie elsewhere: no merge
            print(
                f"  every submodel completed; the merge failed (exit {proc.returncode}), as it "
                "must on NodeODM test mode's canned products"
            )
    print_figures(work, n, k, wall, nodeodm[1] if nodeodm else 1)
    print(
        f"  flow process: peak RSS {peak_rss / 2**20:.0f} MiB, peak threads {peak_threads}, "
        f"CPU {cpu_seconds:.1f} s "
        f"({1000 * cpu_seconds / n:.1f} ms per image)"
    )
    print(cpu.report(tasks=len(_stored_results(work / f"out-{n}"))))
    if watcher is not None:
        print(
            f"  the benchmark's own polls of the nodes (NodeWatcher): {watcher.requests} requests"
            f" ({watcher.requests / max(1, k):.0f} per node; NodeODM spends about 1.1 ms of CPU"
            " on each, bench_upload_requests.py)"
        )
    print_thread_census(work / f"threads-{n}" / f"threads-{proc.pid}.json")
    print_upload_stacks(work / f"threads-{n}" / f"stacks-{proc.pid}.json")
    return {"cpu_per_image": cpu_seconds / n, "wall": wall}


def print_thread_census(path: Path) -> None:
    """The flow process's threads at its peak Python thread count, by name (digits and URLs
    folded; ``thread-census`` is the sampler's own)."""
    if not path.exists():
        print("  thread census: none written")
        return
    census = json.loads(path.read_text())
    groups = ", ".join(f"{name} {n}" for name, n in census["groups"].items())
    print(f"  Python threads at their peak ({census['peak']}): {groups}")


def print_upload_stacks(path: Path) -> None:
    """What the flow's upload threads and task runner workers were doing, by share of their
    samples (most first)."""
    if not path.exists():
        return
    stacks = json.loads(path.read_text())["stacks"]
    for prefix, who in (("upload-", "upload threads"), ("ThreadPoolExecutor-", "runner workers")):
        mine = {k: v for k, v in stacks.items() if k.startswith(prefix)}
        total = sum(mine.values()) or 1
        print(f"  {who}' samples ({total}), by where they were:")
        for where, count in list(mine.items())[:8]:
            print(f"    {count / total:.2f} {where}")


def _stored_results(out: Path) -> list[dict[str, Any]]:
    """The submodel results a run stored (``submodels/*/result.json``)."""
    return [json.loads(f.read_text()) for f in sorted(out.glob("*/submodels/*/result.json"))]


def _all_completed(out: Path) -> bool:
    """Whether the run stored a completed result for every planned submodel."""
    plans = list(out.glob("*/plan/plan.json"))
    done = {r["submodel_id"] for r in _stored_results(out) if r["status"] == "completed"}
    return (
        bool(plans) and {sm["id"] for sm in json.loads(plans[0].read_text())["submodels"]} <= done
    )


def print_figures(work: Path, n: int, k: int, wall: float, slots: int = 1) -> None:
    """Print the run's figures from what it left in ``work``: the manifest, the nodes' task
    records and the run's log."""
    text = (work / f"run-{n}.log").read_text(errors="replace")
    found = list((work / f"out-{n}").glob("*/manifest.json"))
    manifest = json.loads(found[0].read_text()) if found else {}
    records = [node_tasks(work / f"node-{n}-{i}") for i in range(k)]
    on_node = {u: p for r in records for u, p in r.processing_seconds.items()}
    submodels = manifest.get("submodels") or _stored_results(work / f"out-{n}")
    # outside the node, from the submodel's task run: its waits for memory slots and a node
    # included (subtracting ``waiting_for_node``, which holds the slot acquisition, hid them)
    done = [s for s in submodels if s["status"] == "completed"]
    overhead = [s["duration_seconds"] - on_node.get(s["task_uuid"], 0.0) for s in done]
    slot_wait = [s.get("phase_seconds", {}).get("waiting_for_node", 0.0) for s in done]
    spans = [span for r in records for span in r.spans]
    first, last = min(a for a, _ in spans), max(b for _, b in spans)
    busy = [busy_share(r.spans, first, last) for r in records]
    gaps = [g for r in records for g in idle_gaps(r.spans)]
    # while submodels waited: until the last task started (after it nothing waits for a node)
    last_start = max(a for a, _ in spans)
    waited = [slot_busy_share(r.spans, slots, first, last_start) for r in records]
    node_waited = [busy_share(r.spans, first, last_start) for r in records]
    api_errors = text.count("retryable status code") + text.count("retryable exception")
    api_503 = text.count("retryable status code 503")
    merge_seconds = float(manifest.get("timings_seconds", {}).get("merge", float("nan")))
    print(f"  {len(submodels)} submodels on {k} nodes, wall {wall:.0f} s")
    print(
        f"  node utilisation from the first task's start to the last task's end ({last - first:.0f} s): "
        + ", ".join(f"{b:.2f}" for b in busy)
        + f"; mean {statistics.fmean(busy):.2f}"
    )
    print(
        f"  while submodels waited (first start to last start, {last_start - first:.0f} s): "
        f"task slots busy {statistics.fmean(waited):.2f} (per node "
        + ", ".join(f"{b:.2f}" for b in waited)
        + f"), nodes running a task {statistics.fmean(node_waited):.2f}"
    )
    if gaps:
        print(
            f"  a node idle between two of its tasks: median {statistics.median(gaps):.1f} s, "
            f"max {max(gaps):.1f} s"
        )
    print(
        f"  time per submodel outside the node (its run minus processing on the node): median "
        f"{statistics.median(overhead):.1f} s, p90 {float(np.percentile(overhead, 90)):.1f} s; of"
        f" it the wait for slots and a node: median {statistics.median(slot_wait):.1f} s, p90 "
        f"{float(np.percentile(slot_wait, 90)):.1f} s"
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
    # the runner's processing phase runs from the commit until it sees the task completed
    noticed = [
        s["phase_seconds"]["processing"] - on_node[s["task_uuid"]]
        for s in submodels
        if s["status"] == "completed"
        and "processing" in s.get("phase_seconds", {})
        and on_node.get(s["task_uuid"])
    ]
    if noticed:
        print(
            "  runner's processing phase beyond the node's processing time (commit to start, "
            f"completion to noticed): median {statistics.median(noticed):.2f} s, "
            f"p90 {float(np.percentile(noticed, 90)):.2f} s"
        )
    print(
        f"  Prefect API answers retried by the client (DEBUG log): {api_errors}, of them 503: "
        f"{api_503}; merge {merge_seconds:.1f} s"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, nargs="+", default=[1800])
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--split", type=int, default=100)
    parser.add_argument("--sqlite", action="store_true", help="SQLite behind the Prefect server")
    parser.add_argument(
        "--embedded",
        action="store_true",
        help="no server: the run starts Prefect's temporary (embedded) API itself",
    )
    parser.add_argument(
        "--nodeodm-test-seconds",
        type=int,
        default=None,
        help="NodeODM 2.2.4 test-mode nodes (../shared/peers) whose tasks run this long, "
        "instead of built-in engines",
    )
    parser.add_argument("--slots", type=int, default=2, help="task slots per NodeODM node")
    parser.add_argument("--work", type=Path, default=None, help="keep everything in this folder")
    parser.add_argument(
        "--upload-requests",
        type=int,
        default=None,
        help="PREFECT_ODM_NODE_UPLOAD_REQUESTS of the run (upload requests one node gets at once)",
    )
    parser.add_argument(
        "--no-merge",
        action="store_true",
        help="stop the flow once every submodel is stored (test mode's canned products cannot "
        "be merged: at 10k their merge took 19.9 GiB before the kernel killed it)",
    )
    parser.add_argument("--from-work", type=Path, default=None, help="print a kept run's figures")
    args = parser.parse_args()
    if args.from_work is not None:
        for n in args.images:
            found = list((args.from_work / f"out-{n}").glob("*/manifest.json"))
            timings = json.loads(found[0].read_text())["timings_seconds"] if found else {}
            wall = float(timings.get("total", float("nan")))
            print(f"\n{n} images (kept run in {args.from_work})")
            print_figures(args.from_work, n, args.nodes, wall, args.slots)
        return
    work = args.work or Path(tempfile.mkdtemp(prefix="bench-city-"))
    print(f"work folder: {work}")
    nodeodm = None if args.nodeodm_test_seconds is None else (args.nodeodm_test_seconds, args.slots)
    api = "embedded" if args.embedded else "sqlite" if args.sqlite else "postgresql"
    results = {
        n: run_once(
            n, args.nodes, args.split, api, work, nodeodm, args.no_merge, args.upload_requests
        )
        for n in args.images
    }
    base_n = min(results)
    for n, r in sorted(results.items()):
        ratio = r["cpu_per_image"] / results[base_n]["cpu_per_image"]
        print(f"flow CPU per image at {n}: {ratio:.2f}x that at {base_n} (baseline)")


if __name__ == "__main__":
    main()
