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
georegistered to GPS; DSM from its sparse points) and ``direct`` (:mod:`.direct`, poses from GPS and
attitude onto a ground plane; a second or two). Every raster carries the GeoTIFF tag
``PREFECT_ODM_ENGINE_METHOD``.

Stages (:data:`STAGES`) keep their results on disk, so ``rerun_from`` resumes from a stage
reusing the earlier stages' files (as ODM's ``--rerun-from``), and ``end-with`` stops after one.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from prefect_odm.engine.camera import ImageMeta, Scene, read_images
from prefect_odm.errors import InputError, ProcessingFailedError

logger = logging.getLogger(__name__)

STAGES: tuple[str, ...] = (
    "dataset",
    "opensfm",
    "odm_dem",
    "odm_orthophoto",
    "odm_georeferencing",
    "odm_report",
)
"""Stage names, in processing order (ODM's names; georeferencing after the orthophoto because
the direct method colours its points from the orthophoto)."""

METHODS: tuple[str, ...] = ("sfm", "direct")

FEATURE_QUALITY_MAX_FEATURES: dict[str, int] = {
    "ultra": 12000,
    "high": 6000,
    "medium": 4000,
    "low": 2500,
    "lowest": 1500,
}
"""ODM's ``feature-quality`` levels -> SIFT features per image."""

DIRECT_POINT_SPACING_M = 0.25
"""Spacing of the ground points the direct method writes to its point cloud."""

DEM_TO_ORTHOPHOTO_CELLS = 4
"""The DSM/DTM cell is at least this many orthophoto cells: the surface comes from sparse points
(or a plane), finer cells would only repeat the interpolation."""


def _option(
    name: str, type_: str, value: str, domain: str | list[str], help_: str
) -> dict[str, Any]:
    return {"name": name, "type": type_, "value": value, "domain": domain, "help": help_}


OPTIONS: list[dict[str, Any]] = [
    _option(
        "orthophoto-resolution",
        "float",
        "5",
        "positive float",
        "Orthophoto resolution in cm/pixel; never finer than the estimated GSD. Default: 5",
    ),
    _option(
        "dem-resolution",
        "float",
        "5",
        "positive float",
        "DSM/DTM resolution in cm/pixel; at least 4 orthophoto cells. Default: 5",
    ),
    _option("dsm", "bool", "false", "bool", "Build a digital surface model. Default: false"),
    _option(
        "dtm",
        "bool",
        "false",
        "bool",
        "Build a digital terrain model (simple morphological ground filter). Default: false",
    ),
    _option(
        "pipeline",
        "enum",
        "sfm",
        list(METHODS),
        "Reconstruction method: sfm (structure from motion with pycolmap) or direct "
        "(direct georeferencing from GPS and attitude, no SfM). Default: sfm",
    ),
    _option(
        "resize-to",
        "int",
        "2048",
        "integer",
        "Resize images to this many pixels on the long side for feature extraction "
        "(-1: no resizing). Default: 2048",
    ),
    _option(
        "feature-quality",
        "enum",
        "high",
        list(FEATURE_QUALITY_MAX_FEATURES),
        "Number of SIFT features per image: ultra 12000, high 6000, medium 4000, low 2500, "
        "lowest 1500. Default: high",
    ),
    _option(
        "matcher-neighbors",
        "int",
        "0",
        "non-negative integer",
        "Match each image with this many nearest images by GPS (0: 20). Default: 0",
    ),
    _option(
        "end-with",
        "enum",
        "odm_report",
        list(STAGES),
        "End processing at this stage. Default: odm_report",
    ),
    _option(
        "rerun-from",
        "enum",
        "",
        list(STAGES),
        "Rerun processing from this stage, reusing the earlier stages' results.",
    ),
    _option(
        "max-concurrency",
        "int",
        str(os.cpu_count() or 1),
        "positive integer",
        "Maximum number of threads. Default: number of CPUs",
    ),
]
# names ODM has that the engine accepts and ignores
for _name, _type, _value, _domain in (
    ("fast-orthophoto", "bool", "false", "bool"),
    ("skip-3dmodel", "bool", "false", "bool"),
    ("skip-report", "bool", "false", "bool"),
    ("use-3dmesh", "bool", "false", "bool"),
    ("cog", "bool", "false", "bool"),
    ("build-overviews", "bool", "false", "bool"),
    ("optimize-disk-space", "bool", "false", "bool"),
    ("auto-boundary", "bool", "false", "bool"),
    ("orthophoto-cutline", "bool", "false", "bool"),
    ("pc-ept", "bool", "false", "bool"),
    ("pc-copc", "bool", "false", "bool"),
    ("pc-quality", "enum", "medium", ["ultra", "high", "medium", "low", "lowest"]),
    ("min-num-features", "int", "10000", "integer"),
    ("mesh-size", "int", "200000", "positive integer"),
    ("crop", "float", "3", "non-negative float"),
    ("gps-accuracy", "float", "3", "positive float"),
    ("split", "int", "999999", "positive integer"),
    ("split-overlap", "float", "150", "non-negative float"),
    ("sm-cluster", "string", "", "string"),
    (
        "orthophoto-compression",
        "enum",
        "DEFLATE",
        ["JPEG", "LZW", "PACKBITS", "DEFLATE", "LZMA", "NONE"],
    ),
):
    OPTIONS.append(
        _option(_name, _type, _value, _domain, "Accepted for ODM compatibility; ignored.")
    )

