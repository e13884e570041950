"""Structure from motion with pycolmap (CPU), georegistered to the images' GPS positions.

Steps (COLMAP's incremental pipeline, Schoenberger & Frahm, "Structure-from-Motion Revisited",
CVPR 2016):

1. SIFT features on images downscaled to ``resize-to`` (keypoints are reported in full-size
   pixels); one camera per camera model and image size, its focal length from EXIF
   (:attr:`ImageMeta.focal_length_px`, ODM's prior), with two radial distortion terms (COLMAP's
   RADIAL: ``k1``, ``k2``, the radial part of the ``brown`` model ODM gives OpenSfM by default,
   ``opendm/photo.py``) and the principal point refined as OpenSfM refines it (ODM's default
   ``optimize_camera_parameters``); a camera seen in fewer than :data:`FULL_CAMERA_MIN_IMAGES`
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
   (:func:`_adjust_with_intrinsic_priors`): without those priors they are what sets the ground
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
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from prefect_odm.engine.camera import CameraPose, ImageMeta, Scene, rotation_tuple, utm_positions
from prefect_odm.engine.direct import estimate_ground_z_m
from prefect_odm.errors import ProcessingFailedError

logger = logging.getLogger(__name__)

FULL_CAMERA_MIN_IMAGES = 15
"""Images a camera needs before bundle adjustment refines its full model.

