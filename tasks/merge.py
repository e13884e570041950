"""Prefect tasks that merge submodel products (thin wrappers over :mod:`prefect_odm.merge`).

Inputs may live in object storage: they are fetched into a local working folder first; merged
products are written locally, then stored under their final names.
"""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from prefect_odm import progress, storage
from prefect_odm.errors import MergeError
from prefect_odm.layout import PRODUCT_FILES
from prefect_odm.ownership import Ownership


def _local_inputs(inputs: Mapping[str, str], work: Path, product: str) -> dict[str, Path]:
    return {
        sid: storage.get_file(url, work / "inputs" / product / f"{sid}{Path(url).suffix}")
        for sid, url in sorted(inputs.items())
    }


def _as_dict(report: Any) -> dict[str, Any]:
    if dataclasses.is_dataclass(report) and not isinstance(report, type):
        return dataclasses.asdict(report)
    if hasattr(report, "model_dump"):
        return dict(report.model_dump(mode="json"))
    return dict(report)


def _on_progress(product: str):  # type: ignore[no-untyped-def]
    def callback(done: int, total: int) -> None:
        progress.emit("merge", product=product, done=done, total=total)

    return callback


@task(name="merge_orthophotos", cache_policy=NO_CACHE)
def merge_orthophotos(
    inputs: Mapping[str, str],
    out: Path,
    work: Path,
    ownership: Ownership | None,
    crs_epsg: int | None,
    workers: int = 2,
) -> dict[str, Any]:
    """Merge submodel orthophotos into one RGBA COG at ``out`` (local path); returns the report."""
    from prefect_odm.merge import merge_orthophotos as _merge

    local = _local_inputs(inputs, work, "orthophoto")
    report = _merge(
        local,
        out,
        ownership=ownership,
        crs_epsg=crs_epsg,
        workers=workers,
        progress=_on_progress("orthophoto"),
    )
    return _as_dict(report)


@task(name="merge_dems", cache_policy=NO_CACHE)
def merge_dems(
    inputs: Mapping[str, str],
    out: Path,
    work: Path,
    ownership: Ownership | None,
    crs_epsg: int | None,
    product: str = "dsm",
    workers: int = 2,
) -> dict[str, Any]:
    """Merge submodel DSMs (or DTMs) into one float32 COG at ``out``; returns the report."""
    from prefect_odm.merge import merge_dems as _merge

    local = _local_inputs(inputs, work, product)
    report = _merge(
        local,
        out,
        ownership=ownership,
        crs_epsg=crs_epsg,
        workers=workers,
        progress=_on_progress(product),
    )
    return _as_dict(report)


@task(name="merge_point_clouds", cache_policy=NO_CACHE)
def merge_point_clouds(
    inputs: Mapping[str, str],
    out: Path,
    work: Path,
    ownership: Ownership | None,
    crs_epsg: int | None,
) -> dict[str, Any]:
    """Merge submodel LAZ files, each cropped to its own area, into one LAZ at ``out``."""
    from prefect_odm.merge import merge_point_clouds as _merge

    local = _local_inputs(inputs, work, "point_cloud")
    report = _merge(
        local, out, ownership=ownership, crs_epsg=crs_epsg, progress=_on_progress("point_cloud")
    )
    return _as_dict(report)


@task(name="check_coverage", cache_policy=NO_CACHE)
def check_coverage(
    merged_orthophoto: Path,
    inputs: Mapping[str, str],
    work: Path,
    planned_footprint: dict[str, Any] | None,
) -> dict[str, Any]:
    """Coverage of the merged orthophoto against the inputs and the planned footprint.

    Fails (:class:`MergeError`) when the merged orthophoto is empty, covers less than 99.5% of
    what the submodels cover, or less than half the planned footprint (an estimate from camera
    positions and heights, so only a gross shortfall is an error; the figure is reported).
    """
    from prefect_odm.merge import coverage_report

    local = _local_inputs(inputs, work, "orthophoto")
    try:
        report = coverage_report(
            merged_orthophoto,
            local,
            planned_footprint,
            min_coverage_of_planned=MIN_COVERAGE_OF_PLANNED,
        )
    except MergeError as exc:
        raise MergeError(
            str(exc).replace(str(merged_orthophoto), "the merged orthophoto")
        ) from None
    return _as_dict(report)


MIN_COVERAGE_OF_PLANNED = 0.5
"""Fraction of the planned footprint the merged orthophoto must cover."""


def merge_all(
    products: Mapping[str, Mapping[str, str]],
    layout_merged: Callable[[str], str],
    *,
    ownership: Ownership | None,
    crs_epsg: int | None,
    planned_footprint: dict[str, Any] | None,
) -> tuple[dict[str, str], dict[str, Any]]:
    """Merge every product the inputs have and store the results.

    Args:
        products: submodel id -> product name -> URL (orthophoto and point cloud required).
        layout_merged: product name -> URL where the merged product is stored.
        ownership: who owns which ground position (``None``: from the orthophotos' footprints).
        crs_epsg: CRS of the merged products (and of ``ownership``).
        planned_footprint: GeoJSON polygon of the planned area in ``crs_epsg``, for coverage.

    Returns:
        (product name -> stored URL, reports by product plus ``coverage``). Every product is
        complete in a local staging folder before any is stored.
    """
    reports: dict[str, Any] = {}
    stored: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="prefect-odm-merge-") as tmp:
        work = Path(tmp)
        staged: dict[str, Path] = {}
        ortho_in = {sid: p["orthophoto"] for sid, p in sorted(products.items())}
        if ownership is None:
            from prefect_odm.merge import ownership_from_rasters

            ownership = ownership_from_rasters(
                _local_inputs(ortho_in, work, "orthophoto"), crs_epsg=crs_epsg
            )
        staged["orthophoto"] = work / PRODUCT_FILES["orthophoto"]
        reports["orthophoto"] = merge_orthophotos(
            ortho_in, staged["orthophoto"], work, ownership, crs_epsg
        )
        for dem in ("dsm", "dtm"):
            dem_in = {sid: p[dem] for sid, p in sorted(products.items()) if dem in p}
            if dem_in:
                staged[dem] = work / PRODUCT_FILES[dem]
                reports[dem] = merge_dems(
                    dem_in, staged[dem], work, ownership, crs_epsg, product=dem
                )
        pc_in = {sid: p["point_cloud"] for sid, p in sorted(products.items())}
        staged["point_cloud"] = work / PRODUCT_FILES["point_cloud"]
        reports["point_cloud"] = merge_point_clouds(
            pc_in, staged["point_cloud"], work, ownership, crs_epsg
        )
        reports["coverage"] = check_coverage(
            staged["orthophoto"], ortho_in, work, planned_footprint
        )
        for product, path in staged.items():
            url = layout_merged(product)
            storage.put_file(path, url)
            stored[product] = url
    return stored, reports
