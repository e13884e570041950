"""The stages of the built-in engine's pipeline, each reading and writing files in the task folder.

A stage keeps its results on disk (:data:`.stage_files.STAGE_OUTPUTS` says which files mean it
finished, :mod:`.stage_files` where each lies), so a run can resume from any stage, as ODM's ``--rerun-from`` does. Products are written at the paths
the product registry gives (:data:`prefect_odm.registry.PRODUCTS`), with the report files in
:data:`~prefect_odm.registry.REPORT_FOLDER`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import numpy as np
from numpy.typing import NDArray

from prefect_odm.engine import dem, footprints, orthophoto, terrain, writers
from prefect_odm.engine.camera import ImageMeta, Scene, read_images
from prefect_odm.engine.geo_file import GEO_FILE, apply_geo_file
from prefect_odm.engine.pipeline_options import FEATURE_QUALITY_MAX_FEATURES
from prefect_odm.engine.stage_files import (
    CAMERAS,
    DATASET,
    DENSE_CLOUD,
    DENSE_RECORD,
    DSM,
    DTM,
    ENGINE_REPORT,
    ORTHOPHOTO,
    POINT_CLOUD,
    RECONSTRUCTION_DIR,
    SHOTS,
    SURFACE,
    SURFACE_GRID,
    StageContext,
    read_json_dict,
    read_stage_seconds,
    write_json,
)
from prefect_odm.errors import InputError, ProcessingFailedError
from prefect_odm.grid import Grid, dem_cells_per_orthophoto_cell
from prefect_odm.registry import DSM_SURFACE_TAG

DIRECT_POINT_SPACING_M = 0.25
"""Spacing of the ground points the direct method writes to its point cloud."""

DEM_TO_ORTHOPHOTO_CELLS = 4
"""The DSM/DTM cell is at least this many orthophoto cells: the surface comes from sparse points
(or a plane), finer cells would only repeat the interpolation."""


SMRF = ("slope", "window", "threshold", "scalar")
"""The ``smrf-*`` options, by their suffix."""

DENSE_DEM_TO_SPACING = 2.4
"""On the dense path the DEM cell is at least this many depth-map sample spacings (most cells
then hold several points of each pair). On brighton (20 cm cells at ``medium``) half of it gave
10 cm cells whose objects stood at 28 % of ODM's heights; 20 cm cells gave 36-57 % in three runs."""

FUSION_CELL_TO_SPACING = 2.0
"""The fusion cell (the consistency test's) is at least this many sample spacings, so that each
pair has a few points in each cell."""


def _load_dataset(ctx: StageContext) -> tuple[list[ImageMeta], int]:
    data = json.loads(ctx.path(DATASET).read_text())
    return [ImageMeta.from_json(m) for m in data["images"]], int(data["epsg"])


def _load_scene(ctx: StageContext) -> Scene:
    return Scene.load(ctx.path(RECONSTRUCTION_DIR))


# -- dataset and reconstruction -----------------------------------------------------------------


def _stage_dataset(ctx: StageContext) -> None:
    from prefect_odm.geo import survey_utm_epsg

    if not ctx.images_dir.is_dir():
        raise InputError(f"no images folder in {ctx.task_dir}")
    images = read_images(ctx.images_dir)
    if ctx.path(GEO_FILE).is_file():
        images, placed = apply_geo_file(images, ctx.path(GEO_FILE))
        ctx.log(f"{GEO_FILE}: {placed} of {len(images)} images placed from it")
    epsg = survey_utm_epsg([m.latitude_deg for m in images], [m.longitude_deg for m in images])
    cameras = sorted({m.camera or "unknown camera" for m in images})
    ctx.log(f"Loaded {len(images)} images ({', '.join(cameras)}); working CRS EPSG:{epsg}")
    write_json(ctx.path(DATASET), {"epsg": epsg, "images": [m.to_json() for m in images]})


