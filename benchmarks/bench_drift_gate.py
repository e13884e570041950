"""A copy of brighton whose GPS altitude drifts, through the default command: where it stops.

Issue 31: brighton with its EXIF and XMP (``drone-dji:AbsoluteAltitude``) GPS altitude drifting
``--drift-m`` per image in capture order (its ``RelativeAltitude`` untouched) came out of the
default pipeline with a DSM tilted 19.2 degrees, exit 0. The block gates
(:mod:`prefect_odm.engine.block_checks`) must stop it after structure from motion, before dense
matching, naming the figure. Prints the exit code, the block's figures from the engine's log and
the error line, beside the same figures for the untouched survey (the baseline, same process).

Usage::

    python benchmarks/bench_drift_gate.py [--drift-m 1.7] [--split 0] [--keep DIR]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from exif_gps_edit import drifted_copy

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # the image editor the tests use
BRIGHTON = REPO / ".." / "shared" / "data" / "brighton_beach_1600" / "images"


def run(images: Path, output: Path, split: int) -> tuple[int, float, list[str]]:
    """Run the default command; exit code, seconds and its block/error lines."""
    env = dict(os.environ)
    env["PREFECT_ODM_HOME"] = tempfile.mkdtemp()
    env["PREFECT_HOME"] = tempfile.mkdtemp()
    command = ["prefect-odm", "reconstruct", str(images), "--output", str(output)]
    if split:
        command += ["--split", str(split), "--split-overlap-m", "20"]
    started = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - started
    lines = []
    for path in Path(env["PREFECT_ODM_HOME"]).rglob("task_output.txt"):
        lines += [ln for ln in path.read_text().splitlines() if "block level" in ln]
    lines += [
        ln
        for ln in (done.stdout + done.stderr).splitlines()
        if "not level" in ln or "unusable" in ln
    ]
    return done.returncode, seconds, lines


def main() -> None:
    """Print the untouched and the drifted run's outcome."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--drift-m", type=float, default=1.7)
    parser.add_argument("--split", type=int, default=0)
    parser.add_argument("--keep", type=Path, default=None)
    args = parser.parse_args()
    work = args.keep or Path(tempfile.mkdtemp())
    drifted = work / "drifted"
    drifted_copy(BRIGHTON, drifted, args.drift_m)
    for name, images in (("untouched", BRIGHTON), (f"drift {args.drift_m:+g} m/image", drifted)):
        code, seconds, lines = run(images, work / f"out-{name.split()[0]}", args.split)
        print(f"{name}: exit {code} after {seconds:.0f} s")
        for line in lines:
            print(f"  {line.strip()}")


if __name__ == "__main__":
    main()