From this many images on, the camera is COLMAP's ``RADIAL`` (``f, cx, cy, k1, k2``: the radial
part of ODM's default ``brown``) with the principal point refined, as OpenSfM refines it for ODM;
below, ``SIMPLE_RADIAL`` (``f, cx, cy, k``) with the principal point at the image centre. A
principal-point shift trades against the cameras' tilt, and a few images (one flight line)
cannot tell them apart. On brighton split in two (about 10 images a submodel,
``tests/test_align_wired.py``) the full model needs 2.09 deg of rotation between the two
submodels, over the alignment's 2 deg gate; two radial terms with the principal point fixed
leave their orthophotos 0.45 m apart after alignment; the simple camera 0.03 m. The count is of the images given, per camera. The focal length is
held fixed in both."""

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

INTRINSIC_PRIOR_SD = 0.01
"""Standard deviation of the priors on the principal point (a share of the long image side) and
on each distortion term (towards 0), as OpenSfM sets them for ODM (``principal_point_sd``,
``radial_distortion_k1_sd``, ``radial_distortion_k2_sd``; OpenSfM's ``config.py``)."""

REPROJECTION_SD = 0.004
"""OpenSfM's ``reprojection_error_sd``, a share of the long image side: the weight of the
intrinsic priors against COLMAP's reprojection residuals, which are in pixels."""


@dataclass(frozen=True)
class _Colmap:
    """One COLMAP run: the images, their folder, the scratch folder, threads and the log."""

    images: Sequence[ImageMeta]
    image_dir: Path
    work_dir: Path
    threads: int
    log: Callable[[str], None]

    @property
    def database(self) -> Path:
        """COLMAP's feature and match database."""
        return self.work_dir / "database.db"


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
    run = _Colmap(images, image_dir, work_dir, max(1, int(max_concurrency)), log)
    run.database.unlink(missing_ok=True)
    previous_level = pycolmap.logging.minloglevel
    pycolmap.logging.minloglevel = 2  # COLMAP's INFO lines go to stderr; we log our own
    try:
        _extract_features(run, resize_to, max_features)
        _number_images_by_name(run.database)
        origin = _write_gps_priors(run, epsg, gps_accuracy_m)
        pairs = _match_neighbours(run, max_neighbours)
        model = _map_incrementally(run, pairs)
        _adjust_with_intrinsic_priors(run, model)
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


def _extract_features(run: _Colmap, resize_to: int, max_features: int) -> None:
    """SIFT features of every image into the database, one camera per camera key.

    The camera is ``RADIAL`` for a key with :data:`FULL_CAMERA_MIN_IMAGES` images or more, else
    ``SIMPLE_RADIAL``.
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
        first = group[0]
        full = len(group) >= FULL_CAMERA_MIN_IMAGES
        reader = pycolmap.ImageReaderOptions()
        reader.camera_model = "RADIAL" if full else "SIMPLE_RADIAL"
        reader.camera_params = (
            f"{first.focal_length_px},{first.width / 2.0},{first.height / 2.0},0"
            + (",0" if full else "")
        )
        pycolmap.extract_features(
            run.database,
            run.image_dir,
            image_names=[m.name for m in group],
            camera_mode=pycolmap.CameraMode.SINGLE,
            reader_options=reader,
            extraction_options=extraction,
            device=pycolmap.Device.cpu,
        )
    run.log(
        f"Extracted SIFT features of {len(images)} images ({len(groups)} camera(s)) "
        f"in {time.perf_counter() - started:.1f} s"
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


def _write_gps_priors(run: _Colmap, epsg: int, accuracy_m: float) -> NDArray[np.float64]:
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


def _match_neighbours(run: _Colmap, max_neighbours: int) -> int:
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


def _refines_principal_point(images: Sequence[ImageMeta]) -> bool:
    """Whether every camera has the full model (:data:`FULL_CAMERA_MIN_IMAGES`)."""
    per_camera = Counter(meta.camera_key for meta in images)
    return bool(per_camera) and min(per_camera.values()) >= FULL_CAMERA_MIN_IMAGES


def _map_incrementally(run: _Colmap, pairs: int) -> Any:
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
    options.ba_refine_principal_point = _refines_principal_point(images)
    options.ba_refine_extra_params = True
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


def _adjust_with_intrinsic_priors(run: _Colmap, model: Any) -> None:
    """A last GPS-prior bundle adjustment of ``model`` (in place) with OpenSfM's camera priors.

    COLMAP's bundle adjustment has no priors on a camera's intrinsics; OpenSfM's, which ODM runs,
    holds the principal point near the image centre and every distortion term near zero, each
    with :data:`INTRINSIC_PRIOR_SD`, against reprojection errors of :data:`REPROJECTION_SD`
    (OpenSfM's ``bundle.py``, ``set_internal_parameters_prior_sd``). On a constant-height nadir
    flight the distortion terms and the principal point are barely observable and move the
    ground: on brighton the mapper's free ``k1`` = 0.014 and ``k2`` = 0.015 put the sparse points
    +0.95 m above ODM's cloud (COLMAP's ``OPENCV``, with tangential terms, -3.06 m); with the
    priors both camera models converge to ``k1`` = 0.001, ``k2`` = 0.011 and the points lie
    0.14-0.17 m below it. The focal length stays fixed (see the module docstring). The priors
    are Ceres ``NormalPrior`` residuals ``(p - p0) * REPROJECTION_SD * long side / sd`` in pixels
    (``pyceres.factors``, C++), added to COLMAP's pose-prior bundle adjuster, whose GPS priors
    are those of the mapper.
    """
    import pyceres
    import pycolmap

    started = time.perf_counter()
    options = pycolmap.BundleAdjustmentOptions()
    options.refine_focal_length = False
    options.refine_principal_point = _refines_principal_point(run.images)
    options.refine_extra_params = True
    options.print_summary = False
    options.ceres.solver_options.num_threads = run.threads
    prior_options = pycolmap.PosePriorBundleAdjustmentOptions()
    prior_options.ceres.prior_position_loss_function_type = pycolmap.LossFunctionType.CAUCHY
    config = pycolmap.BundleAdjustmentConfig()
    for image_id in model.reg_image_ids():
        config.add_image(image_id)
    db = pycolmap.Database.open(run.database)
    try:
        pose_priors = db.read_all_pose_priors()
    finally:
        db.close()
    adjuster = pycolmap.create_pose_prior_ceres_bundle_adjuster(
        options, prior_options, config, pose_priors, model
    )
    costs = []  # kept alive until the problem is solved
    before = {}
    for camera_id, camera in model.cameras.items():
        target = np.zeros(len(camera.params))
        target[:3] = camera.params[:3]  # f, cx, cy as COLMAP starts them; distortion 0
        target[1:3] = (camera.width / 2.0, camera.height / 2.0)
        long_side = float(max(camera.width, camera.height))
        sd = np.full(len(camera.params), INTRINSIC_PRIOR_SD)
        sd[:3] = INTRINSIC_PRIOR_SD * long_side  # the focal length is held constant anyway
        # OpenSfM's cost (r_px / (REPROJECTION_SD L))^2 + ((p - p0) / sd)^2, times
        # (REPROJECTION_SD L)^2: COLMAP's pixels plus ((p - p0) / sigma)^2
        sigma = sd / (REPROJECTION_SD * long_side)
        costs.append(pyceres.factors.NormalPrior(target, np.diag(np.square(sigma))))
        adjuster.problem.add_residual_block(costs[-1], None, [camera.params])
        before[camera_id] = np.array(camera.params, dtype=np.float64)
    adjuster.solve()
    changes = ", ".join(
        f"k1 {before[i][3]:+.4f} -> {float(c.params[3]):+.4f}, principal point moved "
        f"{float(np.hypot(*(np.asarray(c.params[1:3]) - before[i][1:3]))):.1f} px"
        for i, c in model.cameras.items()
    )
    run.log(
        f"Bundle adjustment with OpenSfM's camera priors: {changes} "
        f"in {time.perf_counter() - started:.1f} s"
    )


def _align_to_gps(
    run: _Colmap, model: Any, epsg: int, origin: NDArray[np.float64]
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
