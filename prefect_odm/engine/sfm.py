"""Structure from motion with pycolmap (CPU), georegistered to the images' GPS positions.

Steps (COLMAP's incremental pipeline, Schoenberger & Frahm, "Structure-from-Motion Revisited",
CVPR 2016):

1. SIFT features on images downscaled to ``resize-to`` (keypoints are reported in full-size
   pixels); one camera per camera model and image size, its focal length from EXIF
   (:attr:`ImageMeta.focal_length_px`, ODM's prior), with two radial distortion terms (COLMAP's
   RADIAL: ``k1``, ``k2``, the radial part of the ``brown`` model ODM gives OpenSfM by default,
   ``opendm/photo.py``) and the principal point refined as OpenSfM refines it (ODM's default
   ``optimize_camera_parameters``); a camera seen in fewer than :data:`.sfm_priors.FULL_CAMERA_MIN_IMAGES`
   images keeps one radial term and its principal point at the image centre. The images are
   then numbered by name (:func:`_number_images_by_name`): COLMAP numbers them in the order its
   extraction threads finish, and the rest follows the numbers.
2. Spatial matching: each image is matched to its nearest neighbours by GPS position within about
   one image footprint, not exhaustively; each pair's RANSAC is seeded, so the same images give
   the same verified pairs, the same cameras and the same products.
3. Incremental mapping with the focal length held fixed: over a flat scene seen from straight
   above, focal length and scene depth cannot be told apart (a longer focal length just pushes
   the ground down), so letting bundle adjustment refine it makes the ground drift by metres
   (brighton: the refined focal length drifts from 849 to 1107 px and the ground sinks 10 m;
   with the GPS priors below, 889 px sinks it 9.1 m; OpenSfM holds it with a 1 % prior, which
   COLMAP does not offer, and which in OpenSfM's weighting moves it only +0.05 %:
   ``benchmarks/bench_focal_prior.py``). Radial distortion and the principal point are refined,
   and once the mapper is done, refined again with OpenSfM's priors on them
   (:func:`.sfm_priors.adjust_with_intrinsic_priors`): without those priors they are what sets the ground
   height on a constant-height nadir flight (brighton: +0.9 m above ODM's cloud with two free
   radial terms; with the priors the dense DSM lies 0.24 m median, 0.43 m p90 from it, tilt 0.43
   deg, orthophoto offset 0.00 m; ``benchmarks/bench_engine.py --only brighton``). With one
   radial term, 848 px (the 35 mm equivalent on the image diagonal) and the principal point
   fixed, before the priors: tilt 0.98 deg, median |dz| 0.85 m. SIFT's peak threshold is
   lowered so near-textureless frames still register (seneca_1200's fields).
4. Georeferencing inside the bundle adjustment: every image's GPS position (UTM metres less a
   survey origin, standard deviation ``gps-accuracy``) is a position prior in COLMAP's database;
   the mapper aligns each model to the priors (a similarity) and its global bundle adjustments add
   the priors as (robust) residuals, as OpenSfM does for ODM, so a model bent or tilted by the
   similarity-only fit is pulled onto the GPS. A final similarity fit with RANSAC
   (``pycolmap.align_reconstruction_to_locations``) reports the camera-to-GPS residuals and
   catches a model the mapper left unaligned.
"""

from __future__ import annotations

import logging
import math
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from prefect_odm.engine.camera import CameraPose, ImageMeta, Scene, rotation_tuple, utm_positions
from prefect_odm.engine.camera_calibration import Intrinsics
from prefect_odm.engine.direct import estimate_ground_z_m
from prefect_odm.engine.sfm_priors import (
    ColmapRun,
    adjust_with_intrinsic_priors,
    reader_camera,
    refines_principal_point,
)
from prefect_odm.errors import ProcessingFailedError

logger = logging.getLogger(__name__)

MAX_FEATURES = 6000
"""SIFT features kept per image (COLMAP's default is 8192; fewer is faster on 2 cores)."""

SIFT_PEAK_THRESHOLD = 0.002
"""Lower than COLMAP's 0.0067 so near-textureless frames (fields, sand) still get ~2500
features; well textured images are capped at ``max_features`` either way."""

