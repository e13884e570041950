"""The command line's no-change shortcut (``_unchanged_since_last_run``) sees every option that
changes what a run writes: a rerun into the same output with another merge option (a fresh
user's trial: ``--point-cloud-format laz`` after the Quickstart said "nothing changed" and kept
the COPC file) is another request, and runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from prefect_odm.cli.args import build_parser, processing_options
from prefect_odm.cli.reconstruct import _run_request, _unchanged_since_last_run
from prefect_odm.layout import LAST_RUN_FILE


def _request(images: Path, *extra: str):  # type: ignore[no-untyped-def]
    args = build_parser().parse_args(["reconstruct", str(images), "--output", "out", *extra])
    return _run_request(args, processing_options(args))


@pytest.mark.parametrize(
    "changed", [["--point-cloud-format", "laz"], ["--accept-alignment"], ["--split", "6"]]
)
def test_a_merge_option_makes_another_request(tmp_path: Path, changed: list[str]) -> None:
    images = tmp_path / "images"
    images.mkdir()
    (images / "a.jpg").write_bytes(b"\xff\xd8")
    first = _request(images)
    assert _request(images) == first  # the same command is the same request
    other = _request(images, *changed)
    assert other != first
    output = tmp_path / "output"
    output.mkdir()
    (output / LAST_RUN_FILE).write_text("{}")
    assert _unchanged_since_last_run(str(output), other) is None


def test_the_record_keeps_the_merge_options(tmp_path: Path) -> None:
    images = tmp_path / "images"
    images.mkdir()
    request = _request(images, "--point-cloud-format", "laz")
    assert request["merge_options"]["point_cloud_format"] == "laz"
    assert _request(images)["merge_options"]["point_cloud_format"] == "copc"
