"""The ``align_submodels`` task: one correction per submodel, solved before any product is merged.

With every submodel's reconstructed cameras (``shots.geojson``, from ODM nodes and the built-in
engine) it solves one 3-D similarity per submodel from the cameras neighbours share
(:func:`prefect_odm.align.align_submodels`, held on the camera GPS when given), then refines it
from the DSMs and orthophotos; without cameras (outputs made elsewhere) a height plane and shift
per submodel from the products (:func:`prefect_odm.merge.overlaps.align_from_products`).

Each stage is judged before it is applied (:mod:`prefect_odm.align.stages`): its seams are
measured on the products it corrects (:class:`prefect_odm.merge.overlaps_seams.SeamMeter`), and
a stage that worsens a seam, is beyond plausible or leans more than a raster carries is not
applied (the refinement is then solved on the products as the stages before leave them). Then
the quality gates (:func:`prefect_odm.align.check_report`, on the applied stages and the seams
measured on the products they correct): a failed gate fails the run naming the submodel and the
figure, unless ``MergeOptions.accept_alignment``, in which case the failures are logged and
recorded in the returned report (manifest, ``merge.json``, ``report.md``); a refused correction
stays refused either way.
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect_odm.tasks.align_stages import StageJudge, refine_stages

from prefect_odm import storage
from prefect_odm.align import (
    AlignmentReport,
    AlignmentResult,
    CameraTable,
    check_report,
    raise_for_failures,
    read_shots_geojson,
)
from prefect_odm.align import (
    align_submodels as solve_submodels,
)
from prefect_odm.errors import InputError
from prefect_odm.models import MergeOptions

if TYPE_CHECKING:
    from prefect_odm.merge.overlaps import OrthoShift

GpsPositions = Mapping[str, tuple[float, float, float]]


def _camera_tables(
    shots: Mapping[str, str | None], crs_epsg: int | None = None
) -> list[CameraTable] | None:
    """Every submodel's camera table, or None when any submodel has no ``shots.geojson``.

    Raises:
        InputError: a ``shots.geojson`` that cannot be parsed (naming the file).
    """
    if not shots or any(url is None for url in shots.values()):
        return None
    tables = []
    for sid, url in sorted(shots.items()):
        assert url is not None
        try:
            raw = storage.read_bytes(url)
        except FileNotFoundError:
            return None
        try:
            tables.append(read_shots_geojson(sid, raw, crs_epsg))
        except (ValueError, KeyError, TypeError) as exc:
            raise InputError(f"{url}: not a readable shots.geojson ({exc})") from exc
    if any(len(t.names) == 0 for t in tables):
        return None
    return tables


def _local(products: Mapping[str, Mapping[str, str]], name: str, work: Path) -> dict[str, Path]:
    """Submodel id -> local copy of product ``name``, for the submodels that have it."""
    return {
        sid: storage.get_file(p[name], work / name / f"{sid}{Path(p[name]).suffix}")
        for sid, p in sorted(products.items())
        if name in p
    }


@task(name="align_submodels", cache_policy=NO_CACHE)
def align_submodels(
    products: Mapping[str, Mapping[str, str]],
    shots: Mapping[str, str | None],
    options: MergeOptions,
    gps: GpsPositions | None = None,
    crs_epsg: int | None = None,
) -> AlignmentReport | None:
    """Solve and check one correction per submodel; the merge applies it to every product.

    Args:
        products: submodel id -> product name -> URL (the DSMs give the ground heights and,
            without cameras, the heights and tilts; the orthophotos the shifts).
        shots: submodel id -> URL of its ``shots.geojson``, or None where it has none.
        options: ``align``, ``alignment`` (solver and gate thresholds), ``accept_alignment``.
        gps: image name -> camera GPS position in the plan CRS (metres), for the gauge and the
            camera-vs-GPS residuals.
        crs_epsg: the plan CRS (the products' grid).

    Returns:
        The report (transforms, residuals, failed gates, whether accepted), or None when
        alignment is off, there are fewer than two submodels, or nothing to align from.

    Raises:
        AlignmentError: a quality gate failed and ``accept_alignment`` is off; the message
            names each submodel or overlap and figure.
        InputError: an unreadable ``shots.geojson``.
    """
    logger = get_run_logger()
    report = build_alignment(products, shots, options, gps, crs_epsg)
    if report is None:
        logger.info("alignment skipped (off, one submodel, or nothing to align from)")
        return None
    for f in report.failures:
        logger.warning("alignment gate failed and accepted (accept_alignment): %s", f.message)
    for stage in report.stages:
        for why in stage.reasons:
            logger.warning("alignment stage %s not applied: %s", stage.stage, why)
    result, final = report.result, report.final_stage()
    seams = [s for s in (final.seams if final is not None else []) if s.orthophoto is not None]
    worst = max(seams, key=lambda s: s.orthophoto.median_m if s.orthophoto else 0.0, default=None)
    logger.info(
        "aligned %d submodels from %s in %.2f s; applied: %s; worst orthophoto seam %s",
        len(result.transforms),
        result.method,
        result.solve_seconds,
        "unchecked" if final is None else final.stage,
        "not measured"
        if worst is None or worst.orthophoto is None
        else f"{worst.overlap} {worst.orthophoto.median_m:.3f} m (median, feature matches)",
    )
    return report


def build_alignment(
    products: Mapping[str, Mapping[str, str]],
    shots: Mapping[str, str | None],
    options: MergeOptions,
    gps: GpsPositions | None = None,
    crs_epsg: int | None = None,
) -> AlignmentReport | None:
    """What :func:`align_submodels` does, without Prefect (same arguments, result, errors)."""
    if not options.align or len(products) < 2:
        return None
    tables = _camera_tables({sid: shots.get(sid) for sid in products}, crs_epsg)
    from prefect_odm.merge.overlaps import align_from_products, ground_heights_and_relief

    with tempfile.TemporaryDirectory(prefix="prefect-odm-align-") as tmp:
        dsms = _local(products, "dsm", Path(tmp))
        orthos = _local(products, "orthophoto", Path(tmp))
        if tables is None and len(dsms) < 2 and len(orthos) < 2:
            return None
        judge = StageJudge(dsms, orthos, options.alignment, crs_epsg)
        result = _solve(tables, dsms, orthos, options, gps, crs_epsg, judge.matched(None))
        heights, relief = ground_heights_and_relief(dsms) if dsms else ({}, {})
        report = AlignmentReport(result=result, ground_heights_m=heights, relief_m=relief)
        judge.start(report)
        check, refused = judge.judge(report, report.first_stage, result)
        report.stages = [*report.stages, check]

        def refine(on: AlignmentReport) -> AlignmentResult:
            fixes = on.raster_corrections()
            return align_from_products(dsms, orthos, options.alignment, corrections=fixes,
                                       crs_epsg=crs_epsg, matched=judge.matched(fixes))  # fmt: skip

        if result.method == "cameras" and options.alignment.refine_from_products and len(dsms) > 1:
            refused += refine_stages(report, judge, refine)
    final = report.final_stage()
    applied = (report.applies(report.first_stage), report.applies("refined"))
    failures = check_report(result, report.refinement, options.alignment, applied=applied,
                            seams=final.seams if final is not None else ())  # fmt: skip
    failures += refused
    raise_for_failures(failures, accept=options.accept_alignment)
    report.failures, report.accepted = failures, bool(failures)
    return report


def _solve(
    tables: list[CameraTable] | None,
    dsms: Mapping[str, Path],
    orthos: Mapping[str, Path],
    options: MergeOptions,
    gps: GpsPositions | None,
    crs_epsg: int | None,
    matched: Mapping[tuple[str, str], OrthoShift] | None,
) -> AlignmentResult:
    """From the cameras when every submodel has them, else from the products (``matched``:
    the offsets feature matches measure on them)."""
    if tables is not None:
        return solve_submodels(tables, options.alignment, gps=gps or None)
    from prefect_odm.merge.overlaps import align_from_products

    return align_from_products(dsms, orthos, options.alignment, crs_epsg=crs_epsg, matched=matched)