MAX_NEIGHBOURS = 20
"""Images each image is matched with, nearest GPS positions first."""

MIN_REGISTERED_FRACTION = 0.5
"""Reconstruction fails when the largest model registers fewer of the images than this."""

GPS_RANSAC_MAX_ERROR_M = 5.0
"""Inlier threshold of the camera-centre-to-GPS similarity fit (consumer GPS: a few metres)."""

MAX_POINT_REPROJECTION_ERROR_PX = 2.0
"""3D points with a larger mean reprojection error are dropped from the products."""

GPS_ACCURACY_M = 3.0
"""Default standard deviation of a camera's GPS position, metres (ODM's ``gps-accuracy``)."""

MIN_TRACK_LENGTH = 3
"""3D points seen in fewer images are dropped from the products."""


def reconstruct_sfm(
    images: Sequence[ImageMeta],
    image_dir: Path,
    work_dir: Path,
    epsg: int,
    *,
    resize_to: int = 2048,
    max_concurrency: int = 2,
    max_features: int = MAX_FEATURES,
    max_neighbours: int = MAX_NEIGHBOURS,
    gps_accuracy_m: float = GPS_ACCURACY_M,
    calibrated: Mapping[str, Intrinsics] | None = None,
    log: Callable[[str], None] = logger.info,
) -> Scene:
    """Reconstruct the cameras and a sparse point cloud, in the survey's UTM CRS.

    Args:
        images: metadata of every image in ``image_dir`` to use.
        image_dir: folder of the image files.
        work_dir: scratch folder (the COLMAP database and model are kept there).
        epsg: the survey's WGS 84 / UTM EPSG code.
        resize_to: long side in pixels that features are extracted at (<= 0: full size).
        max_concurrency: threads for extraction, matching and bundle adjustment.
        max_features: SIFT features per image.
        max_neighbours: images each image is matched with (nearest GPS positions first).
        gps_accuracy_m: standard deviation of each GPS position, metres (ODM's
            ``gps-accuracy``): the weight of the position priors in the bundle adjustment.
        calibrated: camera key -> intrinsics held fixed (the ``cameras`` option,
            :func:`.camera_calibration.calibrated_cameras`); other cameras are calibrated here.
        log: progress line sink.

    Returns:
        A :class:`Scene` with method ``"sfm"``: the registered cameras (UTM poses, refined
        distortion) and the filtered, coloured 3D points.

    Raises:
        ProcessingFailedError: fewer than half of the images (or fewer than 3) registered, or
            the model could not be aligned to the GPS positions.
        MemoryError: out of memory inside COLMAP.
    """
    import pycolmap

    work_dir.mkdir(parents=True, exist_ok=True)
    threads = max(1, int(max_concurrency))
    run = ColmapRun(images, image_dir, work_dir, threads, log, dict(calibrated or {}))
    run.database.unlink(missing_ok=True)
    previous_level = pycolmap.logging.minloglevel
    pycolmap.logging.minloglevel = 2  # COLMAP's INFO lines go to stderr; we log our own
    try:
        _extract_features(run, resize_to, max_features)
        _number_images_by_name(run.database)
        origin = _write_gps_priors(run, epsg, gps_accuracy_m)
        pairs = _match_neighbours(run, max_neighbours)
        model = _map_incrementally(run, pairs)
        adjust_with_intrinsic_priors(run, model)
        residual, scale = _align_to_gps(run, model, epsg, origin)
        cameras, points, colours = _scene_parts(model, origin)
        return Scene(
            method="sfm",
            epsg=epsg,
            cameras=cameras,
            points_xyz=points,
            points_rgb=colours,
            images=len(images),
            stats={
                "registered_images": float(model.num_reg_images()),
                "verified_pairs": float(pairs),
                "gps_residual_mean_m": float(residual.mean()),
                "gps_residual_max_m": float(residual.max()),
                "gps_residual_rms_m": float(np.sqrt(np.mean(np.square(residual)))),
                "similarity_scale": float(scale),
            },
        )
    finally:
        pycolmap.logging.minloglevel = previous_level


