"""Copies of brighton with bad GPS altitudes through the default command: do they come out level?

Issue 31: brighton with its EXIF and XMP (``drone-dji:AbsoluteAltitude``) GPS altitude drifting
``--drift-m`` per image in capture order (its ``RelativeAltitude`` untouched) came out of the
default pipeline with a DSM tilted 19.2 degrees, exit 0; then the plan refused it. Now the plan
replaces such altitudes by the take-off height + the relative altitude (``plan/altitudes.py``,
sent as ``geo.txt``). Runs, each with fresh ``PREFECT_ODM_HOME``/``PREFECT_HOME``:

* ``untouched``: brighton as it is (the baseline);
* ``drift``: the drifting copy, default command (one submodel);
* ``drift-split``: the same with ``--split 10 --split-overlap-m 20`` (two submodels);
* ``lag``: brighton with ``--lag-m`` on the images either side of each turn
  (``tests/exif_gps_edit.py`` ``lagged_copy``), default command;
* ``lag-split``: the same with the split.

Prints per run: exit code, wall time, the plan's altitude line, each block's figures from the
engine's report (``block_level_deg``: the cameras' mean axis against the attitude the images
record; ``gps_rms_m``), the merged DSM's measured heights against ODM's cloud and against the
untouched run's merged DSM (median |dz|, p90, signed, the tilt of the plane fitted to dz), and
the seams the merge's report records (DSM overlap rms / max after the alignment, per pair).

Usage::

    python benchmarks/bench_drift_gate.py [--drift-m 1.7] [--lag-m 20] [--cases drift,lag]
        [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # the image editor the tests use
sys.path.insert(0, str(REPO / "benchmarks"))
BRIGHTON = REPO / ".." / "shared" / "data" / "brighton_beach_1600"
SPLIT = ["--split", "10", "--split-overlap-m", "20"]
CASES = {
    "untouched": ("untouched", []),
    "drift": ("drift", []),
    "drift-split": ("drift", SPLIT),
    "lag": ("lag", []),
    "lag-split": ("lag", SPLIT),
}
"""Run name -> (the images, the extra arguments); the first is the baseline."""


def run(images: Path, output: Path, extra: list[str]) -> tuple[int, float, list[str]]:
    """Run the default command; exit code, seconds and its altitude/refusal lines."""
    env = dict(os.environ)
    env["PREFECT_ODM_HOME"] = tempfile.mkdtemp(prefix="drift-odm-")
    env["PREFECT_HOME"] = tempfile.mkdtemp(prefix="drift-prefect-")
    command = [sys.executable, "-m", "prefect_odm.cli", "reconstruct", str(images)]
    command += ["--output", str(output), *extra]
    started = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - started
    said = " ".join((done.stdout + done.stderr).split())  # the console wraps long lines
    found = re.findall(r"(GPS altitude unreliable.*?geo\.txt|GPS altitude unusable.*?again)", said)
    lines = found + [ln for ln in done.stderr.splitlines() if "error" in ln or "not level" in ln]
    return done.returncode, seconds, lines


def figures(output: Path, reference: Any, base: Path | None) -> tuple[list[str], Path | None]:
    """The blocks' figures, the merged DSM against ODM's cloud (and against the untouched run's
    merged DSM ``base``) and the seams; and the merged DSM."""
    import _quickstart

    lines = []
    surveys = sorted(output.glob("*/merged/dsm.tif"))
    for report in sorted(output.glob("*/submodels/*/report/engine.json")):
        stats = json.loads(report.read_text())["stats"]
        lines.append(
            f"{report.parents[1].name}: cameras' mean axis {stats['block_level_deg']:.2f} deg "
            f"off the recorded attitude, {stats['gps_rms_m']:.2f} m rms from GPS"
        )
    if not surveys:
        return lines, None
    dz = _quickstart.dz_lines(surveys[-1], reference, base)
    lines += [f"merged DSM {line.replace('single block', 'untouched run')}" for line in dz]
    merge = surveys[-1].parents[1] / "report" / "merge.json"
    if merge.exists():
        alignment = json.loads(merge.read_text()).get("alignment") or {}
        for stage in ("result", "refinement"):
            for pair in (alignment.get(stage) or {}).get("overlaps") or []:
                lines.append(
                    f"seam {pair['overlap']} ({alignment[stage].get('method')}): rms "
                    f"{pair['rms_after_m']:.2f} m, max {pair['max_after_m']:.2f} m after"
                )
    return lines, surveys[-1]


def main() -> None:
    """Make the copies, run the cases and print their figures."""
    import laspy
    import numpy as np
    from exif_gps_edit import drifted_copy, lagged_copy

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--drift-m", type=float, default=1.7)
    parser.add_argument("--lag-m", type=float, default=20.0)
    parser.add_argument("--cases", default="", help="comma-separated subset (untouched first)")
    parser.add_argument("--keep", type=Path, default=None)
    args = parser.parse_args()
    work = args.keep or Path(tempfile.mkdtemp())
    images = {"untouched": BRIGHTON / "images", "drift": work / "drift", "lag": work / "lag"}
    if not images["drift"].exists():
        drifted_copy(BRIGHTON / "images", images["drift"], args.drift_m)
    if not images["lag"].exists():
        lagged_copy(BRIGHTON / "images", images["lag"], args.lag_m)
    las = laspy.read(BRIGHTON / "reference" / "model.laz")
    reference = np.column_stack([las.x, las.y, las.z])
    names = [n for n in CASES if not args.cases or n in args.cases.split(",") or n == "untouched"]
    base = None
    for name in names:
        which, extra = CASES[name]
        code, seconds, lines = run(images[which], work / f"out-{name}", extra)
        more, merged = figures(work / f"out-{name}", reference, base)
        if name == "untouched":
            base = merged
        print(f"\n{name} (drift {args.drift_m:+g} m/image, lag {args.lag_m:g} m): exit {code} "
              f"after {seconds:.0f} s")  # fmt: skip
        for line in lines + more:
            print(f"  {line.strip()}")


if __name__ == "__main__":
    main()
