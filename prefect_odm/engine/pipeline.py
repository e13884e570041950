"""The built-in engine's photogrammetry pipeline: a folder of geotagged images to ODM's outputs.

``run(task_dir, options)`` reads ``task_dir/images`` and writes, in OpenDroneMap's layout and the
survey's WGS 84 / UTM zone (EPSG 326xx/327xx of the mean position):

* ``odm_orthophoto/odm_orthophoto.tif``: RGBA uint8 GeoTIFF, alpha 0 outside coverage;
* ``odm_dem/dsm.tif`` (option ``dsm``) and ``odm_dem/dtm.tif`` (option ``dtm``): float32,
  nodata -9999;
* ``odm_georeferencing/odm_georeferenced_model.laz``: coloured points, LAS 1.2 point format 3;
* ``odm_report/shots.geojson`` (camera positions) and ``odm_report/engine.json`` (method, image
  counts, points, GSD, resolution, seconds per stage).

Two methods (option ``pipeline``): ``sfm`` (:mod:`.sfm`, structure from motion with pycolmap,
the camera GPS as position priors in its bundle adjustment; then, unless ``fast-orthophoto``,
dense matching in ODM's ``openmvs`` stage, :mod:`.dense` and :mod:`.dense_fusion`, whose fused
cloud makes the DSM, the DTM (SMRF ground filter, :mod:`.ground`) and the point cloud; with
``fast-orthophoto`` they come from the sparse points) and ``direct`` (:mod:`.direct`, poses from GPS and
attitude onto a ground plane; a second or two). Every raster carries the GeoTIFF tag
``PREFECT_ODM_ENGINE_METHOD``.

The option list is in :mod:`.pipeline_options`, the stages in :mod:`.stages`, the products'
algorithms in :mod:`.dem`, :mod:`.orthophoto` and :mod:`.footprints`, their files in
:mod:`.writers`. Stages (:data:`STAGES`) keep their results on disk, so ``rerun_from`` resumes from a stage
reusing the earlier stages' files (as ODM's ``--rerun-from``), and ``end-with`` stops after one.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from prefect_odm.engine import pipeline_options
from prefect_odm.engine.pipeline_options import METHODS, OPTIONS, STAGES
from prefect_odm.errors import InputError
from prefect_odm.models import OptionValue

__all__ = ["METHODS", "OPTIONS", "STAGES", "run"]


def run(
    task_dir: Path,
    options: Mapping[str, OptionValue | None],
    *,
    rerun_from: str | None = None,
    log: Callable[[str], None] = print,
) -> None:
    """Process ``task_dir/images`` into ODM's outputs in ``task_dir`` (see the module docstring).

    Args:
        task_dir: the task folder; images in ``task_dir/images``.
        options: option name -> value (strings as NodeODM sends them, or typed values); unknown
            names are ignored, missing ones take :data:`OPTIONS` defaults.
        rerun_from: a stage of :data:`STAGES`: keep the results of the stages before it and run
            from it (a stage before it whose results are missing is run again). Default: the
            ``rerun-from`` option, else everything is run.
        log: receives one progress line at a time.

    Raises:
        InputError: bad option value, unknown stage, ``end-with`` before ``rerun_from``, no
            images, an image without GPS.
        ProcessingFailedError: reconstruction failed (too few images registered, no alignment
            to GPS, empty products).
        MemoryError: out of memory.
    """
    task_dir = Path(task_dir)
    from prefect_odm.engine import stage_files, stages

    settings = pipeline_options.settings(options)
    rerun_from = rerun_from or str(settings["rerun-from"] or "") or None
    if rerun_from is not None and rerun_from not in STAGES:
        raise InputError(f"unknown stage {rerun_from!r}; stages: {', '.join(STAGES)}")
    end_with = str(settings["end-with"] or "") or STAGES[-1]
    ctx = stage_files.StageContext(task_dir=task_dir, settings=settings, log=log)
    start = STAGES.index(rerun_from) if rerun_from else 0
    for index in range(start):
        if not stage_files.stage_done(ctx, STAGES[index]):
            log(f"Results of stage {STAGES[index]} are missing: running from there")
            start = index
            break
    stop = STAGES.index(end_with)
    if stop < start:
        raise InputError(
            f"end-with {end_with} comes before the first stage to run, {STAGES[start]}"
        )
    seconds = stage_files.read_stage_seconds(ctx) if start > 0 else {}
    for stage in STAGES[start:]:
        seconds.pop(stage, None)
    log(
        f"prefect-odm engine: method {settings['pipeline']}, stages {STAGES[start]}..{STAGES[stop]}"
    )
    total = time.perf_counter()
    for stage in STAGES[start : stop + 1]:
        log(f"Running {stage} stage")
        started = time.perf_counter()
        stages.STAGE_FUNCTIONS[stage](ctx)
        seconds[stage] = round(time.perf_counter() - started, 3)
        stage_files.write_json(ctx.path(stage_files.STAGE_SECONDS), seconds)
        if stage == "odm_report":  # the report was written before its own time was known
            report = json.loads(ctx.path(stage_files.ENGINE_REPORT).read_text())
            report["stage_seconds"] = seconds
            stage_files.write_json(ctx.path(stage_files.ENGINE_REPORT), report)
        log(f"Finished {stage} stage in {seconds[stage]:.1f} s")
    log(f"Pipeline finished in {time.perf_counter() - total:.1f} s")