def _extract_features(run: ColmapRun, resize_to: int, max_features: int) -> None:
    """SIFT features of every image into the database, one camera per camera key.

    The camera is ``RADIAL`` for a calibrated key or one with :data:`FULL_CAMERA_MIN_IMAGES`
    images or more, else ``SIMPLE_RADIAL`` (:func:`.sfm_priors.reader_camera`).
    """
    import pycolmap

    images, threads = run.images, run.threads

    started = time.perf_counter()
    extraction = pycolmap.FeatureExtractionOptions()
    extraction.num_threads = threads
    extraction.max_image_size = int(resize_to) if resize_to and resize_to > 0 else -1
    extraction.sift.max_num_features = int(max_features)
    extraction.sift.first_octave = 0  # no upsampled octave: 4x less work, enough features
    extraction.sift.peak_threshold = SIFT_PEAK_THRESHOLD
    groups: dict[str, list[ImageMeta]] = defaultdict(list)
    for meta in images:
        groups[meta.camera_key].append(meta)
    for group in groups.values():
        reader = pycolmap.ImageReaderOptions()
        reader.camera_model, reader.camera_params = reader_camera(run, group)
        pycolmap.extract_features(
            run.database,
            run.image_dir,
            image_names=[m.name for m in group],
            camera_mode=pycolmap.CameraMode.SINGLE,
            reader_options=reader,
            extraction_options=extraction,
            device=pycolmap.Device.cpu,
        )
    fixed = sum(key in run.calibrated for key in groups)
    run.log(
        f"Extracted SIFT features of {len(images)} images ({len(groups)} camera(s), "
        f"{fixed} held at a given calibration) in {time.perf_counter() - started:.1f} s"
    )


def _number_images_by_name(database: Path) -> None:
    """Renumber the database's images (and their one-image frames) in the order of their names.

    COLMAP's extraction threads write the images in the order they finish, so two runs on the
    same images number them differently, and every later step (matching order, the mapper's
    choices, the bundle adjustment) follows the numbers: brighton's DSM differed from run to run.
    The ids are rewritten in one transaction, in the tables of COLMAP's database schema that
    hold an image id: ``images``, ``keypoints``, ``descriptors``, ``frame_data.data_id`` (camera
    sensors), ``pose_priors.corr_data_id``, and ``frames`` (one image per frame, as extraction
    writes them). Matches are made after this, so no pair id needs rewriting.

    Raises:
        ProcessingFailedError: the database does not have that schema (another COLMAP).
    """
    import sqlite3

    connection = sqlite3.connect(database)
    try:
        with connection:
            rows = connection.execute("SELECT image_id, name FROM images").fetchall()
            order = {old: new for new, (old, _) in enumerate(sorted(rows, key=lambda r: r[1]), 1)}
            frames = connection.execute(
                "SELECT frame_id, data_id FROM frame_data WHERE sensor_type = 0"
            ).fetchall()
            if len(frames) != len(rows) or len({f for f, _ in frames}) != len(rows):
                raise ProcessingFailedError(
                    f"{database}: COLMAP wrote {len(frames)} image frames for {len(rows)} images"
                )
            frame_of = {image: frame for frame, image in frames}
            shift = 1 << 30  # above every id: no clash while the ids move
            statements = [
                ("UPDATE images SET image_id = ? WHERE image_id = ?", "image"),
                ("UPDATE keypoints SET image_id = ? WHERE image_id = ?", "image"),
                ("UPDATE descriptors SET image_id = ? WHERE image_id = ?", "image"),
                (
                    "UPDATE frame_data SET data_id = ? WHERE data_id = ? AND sensor_type = 0",
                    "image",
                ),
                ("UPDATE pose_priors SET corr_data_id = ? WHERE corr_data_id = ?", "image"),
                ("UPDATE frame_data SET frame_id = ? WHERE frame_id = ?", "frame"),
                ("UPDATE frames SET frame_id = ? WHERE frame_id = ?", "frame"),
            ]
            for step in (0, 1):
                for sql, kind in statements:
                    for old, new in order.items():
                        source = frame_of[old] if kind == "frame" else old
                        if step == 0:
                            connection.execute(sql, (source + shift, source))
                        else:
                            connection.execute(sql, (new, source + shift))
    except sqlite3.Error as exc:
        raise ProcessingFailedError(f"{database}: cannot renumber the images ({exc})") from exc
    finally:
        connection.close()