_SPECS: dict[str, dict[str, Any]] = {o["name"]: o for o in OPTIONS}


def _coerce(name: str, value: Any) -> Any:
    spec = _SPECS[name]
    kind = spec["type"]
    try:
        if kind == "bool":
            if isinstance(value, bool):
                return value
            text = str(value).strip().lower()
            if text not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError(value)
            return text in ("true", "1", "yes")
        if kind == "int":
            number = float(value)
            if number != int(number):
                raise ValueError(value)
            return int(number)
        if kind == "float":
            number = float(value)
            if not math.isfinite(number):
                raise ValueError(value)
            return number
        text = "" if value is None else str(value)
        if kind == "enum" and text and text not in spec["domain"]:
            raise ValueError(value)
        return text
    except (TypeError, ValueError) as exc:
        raise InputError(f"option {name}: invalid value {value!r}") from exc


def _settings(options: dict[str, Any]) -> dict[str, Any]:
    """Defaults of :data:`OPTIONS` overlaid with ``options`` (typed). Unknown names are ignored."""
    settings = {name: _coerce(name, spec["value"]) for name, spec in _SPECS.items()}
    for name, value in options.items():
        if name in _SPECS and value is not None:
            settings[name] = _coerce(name, value)
    if settings["orthophoto-resolution"] <= 0:
        raise InputError("option orthophoto-resolution must be greater than zero")
    return settings


@dataclass
class _Context:
    task_dir: Path
    settings: dict[str, Any]
    log: Callable[[str], None]

    @property
    def images_dir(self) -> Path:
        return self.task_dir / "images"

    def path(self, relative: str) -> Path:
        return self.task_dir / relative


# files whose presence means a stage finished
_STAGE_OUTPUTS: dict[str, tuple[str, ...]] = {
    "dataset": ("images.json",),
    "opensfm": ("opensfm/scene.json", "opensfm/scene_points.npz"),
    "odm_dem": ("odm_dem/engine_surface.tif", "odm_dem/engine_dem.json"),
    "odm_orthophoto": ("odm_orthophoto/odm_orthophoto.tif",),
    "odm_georeferencing": ("odm_georeferencing/odm_georeferenced_model.laz",),
    "odm_report": ("odm_report/engine.json", "odm_report/shots.geojson"),
}
_STAGE_SECONDS = "odm_report/stage_seconds.json"


def _write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    tmp.replace(path)


def _load_dataset(ctx: _Context) -> tuple[list[ImageMeta], int]:
    data = json.loads(ctx.path("images.json").read_text())
    return [ImageMeta.from_json(m) for m in data["images"]], int(data["epsg"])


# -- stages -------------------------------------------------------------------------------------


def _stage_dataset(ctx: _Context) -> None:
    from prefect_odm.geo import survey_utm_epsg

    if not ctx.images_dir.is_dir():
        raise InputError(f"no images folder in {ctx.task_dir}")
    images = read_images(ctx.images_dir)
    epsg = survey_utm_epsg([m.latitude_deg for m in images], [m.longitude_deg for m in images])
    cameras = sorted({m.camera or "unknown camera" for m in images})
    ctx.log(f"Loaded {len(images)} images ({', '.join(cameras)}); working CRS EPSG:{epsg}")
    _write_json(ctx.path("images.json"), {"epsg": epsg, "images": [m.to_json() for m in images]})