def _stage_opensfm(ctx: StageContext) -> None:
    images, epsg = _load_dataset(ctx)
    method = ctx.settings["pipeline"]
    if method == "direct":
        from prefect_odm.engine.direct import reconstruct_direct

        scene = reconstruct_direct(images, epsg, image_dir=ctx.images_dir, log=ctx.log)
    else:
        from prefect_odm.engine.camera_calibration import calibrated_cameras
        from prefect_odm.engine.sfm import MAX_NEIGHBOURS, reconstruct_sfm

        neighbours = ctx.settings["matcher-neighbors"] or MAX_NEIGHBOURS
        scene = reconstruct_sfm(
            images,
            ctx.images_dir,
            ctx.path(RECONSTRUCTION_DIR),
            epsg,
            resize_to=ctx.settings["resize-to"],
            max_concurrency=ctx.settings["max-concurrency"],
            max_features=FEATURE_QUALITY_MAX_FEATURES[ctx.settings["feature-quality"]],
            max_neighbours=neighbours,
            gps_accuracy_m=ctx.settings["gps-accuracy"],
            calibrated=calibrated_cameras(images, str(ctx.settings["cameras"])),
            log=ctx.log,
        )
    from prefect_odm.engine.block_checks import block_figures, check_block

    rms = scene.stats.get("gps_residual_rms_m")
    figures = block_figures(scene.cameras, images, None if rms is None else [rms])
    scene.stats.update(figures.as_stats())
    scene.save(ctx.path(RECONSTRUCTION_DIR))
    writers.write_cameras_json(ctx.path(CAMERAS), scene, images)  # as ODM: after opensfm
    ctx.log(
        f"Reconstruction ({scene.method}): {len(scene.cameras)}/{scene.images} images posed, "
        f"{len(scene.points_xyz)} points; block level {figures.level_deg:.2f} deg against "
        f"{figures.attitude_source}"
        + ("" if figures.gps_rms_m is None else f", cameras {figures.gps_rms_m:.2f} m rms from GPS")
    )
    check_block(figures)


# -- DEMs -----------------------------------------------------------------------------------------


def _resolutions(ctx: StageContext, scene: Scene, ground_z: float) -> tuple[float, float, float]:
    """(GSD cm, orthophoto resolution cm, DEM resolution cm).

    The orthophoto cell is ``orthophoto-resolution``, never finer than the GSD. The DEM cell is a
    whole number of orthophoto cells (:func:`~prefect_odm.grid.dem_cells_per_orthophoto_cell`):
    the nearest to ``dem-resolution`` when it is asked (> 0), else to the default:
    :data:`DENSE_DEM_TO_SPACING` depth-map sample spacings (GSD / ``pc-quality`` scale) on the
    dense path, :data:`DEM_TO_ORTHOPHOTO_CELLS` orthophoto cells on the sparse and direct paths.
    """
    gsd_cm = footprints.estimate_gsd_cm(scene, ground_z)
    ortho_cm = max(float(ctx.settings["orthophoto-resolution"]), gsd_cm)
    if dense_wanted(ctx, scene):
        default_cm = DENSE_DEM_TO_SPACING * gsd_cm / _depthmap_scale(ctx, scene)
    else:
        default_cm = DEM_TO_ORTHOPHOTO_CELLS * ortho_cm
    asked_cm = float(ctx.settings["dem-resolution"])
    cells = dem_cells_per_orthophoto_cell(ortho_cm, asked_cm if asked_cm > 0 else None, default_cm)
    return gsd_cm, ortho_cm, cells * ortho_cm


def _depthmap_scale(ctx: StageContext, scene: Scene) -> float:
    """The dense depth maps' image scale for the largest camera (:func:`~prefect_odm.plan.depthmaps.depthmap_scale`)."""
    from prefect_odm.plan.depthmaps import depthmap_scale

    width, height = max(((c.width, c.height) for c in scene.cameras), key=lambda wh: max(wh))
    return depthmap_scale(width, height, str(ctx.settings["pc-quality"]))