def _write_gps_priors(run: ColmapRun, epsg: int, accuracy_m: float) -> NDArray[np.float64]:
    """Replace the database's pose priors by Cartesian UTM GPS positions (less an origin).

    COLMAP's feature extraction writes WGS 84 priors from EXIF; the bundle adjustment needs metric
    coordinates, so each image gets ``UTM - origin`` with covariance ``accuracy_m**2 * I``.

    Returns:
        The origin (3,), UTM metres (mean easting and northing, z 0).
    """
    import pycolmap

    gps = utm_positions(run.images, epsg)
    origin = np.array([gps[:, 0].mean(), gps[:, 1].mean(), 0.0])
    by_name = dict(zip((m.name for m in run.images), gps - origin, strict=True))
    variance = max(float(accuracy_m), 0.01) ** 2
    db = pycolmap.Database.open(run.database)
    try:
        db.clear_pose_priors()
        for image in db.read_all_images():
            prior = pycolmap.PosePrior()
            prior.corr_data_id = image.data_id
            prior.position = by_name[image.name]
            prior.position_covariance = np.eye(3) * variance
            prior.coordinate_system = pycolmap.PosePriorCoordinateSystem.CARTESIAN
            db.write_pose_prior(prior)
    finally:
        db.close()
    return origin


def _match_neighbours(run: ColmapRun, max_neighbours: int) -> int:
    """Match each image with its GPS neighbours within about one footprint; verified pairs."""
    import pycolmap

    images = run.images

    started = time.perf_counter()
    ground_z, _ = estimate_ground_z_m(images)
    heights = [m.altitude_m - ground_z for m in images if m.altitude_m is not None]
    height_m = max(float(np.median(heights)) if heights else 60.0, 5.0)
    long_side = max(max(m.width, m.height) / m.focal_length_px for m in images)
    matching = pycolmap.FeatureMatchingOptions()
    matching.num_threads = run.threads
    verification = pycolmap.TwoViewGeometryOptions()
    # a seeded RANSAC per pair: with the default (-1) each thread's generator draws in the
    # order the pairs reach it, and the verified pairs differ from run to run
    verification.ransac.random_seed = 0
    pairing = pycolmap.SpatialPairingOptions()
    pairing.max_num_neighbors = min(max(1, int(max_neighbours)), max(len(images) - 1, 1))
    pairing.max_distance = 1.2 * height_m * long_side
    pairing.ignore_z = True
    pycolmap.match_spatial(
        run.database,
        matching_options=matching,
        pairing_options=pairing,
        verification_options=verification,
        device=pycolmap.Device.cpu,
    )
    db = pycolmap.Database.open(run.database)
    try:
        pairs = int(db.num_verified_image_pairs())
    finally:
        db.close()
    run.log(
        f"Matched neighbours within {pairing.max_distance:.0f} m: {pairs} verified pairs "
        f"in {time.perf_counter() - started:.1f} s"
    )
    return pairs


