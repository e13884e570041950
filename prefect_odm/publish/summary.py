"""The product summary that opens ``report.md``: how big, how sharp, how complete.

Figures are read from the merged products themselves: file sizes; the orthophoto's ground
sampling distance (GSD, cm per pixel) and covered area (pixels whose alpha is set, times the pixel
area); the DSM's share of cells *measured* (its measured band,
:data:`~prefect_odm.registry.DSM_MEASURED_BAND`, where it has one; else the cells holding at
least one point of the merged cloud) and *filled* (a value interpolated where no point fell:
OpenDroneMap fills DSM holes); the pipeline and, for a DSM made from the images' metadata
(:mod:`prefect_odm.publish.surface`), what it is in words, its point cloud called synthetic; the point
count and density (points per m² of the orthophoto's covered area). The cloud is read in chunks
of :data:`CHUNK_POINTS` points, so memory is bounded by the DSM's cell grid plus one chunk.
Paths are relative to the report (``../merged/...``), and the coverage figures are explained in
words.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping
from typing import Any

import laspy
import numpy as np
import rasterio

from prefect_odm import storage
from prefect_odm.models import Manifest
from prefect_odm.publish import surface
from prefect_odm.registry import (
    DSM_MEASURED_BAND,
    DSM_MEASURED_DESCRIPTION,
    point_cloud_format_of,
)

CHUNK_POINTS = 2_000_000
"""Points read at once when counting the DSM cells the cloud measured."""


def report_folder_of(products: Mapping[str, str]) -> str:
    """The ``report`` folder beside the products' ``merged`` folder (where ``report.md`` is)."""
    some = next(iter(products.values()))
    return posixpath.join(posixpath.dirname(posixpath.dirname(some)), "report")


def path_from_report(url: str, report_dir: str) -> str:
    """A local product's path relative to the report's folder (so a link opens from the
    report wherever the command ran); a remote URL unchanged."""
    return posixpath.relpath(url, report_dir) if storage.is_local(url) else url


def product_summary_lines(manifest: Manifest, report_dir: str | None = None) -> list[str]:
    """Markdown lines of the product summary of a run (a ``## Product summary`` section).

    Args:
        manifest: the run's manifest; its product URLs are read (local or fsspec).
        report_dir: the folder of ``report.md`` the paths are made relative to; None: the
            ``report`` folder beside the products' ``merged`` folder.

    Returns:
        Lines without trailing newlines; empty when the run has no merged products.
    """
    products = manifest.products
    if not products:
        return []
    if report_dir is None:
        report_dir = report_folder_of(products)
    lines = ["## Product summary", ""]
    figures = _figures(products)
    for name, url in products.items():
        size = _size_bytes(url)
        rel = path_from_report(url, report_dir)
        lines.append(f"- {name}: [`{rel}`]({rel}), {size / 2**20:.1f} MiB")
    lines.append("")
    if "gsd_cm" in figures:
        lines.append(
            f"- **How sharp**: orthophoto written at {figures['gsd_cm']:.1f} cm per pixel"
            + (
                f", DSM {figures['dsm_cell_cm']:.1f} cm per cell"
                if "dsm_cell_cm" in figures
                else ""
            )
            + "."
        )
    if "area_m2" in figures:
        area = figures["area_m2"]
        lines.append(
            f"- **How big**: the orthophoto covers {area:,.0f} m² ({area / 1e4:.2f} ha)"
            f" in EPSG:{manifest.crs_epsg}."
        )
    if (pipeline := surface.pipeline_words(manifest)) is not None:
        lines.append(f"- **Pipeline**: {pipeline}.")
    words = surface.dsm_surface_words(manifest) if "dsm" in products else None
    if words is not None:
        lines.append(  # made from the images' metadata: nothing in it is measured
            f"- **DSM: {words}** (0.0 % of its valid cells are measured). "
            "Do not use it as a surface model of the scene."
        )
    elif "measured_share" in figures:
        lines.append(
            f"- **DSM**: {100 * figures['measured_share']:.1f} % of its valid cells are measured "
            f"(at least one point fell in them), {100 * figures['filled_share']:.1f} % are "
            "filled by interpolation between measured cells (less reliable: roofs, trees and "
            "water edges may be smoothed there)."
        )
    if "points" in figures:
        density = (
            f", {figures['points'] / figures['area_m2']:.1f} points per m² of the covered area"
            if figures.get("area_m2")
            else ""
        )
        synthetic = (
            ": synthetic, sampled from the DSM's surface under the orthophoto's colours, not a "
            "point cloud of the scene"
            if words is not None
            else ""
        )
        lines.append(f"- **Point cloud**: {int(figures['points']):,} points{density}{synthetic}.")
    lines += _coverage_words(manifest.coverage)
    lines += [*_open_where(products), ""]
    return lines