def dense_wanted(ctx: StageContext, scene: Scene) -> bool:
    """True when the DEMs and the point cloud come from dense matching: structure from motion
    and not ``fast-orthophoto``."""
    return scene.method == "sfm" and not ctx.settings["fast-orthophoto"]


def _dem_grid(ctx: StageContext, scene: Scene) -> tuple[Grid, float, float]:
    """(the DEM grid, GSD cm, DEM resolution cm).

    The grid covers every camera's view with its corner on whole multiples of the DEM cell (in
    the UTM CRS): the orthophoto's grid (:func:`_orthophoto_grid`) has the same corner and
    extent, its cell a whole fraction of the DEM's, so every DEM cell edge is an orthophoto cell
    edge and a merge snapped to either resolution keeps them aligned.
    """
    ground_z = footprints.reference_ground_z_m(scene)
    gsd_cm, _, dem_cm = _resolutions(ctx, scene, ground_z)
    res_m = dem_cm / 100.0
    return Grid.covering(footprints.coverage_bounds(scene, ground_z), res_m, res_m), gsd_cm, dem_cm


# -- dense matching -------------------------------------------------------------------------------


def _stage_openmvs(ctx: StageContext) -> None:
    from prefect_odm.engine.dense_fusion import densify

    scene = _load_scene(ctx)
    ctx.path(DENSE_CLOUD).unlink(missing_ok=True)
    if not dense_wanted(ctx, scene):
        reason = "fast-orthophoto" if scene.method == "sfm" else f"method {scene.method}"
        ctx.log(f"Dense matching skipped ({reason}): products from the sparse model")
        write_json(ctx.path(DENSE_RECORD), {"dense": False})
        return
    dem_grid, gsd_cm, dem_cm = _dem_grid(ctx, scene)
    scale = _depthmap_scale(ctx, scene)
    cell_m = max(dem_cm, FUSION_CELL_TO_SPACING * gsd_cm / scale) / 100.0
    grid = Grid.covering(dem_grid.bounds, cell_m, cell_m)
    fused, pairs = densify(
        scene,
        ctx.images_dir,
        grid,
        scale=scale,
        workers=int(ctx.settings["max-concurrency"]),
        sample_m=float(ctx.settings["pc-sample"]),
        log=ctx.log,
    )
    if len(fused.xyz) == 0:
        raise ProcessingFailedError("dense matching found no point that two pairs agree on")
    ctx.path(DENSE_CLOUD).parent.mkdir(parents=True, exist_ok=True)
    tmp = ctx.path(DENSE_CLOUD + ".tmp.npz")
    np.savez(tmp, xyz=fused.xyz, rgb=fused.rgb)
    tmp.replace(ctx.path(DENSE_CLOUD))
    write_json(
        ctx.path(DENSE_RECORD),
        {
            "dense": True,
            "pairs": len(pairs),
            "points": len(fused.xyz),
            "image_scale": scale,
            "fusion_cell_cm": round(cell_m * 100.0, 3),
            "measured_cells": int(np.isfinite(fused.heights).sum()),
        },
    )


def _load_dense(ctx: StageContext) -> tuple[NDArray[np.float64], NDArray[np.uint8]] | None:
    """The dense cloud ``(xyz, rgb)`` when the dense stage made one, else None."""
    if not read_json_dict(ctx, DENSE_RECORD).get("dense"):
        return None
    with np.load(ctx.path(DENSE_CLOUD)) as data:
        return np.asarray(data["xyz"]), np.asarray(data["rgb"])