def _map_incrementally(run: ColmapRun, pairs: int) -> Any:
    """COLMAP's incremental mapping with the focal length held fixed; the largest model.

    Raises:
        ProcessingFailedError: no model, or it registers too few of the images.
    """
    import pycolmap

    images = run.images
    started = time.perf_counter()
    options = pycolmap.IncrementalPipelineOptions()
    options.num_threads = run.threads
    options.random_seed = 0
    options.ba_refine_focal_length = False
    options.ba_refine_principal_point = refines_principal_point(run)
    options.ba_refine_extra_params = not run.all_calibrated
    options.mapper.abs_pose_refine_extra_params = not run.all_calibrated
    options.mapper.abs_pose_refine_focal_length = False
    options.min_model_size = 3
    options.use_prior_position = True
    options.use_robust_loss_on_prior_position = True
    sparse = run.work_dir / "sparse"
    sparse.mkdir(exist_ok=True)
    models = pycolmap.incremental_mapping(run.database, run.image_dir, sparse, options)
    if not models:
        raise ProcessingFailedError(
            f"structure from motion failed: no model from {len(images)} images "
            f"({pairs} matched pairs)"
        )
    model = max(models.values(), key=lambda m: m.num_reg_images())
    registered = model.num_reg_images()
    run.log(
        f"Incremental mapping: {registered}/{len(images)} images registered, "
        f"{model.num_points3D()} points, {len(models)} model(s) "
        f"in {time.perf_counter() - started:.1f} s"
    )
    needed = max(3, math.ceil(MIN_REGISTERED_FRACTION * len(images)))
    if registered < min(needed, len(images)):
        raise ProcessingFailedError(
            f"structure from motion registered only {registered} of {len(images)} images "
            f"(at least {needed} needed)"
        )
    return model


def _align_to_gps(
    run: ColmapRun, model: Any, epsg: int, origin: NDArray[np.float64]
) -> tuple[NDArray[np.float64], float]:
    """Transform ``model`` (in place) onto the GPS positions, in UTM metres less ``origin``.

    After the prior-constrained bundle adjustment the similarity is close to the identity.

    Returns:
        ``(camera-to-GPS residuals (n,) metres, similarity scale)``.

    Raises:
        ProcessingFailedError: no similarity transform fits the GPS positions.
    """
    import pycolmap

    by_name = {m.name: m for m in run.images}
    reg_ids = list(model.reg_image_ids())
    reg_names = [model.images[i].name for i in reg_ids]
    gps = utm_positions([by_name[n] for n in reg_names], epsg)
    ransac = pycolmap.RANSACOptions()
    ransac.max_error = GPS_RANSAC_MAX_ERROR_M
    sim = pycolmap.align_reconstruction_to_locations(model, reg_names, gps - origin, 3, ransac)
    if sim is None:
        raise ProcessingFailedError(
            "structure from motion model could not be aligned to the GPS positions"
        )
    model.transform(sim)
    centers = np.array([model.images[i].projection_center() for i in reg_ids]) + origin
    residual = np.linalg.norm(centers - gps, axis=1)
    run.log(
        f"Aligned to GPS (scale {sim.scale:.3f}): camera residual mean "
        f"{residual.mean():.2f} m, max {residual.max():.2f} m"
    )
    return residual, float(sim.scale)


def _scene_parts(
    model: Any, origin: NDArray[np.float64]
) -> tuple[tuple[CameraPose, ...], NDArray[np.float64], NDArray[np.uint8]]:
    """The registered cameras (UTM poses) and the filtered, coloured points of ``model``."""
    cameras = []
    for image_id in model.reg_image_ids():
        image = model.images[image_id]
        camera = model.cameras[image.camera_id]
        f, cx, cy, k1, *rest = (float(v) for v in camera.params)
        k2 = rest[0] if rest else 0.0  # RADIAL has a second term, SIMPLE_RADIAL none
        rotation = image.cam_from_world().rotation.matrix()
        center = np.asarray(image.projection_center()) + origin
        cameras.append(
            CameraPose(
                name=image.name,
                width=int(camera.width),
                height=int(camera.height),
                focal_px=f,
                cx=cx,
                cy=cy,
                k1=k1,
                k2=k2,
                rotation=rotation_tuple(rotation),
                center=(float(center[0]), float(center[1]), float(center[2])),
            )
        )
    xyz, rgb = [], []
    for point in model.points3D.values():
        if point.track.length() >= MIN_TRACK_LENGTH and point.error <= (
            MAX_POINT_REPROJECTION_ERROR_PX
        ):
            xyz.append(point.xyz)
            rgb.append(point.color)
    points = np.asarray(xyz, dtype=np.float64).reshape(-1, 3) + origin
    colours = np.asarray(rgb, dtype=np.uint8).reshape(-1, 3)
    return tuple(cameras), points, colours
