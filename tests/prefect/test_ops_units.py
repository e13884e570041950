"""Fast checks of the deployment-mode and inbox helpers (no Prefect server)."""

from __future__ import annotations

import pytest

from prefect_odm.errors import InputError
from prefect_odm.run_policy import configured_submodel_deployment, work_queue_for
from prefect_odm.survey.inbox import InboxEntry, InboxReport, survey_folders

SUBMODEL_DEPLOYMENT_ENV = "PREFECT_ODM_SUBMODEL_DEPLOYMENT"
URGENT_WORK_QUEUE_ENV = "PREFECT_ODM_URGENT_WORK_QUEUE"


def test_submodel_deployment_comes_from_the_parameter_then_the_environment(monkeypatch):
    monkeypatch.delenv(SUBMODEL_DEPLOYMENT_ENV, raising=False)
    assert configured_submodel_deployment(None) is None
    assert configured_submodel_deployment("a/b") == "a/b"
    monkeypatch.setenv(SUBMODEL_DEPLOYMENT_ENV, "process_submodel/process-submodel")
    assert configured_submodel_deployment(None) == "process_submodel/process-submodel"
    assert configured_submodel_deployment("inline") is None
    monkeypatch.setenv(SUBMODEL_DEPLOYMENT_ENV, "inline")
    assert configured_submodel_deployment(None) is None


def test_only_urgent_runs_pick_a_work_queue(monkeypatch):
    monkeypatch.delenv(URGENT_WORK_QUEUE_ENV, raising=False)
    assert work_queue_for("normal") is None
    assert work_queue_for("urgent") == "urgent"
    monkeypatch.setenv(URGENT_WORK_QUEUE_ENV, "rush")
    assert work_queue_for("urgent") == "rush"


def test_survey_folders_lists_sub_folders_only(tmp_path):
    (tmp_path / "b").mkdir()
    (tmp_path / "a").mkdir()
    (tmp_path / ".hidden").mkdir()
    (tmp_path / "note.txt").write_text("x")
    (tmp_path / "linked").symlink_to(tmp_path / "a")
    assert survey_folders(str(tmp_path)) == [str(tmp_path / n) for n in ("a", "b", "linked")]
    with pytest.raises(InputError):
        survey_folders(str(tmp_path / "missing"))


def test_survey_folders_on_s3(s3_endpoint):
    import s3fs

    fs = s3fs.S3FileSystem(client_kwargs={"endpoint_url": s3_endpoint})
    fs.mkdir("inbox-bucket")
    fs.pipe(
        {
            "inbox-bucket/in/one/a.jpg": b"1",
            "inbox-bucket/in/two/b.jpg": b"2",
            "inbox-bucket/in/x.txt": b"3",
        }
    )
    assert survey_folders("s3://inbox-bucket/in") == [
        "s3://inbox-bucket/in/one",
        "s3://inbox-bucket/in/two",
    ]


def test_inbox_report_markdown_lists_every_folder():
    report = InboxReport(
        inbox="/in",
        output="/out",
        entries=[
            InboxEntry(
                folder="/in/a", survey_fingerprint="f" * 64, action="skipped", reason="already"
            ),
            InboxEntry(
                folder="/in/b", survey_fingerprint="e" * 64, action="started", flow_run_id="r1"
            ),
        ],
    )
    text = report.markdown()
    assert "Started 1 reconstruction(s)" in text
    assert "| /in/a | ffffffffffffffff | skipped | already |" in text
    assert [e.folder for e in report.started] == ["/in/b"]
