"""A reuse is trusted only when its files are there and whole (issue of a new user: a deleted
submodel folder and a truncated DSM were "reused"; ``merge --plan`` merged one submodel of two
without a word; an unwritable ``merged/`` cost the earlier manifest).

Each test copies the session's brighton reconstruction (``brighton_split``: --split 10
--split-overlap-m 20, two submodels) into ``tmp_path``, damages the copy and asks the same
functions the command line and the flow ask. No new reconstruction."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from prefect_odm import progress
from prefect_odm.cli.reconstruct import _damage_since_last_run
from prefect_odm.errors import InputError, StorageError
from prefect_odm.layout import OutputLayout
from prefect_odm.models import Manifest, MergeOptions
from prefect_odm.run_policy import reused_and_pending, stored_manifest

pytestmark = pytest.mark.integration


def _copy_run(brighton_split, tmp_path: Path) -> tuple[Path, Manifest]:  # type: ignore[no-untyped-def]
    """The run's survey folder copied under ``tmp_path/out``, every JSON record pointing at
    the copy; (the copy's survey folder, its manifest)."""
    _manifest, survey_dir, _plan = brighton_split
    copy = tmp_path / "out" / survey_dir.name
    shutil.copytree(survey_dir, copy)
    for record in copy.rglob("*.json"):
        record.write_text(record.read_text().replace(str(survey_dir), str(copy)))
    return copy, Manifest.model_validate_json((copy / "manifest.json").read_text())


def _warnings() -> tuple[list[str], object]:
    seen: list[str] = []

    def listen(event: progress.ProgressEvent) -> None:
        if isinstance(event, progress.WarningEvent):
            seen.append(event.text)

    return seen, progress.subscribe(listen)


def test_a_deleted_submodel_is_processed_again_and_said(brighton_split, tmp_path: Path) -> None:
    _m, _d, plan = brighton_split
    copy, manifest = _copy_run(brighton_split, tmp_path)
    assert manifest.product_sizes and all(r.product_sizes for r in manifest.submodels)
    layout = OutputLayout(str(tmp_path / "out"), manifest.survey_fingerprint)
    assert _damage_since_last_run(manifest) is None  # the undamaged copy is reused whole
    assert sorted(reused_and_pending(plan, layout, force=False)[0]) == [
        "submodel-000",
        "submodel-001",
    ]
    (gone,) = copy.glob("submodels/submodel-001-*")
    dsm = gone / "dsm.tif"
    dsm.write_bytes(dsm.read_bytes()[:1000])  # result.json kept, a product cut short
    seen, stop = _warnings()
    try:
        reused, pending = reused_and_pending(plan, layout, force=False)
    finally:
        stop()  # type: ignore[operator]
    assert sorted(reused) == ["submodel-000"] and pending == ["submodel-001"]
    assert seen == [
        f"submodel-001: its products are damaged ({dsm}: 1000 of "
        f"{manifest.submodels[1].product_sizes['dsm']} bytes); processing it again"
    ]
    shutil.rmtree(gone)  # the user's rm -rf OUT/<fp>/submodels/submodel-001-*
    why = _damage_since_last_run(manifest)
    assert why is not None and why.startswith("submodel-001: its products are missing (")
    assert str(gone) in why and why.endswith("; processing it again")
    assert reused_and_pending(plan, layout, force=False)[1] == ["submodel-001"]


def test_a_truncated_merged_dsm_is_merged_again(brighton_split, tmp_path: Path) -> None:
    copy, manifest = _copy_run(brighton_split, tmp_path)
    layout = OutputLayout(str(tmp_path / "out"), manifest.survey_fingerprint)
    assert stored_manifest(layout, manifest.merge_fingerprint) is not None
    dsm = copy / "merged" / "dsm.tif"
    whole = dsm.read_bytes()
    dsm.write_bytes(whole[:1000])  # truncate -s 1000
    assert "merged products are damaged" in (_damage_since_last_run(manifest) or "")
    seen, stop = _warnings()
    try:
        assert stored_manifest(layout, manifest.merge_fingerprint) is None
    finally:
        stop()  # type: ignore[operator]
    assert seen == [
        f"merged products are damaged ({dsm}: 1000 of {len(whole)} bytes); merging again"
    ]
    # A manifest written before sizes were recorded: the DSM must open, and it does not.
    record = json.loads((copy / "manifest.json").read_text())
    del record["product_sizes"]
    (copy / "manifest.json").write_text(json.dumps(record))
    assert stored_manifest(layout, manifest.merge_fingerprint) is None
    dsm.write_bytes(whole)  # whole again: the old record is reused (it opens)
    assert stored_manifest(layout, manifest.merge_fingerprint) is not None


def test_merge_with_a_plan_refuses_a_missing_submodel(brighton_split, tmp_path: Path) -> None:
    from prefect_odm.flows.merge_existing import merge_existing

    copy, _manifest = _copy_run(brighton_split, tmp_path)
    for gone in copy.glob("submodels/submodel-001-*"):
        shutil.rmtree(gone)
    plan_json = str(copy / "plan" / "plan.json")
    with pytest.raises(
        InputError, match=r"^--plan .*plan\.json: 1 of its 2 submodels \(submodel-001\) not among"
    ):
        merge_existing(inputs=[str(copy / "submodels")], output=str(tmp_path / "M"), plan=plan_json)
    assert not (tmp_path / "M").exists()


def test_an_unwritable_merged_folder_keeps_the_manifest(
    brighton_split, brighton_images, tmp_path: Path, odm_home
) -> None:
    from prefect_odm.flows import reconstruct

    copy, _manifest = _copy_run(brighton_split, tmp_path)
    before = (copy / "manifest.json").read_bytes()
    merged = copy / "merged"
    subprocess.run(["chattr", "+i", str(merged)], check=True)  # the user's chattr +i
    try:
        with pytest.raises(StorageError, match=rf"^{merged}: cannot write here"):
            reconstruct(
                images=str(brighton_images), output=str(tmp_path / "out"), split=10,
                split_overlap_m=20, merge_options=MergeOptions(point_cloud_format="laz"),
            )  # fmt: skip
    finally:
        subprocess.run(["chattr", "-i", str(merged)], check=True)
    assert (copy / "manifest.json").read_bytes() == before


def test_a_plan_written_by_a_later_unfinished_run_is_not_answered_from(
    brighton_split, tmp_path: Path
) -> None:
    """A rerun refused after planning (a new user's trial: another option, a node's calibration
    refused) left its own ``plan/plan.json``; the first command repeated was answered "nothing
    changed" with that plan in place (a ``merge --plan`` of it describes a run that never
    finished). The shortcut now sees it and plans again."""
    from prefect_odm.cli.last_run_checks import _plan_since_last_run

    copy, manifest = _copy_run(brighton_split, tmp_path)
    output = str(tmp_path / "out")
    assert _plan_since_last_run(output, manifest) is None  # the run's own plan
    plan_file = copy / "plan" / "plan.json"
    plan = json.loads(plan_file.read_text())
    assert plan["fingerprint"] == manifest.plan_fingerprint
    plan_file.write_text(json.dumps({**plan, "fingerprint": "823e" + "0" * 60}))
    why = _plan_since_last_run(output, manifest)
    assert why is not None and why.endswith(
        "plan.json is not the last run's plan (a later run did not finish); planning again"
    ), why
    plan_file.unlink()
    assert _plan_since_last_run(output, manifest) is not None