def _open_where(products: Mapping[str, str]) -> list[str]:
    """Which program opens which product (the COPC file's advice follows its format)."""
    cloud = products.get("point_cloud", "")
    if point_cloud_format_of(cloud) == "copc":
        where = (
            f"the point cloud `{posixpath.basename(cloud)}` is a COPC file (a LAZ 1.4 with an "
            "octree): QGIS 3.32+ streams it (Layer > Add Layer > Add Point Cloud Layer, from "
            "disk or an https/S3 URL), as do PDAL (`readers.copc`), Potree 2 and "
            "https://viewer.copc.io (drop the file or give its URL); any LAZ reader "
            "(CloudCompare, LAStools, laspy) reads it whole."
        )
    elif cloud:
        where = (
            f"the point cloud `{posixpath.basename(cloud)}` (plain LAZ) in QGIS 3.18+ (it builds "
            "a COPC index beside the file on first opening) or CloudCompare."
        )
    else:
        where = "no point cloud was merged."
    return [
        "- **Open**: the GeoTIFFs (Cloud Optimized) in QGIS (Layer > Add Raster Layer) or any GIS; "
        + where
    ]


def _coverage_words(coverage: Mapping[str, float]) -> list[str]:
    """The coverage figures in words (``coverage_of_planned`` 0.80: 80 % of the plan covered)."""
    lines = []
    planned = coverage.get("coverage_of_planned")
    if planned is not None:
        lines.append(
            f"- **How complete**: the merged orthophoto covers {100 * planned:.0f} % of the "
            "planned footprint (the area the flight was split to cover; its edges, seen by "
            "few images, are often not reconstructed)"
            + (
                f", and {100 * coverage['coverage_of_union']:.0f} % of what the submodels "
                "themselves covered (below 100 %: the merge lost area)."
                if "coverage_of_union" in coverage
                else "."
            )
        )
    return lines


def _size_bytes(url: str) -> int:
    fs, path = storage.filesystem(url)
    return int(fs.size(path))


def _figures(products: Mapping[str, str]) -> dict[str, float]:
    """GSD, covered area, DSM measured and filled shares and point count of merged products."""
    out: dict[str, float] = {}
    ortho = products.get("orthophoto")
    if ortho is not None:
        with rasterio.open(_readable(ortho)) as ds:
            out["gsd_cm"] = 100 * abs(ds.res[0])
            valid = 0
            for _, window in ds.block_windows(1):
                valid += int(np.count_nonzero(ds.dataset_mask(window=window)))
            out["area_m2"] = valid * abs(ds.res[0] * ds.res[1])
    cloud = products.get("point_cloud")
    dsm = products.get("dsm")
    if cloud is not None:
        with laspy.open(_readable(cloud)) as reader:
            out["points"] = float(reader.header.point_count)
    if dsm is not None:
        with rasterio.open(_readable(dsm)) as ds:
            out["dsm_cell_cm"] = 100 * abs(ds.res[0])
            valid_mask = ds.dataset_mask() > 0
            transform = ds.transform
            shape = (ds.height, ds.width)
            flags = (
                ds.read(DSM_MEASURED_BAND) == 1
                if ds.count >= DSM_MEASURED_BAND
                and ds.descriptions[DSM_MEASURED_BAND - 1] == DSM_MEASURED_DESCRIPTION
                else None
            )
        if flags is not None and valid_mask.any():  # the band says which cells were measured
            n_valid = int(valid_mask.sum())
            out["measured_share"] = int(np.count_nonzero(flags & valid_mask)) / n_valid
            out["filled_share"] = 1.0 - out["measured_share"]
        elif cloud is not None and valid_mask.any():
            measured = _cells_with_points(_readable(cloud), transform, shape)
            n_valid = int(valid_mask.sum())
            n_measured = int(np.count_nonzero(measured & valid_mask))
            out["measured_share"] = n_measured / n_valid
            out["filled_share"] = 1.0 - n_measured / n_valid
    return out


def _readable(url: str) -> Any:
    """A path rasterio and laspy open: local paths as they are, URLs through fsspec."""
    if storage.is_local(url):
        return str(storage.local_path(url))
    fs, path = storage.filesystem(url)
    return fs.open(path, "rb")


def _cells_with_points(source: Any, transform: Any, shape: tuple[int, int]) -> np.ndarray:
    """A boolean grid of ``shape`` (rows, columns): True where at least one point falls."""
    hit = np.zeros(shape, dtype=bool)
    inverse = ~transform
    with laspy.open(source) as reader:
        for chunk in reader.chunk_iterator(CHUNK_POINTS):
            x, y = np.asarray(chunk.x), np.asarray(chunk.y)
            cols = inverse.a * x + inverse.b * y + inverse.c
            rows = inverse.d * x + inverse.e * y + inverse.f
            r = np.floor(rows).astype(np.int64)
            c = np.floor(cols).astype(np.int64)
            inside = (r >= 0) & (r < shape[0]) & (c >= 0) & (c < shape[1])
            hit[r[inside], c[inside]] = True
    return hit
