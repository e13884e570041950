"""Are the merged products byte-identical to those of an earlier revision? (issue 29's check that a
regrouping moved code without changing what it computes)

Runs the Quickstart's brighton reconstruction (``--split 10 --split-overlap-m 20``) twice, in
separate processes with private Prefect and engine homes: once with the working tree's package,
once with the package of ``--baseline`` (a git revision, extracted with ``git archive`` and laid
out as installed: ``flows/``, ``tasks/`` and ``blocks/`` linked into ``prefect_odm``). It prints
the SHA-256 of every merged product of each run, whether they match, whether the run's records
(``report/merge.json``, ``manifest.json``, ``report/report.md``) match once the figures that vary
between two runs are masked (times, ``created``, the run's own folder), and the two wall times
(the ratio is this tree's over the baseline's).

    python benchmarks/bench_same_products.py --baseline 941c2e3 [--pipeline sfm|direct]

Exit status 1 when any product or record differs.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
IMAGES = REPO.parent / "shared" / "data" / "brighton_beach_1600" / "images"
PRODUCTS = ("odm_orthophoto.tif", "dsm.tif", "odm_georeferenced_model.laz")
RECORDS = ("report/merge.json", "manifest.json", "report/report.md")
VARYING_KEYS = re.compile(r"seconds|^created$|^points_per_second$|^version$")
"""JSON keys whose values differ between two runs of the same code (times, the clock, the
package version), masked before the records are compared."""
NUMBER = re.compile(r"\d+(\.\d+)?")


def _masked_json(value: object) -> object:
    if isinstance(value, dict):
        return {k: "*" if VARYING_KEYS.search(k) else _masked_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_masked_json(v) for v in value]
    return value


def _masked_markdown(text: str) -> str:
    """The report with its times masked (the submodel table, the timings, each alignment
    stage's seconds)."""
    lines, timings = [], False
    for line in text.splitlines():
        if line.startswith("## "):
            timings = line.startswith("## Timings")
        if timings or line.startswith("| submodel-") or "seconds:" in line:
            line = NUMBER.sub("#", line)
        line = re.sub(r", \d+(\.\d+)? s\)$", ", # s)", line)  # an alignment stage's time
        lines.append(re.sub(r"prefect-odm \S+\.$", "prefect-odm VERSION.", line))
    return "\n".join(lines)


def records(out: Path) -> dict[str, str]:
    """The run's records, masked (see :data:`VARYING_KEYS`), with the run folder as ``OUT`` and
    the built-in engine's port as ``PORT``."""
    survey = next((out / "run").glob("*/manifest.json")).parent
    masked: dict[str, str] = {}
    for name in RECORDS:
        text = (survey / name).read_text().replace(str(out), "OUT")
        text = re.sub(r"127\.0\.0\.1:\d+", "127.0.0.1:PORT", text)  # the engine's port
        if name.endswith(".json"):
            text = json.dumps(_masked_json(json.loads(text)), indent=1)
        else:
            text = _masked_markdown(text)
        masked[name] = text
    return masked


def installed_layout(revision: str, dest: Path) -> Path:
    """The package of ``revision`` laid out as installed, under ``dest``; returns the folder to
    put on ``PYTHONPATH``."""
    src = dest / "src"
    src.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "archive", revision], cwd=REPO, capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(src)], input=archive, check=True)
    shadow = dest / "shadow" / "prefect_odm"
    shadow.mkdir(parents=True)
    for entry in (src / "prefect_odm").iterdir():
        (shadow / entry.name).symlink_to(entry)
    for sub in ("flows", "tasks", "blocks"):
        (shadow / sub).symlink_to(src / sub)
    return shadow.parent


def run(
    python_path: Path | None, out: Path, pipeline: str
) -> tuple[dict[str, str], dict[str, str], float]:
    """Reconstruct brighton into ``out``; the merged products' SHA-256, the masked records and
    the wall time, s."""
    env = dict(os.environ)
    env["PREFECT_HOME"] = str(out / "prefect-home")
    env["PREFECT_ODM_HOME"] = str(out / "odm-home")
    env.pop("PREFECT_API_URL", None)
    if python_path is not None:
        env["PYTHONPATH"] = str(python_path)
    args = [sys.executable, "-m", "prefect_odm.cli", "reconstruct", str(IMAGES), "--output",
            str(out / "run"), "--split", "10", "--split-overlap-m", "20", "--pipeline", pipeline]  # fmt: skip
    start = time.perf_counter()
    done = subprocess.run(args, env=env, cwd=out, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(
            f"reconstruct failed ({python_path or 'this tree'}):\n{done.stderr[-3000:]}"
        )
    merged = next((out / "run").glob("*/merged"))
    digests = {name: hashlib.sha256((merged / name).read_bytes()).hexdigest() for name in PRODUCTS}
    return digests, records(out), wall


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", default="941c2e3", help="git revision to compare with")
    parser.add_argument("--pipeline", default="sfm", choices=["sfm", "direct"])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="same-products-") as tmp:
        root = Path(tmp)
        (root / "base").mkdir()
        (root / "this").mkdir()
        base_path = installed_layout(args.baseline, root / "layout")
        base, base_records, base_s = run(base_path, root / "base", args.pipeline)
        this, this_records, this_s = run(None, root / "this", args.pipeline)
    print(f"brighton --split 10 --split-overlap-m 20 --pipeline {args.pipeline}")
    print(f"{'product':<30} {'baseline ' + args.baseline:<20} {'this tree':<20} same")
    differ = 0
    for name in PRODUCTS:
        same = base[name] == this[name]
        differ += not same
        print(f"{name:<30} {base[name][:16]:<20} {this[name][:16]:<20} {'yes' if same else 'NO'}")
    for name in RECORDS:
        same = base_records[name] == this_records[name]
        differ += not same
        print(f"{name:<30} {'(masked times)':<20} {'':<20} {'yes' if same else 'NO'}")
        if not same:
            import difflib

            diff = difflib.unified_diff(
                base_records[name].splitlines(), this_records[name].splitlines(), lineterm=""
            )
            print("\n".join(list(diff)[:40]))
    print(f"wall: baseline {base_s:.1f} s, this tree {this_s:.1f} s, ratio {this_s / base_s:.2f}")
    return 1 if differ else 0


if __name__ == "__main__":
    raise SystemExit(main())
