"""Prefect tasks that merge submodel products (thin wrappers over :mod:`prefect_odm.merge`).

Inputs may live in object storage: they are fetched into a local working folder first; merged
products are written locally, then stored under their final names.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from prefect_odm import progress, storage
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
    inputs: Mapping[str, str], out: Path, work: Path, ownership: Ownership | None, workers: int = 2
) -> dict[str, Any]:
    """Merge submodel orthophotos into one RGBA COG at ``out`` (local path); returns the report."""
    from prefect_odm.merge import merge_orthophotos as _merge

    local = _local_inputs(inputs, work, "orthophoto")
    return _as_dict(_merge(local, out, ownership=ownership, workers=workers, progress=_on_progress("orthophoto")))


@task(name="merge_dems", cache_policy=NO_CACHE)
def merge_dems(
    inputs: Mapping[str, str], out: Path, work: Path, ownership: Ownership | None, product: str = "dsm", workers: int = 2
) -> dict[str, Any]:
    """Merge submodel DSMs (or DTMs) into one float32 COG at ``out``; returns the report."""
    from prefect_odm.merge import merge_dems as _merge

    local = _local_inputs(inputs, work, product)
    return _as_dict(_merge(local, out, ownership=ownership, workers=workers, progress=_on_progress(product)))


@task(name="merge_point_clouds", cache_policy=NO_CACHE)
def merge_point_clouds(
    inputs: Mapping[str, str], out: Path, work: Path, ownership: Ownership | None
) -> dict[str, Any]:
    """Merge submodel LAZ files, each cropped to its own area, into one LAZ at ``out``."""
    from prefect_odm.merge import merge_point_clouds as _merge

    local = _local_inputs(inputs, work, "point_cloud")
    return _as_dict(_merge(local, out, ownership=ownership, progress=_on_progress("point_cloud")))


@task(name="check_coverage", cache_policy=NO_CACHE)
def check_coverage(
    merged_orthophoto: Path, inputs: Mapping[str, str], work: Path, planned_footprint: dict[str, Any] | None
) -> dict[str, Any]:
    """Coverage of the merged orthophoto against the inputs and the planned footprint."""
    from prefect_odm.merge import coverage_report

    local = _local_inputs(inputs, work, "orthophoto")
    return _as_dict(coverage_report(merged_orthophoto, local, planned_footprint))
