"""COPC writing (streamed, :func:`prefect_odm.merge.copc.write_copc`) against laspy's plain LAZ
read + write of the same points, side by side, for each input.

Each case runs in its own spawned process (peak resident memory is per process) on the same input;
the script prints seconds (wall and CPU), peak MiB, output MB and the ratios against the baseline (laspy plain,
``laspy.read(src).write(dst)``: the whole cloud in memory). Inputs: brighton's ODM cloud (940,393
points) and, with ``--synthetic N``, a synthesized ODM-like cloud of N points (point format 3, RGB,
a 1 km square, written in chunks into the temporary folder, never kept).

    python benchmarks/bench_copc.py [cloud.laz ...] [--synthetic 12000000 --synthetic 50000000]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

DEFAULT = (
    Path(__file__).resolve().parents[1]
    / ".."
    / "shared"
    / "data"
    / "brighton_beach_1600"
    / "reference"
    / "model.laz"
)


def _laspy_plain(src: str, dst: str) -> None:
    import laspy

    laspy.read(src).write(dst)


def _copc(src: str, dst: str) -> None:
    from prefect_odm.merge.copc import write_copc

    write_copc(Path(src), Path(dst), work=Path(dst).parent)


def _run(case: str, src: str, dst: str, queue: mp.Queue) -> None:  # type: ignore[type-arg]
    from _measure import peak_mib

    start, cpu = time.perf_counter(), time.process_time()
    (_laspy_plain if case == "laspy" else _copc)(src, dst)
    queue.put((time.perf_counter() - start, time.process_time() - cpu, peak_mib()))


def synthesize(path: Path, points: int, chunk: int = 2_000_000) -> Path:
    """An ODM-like cloud: format 3 with RGB, EPSG:32615, 1 km square, ground 150 m +- 3 m."""
    import laspy
    import numpy as np
    import pyproj

    rng = np.random.default_rng(0)
    header = laspy.LasHeader(point_format=3, version="1.2")
    header.scales = np.array([0.001, 0.001, 0.001])
    header.offsets = np.array([500_000.0, 5_000_000.0, 0.0])
    header.add_crs(pyproj.CRS.from_epsg(32615))
    with laspy.open(path, mode="w", header=header) as writer:
        done = 0
        while done < points:
            n = min(chunk, points - done)
            rec = laspy.ScaleAwarePointRecord.zeros(n, header=header)
            rec.x = 500_000.0 + rng.uniform(0, 1000, n)
            rec.y = 5_000_000.0 + rng.uniform(0, 1000, n)
            rec.z = 150 + rng.normal(0, 3, n)
            rec.red = rng.integers(0, 65535, n, dtype=np.uint16)
            rec.green, rec.blue = rec.red, rec.red
            writer.write_points(rec)
            done += n
    return path


def _compare(src: Path, tmp: Path) -> None:
    ctx = mp.get_context("spawn")
    rows = []
    for case, name in (("laspy", "plain.laz"), ("copc", "model.copc.laz")):
        queue = ctx.Queue()
        dst = str(tmp / name)
        proc = ctx.Process(target=_run, args=(case, str(src), dst, queue))
        proc.start()
        seconds, cpu, peak = queue.get()
        proc.join()
        rows.append((case, seconds, cpu, peak, Path(dst).stat().st_size / 1e6))
        Path(dst).unlink()
    base, base_cpu = rows[0][1], rows[0][2]
    print(f"input {src.name}: {src.stat().st_size / 1e6:.2f} MB")
    for case, seconds, cpu, peak, size in rows:
        print(
            f"  {case:6s} {seconds:7.2f} s  cpu {cpu:7.2f} s  peak {peak:7.1f} MiB  "
            f"output {size:7.2f} MB  ratio vs laspy plain: time {seconds / base:.2f}, "
            f"cpu {cpu / base_cpu:.2f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("clouds", nargs="*", type=Path)
    parser.add_argument("--synthetic", type=int, action="append", default=[])
    args = parser.parse_args()
    clouds = args.clouds or ([] if args.synthetic else [DEFAULT])
    with tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder)
        for src in clouds:
            _compare(src.resolve(), tmp)
        for points in args.synthetic:
            src = synthesize(tmp / f"synthetic_{points}.laz", points)
            _compare(src, tmp)
            src.unlink()


if __name__ == "__main__":
    main()
