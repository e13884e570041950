"""What a node gets with a submodel's images: the plan's ``geo.txt`` where it corrected the
camera altitudes (:mod:`prefect_odm.plan.altitudes`).

NodeODM routes an upload named ``geo.txt`` to ODM's ``--geo``, the built-in engine to its
dataset stage (:mod:`prefect_odm.engine.geo_file`); the file is stored beside the submodel's
results (``inputs/geo.txt``) and uploaded from there under its base name.
"""

from __future__ import annotations

from collections.abc import Sequence

from prefect_odm import storage
from prefect_odm.models import SplitPlan, Survey
from prefect_odm.plan.altitudes import geo_txt

GEO_TXT = "geo.txt"


def plan_altitudes(plan: SplitPlan, names: Sequence[str]) -> dict[str, float]:
    """Image name -> the plan's corrected altitude, metres, for ``names`` (empty where the plan
    keeps the GPS altitudes)."""
    if plan.altitude_correction is None:
        return {}
    wanted = set(names)
    return {c.name: c.z_m for c in plan.cameras if c.name in wanted and c.z_m is not None}


def altitudes_by_identity(
    plan: SplitPlan, survey: Survey, names: Sequence[str]
) -> dict[str, float]:
    """:func:`plan_altitudes` keyed by image identity (what a fingerprint holds)."""
    identity = {im.name: im.identity for im in survey.images}
    return {identity[n]: z for n, z in plan_altitudes(plan, names).items()}


def upload_files(plan: SplitPlan, survey: Survey, names: Sequence[str], geo_url: str) -> list[str]:
    """The locations to upload for the images ``names``: the images, then ``geo.txt`` (written
    first to ``geo_url``, whose base name must be ``geo.txt``) when the plan corrected their
    altitudes."""
    by_name = {img.name: img for img in survey.images}
    files = [by_name[n].url for n in names]
    altitudes = plan_altitudes(plan, names)
    if altitudes:
        text = geo_txt([by_name[n] for n in names], altitudes)
        storage.write_bytes_atomic(geo_url, text.encode("ascii"))
        files.append(geo_url)
    return files
