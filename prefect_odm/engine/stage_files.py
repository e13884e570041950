"""Where the built-in engine's stages keep their results in the task folder, the context every
stage gets, and whether a stage finished (its files are on disk)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prefect_odm.registry import PRODUCTS, REPORT_FILES, REPORT_FOLDER

ENGINE_REPORT = f"{REPORT_FOLDER}/engine.json"
"""The engine's report: method, image counts, points, GSD, resolutions, seconds per stage."""

SHOTS = f"{REPORT_FOLDER}/{REPORT_FILES['shots']}"
CAMERAS = REPORT_FILES["cameras"]
"""The camera models, at the top of the task's outputs as ODM writes them."""
STAGE_SECONDS = f"{REPORT_FOLDER}/stage_seconds.json"
DATASET = "images.json"
RECONSTRUCTION_DIR = "opensfm"
DENSE_RECORD = "openmvs/dense.json"
"""What the dense stage did: ``{"dense": bool, ...}`` (pairs, points, image scale, cell)."""
DENSE_CLOUD = "openmvs/scene_dense.npz"
"""The fused dense cloud: ``xyz`` (n, 3) float64 UTM metres, ``rgb`` (n, 3) uint8."""
SURFACE = "odm_dem/engine_surface.tif"
"""The gap-free surface the orthophoto is draped on (on the DEM grid)."""
SURFACE_GRID = "odm_dem/engine_dem.json"
"""The DEM grid, GSD and resolution, as JSON."""

ORTHOPHOTO = PRODUCTS["orthophoto"].odm_path
DSM = PRODUCTS["dsm"].odm_path
DTM = PRODUCTS["dtm"].odm_path
POINT_CLOUD = PRODUCTS["point_cloud"].odm_path

STAGE_OUTPUTS: dict[str, tuple[str, ...]] = {
    "dataset": (DATASET,),
    "opensfm": (
        f"{RECONSTRUCTION_DIR}/scene.json",
        f"{RECONSTRUCTION_DIR}/scene_points.npz",
        CAMERAS,
    ),
    "openmvs": (DENSE_RECORD,),
    "odm_dem": (SURFACE, SURFACE_GRID),
    "odm_orthophoto": (ORTHOPHOTO,),
    "odm_georeferencing": (POINT_CLOUD,),
    "odm_report": (ENGINE_REPORT, SHOTS),
}
"""Stage -> the files (relative to the task folder) whose presence means it finished."""


@dataclass
class StageContext:
    """What every stage gets: the task folder, the typed options and the log.

    Attributes:
        task_dir: the task folder (images in ``task_dir/images``).
        settings: option name -> typed value (:func:`.pipeline_options.settings`).
        log: receives one progress line at a time.
    """

    task_dir: Path
    settings: dict[str, Any]
    log: Callable[[str], None]

    @property
    def images_dir(self) -> Path:
        """The folder of the task's images."""
        return self.task_dir / "images"

    def path(self, relative: str) -> Path:
        """A path inside the task folder."""
        return self.task_dir / relative


def write_json(path: Path, data: Any) -> None:
    """Write ``data`` as indented JSON (temporary name, then renamed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    tmp.replace(path)


def read_json_dict(ctx: StageContext, relative: str) -> dict[str, Any]:
    """A JSON file of the task folder as a dict (empty when missing)."""
    path = ctx.path(relative)
    return dict(json.loads(path.read_text())) if path.exists() else {}


def read_stage_seconds(ctx: StageContext) -> dict[str, float]:
    """Seconds per finished stage, from :data:`STAGE_SECONDS` (empty when missing)."""
    path = ctx.path(STAGE_SECONDS)
    if path.exists():
        return {k: float(v) for k, v in json.loads(path.read_text()).items()}
    return {}


def stage_done(ctx: StageContext, stage: str) -> bool:
    """True when the results of ``stage`` are on disk (the DSM too, when it is asked for)."""
    if stage == "odm_dem" and ctx.settings["dsm"] and not ctx.path(DSM).exists():
        return False
    return all(ctx.path(p).exists() for p in STAGE_OUTPUTS[stage])
