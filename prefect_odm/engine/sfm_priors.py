"""The camera model structure from motion refines, and OpenSfM's priors on it (:mod:`.sfm`).

A camera seen in enough images gets the full model with its principal point refined; after the
mapper, a last GPS-prior bundle adjustment holds the principal point and the distortion terms
near their starts with OpenSfM's priors. :class:`ColmapRun` is what every step of a COLMAP run
gets.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from prefect_odm.engine.camera import ImageMeta
from prefect_odm.engine.camera_calibration import Intrinsics

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

INTRINSIC_PRIOR_SD = 0.01
"""Standard deviation of the priors on the principal point (a share of the long image side) and
on each distortion term (towards 0), as OpenSfM sets them for ODM (``principal_point_sd``,
``radial_distortion_k1_sd``, ``radial_distortion_k2_sd``; OpenSfM's ``config.py``)."""

REPROJECTION_SD = 0.004
"""OpenSfM's ``reprojection_error_sd``, a share of the long image side: the weight of the
intrinsic priors against COLMAP's reprojection residuals, which are in pixels."""


@dataclass(frozen=True)
class ColmapRun:
    """One COLMAP run: the images, their folder, the scratch folder, threads, the log, and the
    cameras whose intrinsics are given and held fixed (camera key -> intrinsics; the
    ``cameras`` option, :mod:`.camera_calibration`)."""

    images: Sequence[ImageMeta]
    image_dir: Path
    work_dir: Path
    threads: int
    log: Callable[[str], None]
    calibrated: Mapping[str, Intrinsics] = field(default_factory=dict)

    @property
    def all_calibrated(self) -> bool:
        """Whether every camera of the images has given intrinsics (nothing to refine)."""
        return all(meta.camera_key in self.calibrated for meta in self.images)

    @property
    def database(self) -> Path:
        """COLMAP's feature and match database."""
        return self.work_dir / "database.db"


def refines_principal_point(run: ColmapRun) -> bool:
    """Whether bundle adjustment refines the principal points: every camera not calibrated
    has the full model (:data:`FULL_CAMERA_MIN_IMAGES`), and one at least is not calibrated."""
    per_camera = Counter(m.camera_key for m in run.images if m.camera_key not in run.calibrated)
    return bool(per_camera) and min(per_camera.values()) >= FULL_CAMERA_MIN_IMAGES


def reader_camera(run: ColmapRun, group: Sequence[ImageMeta]) -> tuple[str, str]:
    """COLMAP's camera model and starting parameters for the images of one camera key.

    A calibrated camera is ``RADIAL`` with its given intrinsics; else ``RADIAL`` from
    :data:`FULL_CAMERA_MIN_IMAGES` images on, ``SIMPLE_RADIAL`` below, from the EXIF focal
    length with the principal point at the centre and no distortion.
    """
    first = group[0]
    given = run.calibrated.get(first.camera_key)
    if given is not None:
        return "RADIAL", given.colmap_params()
    full = len(group) >= FULL_CAMERA_MIN_IMAGES
    params = f"{first.focal_length_px},{first.width / 2.0},{first.height / 2.0},0"
    return ("RADIAL", params + ",0") if full else ("SIMPLE_RADIAL", params)


def adjust_with_intrinsic_priors(run: ColmapRun, model: Any) -> None:
    """A last GPS-prior bundle adjustment of ``model`` (in place) with OpenSfM's camera priors.

    COLMAP's bundle adjustment has no priors on a camera's intrinsics; OpenSfM's, which ODM runs,
    holds the principal point near the image centre and every distortion term near zero, each
    with :data:`INTRINSIC_PRIOR_SD`, against reprojection errors of :data:`REPROJECTION_SD`
    (OpenSfM's ``bundle.py``, ``set_internal_parameters_prior_sd``). On a constant-height nadir
    flight the distortion terms and the principal point are barely observable and move the
    ground: on brighton the mapper's free ``k1`` = 0.014 and ``k2`` = 0.015 put the sparse points
    +0.95 m above ODM's cloud (COLMAP's ``OPENCV``, with tangential terms, -3.06 m); with the
    priors both camera models converge to ``k1`` = 0.001, ``k2`` = 0.011 and the points lie
    0.14-0.17 m below it. The focal length stays fixed (see :mod:`.sfm`'s docstring). The priors
    are Ceres ``NormalPrior`` residuals ``(p - p0) * REPROJECTION_SD * long side / sd`` in pixels
    (``pyceres.factors``, C++), added to COLMAP's pose-prior bundle adjuster, whose GPS priors
    are those of the mapper.
    """
    import pyceres
    import pycolmap

    started = time.perf_counter()
    options = pycolmap.BundleAdjustmentOptions()
    options.refine_focal_length = False
    options.refine_principal_point = refines_principal_point(run)
    options.refine_extra_params = not run.all_calibrated
    options.print_summary = False
    options.ceres.solver_options.num_threads = run.threads
    prior_options = pycolmap.PosePriorBundleAdjustmentOptions()
    prior_options.ceres.prior_position_loss_function_type = pycolmap.LossFunctionType.CAUCHY
    config = pycolmap.BundleAdjustmentConfig()
    for image_id in model.reg_image_ids():
        config.add_image(image_id)
    fixed = _calibrated_camera_ids(run, model)
    for camera_id, key in fixed.items():
        # the mapper refined them where other cameras needed refining: back to the calibration
        model.cameras[camera_id].params = np.array(
            [float(v) for v in run.calibrated[key].colmap_params().split(",")]
        )
        config.set_constant_cam_intrinsics(camera_id)
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
        if camera_id in fixed:
            continue
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
        if i in before
        else f"camera {i} held at its calibration"
        for i, c in model.cameras.items()
    )
    run.log(
        f"Bundle adjustment with OpenSfM's camera priors: {changes} "
        f"in {time.perf_counter() - started:.1f} s"
    )


def _calibrated_camera_ids(run: ColmapRun, model: Any) -> dict[int, str]:
    """The model's camera ids whose images have given intrinsics (held constant) -> camera key."""
    by_name = {m.name: m for m in run.images}
    return {
        int(image.camera_id): by_name[image.name].camera_key
        for image in model.images.values()
        if image.name in by_name and by_name[image.name].camera_key in run.calibrated
    }