def _stage_opensfm(ctx: _Context) -> None:
    images, epsg = _load_dataset(ctx)
    method = ctx.settings["pipeline"]
    if method == "direct":
        from prefect_odm.engine.direct import reconstruct_direct

        scene = reconstruct_direct(images, epsg, image_dir=ctx.images_dir, log=ctx.log)
    else:
        from prefect_odm.engine.sfm import MAX_NEIGHBOURS, reconstruct_sfm

        neighbours = ctx.settings["matcher-neighbors"] or MAX_NEIGHBOURS
        scene = reconstruct_sfm(
            images,
            ctx.images_dir,
            ctx.path("opensfm"),
            epsg,
            resize_to=ctx.settings["resize-to"],
            max_concurrency=ctx.settings["max-concurrency"],
            max_features=FEATURE_QUALITY_MAX_FEATURES[ctx.settings["feature-quality"]],
            max_neighbours=neighbours,
            log=ctx.log,
        )
    scene.save(ctx.path("opensfm"))
    ctx.log(
        f"Reconstruction ({scene.method}): {len(scene.cameras)}/{scene.images} images posed, "
        f"{len(scene.points_xyz)} points"
    )


def _resolutions(ctx: _Context, scene: Scene, ground_z: float) -> tuple[float, float, float]:
    """(GSD cm, orthophoto resolution cm, DEM resolution cm)."""
    from prefect_odm.engine.products import estimate_gsd_cm

    gsd_cm = estimate_gsd_cm(scene, ground_z)
    ortho_cm = max(float(ctx.settings["orthophoto-resolution"]), gsd_cm)
    dem_cm = max(float(ctx.settings["dem-resolution"]), DEM_TO_ORTHOPHOTO_CELLS * ortho_cm)
    return gsd_cm, ortho_cm, dem_cm


def _stage_dem(ctx: _Context) -> None:
    from prefect_odm.engine import products

    scene = Scene.load(ctx.path("opensfm"))
    ground_z = products.reference_ground_z_m(scene)
    gsd_cm, ortho_cm, dem_cm = _resolutions(ctx, scene, ground_z)
    dem_res_m = dem_cm / 100.0
    grid = products.Grid.covering(products.coverage_bounds(scene, ground_z), dem_res_m, dem_res_m)
    if scene.method == "direct":
        surface = np.full((grid.height, grid.width), ground_z, dtype=np.float32)
        seen = products.coverage_mask(scene, grid, surface)
        dsm = np.where(seen, surface, np.nan).astype(np.float32)
        points_used = 0
    else:
        keep = products.filter_point_outliers(scene.points_xyz)
        points = scene.points_xyz[keep]
        ctx.log(f"DSM from {len(points)} points ({int((~keep).sum())} outliers removed)")
        interpolated = products.surface_from_points(points, grid)
        surface = products.fill_nearest(interpolated)
        seen = products.coverage_mask(scene, grid, surface)
        dsm = np.where(seen, interpolated, np.nan).astype(np.float32)
        points_used = len(points)
    if not np.isfinite(dsm).any():
        raise ProcessingFailedError("the DSM is empty: no reconstructed surface under the cameras")
    tags = {products.ENGINE_TAG: scene.method}
    products.write_geotiff(
        ctx.path("odm_dem/engine_surface.tif"), surface, grid, scene.epsg, tags=tags
    )
    if ctx.settings["dsm"]:
        products.write_geotiff(
            ctx.path("odm_dem/dsm.tif"),
            np.where(np.isfinite(dsm), dsm, products.DSM_NODATA).astype(np.float32),
            grid,
            scene.epsg,
            nodata=products.DSM_NODATA,
            tags=tags,
        )
    if ctx.settings["dtm"]:
        # the direct method's surface is the ground plane already
        dtm = dsm.copy() if scene.method == "direct" else products.dtm_from_dsm(dsm, dem_res_m)
        products.write_geotiff(
            ctx.path("odm_dem/dtm.tif"),
            np.where(np.isfinite(dtm), dtm, products.DSM_NODATA).astype(np.float32),
            grid,
            scene.epsg,
            nodata=products.DSM_NODATA,
            tags=tags,
        )
    _write_json(
        ctx.path("odm_dem/engine_dem.json"),
        {
            "left": grid.left,
            "top": grid.top,
            "res_m": grid.res_m,
            "width": grid.width,
            "height": grid.height,
            "gsd_cm": gsd_cm,
            "dem_resolution_cm": dem_cm,
            "points_used": points_used,
        },
    )
    ctx.log(
        f"DEM grid {grid.width}x{grid.height} at {dem_cm:.1f} cm; GSD {gsd_cm:.2f} cm"
        + ("; wrote dsm.tif" if ctx.settings["dsm"] else "")
        + ("; wrote dtm.tif" if ctx.settings["dtm"] else "")
    )


