"""Ctrl-C at random points of a run: are the memory slots all named, and free for the next run?

Issue 30, item 5: ``prefect-odm reconstruct`` on Prefect's temporary server (no
``PREFECT_API_URL``), the built-in engine, brighton with ``--split 5 --split-overlap-m 15
--pipeline direct --force``, is interrupted ``--runs`` times with SIGINT sent to its whole process
group (what Ctrl-C in a terminal does) at a random point of an uninterrupted repeat run's length
(seeded). After each interrupt it prints: seconds from the signal to the exit, the exit code,
the slots the server counts, those named by living holders, by dead ledger entries and by nobody
(``prefect-odm slots`` says each), and the slots still held once a next run's admission has
reclaimed what no living process holds (must be 0). One PREFECT_HOME and PREFECT_ODM_HOME serve
every run, as on a user's machine. The baseline is the uninterrupted run, in the same process.

Usage::

    python benchmarks/bench_interrupts.py [--runs 10] [--seed 30]
"""

from __future__ import annotations

import argparse
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BRIGHTON = REPO / ".." / "shared" / "data" / "brighton_beach_1600" / "images"
LIMIT = "prefect-odm-memory-gib"
GRACE_SECONDS = 20.0  # the CLI's own deadline for a graceful stop (cli/process.py)


def command(output: Path) -> list[str]:
    """The interrupted command."""
    return [
        sys.executable,
        "-m",
        "prefect_odm.cli",
        "reconstruct",
        str(BRIGHTON),
        "--output",
        str(output),
        "--split",
        "5",
        "--split-overlap-m",
        "15",
        "--pipeline",
        "direct",
        "--force",
    ]


def slots_figures(env: dict[str, str]) -> tuple[int, int, int, int]:
    """``prefect-odm slots``: in use, held by living holders, by dead entries, by nobody."""
    shown = subprocess.run(
        [sys.executable, "-m", "prefect_odm.cli", "slots"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    in_use = re.search(r": (\d+) of \d+ GiB slots in use", shown)
    living = sum(int(m) for m in re.findall(r": (\d+) slots for .*\[running\]", shown))
    dead = sum(int(m) for m in re.findall(r": (\d+) slots for .*\[dead", shown))
    nobody = re.search(r"(\d+) slots held by no process", shown)
    return (
        int(in_use.group(1)) if in_use else 0,
        living,
        dead,
        int(nobody.group(1)) if nobody else 0,
    )


def held_after_reclaim(env: dict[str, str]) -> int:
    """Slots still counted once a next run's admission reclaimed the dead and the orphaned."""
    code = (
        "from prefect_odm.tasks.admission import reclaim_dead_holders, slots_status\n"
        f"reclaim_dead_holders({LIMIT!r})\n"
        f"print(slots_status({LIMIT!r})['active_slots'] or 0)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    return int(done.stdout.strip().splitlines()[-1])


def _last_line(path: Path) -> str:
    """The command's last line on stderr (how it ended)."""
    lines = path.read_text(errors="replace").strip().splitlines()
    return lines[-1][:160] if lines else ""


def main() -> None:
    """Run the baseline, then the interrupts, and print one row per interrupt."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--seed", type=int, default=30)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-interrupts-"))
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env.update(
        PREFECT_HOME=str(work / "prefect-home"),
        PREFECT_ODM_HOME=str(work / "odm-home"),
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="180",
    )
    for attempt in ("first", "repeat"):  # the repeat's length, caches warm, is the range
        started = time.perf_counter()
        subprocess.run(command(work / attempt), env=env, check=True, capture_output=True)
        baseline_seconds = time.perf_counter() - started
        print(f"baseline: uninterrupted {attempt} run {baseline_seconds:.1f} s (temporary server)")
    rng = random.Random(args.seed)
    print("run  at_s  exit  stop_s  in_use  living  dead  nobody  after_reclaim  last line")
    worst_stop = 0.0
    left_held = 0
    for run in range(args.runs):
        at = rng.uniform(1.0, baseline_seconds)
        said = work / f"run{run}.stderr"
        proc = subprocess.Popen(
            command(work / f"run{run}"),
            env=env,
            start_new_session=True,
            stdout=subprocess.DEVNULL,
            stderr=said.open("w"),
        )
        time.sleep(at)
        signalled = time.perf_counter()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)
        code = proc.wait(timeout=600)
        stop = time.perf_counter() - signalled
        worst_stop = max(worst_stop, stop)
        in_use, living, dead, nobody = slots_figures(env)
        after = held_after_reclaim(env)
        left_held += after
        print(
            f"{run:3d} {at:5.1f} {code:5d} {stop:7.1f} {in_use:7d} {living:7d} {dead:5d}"
            f" {nobody:7d} {after:14d}  {_last_line(said)}"
        )
    print(
        f"worst stop {worst_stop:.1f} s against the {GRACE_SECONDS:.0f} s deadline"
        f" (ratio {worst_stop / GRACE_SECONDS:.2f}); slots held after the next run's reclaim,"
        f" all runs: {left_held}"
    )


if __name__ == "__main__":
    main()
