"""Which images calibrate a survey's cameras once for all its submodels (pure core).

A submodel of a dozen images cannot tell a camera's focal length, principal point and radial
terms from the block's height over the ground: brighton's Quickstart split (two submodels of 12
images, each calibrating its own simpler camera) put the merged DSM 1.07 m below ODM's cloud,
where the same images in one block give 0.24 m (issue 31). So, when a plan has two submodels or
more and structure from motion runs, one small reconstruction calibrates every camera on a
compact block of images near the survey's middle (:func:`calibration_images`: up to
:data:`CALIBRATION_IMAGES` of each camera, several flight lines, the cross-strip geometry a
calibration needs), and every submodel gets its ``cameras.json`` as ODM's ``cameras`` option
(the calibration then enters each submodel's fingerprint with the options). One submodel has
nothing to share and is left as it was; so are submodels all at least as large as the
calibration block, and a run whose options already give ``cameras`` (``--option cameras={}``, no
camera, turns the shared calibration off).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping

from prefect_odm.fingerprints import fingerprint
from prefect_odm.models import ImageRecord, OptionValue, SplitPlan, Survey

CALIBRATION_IMAGES = 30
"""Images of each camera the calibration reconstructs (the nearest to that camera's mean
position; all of them when it has fewer). At least the engine's ``FULL_CAMERA_MIN_IMAGES``
(15), from which it refines the full radial camera with its principal point."""

CALIBRATION_OPTION = "cameras"
"""ODM's option that takes a ``cameras.json`` (its text) instead of calibrating."""

CALIBRATION_END_WITH = "opensfm"
"""The calibration task stops after structure from motion, where ODM (and the engine) write
``cameras.json``."""


def needs_calibration(plan: SplitPlan) -> bool:
    """Whether the plan's submodels should share one camera calibration: two or more
    submodels, structure from motion, no ``cameras`` option given, and a submodel smaller than
    the calibration block (:data:`CALIBRATION_IMAGES`). Submodels at least that large calibrate
    their cameras as well as the shared block would: seneca ``--split 50`` (submodels of 86-91
    images) held at a calibration of its 30 middle images gave a block 3.3 deg off nadir where
    the same submodel calibrating itself gave 2.3 deg, and its seams were measured that way."""
    return (
        len(plan.submodels) >= 2
        and plan.options.pipeline == "sfm"
        and CALIBRATION_OPTION not in plan.options.extra
        and min(len(s.image_names) for s in plan.submodels) < CALIBRATION_IMAGES
    )


def _camera_of(image: ImageRecord) -> tuple[str, int, int]:
    return image.camera, image.width, image.height


def calibration_images(plan: SplitPlan, survey: Survey) -> list[str]:
    """The images the calibration reconstructs, sorted by name: per camera (make, model, image
    size) the :data:`CALIBRATION_IMAGES` nearest to the mean plan position of its images
    (ties by name)."""
    position = {c.name: (c.x_m, c.y_m) for c in plan.cameras}
    groups: dict[tuple[str, int, int], list[ImageRecord]] = defaultdict(list)
    for image in survey.images:
        if image.name in position:
            groups[_camera_of(image)].append(image)
    chosen: list[str] = []
    for members in groups.values():
        xs = [position[m.name][0] for m in members]
        ys = [position[m.name][1] for m in members]
        cx, cy = sum(xs) / len(xs), sum(ys) / len(ys)

        def distance(image: ImageRecord, cx: float = cx, cy: float = cy) -> tuple[float, str]:
            x, y = position[image.name]
            return (x - cx) ** 2 + (y - cy) ** 2, image.name

        chosen += [m.name for m in sorted(members, key=distance)[:CALIBRATION_IMAGES]]
    return sorted(chosen)


def calibration_fingerprint(
    plan: SplitPlan,
    survey: Survey,
    names: list[str],
    altitudes_m: dict[str, float],
    options: Mapping[str, OptionValue] | None = None,
) -> str:
    """The calibration's identity: its images' contents, the options it depends on, the
    engine, and the camera altitudes sent with the images.

    Args:
        options: the NodeODM options the calibration's stages read (the caller passes those
            of the stages before georeferencing: the calibration ends with structure from
            motion, so a late-stage option such as ``orthophoto-resolution`` changes nothing in
            its ``cameras.json``); default every option of the plan.
    """
    identity = {im.name: im.identity for im in survey.images}
    value: dict[str, object] = {
        "kind": "calibration",
        "images": sorted(identity[n] for n in names),
        "options": dict(options) if options is not None else plan.options.to_nodeodm(),
        "engine": plan.engine_identity,
    }
    if altitudes_m:
        value["altitudes_m"] = {identity[n]: z for n, z in sorted(altitudes_m.items())}
    return fingerprint(value)