def _load_surface(ctx: _Context) -> tuple[np.ndarray, Any]:
    import rasterio

    from prefect_odm.engine.products import Grid

    meta = json.loads(ctx.path("odm_dem/engine_dem.json").read_text())
    grid = Grid(
        left=meta["left"],
        top=meta["top"],
        res_m=meta["res_m"],
        width=meta["width"],
        height=meta["height"],
    )
    with rasterio.open(ctx.path("odm_dem/engine_surface.tif")) as src:
        surface = src.read(1)
    return surface, grid


def _orthophoto_grid(ctx: _Context, scene: Scene, dem_grid: Any) -> Any:
    from prefect_odm.engine.products import Grid, reference_ground_z_m

    _, ortho_cm, _ = _resolutions(ctx, scene, reference_ground_z_m(scene))
    res_m = ortho_cm / 100.0
    left, bottom, right, top = dem_grid.bounds
    return Grid(
        left=left,
        top=top,
        res_m=res_m,
        width=max(1, int(round((right - left) / res_m))),
        height=max(1, int(round((top - bottom) / res_m))),
    )


def _stage_orthophoto(ctx: _Context) -> None:
    from prefect_odm.engine import products

    scene = Scene.load(ctx.path("opensfm"))
    surface, dem_grid = _load_surface(ctx)
    grid = _orthophoto_grid(ctx, scene, dem_grid)
    height_at: products.HeightSampler
    if scene.method == "direct":
        ground = float(scene.ground_z_m if scene.ground_z_m is not None else surface.mean())

        def height_at(rows: Any, cols: Any) -> Any:
            return np.full(rows.shape, ground)
    else:
        height_at = products.surface_sampler(surface, dem_grid, grid)
    rgba = products.render_orthophoto(scene, ctx.images_dir, grid, height_at, log=ctx.log)
    if not rgba[3].any():
        raise ProcessingFailedError("the orthophoto is empty: no image sees the surface")
    products.write_geotiff(
        ctx.path("odm_orthophoto/odm_orthophoto.tif"),
        rgba,
        grid,
        scene.epsg,
        rgba=True,
        tags={products.ENGINE_TAG: scene.method},
    )


def _stage_georeferencing(ctx: _Context) -> None:
    import rasterio

    from prefect_odm.engine import products

    scene = Scene.load(ctx.path("opensfm"))
    if scene.method == "direct":
        surface, dem_grid = _load_surface(ctx)
        with rasterio.open(ctx.path("odm_orthophoto/odm_orthophoto.tif")) as src:
            rgba = src.read()
            t = src.transform
            grid = products.Grid(left=t.c, top=t.f, res_m=t.a, width=src.width, height=src.height)
        height_at = products.surface_sampler(surface, dem_grid, grid)
        xyz, rgb = products.grid_points_from_orthophoto(
            rgba, grid, height_at, DIRECT_POINT_SPACING_M
        )
    else:
        keep = products.filter_point_outliers(scene.points_xyz)
        xyz, rgb = scene.points_xyz[keep], scene.points_rgb[keep]
    if len(xyz) == 0:
        raise ProcessingFailedError("no point to write to the point cloud")
    products.write_laz(
        ctx.path("odm_georeferencing/odm_georeferenced_model.laz"), xyz, rgb, scene.epsg
    )
    ctx.log(f"Point cloud: {len(xyz)} points (EPSG:{scene.epsg})")


