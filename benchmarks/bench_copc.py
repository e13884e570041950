"""COPC writing against laspy's plain LAZ read + write of the same points, side by side.

Each case runs in its own spawned process (peak resident memory is per process) on the same input;
the script prints seconds, peak MiB, output MB and the ratio against the baseline (laspy plain).

    python benchmarks/bench_copc.py [cloud.laz]   # default: brighton's ODM cloud (940,393 points)
"""

from __future__ import annotations

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

    write_copc(Path(src), Path(dst))


def _run(case: str, src: str, dst: str, queue: mp.Queue) -> None:  # type: ignore[type-arg]
    from _measure import peak_mib

    start = time.perf_counter()
    (_laspy_plain if case == "laspy" else _copc)(src, dst)
    queue.put((time.perf_counter() - start, peak_mib()))


def main() -> None:
    src = Path(sys.argv[1] if len(sys.argv) > 1 else DEFAULT).resolve()
    ctx = mp.get_context("spawn")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for case, name in (("laspy", "plain.laz"), ("copc", "model.copc.laz")):
            queue = ctx.Queue()
            dst = str(Path(tmp) / name)
            proc = ctx.Process(target=_run, args=(case, str(src), dst, queue))
            proc.start()
            seconds, peak = queue.get()
            proc.join()
            rows.append((case, seconds, peak, Path(dst).stat().st_size / 1e6))
    base = rows[0][1]
    print(f"input {src.name}: {src.stat().st_size / 1e6:.2f} MB")
    for case, seconds, peak, size in rows:
        print(
            f"{case:6s} {seconds:7.2f} s  peak {peak:7.1f} MiB  output {size:6.2f} MB  "
            f"time ratio vs laspy plain {seconds / base:.2f}"
        )


if __name__ == "__main__":
    main()
