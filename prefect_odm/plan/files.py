"""The plan's files beside the outputs: ``plan.json``, ``survey.json``, ``plan.geojson`` and
``plan.png`` (:class:`~prefect_odm.layout.OutputLayout` names them)."""

from __future__ import annotations

import tempfile
from pathlib import Path

from prefect_odm import storage
from prefect_odm.layout import OutputLayout
from prefect_odm.models import SplitPlan, Survey

__all__ = ["write_plan_files"]


def _plan_stored(plan: SplitPlan, layout: OutputLayout) -> bool:
    """True when this very plan (same fingerprint) and its pictures are already stored."""
    try:
        stored = storage.read_json(layout.plan_json)
    except (FileNotFoundError, OSError, ValueError):
        return False
    same_names = [c.get("name") for c in stored.get("cameras", [])] == [
        c.name for c in plan.cameras
    ]
    return bool(
        stored.get("fingerprint") == plan.fingerprint
        and same_names
        and storage.exists(layout.plan_png)
    )


def write_plan_files(plan: SplitPlan, survey: Survey, layout: OutputLayout) -> None:
    """Write ``survey.json`` and ``plan.json`` always (image locations may have moved, the plan
    identity does not see names); ``plan.geojson`` and ``plan.png`` only when the plan changed.
    No Prefect: the command line writes a refused plan before Prefect starts.

    Raises:
        OSError: the output cannot be written.
    """
    picture = not _plan_stored(plan, layout)
    from prefect_odm.plan.picture import plan_geojson, plan_png

    storage.write_json_atomic(layout.survey_json, survey.model_dump(mode="json"))
    if picture:
        storage.write_json_atomic(layout.plan_geojson, plan_geojson(plan))
        with tempfile.TemporaryDirectory() as tmp:
            png = Path(tmp) / "plan.png"
            plan_png(plan, png)
            storage.put_file(png, layout.plan_png)
    # plan.json last: process_submodel runs read it, and survey.json beside it.
    storage.write_json_atomic(layout.plan_json, plan.model_dump(mode="json"))
