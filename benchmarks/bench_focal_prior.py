"""Would OpenSfM's focal-length prior put the built-in engine's ground where ODM's is?

Before OpenSfM's priors on the principal point and the distortion terms joined the engine's
structure from motion, its dense DSM sat +0.8 to +0.9 m above ODM's cloud on brighton
(``bench_engine.py --only brighton --cases dense``); this benchmark showed that the focal prior
was not the reason. On a constant-height nadir flight focal length and depth trade
one for the other, and the engine holds the focal length fixed at ODM's prior (35 mm equivalent /
36 mm x the long side, 889 px) because COLMAP has no intrinsic priors. OpenSfM, which ODM runs,
refines it against a prior of ``exif_focal_sd`` = 1 %, with reprojection errors weighted by
``reprojection_error_sd`` = 0.004 of the long image side (OpenSfM's ``config.py`` defaults).

This benchmark reconstructs brighton with the engine's structure from motion, then runs COLMAP's
GPS-prior bundle adjustment again on the mapper's model with the focal length refined: free, and
held by OpenSfM's prior in OpenSfM's weighting (a residual ``(f - f0) / (sd * f0)`` times the
reprojection sd in pixels, added to COLMAP's Ceres problem through ``pyceres``). It prints, for
each, the refined focal length, how far the ground moves (median height of the sparse points
relative to the median camera height) and, from ODM's ``reference/model.laz``, the focal length
that would put the sparse points at ODM's heights.

Needs ``.[engine]`` (pycolmap and pyceres).

    python benchmarks/bench_focal_prior.py
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "brighton_beach_1600"
REPROJECTION_SD = 0.004
"""OpenSfM's ``reprojection_error_sd``, as a share of the long image side."""
PRIORS = (("fixed (the engine)", None), ("OpenSfM's 1 % prior", 0.01), ("free", 0.0))


def _ground_depth_m(model: Any) -> float:
    """Median camera height minus median sparse-point height, model units (metres)."""
    cameras = [model.images[i].projection_center()[2] for i in model.reg_image_ids()]
    points = [p.xyz[2] for p in model.points3D.values()]
    return float(np.median(cameras) - np.median(points))


def _refine(sparse_dir: Path, database: Path, prior_sd: float | None) -> tuple[float, float, float]:
    """``(focal before, focal after, ground depth after)`` of one bundle adjustment."""
    import pyceres
    import pycolmap

    model = pycolmap.Reconstruction(str(sparse_dir))
    camera = next(iter(model.cameras.values()))
    focal0 = float(camera.params[0])
    if prior_sd is None:
        return focal0, focal0, _ground_depth_m(model)
    db = pycolmap.Database.open(str(database))
    priors = db.read_all_pose_priors()
    db.close()
    options = pycolmap.BundleAdjustmentOptions()
    options.refine_focal_length = True
    options.refine_principal_point = True
    options.refine_extra_params = True
    options.print_summary = False
    prior_options = pycolmap.PosePriorBundleAdjustmentOptions()
    prior_options.ceres.prior_position_loss_function_type = pycolmap.LossFunctionType.CAUCHY
    config = pycolmap.BundleAdjustmentConfig()
    for image_id in model.reg_image_ids():
        config.add_image(image_id)
    adjuster = pycolmap.create_pose_prior_ceres_bundle_adjuster(
        options, prior_options, config, priors, model
    )
    if prior_sd > 0:
        # OpenSfM's cost: sum (reprojection / sd_r)^2 + ((f - f0) / (sd_f f0))^2; COLMAP's
        # reprojection residuals are plain pixels, so the prior is scaled by sd_r in pixels.
        sd_px = prior_sd * focal0 / (REPROJECTION_SD * max(camera.width, camera.height))

        class FocalPrior(pyceres.CostFunction):  # type: ignore[misc]
            def __init__(self) -> None:
                super().__init__()
                self.set_num_residuals(1)
                self.set_parameter_block_sizes([len(camera.params)])

            def Evaluate(self, params: Any, residuals: Any, jacobians: Any) -> bool:  # noqa: N802
                residuals[0] = (params[0][0] - focal0) / sd_px
                if jacobians is not None and jacobians[0] is not None:
                    jacobians[0][:] = 0.0
                    jacobians[0][0] = 1.0 / sd_px
                return True

        cost = FocalPrior()  # the problem does not own the Python objects: keep them alive
        problem = adjuster.problem
        problem.add_residual_block(cost, None, [camera.params])
        adjuster.solve()
    else:
        adjuster.solve()
    return focal0, float(next(iter(model.cameras.values())).params[0]), _ground_depth_m(model)


def _offset_to_odm_m(points_utm: np.ndarray) -> float:
    """Median height of the sparse points above ODM's cloud (its median height per 1 m cell)."""
    import laspy
    from scipy.stats import binned_statistic_2d

    cloud = laspy.read(DATA / "reference" / "model.laz")
    x, y, z = (np.asarray(v, dtype=np.float64) for v in (cloud.x, cloud.y, cloud.z))
    edges = [np.arange(x.min(), x.max() + 1.0), np.arange(y.min(), y.max() + 1.0)]
    reference = binned_statistic_2d(x, y, z, "median", bins=edges).statistic
    col = np.floor(points_utm[:, 0] - x.min()).astype(np.int64)
    row = np.floor(points_utm[:, 1] - y.min()).astype(np.int64)
    inside = (col >= 0) & (col < reference.shape[0]) & (row >= 0) & (row < reference.shape[1])
    below = reference[col[inside], row[inside]]
    found = np.isfinite(below)
    return float(np.median(points_utm[inside][found, 2] - below[found]))


def main() -> None:
    from prefect_odm.engine.camera import read_images
    from prefect_odm.engine.sfm import reconstruct_sfm
    from prefect_odm.geo import survey_utm_epsg

    images = read_images(DATA / "images")
    epsg = survey_utm_epsg([m.latitude_deg for m in images], [m.longitude_deg for m in images])
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        started = time.perf_counter()
        scene = reconstruct_sfm(images, DATA / "images", work, epsg, log=lambda _: None)
        print(f"brighton: {len(scene.cameras)} cameras, {len(scene.points_xyz)} sparse points "
              f"in {time.perf_counter() - started:.1f} s")  # fmt: skip
        offset = _offset_to_odm_m(scene.points_xyz)
        cameras_z = float(np.median([c.center[2] for c in scene.cameras]))
        depth = cameras_z - float(np.median(scene.points_xyz[:, 2]))
        focal = scene.cameras[0].focal_px
        needed = focal * (depth + offset) / depth
        print(f"sparse points {offset:+.2f} m above ODM's cloud; ground {depth:.2f} m below the "
              f"cameras; ODM's heights need f = {needed:.1f} px ({100 * (needed / focal - 1):+.2f} %"
              f" of {focal:.1f} px)")  # fmt: skip
        sparse = next((work / "sparse").iterdir())
        for label, prior_sd in PRIORS:
            started = time.perf_counter()
            before, after, depth_after = _refine(sparse, work / "database.db", prior_sd)
            base = _ground_depth_m(__import__("pycolmap").Reconstruction(str(sparse)))
            print(f"  {label:22s} f {after:7.1f} px ({100 * (after / before - 1):+6.2f} %), ground "
                  f"moves {base - depth_after:+6.2f} m, then {offset - (depth_after - base):+5.2f} m "
                  f"from ODM's ({time.perf_counter() - started:.1f} s)")  # fmt: skip


if __name__ == "__main__":
    main()
