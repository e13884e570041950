"""What a run's DSM is, in words: measured, or made from the images' metadata.

The built-in engine's direct pipeline (no structure from motion) makes its DSM from an assumed
ground plane or from the heights above ground the images record, and tags it
(:data:`~prefect_odm.registry.DSM_SURFACE_TAG`); its point cloud is sampled from that surface
under the orthophoto's colours. Neither is measured, and the report's summary and the console
say so, naming the pipeline, so such a DSM is not shipped as a surface model of the scene. The
submodels' DSMs are read (the merge does not copy GeoTIFF tags).
"""

from __future__ import annotations

from typing import Any

import rasterio

from prefect_odm import storage
from prefect_odm.models import Manifest
from prefect_odm.registry import DSM_SURFACE_TAG, DSM_SURFACES

PIPELINES = {
    "sfm": "sfm (structure from motion)",
    "direct": "direct (cameras from GPS and attitude, no structure from motion)",
}
"""The pipelines' names in the report and on the console (the engine is not named: ``sfm`` is
the built-in engine's or ODM's on a NodeODM node, whichever processed the submodel)."""


def pipeline_of(manifest: Manifest) -> str | None:
    """The pipeline(s) the run's submodels were processed with (``sfm``, ``direct``, or several
    joined by ``+``); None when no submodel names one (outputs made elsewhere)."""
    names = sorted(
        {
            str(r.method or r.options.get("pipeline"))
            for r in manifest.submodels
            if r.status != "failed" and (r.method or r.options.get("pipeline"))
        }
    )
    return "+".join(names) if names else None


def pipeline_words(manifest: Manifest) -> str | None:
    """``"direct (cameras from GPS and attitude, ...)"``: the pipeline in words, or None."""
    name = pipeline_of(manifest)
    return None if name is None else PIPELINES.get(name, name)


def dsm_surface_of(manifest: Manifest) -> str | None:
    """The :data:`~prefect_odm.registry.DSM_SURFACES` key of the run's DSM: that of its
    submodels' DSMs (the least measured one when they differ: an assumed plane before recorded
    heights); None when no submodel DSM carries the tag (a measured or interpolated surface)."""
    found = set()
    for r in manifest.submodels:
        url = r.products.get("dsm")
        if r.status == "failed" or url is None:
            continue
        tag = _surface_tag(url)
        if tag in DSM_SURFACES:
            found.add(tag)
    order = ("take-off-plane", "assumed-plane", "above-ground-heights")
    return next((kind for kind in order if kind in found), None)


def dsm_surface_words(manifest: Manifest) -> str | None:
    """``"a plane at the take-off height (...): not a measured surface"`` or None (the DSM's
    heights come from reconstructed points)."""
    kind = dsm_surface_of(manifest)
    return None if kind is None else DSM_SURFACES[kind]


def console_lines(manifest: Manifest) -> list[str]:
    """The console's closing lines on the pipeline and, when it is not measured, the DSM."""
    lines = []
    if (pipeline := pipeline_words(manifest)) is not None:
        lines.append(f"pipeline: {pipeline}")
    if (surface := dsm_surface_words(manifest)) is not None and "dsm" in manifest.products:
        lines.append(f"DSM: {surface}")
        if "point_cloud" in manifest.products:
            lines.append("point cloud: synthetic, sampled from that surface (not measured)")
    return lines


def _surface_tag(url: str) -> str | None:
    """The DSM's :data:`~prefect_odm.registry.DSM_SURFACE_TAG`, None without one or when the
    file cannot be read (its absence is reported elsewhere)."""
    try:
        with rasterio.open(_readable(url)) as ds:
            tag = ds.tags().get(DSM_SURFACE_TAG)
    except (OSError, rasterio.errors.RasterioError, ValueError):
        return None
    return None if tag is None else str(tag)


def _readable(url: str) -> Any:
    """A path rasterio opens: local paths as they are, URLs through fsspec."""
    if storage.is_local(url):
        return str(storage.local_path(url))
    fs, path = storage.filesystem(url)
    return fs.open(path, "rb")
