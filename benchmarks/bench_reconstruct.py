"""End-to-end timing of `prefect-odm reconstruct`: a first run, then an identical second run.

The second run must reuse every submodel and the merge; the figure of merit is its time as a
fraction of the first run's (target: under 20%). Both runs are the real command line in a fresh
process on Prefect's embedded API, with the built-in engine, exactly as a user runs them.

    python benchmarks/bench_reconstruct.py [--survey brighton_beach_1600] [--split 10]
        [--split-overlap-m 20] [--pipeline sfm]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def run(cmd: list[str], env: dict[str, str]) -> tuple[float, str]:
    start = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"command failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr[-3000:]}")
    return elapsed, proc.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--survey", default="brighton_beach_1600")
    parser.add_argument("--split", default="10")
    parser.add_argument("--split-overlap-m", default="20")
    parser.add_argument("--pipeline", default="sfm", choices=["sfm", "direct"])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, PREFECT_ODM_HOME=f"{tmp}/home")
        env.pop("PREFECT_API_URL", None)
        cmd = [
            sys.executable,
            "-m",
            "prefect_odm.cli",
            "reconstruct",
            str(DATA / args.survey / "images"),
            "--output",
            f"{tmp}/out",
            "--split",
            args.split,
            "--split-overlap-m",
            args.split_overlap_m,
            "--pipeline",
            args.pipeline,
        ]
        first, out1 = run(cmd, env)
        first_timings = json.loads(next(Path(tmp, "out").glob("*/manifest.json")).read_text())[
            "timings_seconds"
        ]
        second, out2 = run(cmd, env)
        # The same images under another path: the command's record of the last run does not
        # match, so the flow runs; every submodel and the merge are reused by fingerprint
        # (Prefect's embedded API start-up is most of this time).
        linked = Path(tmp, "images")
        linked.mkdir()
        for src in sorted((DATA / args.survey / "images").iterdir()):
            (linked / src.name).symlink_to(src)
        cmd_linked = [*cmd[:4], str(linked), *cmd[5:]]
        third, out3 = run(cmd_linked, env)
        assert "reused" in out3, out3
        manifest = json.loads(next(Path(tmp, "out").glob("*/manifest.json")).read_text())
        states = [s["status"] for s in manifest["submodels"]]
        print(f"survey={args.survey} pipeline={args.pipeline} submodels={len(states)}")
        print(f"first run:  {first:7.1f} s")
        print(
            f"second run: {second:7.1f} s  (states: {', '.join(states)}; nothing changed: no flow run)"
        )
        print(f"ratio second/first: {second / first:.3f}  (target < 0.20)")
        print(
            f"same images under another path (flow runs, everything reused): {third:7.1f} s, ratio {third / first:.3f}"
        )
        print(f"timings of the first run (s): {json.dumps(first_timings)}")


if __name__ == "__main__":
    main()
