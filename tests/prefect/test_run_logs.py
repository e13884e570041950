"""Core loggers reach the Prefect UI: a line a core module logs inside a flow run is in that
run's logs on the server; a line logged outside any run is dropped without a warning."""

from __future__ import annotations

import logging
import time
import warnings
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration


def _survey_with_an_empty_image(brighton_images: Path, folder: Path) -> Path:
    folder.mkdir()
    for src in sorted(brighton_images.glob("*.JPG"))[:3]:
        (folder / src.name).symlink_to(src)
    (folder / "empty.jpg").write_bytes(b"")  # rejected by the scan, which logs it (INFO)
    return folder


def _run_logs(flow_run_id, timeout_seconds: float = 30) -> list:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
    from prefect.logging.handlers import APILogHandler

    APILogHandler().flush()  # send what the log worker still holds
    deadline = time.monotonic() + timeout_seconds
    with get_client(sync_client=True) as client:
        while True:
            logs = client.read_logs(
                log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])),
                limit=200,
            )
            if any(log.name.startswith("prefect_odm.") for log in logs):
                return logs
            if time.monotonic() > deadline:
                return logs
            time.sleep(0.5)


def test_core_module_lines_are_in_the_flow_runs_logs(prefect_api, brighton_images, tmp_path):
    from prefect import flow
    from prefect.context import get_run_context
    from prefect_odm.tasks.survey import scan_survey

    images = _survey_with_an_empty_image(brighton_images, tmp_path / "images")

    @flow(name="scan-with-core-logs")
    def scan_flow(folder: str) -> str:
        scan_survey(folder)
        return str(get_run_context().flow_run.id)

    flow_run_id = scan_flow(str(images))
    logs = _run_logs(flow_run_id)
    core = [log for log in logs if log.name == "prefect_odm.survey.scan"]
    assert any("rejected empty.jpg" in log.message for log in core), [
        (log.name, log.message) for log in logs
    ]
    assert all(log.level >= logging.INFO for log in core)


def test_core_lines_outside_a_run_are_dropped_quietly():
    import prefect_odm.tasks  # noqa: F401  (attaches the run-log handler)

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        logging.getLogger("prefect_odm.survey.scan").info("a line outside any run")
