"""Benchmark: point-cloud merge vs plain laspy read-and-write of the same points.

Writes ``--points`` points (default 50 million) as four LAZ submodels (point format 3, as
OpenDroneMap writes) in a 2 x 2 layout whose tiles overlap by 20 % of their side. Then, in child
processes of this same run (each peak memory measured alone):

- baseline: read every input with ``laspy`` ``chunk_iterator`` and write all points to one LAZ
  (no cropping: overlaps doubled);
- ours: :func:`prefect_odm.merge.merge_point_clouds` (ownership cropping, header from all
  inputs, exact bounds and CRS), once per ``--formats`` entry: ``laz`` (plain LAZ, point format
  3) and ``copc`` (COPC, point format 7, octree built from spill files beside the output).

Throughput is input points per second; the ratio ours/baseline is printed for each format, from
wall time and from CPU time (all threads of the child: the work done, which a busy machine does
not change as much as the wall time). The LAZ backends are printed: both sides read through
laspy's default (its first available ``LazBackend``: ``LazrsParallel``, lazrs decoding the LAZ
chunks on every core); the baseline and the plain-LAZ merge write through the same, the COPC
merge through ``lazrs.ParLasZipCompressor.compress_chunks`` (the nodes compressed on every core).
The machine's load average is printed before and after each case. Inputs already in ``--keep``
(same count) are used again. ``--workers on`` runs the merge with ``workers=True`` (decoding and
node compression in worker processes); CPU time then counts the joined workers too, and their
peaks are printed beside the merge's.

Usage::

    python benchmarks/bench_merge_points.py --points 50000000 [--chunk 2000000] [--keep DIR]
        [--formats laz,copc] [--workers on|off]
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
from _measure import peak_mib
from _merge_common import bench_folder, run_in_child

EPSG = 32615
LEFT, BOTTOM, TILE_M = 500_000.0, 5_000_000.0, 500.0


def _layout(overlap: float) -> list[tuple[str, float, float]]:
    step = TILE_M * (1 - overlap)
    return [
        (f"submodel_{n:04d}", LEFT + c * step, BOTTOM + r * step)
        for n, (r, c) in enumerate([(0, 0), (0, 1), (1, 0), (1, 1)])
    ]


def make_inputs(folder: Path, points: int, overlap: float, chunk: int) -> dict[str, Path]:
    import laspy
    import pyproj

    rng = np.random.default_rng(0)
    out = {}
    per = points // 4
    for sid, x0, y0 in _layout(overlap):
        header = laspy.LasHeader(point_format=3, version="1.2")
        header.scales = np.array([0.001, 0.001, 0.001])
        header.offsets = np.array([x0, y0, 0.0])
        header.add_crs(pyproj.CRS.from_epsg(EPSG))
        path = folder / f"{sid}.laz"
        out[sid] = path
        if path.exists():
            with laspy.open(path) as old:
                if int(old.header.point_count) == per:
                    continue
        with laspy.open(path, mode="w", header=header) as writer:
            done = 0
            while done < per:
                n = min(chunk, per - done)
                rec = laspy.ScaleAwarePointRecord.zeros(n, header=header)
                rec.x = x0 + rng.uniform(0, TILE_M, n)
                rec.y = y0 + rng.uniform(0, TILE_M, n)
                rec.z = 150 + rng.normal(0, 3, n)
                rec.intensity = rng.integers(0, 4000, n, dtype=np.uint16)
                rec.red = rng.integers(0, 65535, n, dtype=np.uint16)
                rec.green = rec.red
                rec.blue = rec.red
                writer.write_points(rec)
                done += n
    return out


def _load() -> str:
    one, five, _ = os.getloadavg()
    return f"load {one:.1f} (1 min), {five:.1f} (5 min)"


def _backends() -> str:
    import laspy

    first = laspy.LazBackend.detect_available()[0]
    return (
        f"LAZ backends: reading (both sides) laspy {first.name}; writing: baseline and merge laz "
        f"laspy {first.name}, merge copc lazrs.ParLasZipCompressor.compress_chunks; "
        f"{os.cpu_count()} CPUs"
    )


def _run_baseline(inputs: dict[str, Path], out: Path, chunk: int, queue: Any) -> None:
    import laspy

    t, cpu = time.perf_counter(), _cpu_seconds()
    ids = sorted(inputs)
    total = 0
    with laspy.open(inputs[ids[0]]) as first:
        header = first.header
    with laspy.open(out, mode="w", header=header) as writer:
        for sid in ids:
            with laspy.open(inputs[sid]) as reader:
                for pts in reader.chunk_iterator(chunk):
                    writer.write_points(pts)
                    total += len(pts)
    queue.put((time.perf_counter() - t, _cpu_seconds() - cpu, peak_mib(), total, total))


def _run_ours(
    inputs: dict[str, Path],
    out: Path,
    chunk: int,
    overlap: float,
    fmt: str,
    workers: bool,
    queue: Any,
) -> None:
    from prefect_odm.merge import merge_point_clouds
    from prefect_odm.merge.decode_ahead import DecodeAhead
    from prefect_odm.merge.encode_ahead import EncodeAhead
    from prefect_odm.ownership import Ownership

    worker_mib = [0.0, 0.0]
    close = DecodeAhead.close

    def close_and_note(self: DecodeAhead) -> None:  # the worker's peak, for the figures
        close(self)
        worker_mib[0] = self.worker_peak_mib

    DecodeAhead.close = close_and_note  # type: ignore[method-assign]
    done = EncodeAhead.done

    def done_and_note(self: EncodeAhead) -> None:
        done(self)
        worker_mib[1] = self.worker_peak_mib

    EncodeAhead.done = done_and_note  # type: ignore[method-assign]
    cams = [(x0 + TILE_M / 2, y0 + TILE_M / 2, sid) for sid, x0, y0 in _layout(overlap)]
    t, cpu = time.perf_counter(), _cpu_seconds()
    report = merge_point_clouds(
        inputs,
        out,
        ownership=Ownership.from_cameras(cams),
        chunk_points=chunk,
        point_cloud_format=fmt,  # type: ignore[arg-type]
        workers=workers,
    )
    queue.put(
        (
            time.perf_counter() - t,
            _cpu_seconds() - cpu,
            peak_mib(),
            report.points_in,
            report.points_kept,
            tuple(worker_mib),
        )
    )


def _cpu_seconds() -> float:
    """CPU seconds of this process (all threads) and of its joined children (the decoder)."""
    times = os.times()
    return times.user + times.system + times.children_user + times.children_system


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--points", type=int, default=50_000_000)
    parser.add_argument("--chunk", type=int, default=2_000_000)
    parser.add_argument("--overlap", type=float, default=0.2)
    parser.add_argument("--keep", type=Path, default=None)
    parser.add_argument("--formats", default="laz,copc", help="merge outputs to time: laz,copc")
    parser.add_argument(
        "--workers",
        choices=("on", "off"),
        default="off",
        help="the merge decodes and compresses in worker processes (on) or in process (off)",
    )
    args = parser.parse_args()
    with bench_folder(args.keep, "bench_merge_points_") as root:
        t = time.perf_counter()
        inputs = make_inputs(root, args.points, args.overlap, args.chunk)
        print(f"wrote {args.points:,} points in 4 LAZ inputs in {time.perf_counter() - t:.1f} s")
        print(_backends())
        print(f"  before baseline: {_load()}")
        b_s, b_cpu, b_mib, b_in, _ = run_in_child(
            _run_baseline, inputs, root / "baseline.laz", args.chunk
        )
        print(
            f"  laspy read+write       : {b_s:7.1f} s  cpu {b_cpu:7.1f} s  "
            f"{b_in / b_s / 1e6:6.2f} Mpts/s  peak {b_mib:6.0f} MiB  (after: {_load()})"
        )
        ahead = args.workers == "on"
        for fmt in args.formats.split(","):
            name = "ours.copc.laz" if fmt == "copc" else "ours.laz"
            o_s, o_cpu, o_mib, o_in, o_kept, w_mib = run_in_child(
                _run_ours, inputs, root / name, args.chunk, args.overlap, fmt, ahead
            )
            size_mb = (root / name).stat().st_size / 1e6
            print(
                f"  merge_point_clouds {fmt:4s}: {o_s:7.1f} s  cpu {o_cpu:7.1f} s  "
                f"{o_in / o_s / 1e6:6.2f} Mpts/s  peak {o_mib:6.0f} MiB "
                f"(workers: decoding {w_mib[0]:.0f}, compressing {w_mib[1]:.0f} MiB)  "
                f"{size_mb:7.1f} MB  "
                f"(kept {o_kept:,} of {o_in:,})  throughput ratio ours/baseline = "
                f"{(o_in / o_s) / (b_in / b_s):.2f} (wall), {b_cpu / o_cpu:.2f} (cpu)  "
                f"(after: {_load()})"
            )


if __name__ == "__main__":
    main()
