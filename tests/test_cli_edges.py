"""Bad input at the command line's edge: one line naming the thing and the problem, exit status 2,
nothing written; tokens given in node URLs never reach parameters or files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from prefect_odm.cli_reconstruct import _tokens_out_of_urls


def _run(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env.update(PREFECT_ODM_HOME=str(tmp_path / "home"), PREFECT_HOME=str(tmp_path / "ph"))
    return subprocess.run(
        [sys.executable, "-m", "prefect_odm.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


def _one_error_line(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    return lines[-1]


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--option", "=1"], "the option has no name"),
        (["--option", "orthophoto-resolution=3"], "set it with --orthophoto-resolution"),
        (["--orthophoto-resolution", "inf"], "--orthophoto-resolution: must be a finite"),
    ],
)
def test_reconstruct_refuses_bad_options_before_any_work(
    flags, expected, brighton_images, tmp_path
):
    out = tmp_path / "out"
    proc = _run(["reconstruct", str(brighton_images), "--output", str(out), *flags], tmp_path)
    line = _one_error_line(proc)
    assert line.startswith("prefect-odm: error:") and expected in line, line
    assert not out.exists()


def test_infinite_overlap_is_refused(brighton_images, tmp_path):
    proc = _run(["plan", str(brighton_images), "--split-overlap-m", "inf"], tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "--split-overlap-m must be a finite" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_plan_into_an_unwritable_place_is_one_line(brighton_images, tmp_path):
    """A path under a regular file cannot be created, for root too."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    proc = _run(["plan", str(brighton_images), "--output", str(blocker / "plan")], tmp_path)
    line = _one_error_line(proc)
    assert "cannot write the plan here" in line and str(blocker) in line


@pytest.mark.parametrize("content", [None, "not json at all"])
def test_merge_with_a_bad_plan_file_is_one_line(content, tmp_path):
    plan = tmp_path / "plan.json"
    if content is not None:
        plan.write_text(content)
    proc = _run(
        ["merge", str(tmp_path), "--plan", str(plan), "--output", str(tmp_path / "m")], tmp_path
    )
    line = _one_error_line(proc)
    assert f"--plan {plan}" in line
    assert not (tmp_path / "m").exists()


def test_tokens_move_out_of_node_urls_into_the_environment(monkeypatch):
    monkeypatch.setenv("PREFECT_ODM_NODE_TOKENS", json.dumps({"http://127.0.0.1:2": "other"}))
    urls = _tokens_out_of_urls(["http://127.0.0.1:1?token=s3cret", "http://127.0.0.1:2"])
    assert urls == ["http://127.0.0.1:1", "http://127.0.0.1:2"]
    assert json.loads(os.environ["PREFECT_ODM_NODE_TOKENS"]) == {
        "http://127.0.0.1:1": "s3cret",
        "http://127.0.0.1:2": "other",
    }
