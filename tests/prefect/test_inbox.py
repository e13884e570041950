"""``process_inbox`` on a real server: two surveys (brighton's halves, as symlinks), one already
reconstructed under another folder name -> exactly one new reconstruction is started."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from odm_prefect_helpers import run_deployment_and_wait, runs_of

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _half(images: Path, dest: Path, part: int) -> Path:
    files = sorted(p for p in images.iterdir() if p.suffix.lower() in (".jpg", ".jpeg"))
    half = files[: len(files) // 2] if part == 0 else files[len(files) // 2 :]
    dest.mkdir(parents=True)
    for f in half:
        (dest / f.name).symlink_to(f)
    return dest


def test_inbox_starts_exactly_one_reconstruction(
    prefect_server, worker, brighton_images, tmp_path, odm_home
):
    from prefect.client.orchestration import get_client
    from prefect_odm.flows import reconstruct
    from prefect_odm.flows.process_inbox import SURVEY_TAG_PREFIX

    from prefect_odm.models import ProcessingOptions
    from prefect_odm.survey.scan import scan_images

    output = tmp_path / "out"
    # Half A was reconstructed earlier from a folder of another name (inline, in this process).
    first = _half(brighton_images, tmp_path / "earlier" / "flight-2026-06-01", 0)
    done = reconstruct(
        images=str(first),
        output=str(output),
        split=10,
        options=ProcessingOptions(pipeline="direct"),
        submodel_deployment="inline",
    )
    inbox = tmp_path / "inbox"
    _half(brighton_images, inbox / "a-renamed", 0)
    new = _half(brighton_images, inbox / "b", 1)
    new_fp = scan_images(str(new)).fingerprint

    inbox_parameters = {
        "inbox": str(inbox),
        "output": str(output),
        "max_concurrent": 2,
        "settings": {"split": 10, "options": {"pipeline": "direct"}},
    }
    run = run_deployment_and_wait(
        "process_inbox/process-inbox", inbox_parameters, timeout_seconds=300
    )
    assert run.state.type.value == "COMPLETED", run.state.message

    started = runs_of("reconstruct", output)
    assert len(started) == 1
    assert started[0].parameters["images"] == str(new)
    assert f"{SURVEY_TAG_PREFIX}{new_fp[:16]}" in started[0].tags
    assert started[0].state.type.value == "COMPLETED"
    assert (output / new_fp[:16] / "manifest.json").is_file()
    assert (output / done.survey_fingerprint[:16] / "manifest.json").is_file()
    with get_client(sync_client=True) as client:
        artifact = client.read_latest_artifacts()  # latest version of every keyed artifact
    report = next(a for a in artifact if a.key == "inbox-report")
    assert "a-renamed" in report.data and "already reconstructed" in report.data
    assert json.dumps(str(new))[1:-1] in report.data and "started" in report.data