def _surface_and_dsm(ctx: StageContext, scene: Scene, grid: Grid) -> dem.DenseDsm:
    """The surface, DSM, ground filter's input, measured cells and counts on ``grid``.

    Counts: ``points_used``, ``coverage_cells`` (seen by a camera), ``measured_cells`` (heights
    from points in the cell; dense path) and ``filled_cells`` (``dem-gapfill-steps``). Only the
    dense path measures cells; the sparse and direct DSMs are interpolations (``measured`` all
    False, the ground filter's input the DSM).
    """
    if scene.method == "direct":
        surface = terrain.direct_surface(scene, grid)
        seen = footprints.coverage_mask(scene, grid, surface)
        dsm = np.where(seen, surface, np.nan).astype(np.float32)
        counts = {"points_used": 0, "coverage_cells": int(seen.sum())}
        return dem.DenseDsm(surface, dsm, dsm, np.zeros(dsm.shape, dtype=bool), counts)
    cloud = _load_dense(ctx)
    if cloud is None:
        keep = dem.filter_point_outliers(scene.points_xyz)
        points = scene.points_xyz[keep]
        ctx.log(f"DSM from {len(points)} sparse points ({int((~keep).sum())} outliers removed)")
        interpolated = dem.surface_from_points(points, grid)
        surface = dem.fill_nearest(interpolated)
        seen = footprints.coverage_mask(scene, grid, surface)
        dsm = np.where(seen, interpolated, np.nan).astype(np.float32)
        counts = {"points_used": len(points), "coverage_cells": int(seen.sum())}
        return dem.DenseDsm(surface, dsm, dsm, np.zeros(dsm.shape, dtype=bool), counts)
    made = dem.dense_dsm(cloud[0], scene, grid, int(ctx.settings["dem-gapfill-steps"]))
    counts = made.counts
    ctx.log(
        f"DSM from {len(cloud[0])} dense points: {counts['measured_cells']} of "
        f"{counts['coverage_cells']} covered cells measured, {counts['filled_cells']} gap-filled"
    )
    return made


def _dtm(ctx: StageContext, scene: Scene, dsm: NDArray[np.float32], res_m: float) -> NDArray[Any]:
    """The DTM: the direct method's plane, else the DSM's SMRF ground cells interpolated."""
    if scene.method == "direct" or not np.isfinite(dsm).any():
        return dsm.copy()
    dtm, share = dem.smrf_dtm(dsm, res_m, {k: float(ctx.settings[f"smrf-{k}"]) for k in SMRF})
    ctx.log(f"DTM: {100.0 * share:.0f}% of the DSM cells are ground (SMRF)")
    return dtm


def _dem_tags(scene: Scene) -> dict[str, str]:
    """A DEM's GeoTIFF tags: the method, and for the direct method what its surface is
    (:data:`~prefect_odm.registry.DSM_SURFACE_TAG`)."""
    tags = {writers.ENGINE_TAG: scene.method}
    if scene.method == "direct":
        from prefect_odm.engine.direct import dsm_surface_of

        tags[DSM_SURFACE_TAG] = dsm_surface_of(scene)
    return tags


def _write_dem(
    ctx: StageContext,
    relative: str,
    data: NDArray[np.float32],
    grid: Grid,
    scene: Scene,
    measured: NDArray[np.bool_] | None = None,
) -> None:
    """Write a DSM or DTM (NaN -> :data:`~.dem.DSM_NODATA`) tagged with the method; with
    ``measured``, a second band (:data:`~.dem.MEASURED_BAND`): 1 measured, 0 gap-filled."""
    valid = np.isfinite(data)
    bands = [np.where(valid, data, dem.DSM_NODATA).astype(np.float32)]
    if measured is not None:
        bands.append(np.where(valid, measured.astype(np.float32), dem.DSM_NODATA))
    writers.write_geotiff(
        ctx.path(relative),
        np.stack(bands).astype(np.float32),
        grid,
        scene.epsg,
        nodata=dem.DSM_NODATA,
        tags=_dem_tags(scene),
        descriptions=("height", dem.MEASURED_DESCRIPTION)[: len(bands)],
    )


