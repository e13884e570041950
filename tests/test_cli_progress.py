"""The command line's live progress on a real run of 12 brighton images (direct pipeline,
built-in engine, 2 submodels):
in a pseudo-terminal, the screen shows a line per submodel in flight with its node and state;
piped, the same run is told in plain lines (no terminal control codes)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
IN_FLIGHT = re.compile(
    r"submodel-00\d +http://127\.0\.0\.1:\d+ +(uploading|processing|downloading) +\d+\.\d% +\d+:\d\d"
)


def _command(images: Path, output: Path) -> list[str]:
    """The command on 12 of brighton's images (links), in 2 submodels: a short real run."""
    subset = output.parent / "images"
    subset.mkdir(exist_ok=True)
    for src in sorted(images.glob("*.JPG"))[:12]:
        if not (subset / src.name).is_symlink():  # a second run beside the first
            (subset / src.name).symlink_to(src)
    return [
        sys.executable, "-m", "prefect_odm.cli", "reconstruct", str(subset),
        "--output", str(output), "--split", "6", "--split-overlap-m", "20",
        "--pipeline", "direct",
    ]  # fmt: skip


@pytest.fixture(scope="module")
def prefect_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One Prefect home for both runs: the second temporary server finds its database migrated."""
    return tmp_path_factory.mktemp("prefect-home")


def _env(tmp_path: Path, prefect_home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env.update(PREFECT_ODM_HOME=str(tmp_path / "home"), PREFECT_HOME=str(prefect_home))
    return env


def test_terminal_shows_each_submodel_in_flight_with_node_and_state(
    brighton_images, tmp_path, prefect_home
):
    import pexpect

    env = {
        **_env(tmp_path, prefect_home),
        "TERM": "xterm-256color",
        "COLUMNS": "160",
        "LINES": "40",
    }
    cmd = _command(brighton_images, tmp_path / "out")
    child = pexpect.spawn(
        cmd[0], cmd[1:], env=env, dimensions=(40, 160), encoding="utf-8", timeout=600
    )
    # the screen while the run is in flight: a submodel line with its node, state, node
    # progress and elapsed time, under the header with the stage and the counts
    child.expect(IN_FLIGHT)
    shown = ANSI.sub("", child.before + child.after)
    assert re.search(r"process +\d of (\d+) submodels done \(0 cached\), 0 failed", shown), shown
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0, ANSI.sub("", child.before)
    screen = ANSI.sub("", child.before)
    assert "orthophoto:" in screen and re.search(r"(\d+) of \1 submodels done", screen), screen


def test_piped_output_is_plain_lines(brighton_images, tmp_path, prefect_home):
    proc = subprocess.run(
        _command(brighton_images, tmp_path / "out"),
        capture_output=True,
        text=True,
        env=_env(tmp_path, prefect_home),
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    assert not ANSI.search(proc.stderr), proc.stderr
    lines = proc.stderr.splitlines()
    planned = int(re.search(r"^plan: (\d+) submodels$", proc.stderr, re.M).group(1))
    assert planned >= 2, proc.stderr
    # Which submodel a free slot takes first is a race between the runner's threads (on a
    # machine with one memory slot, the other submodel uploads after the first completes):
    # the first upload comes with nothing done, and every planned submodel uploads once.
    uploads = [line for line in lines if re.match(r"submodel-\d{3}: uploading on ", line)]
    assert uploads, proc.stderr
    assert re.match(
        r"submodel-\d{3}: uploading on http://127\.0\.0\.1:\d+; 0 of \d+ submodels done", uploads[0]
    ), proc.stderr
    assert sorted(line.split(":")[0] for line in uploads) == [
        f"submodel-{i:03d}" for i in range(planned)
    ], proc.stderr
    for expected in (
        r"stage: scan$",
        rf"submodel-00\d: completed on http://127\.0\.0\.1:\d+; {planned} of {planned} submodels",
        r"merge orthophoto \d+/\d+$",
        r"stage: done$",
    ):
        assert any(re.match(expected, line) for line in lines), (expected, proc.stderr)
    assert "submodel-000: " in proc.stdout and "orthophoto: " in proc.stdout


def test_a_second_run_elsewhere_counts_the_engines_finished_tasks_it_re_attached(
    brighton_images, tmp_path, prefect_home
):
    """The built-in engine's tasks live under the shared home (``~/.cache/prefect-odm`` by
    default), so a run into another output folder re-attaches to the tasks the first run
    finished and only downloads them: its counts say so, where a new user read "(0 cached)"."""
    env = _env(tmp_path, prefect_home)
    first = subprocess.run(
        _command(brighton_images, tmp_path / "first"), capture_output=True, text=True, env=env,
        timeout=600,
    )  # fmt: skip
    assert first.returncode == 0, first.stderr
    assert "re-attached" not in first.stderr, first.stderr
    second = subprocess.run(
        _command(brighton_images, tmp_path / "second"), capture_output=True, text=True, env=env,
        timeout=600,
    )  # fmt: skip
    assert second.returncode == 0, second.stderr
    planned = int(re.search(r"^plan: (\d+) submodels$", second.stderr, re.M).group(1))
    done = (
        f"{planned} of {planned} submodels done (0 cached, {planned} re-attached to finished tasks)"
    )
    assert done in second.stderr, second.stderr
    assert not re.search(r"submodel-\d{3}: uploading", second.stderr), second.stderr


def test_a_table_printed_into_a_pipe_keeps_each_row_on_one_line(monkeypatch):
    """Piped, rich folds to 80 columns; the ``clusters`` table (9 columns) broke every row over
    several lines, so a script could not read it."""
    import io

    from rich.table import Table

    from prefect_odm.cli.console import table_console

    monkeypatch.delenv("COLUMNS", raising=False)
    table = Table(title="clusters")
    names = ("cluster", "nodes up", "memory GiB", "wanted GiB", "running GiB", "free GiB")
    for name in (*names, "queue depth", "oldest waiting", "state"):
        table.add_column(name)
    table.add_row(
        "cluster-with-a-long-name",
        "3/4",
        "112.5",
        "64.0",
        "32.0",
        "48.5",
        "12",
        "4 min",
        "NOT READY",
    )
    buf = io.StringIO()
    table_console(file=buf).print(table)
    rows = [line for line in buf.getvalue().splitlines() if "cluster-with-a-long-name" in line]
    assert len(rows) == 1 and "NOT READY" in rows[0] and "oldest waiting" in buf.getvalue()