def _stage_report(ctx: _Context) -> None:
    import laspy

    from prefect_odm.engine import products

    scene = Scene.load(ctx.path("opensfm"))
    products.write_shots_geojson(ctx.path("odm_report/shots.geojson"), scene)
    ground_z = products.reference_ground_z_m(scene)
    gsd_cm, ortho_cm, dem_cm = _resolutions(ctx, scene, ground_z)
    laz = ctx.path("odm_georeferencing/odm_georeferenced_model.laz")
    points = 0
    if laz.exists():
        with laspy.open(laz) as reader:
            points = int(reader.header.point_count)
    ortho = ctx.path("odm_orthophoto/odm_orthophoto.tif")
    if ortho.exists():
        import rasterio

        with rasterio.open(ortho) as src:
            ortho_cm = float(src.res[0] * 100.0)
    seconds = _read_stage_seconds(ctx)
    _write_json(
        ctx.path("odm_report/engine.json"),
        {
            "method": scene.method,
            "images": scene.images,
            "registered_images": len(scene.cameras),
            "points": points,
            "gsd_cm": round(gsd_cm, 3),
            "orthophoto_resolution_cm": round(ortho_cm, 3),
            "dem_resolution_cm": round(dem_cm, 3),
            "epsg": scene.epsg,
            "stats": scene.stats,
            "stage_seconds": seconds,
        },
    )


_STAGE_FUNCTIONS: dict[str, Callable[[_Context], None]] = {
    "dataset": _stage_dataset,
    "opensfm": _stage_opensfm,
    "odm_dem": _stage_dem,
    "odm_orthophoto": _stage_orthophoto,
    "odm_georeferencing": _stage_georeferencing,
    "odm_report": _stage_report,
}


def _read_stage_seconds(ctx: _Context) -> dict[str, float]:
    path = ctx.path(_STAGE_SECONDS)
    if path.exists():
        return {k: float(v) for k, v in json.loads(path.read_text()).items()}
    return {}


def _stage_done(ctx: _Context, stage: str) -> bool:
    if stage == "odm_dem" and ctx.settings["dsm"] and not ctx.path("odm_dem/dsm.tif").exists():
        return False
    return all(ctx.path(p).exists() for p in _STAGE_OUTPUTS[stage])


def run(
    task_dir: Path,
    options: dict[str, Any],
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
    settings = _settings(dict(options))
    rerun_from = rerun_from or settings["rerun-from"] or None
    if rerun_from is not None and rerun_from not in STAGES:
        raise InputError(f"unknown stage {rerun_from!r}; stages: {', '.join(STAGES)}")
    end_with = settings["end-with"] or STAGES[-1]
    ctx = _Context(task_dir=task_dir, settings=settings, log=log)
    start = STAGES.index(rerun_from) if rerun_from else 0
    for index in range(start):
        if not _stage_done(ctx, STAGES[index]):
            log(f"Results of stage {STAGES[index]} are missing: running from there")
            start = index
            break
    stop = STAGES.index(end_with)
    if stop < start:
        raise InputError(
            f"end-with {end_with} comes before the first stage to run, {STAGES[start]}"
        )
    seconds = _read_stage_seconds(ctx) if start > 0 else {}
    for stage in STAGES[start:]:
        seconds.pop(stage, None)
    log(
        f"prefect-odm engine: method {settings['pipeline']}, stages {STAGES[start]}..{STAGES[stop]}"
    )
    total = time.perf_counter()
    for stage in STAGES[start : stop + 1]:
        log(f"Running {stage} stage")
        started = time.perf_counter()
        _STAGE_FUNCTIONS[stage](ctx)
        seconds[stage] = round(time.perf_counter() - started, 3)
        _write_json(ctx.path(_STAGE_SECONDS), seconds)
        if stage == "odm_report":  # the report was written before its own time was known
            report = json.loads(ctx.path("odm_report/engine.json").read_text())
            report["stage_seconds"] = seconds
            _write_json(ctx.path("odm_report/engine.json"), report)
        log(f"Finished {stage} stage in {seconds[stage]:.1f} s")
    log(f"Pipeline finished in {time.perf_counter() - total:.1f} s")