def _stage_dem(ctx: StageContext) -> None:
    scene = _load_scene(ctx)
    grid, gsd_cm, dem_cm = _dem_grid(ctx, scene)
    dem_res_m = dem_cm / 100.0
    made = _surface_and_dsm(ctx, scene, grid)
    surface, dsm, counts = made.surface, made.dsm, made.counts
    if not np.isfinite(dsm).any():
        raise ProcessingFailedError("the DSM is empty: no reconstructed surface under the cameras")
    tags = {writers.ENGINE_TAG: scene.method}
    writers.write_geotiff(ctx.path(SURFACE), surface, grid, scene.epsg, tags=tags)
    if ctx.settings["dsm"]:
        # a plane carries the band all 0 (nothing measured): a merge of it says 0 % measured
        plane = _dem_tags(scene).get(DSM_SURFACE_TAG, "").endswith("-plane")
        measured = made.measured if made.measured.any() or plane else None
        _write_dem(ctx, DSM, dsm, grid, scene, measured)
    if ctx.settings["dtm"]:
        _write_dem(ctx, DTM, _dtm(ctx, scene, made.ground_input, dem_res_m), grid, scene)
    write_json(
        ctx.path(SURFACE_GRID),
        {
            "left": grid.left,
            "top": grid.top,
            "res_m": grid.resolution_m,
            "width": grid.width,
            "height": grid.height,
            "gsd_cm": gsd_cm,
            "dem_resolution_cm": dem_cm,
            **counts,
        },
    )
    asked_cm = float(ctx.settings["dem-resolution"])
    if asked_cm > 0 and abs(asked_cm - dem_cm) > 1e-3:
        ctx.log(
            f"dem-resolution {asked_cm:g} cm -> {dem_cm:.2f} cm: the nearest whole number of "
            "orthophoto cells, never finer than one"
        )
    ctx.log(
        f"DEM grid {grid.width}x{grid.height} at {dem_cm:.1f} cm; GSD {gsd_cm:.2f} cm"
        + ("; wrote dsm.tif" if ctx.settings["dsm"] else "")
        + ("; wrote dtm.tif" if ctx.settings["dtm"] else "")
    )


def _load_surface(ctx: StageContext) -> tuple[NDArray[np.float32], Grid]:
    import rasterio

    meta = json.loads(ctx.path(SURFACE_GRID).read_text())
    grid = Grid(
        left=meta["left"],
        top=meta["top"],
        resolution_m=meta["res_m"],
        width=meta["width"],
        height=meta["height"],
    )
    with rasterio.open(ctx.path(SURFACE)) as src:
        surface = src.read(1)
    return surface, grid


# -- orthophoto, point cloud, report --------------------------------------------------------------


def _orthophoto_grid(ctx: StageContext, scene: Scene, dem_grid: Grid) -> Grid | None:
    """The orthophoto's grid: the DEM grid's corner and extent, at the orthophoto resolution
    (the DEM cell is a whole number of orthophoto cells, :func:`_resolutions`); None when the
    DEM was made for another orthophoto resolution whose cells do not divide it."""
    _, ortho_cm, _ = _resolutions(ctx, scene, footprints.reference_ground_z_m(scene))
    res_m = ortho_cm / 100.0
    cells = max(1, round(dem_grid.resolution_m / res_m))
    if abs(cells * res_m - dem_grid.resolution_m) > 1e-6 * dem_grid.resolution_m:
        return None
    return dem_grid.refined(cells, res_m)


