"""``--option NAME=VALUE``: a JSON object or list stays its text, as ODM's ``cameras`` and
``boundary`` options take it (issue 31: ``--option cameras={}`` turns the shared camera
calibration off, ``--option cameras="$(cat cameras.json)"`` gives one)."""

from __future__ import annotations

import json

from prefect_odm.cli.args import build_parser, processing_options


def _options(*words: str) -> dict[str, object]:
    args = build_parser().parse_args(["reconstruct", "images", "--output", "out", *words])
    return dict(processing_options(args).extra)


def test_json_objects_and_lists_stay_text_numbers_do_not() -> None:
    cameras = json.dumps({"dji fc300s 1600 900 brown 0.5555": {"focal_x": 0.5556}})
    extra = _options(
        "--option", f"cameras={cameras}", "--option", "boundary=[1, 2]",
        "--option", "min-num-features=8000", "--option", "fast-orthophoto=true",
        "--option", "sm-cluster=http://x",
    )  # fmt: skip
    assert extra == {
        "cameras": cameras,
        "boundary": "[1, 2]",
        "min-num-features": 8000,
        "fast-orthophoto": True,
        "sm-cluster": "http://x",
    }
    assert _options("--option", "cameras={}") == {"cameras": "{}"}