def _stage_orthophoto(ctx: StageContext) -> None:
    scene = _load_scene(ctx)
    surface, dem_grid = _load_surface(ctx)
    maybe_grid = _orthophoto_grid(ctx, scene, dem_grid)
    if maybe_grid is None:
        # a rerun from odm_orthophoto at an orthophoto resolution that does not divide the
        # DEM cell: the DEMs are rebuilt so that they stay on the orthophoto's grid
        ctx.log(
            f"The DEM cell ({100.0 * dem_grid.resolution_m:.2f} cm) is not a whole number of "
            "orthophoto cells: rebuilding the DEMs on the orthophoto's grid"
        )
        _stage_dem(ctx)
        surface, dem_grid = _load_surface(ctx)
        maybe_grid = _orthophoto_grid(ctx, scene, dem_grid)
        if maybe_grid is None:
            raise ProcessingFailedError("the DEM grid does not fit the orthophoto's grid")
    grid = maybe_grid
    height_at: dem.HeightSampler
    if scene.method == "direct":
        height_at = terrain.direct_height_sampler(scene, surface, dem_grid, grid)
    else:
        height_at = dem.surface_sampler(surface, dem_grid, grid)
    rgba = orthophoto.render_orthophoto(scene, ctx.images_dir, grid, height_at, log=ctx.log)
    if not rgba[3].any():
        raise ProcessingFailedError("the orthophoto is empty: no image sees the surface")
    writers.write_geotiff(
        ctx.path(ORTHOPHOTO),
        rgba,
        grid,
        scene.epsg,
        rgba=True,
        tags={writers.ENGINE_TAG: scene.method},
    )


def _stage_georeferencing(ctx: StageContext) -> None:
    import rasterio

    scene = _load_scene(ctx)
    if scene.method == "direct":
        surface, dem_grid = _load_surface(ctx)
        with rasterio.open(ctx.path(ORTHOPHOTO)) as src:
            rgba = src.read()
            t = src.transform
            grid = Grid(left=t.c, top=t.f, resolution_m=t.a, width=src.width, height=src.height)
        height_at = dem.surface_sampler(surface, dem_grid, grid)
        xyz, rgb = orthophoto.grid_points_from_orthophoto(
            rgba, grid, height_at, DIRECT_POINT_SPACING_M
        )
    elif (cloud := _load_dense(ctx)) is not None:
        xyz, rgb = cloud
    else:
        keep = dem.filter_point_outliers(scene.points_xyz)
        xyz, rgb = scene.points_xyz[keep], scene.points_rgb[keep]
    if len(xyz) == 0:
        raise ProcessingFailedError("no point to write to the point cloud")
    writers.write_laz(ctx.path(POINT_CLOUD), xyz, rgb, scene.epsg)
    ctx.log(f"Point cloud: {len(xyz)} points (EPSG:{scene.epsg})")


def _stage_report(ctx: StageContext) -> None:
    import laspy

    scene = _load_scene(ctx)
    writers.write_shots_geojson(ctx.path(SHOTS), scene)
    ground_z = footprints.reference_ground_z_m(scene)
    gsd_cm, ortho_cm, dem_cm = _resolutions(ctx, scene, ground_z)
    laz = ctx.path(POINT_CLOUD)
    points = 0
    if laz.exists():
        with laspy.open(laz) as reader:
            points = int(reader.header.point_count)
    ortho = ctx.path(ORTHOPHOTO)
    if ortho.exists():
        import rasterio

        with rasterio.open(ortho) as src:
            ortho_cm = float(src.res[0] * 100.0)
    seconds = read_stage_seconds(ctx)
    dense_record = read_json_dict(ctx, DENSE_RECORD)
    dem_record = read_json_dict(ctx, SURFACE_GRID)
    write_json(
        ctx.path(ENGINE_REPORT),
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
            "dense": dense_record,
            "dem": {k: v for k, v in dem_record.items() if k.endswith(("_cells", "_used"))},
            "stage_seconds": seconds,
        },
    )


STAGE_FUNCTIONS: dict[str, Callable[[StageContext], None]] = {
    "dataset": _stage_dataset,
    "opensfm": _stage_opensfm,
    "openmvs": _stage_openmvs,
    "odm_dem": _stage_dem,
    "odm_orthophoto": _stage_orthophoto,
    "odm_georeferencing": _stage_georeferencing,
    "odm_report": _stage_report,
}
"""Stage name -> the function that runs it."""
