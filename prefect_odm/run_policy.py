"""Run policy of a reconstruction: what a run does with what is already stored (no Prefect).

Which submodels are pending (a stored result of the same fingerprint is reused when its product
files are there and whole: :mod:`prefect_odm.product_files`), how a failed submodel is described,
which submodels are merged, whether a stored merge can be reused (the stored manifest has the same
merge fingerprint and its products are still whole), the manifest of the run, and where the submodels run (inline, or as runs of a deployment, on which work queue). The
flows in ``prefect_odm.flows`` are sequences of Prefect tasks around these decisions.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime

from prefect_odm import __version__, progress, storage
from prefect_odm.align.report import AlignmentReport
from prefect_odm.clusters.records import RoutingSummary
from prefect_odm.errors import InputError, StorageError
from prefect_odm.layout import OutputLayout
from prefect_odm.models import (
    Manifest,
    NodeHealthRecord,
    SplitPlan,
    Submodel,
    SubmodelResult,
    Survey,
)
from prefect_odm.product_files import damaged_products, product_sizes
from prefect_odm.registry import PRODUCTS
from prefect_odm.settings import get_settings

MIN_SURVEY_IMAGES = 3
"""Fewer usable images than this cannot be reconstructed (structure from motion needs overlap)."""


def check_survey_size(survey: Survey, images: str) -> None:
    """Refuse a survey with fewer than :data:`MIN_SURVEY_IMAGES` usable images, for ``plan``
    and ``reconstruct`` alike (``plan`` once wrote a plan that ``reconstruct`` then refused).

    Raises:
        InputError: too few usable images, naming the folder and the count.
    """
    if len(survey.images) < MIN_SURVEY_IMAGES:
        aside = f", {set_aside_words(survey)}" if survey.rejected else ""
        raise InputError(
            f"{images}: {len(survey.images)} usable image(s){aside}; a reconstruction needs at "
            f"least {MIN_SURVEY_IMAGES} overlapping geotagged images"
        )


SET_ASIDE_NAMES = 5
"""Set-aside images a one-line message names; the others are counted."""


def set_aside_words(survey: Survey) -> str:
    """The images the scan set aside, in a few words: ``5 set aside (IMG_2.JPG, IMG_3.JPG, ...:
    same bytes as IMG_1.JPG)``, the names grouped by their reason's detail, the first
    :data:`SET_ASIDE_NAMES` named and the rest counted."""
    groups: dict[str, list[str]] = {}
    for r in survey.rejected:
        groups.setdefault(r.detail or r.reason, []).append(r.name)
    shown: list[str] = []
    left = SET_ASIDE_NAMES
    for detail, names in groups.items():
        if left <= 0:
            break
        shown.append(f"{', '.join(names[:left])}: {detail}")
        left -= len(names[:left])
    more = len(survey.rejected) - (SET_ASIDE_NAMES - left)
    tail = f"; and {more} more" if more > 0 else ""
    return f"{len(survey.rejected)} set aside ({'; '.join(shown)}{tail})"


FAILURE_OUTPUT_LINES = 5
"""Last node output lines kept in a failed submodel's description."""


def rebased_result(result: SubmodelResult, layout: OutputLayout) -> SubmodelResult:
    """A stored result whose product paths hold from any working folder: an older record's
    paths relative to its writer's working folder are taken under ``layout``
    (:meth:`~prefect_odm.layout.OutputLayout.rebased`)."""
    products = {name: layout.rebased(url) for name, url in result.products.items()}
    if products == result.products:
        return result
    return result.model_copy(update={"products": products})


def rebased_manifest(manifest: Manifest, layout: OutputLayout) -> Manifest:
    """A stored manifest whose product paths (merged and each submodel's) hold from any
    working folder (:func:`rebased_result`; ``layout`` the manifest's run folder's)."""
    return manifest.model_copy(
        update={
            "products": {name: layout.rebased(url) for name, url in manifest.products.items()},
            "submodels": [rebased_result(r, layout) for r in manifest.submodels],
        }
    )


def load_stored_result(layout: OutputLayout, submodel: Submodel) -> SubmodelResult | None:
    """The stored result of this submodel and fingerprint when it is complete, else ``None``."""
    return checked_stored_result(layout, submodel)[0]


def checked_stored_result(
    layout: OutputLayout, submodel: Submodel
) -> tuple[SubmodelResult | None, str | None]:
    """(the stored result of this submodel and fingerprint, ``None``) when it is complete and
    its products are there and whole (:func:`~prefect_odm.product_files.damaged_products`);
    else (``None``, why not: ``None`` when there is no usable record at all, or the one line
    ``"submodel-001: its products are missing (URL); processing it again"``)."""
    url = layout.submodel_result(submodel.id, submodel.fingerprint)
    try:
        if not storage.exists(url):
            return None, None
        result = rebased_result(SubmodelResult.model_validate(storage.read_json(url)), layout)
    except (StorageError, ValueError, OSError):
        return None, None
    if result.status not in ("completed", "reused") or result.fingerprint != submodel.fingerprint:
        return None, None
    damage = damaged_products(result.products, result.product_sizes)
    if damage is not None:
        return None, f"{submodel.id}: its products are {damage}; processing it again"
    return result, None


def reused_and_pending(
    plan: SplitPlan, layout: OutputLayout, *, force: bool
) -> tuple[dict[str, SubmodelResult], list[str]]:
    """Split the plan's submodels into those with a stored result and those to process.

    Args:
        plan: the split plan.
        layout: where the results are stored.
        force: process every submodel again (nothing is reused).

    Returns:
        (submodel id -> stored result marked ``reused``, ids to process in plan order). A
        ``submodel`` progress event ``reused`` is sent for each reused one.
    """
    reused: dict[str, SubmodelResult] = {}
    pending: list[str] = []
    for sm in plan.submodels:
        stored, why = (None, None) if force else checked_stored_result(layout, sm)
        if why is not None:
            progress.emit(progress.WarningEvent(text=why))
        if stored is not None:
            reused[sm.id] = stored.model_copy(update={"status": "reused"})
            progress.emit(progress.SubmodelEvent(submodel_id=sm.id, state="reused", fraction=1.0))
        else:
            pending.append(sm.id)
    return reused, pending


def failure_text(result: SubmodelResult) -> str:
    """The error and the node's last output lines, one string (for the error and the manifest)."""
    text = result.error or "failed"
    if result.last_output:
        text += "\n    " + "\n    ".join(result.last_output[-FAILURE_OUTPUT_LINES:])
    return text


def failed_submodels(results: Mapping[str, SubmodelResult]) -> dict[str, str]:
    """Submodel id -> :func:`failure_text` for every failed result."""
    return {sid: failure_text(r) for sid, r in results.items() if r.status == "failed"}


def asked_products(products: Mapping[str, str], options: Mapping[str, object]) -> dict[str, str]:
    """The products of one submodel that the run asked for (product -> URL).

    A product whose registry entry names an option (``dtm``, ``dsm``) is kept only when that
    option is true in ``options`` (the node options of the plan): a node may return a DTM that
    was not asked for, and it is not merged.
    """
    out: dict[str, str] = {}
    for name, url in products.items():
        product = PRODUCTS.get(name)  # type: ignore[call-overload]
        if product is None or product.option is None or options.get(product.option) is True:
            out[name] = url
    return out


def mergeable(results: Iterable[SubmodelResult]) -> list[SubmodelResult]:
    """The results that finished (completed or reused), by submodel id."""
    return sorted((r for r in results if r.status != "failed"), key=lambda r: r.submodel_id)


def stored_manifest(layout: OutputLayout, merge_fingerprint: str) -> Manifest | None:
    """The stored manifest when its merge can be reused: same merge fingerprint and every
    product still stored whole (:func:`~prefect_odm.product_files.damaged_products`; a damaged
    one is said in a warning event); else ``None``."""
    try:
        if not storage.exists(layout.manifest):
            return None
        manifest = rebased_manifest(
            Manifest.model_validate(storage.read_json(layout.manifest)), layout
        )
    except (ValueError, OSError):
        return None
    if manifest.merge_fingerprint != merge_fingerprint:
        return None
    damage = damaged_products(manifest.products, manifest.product_sizes)
    if damage is not None:
        progress.emit(progress.WarningEvent(text=f"merged products are {damage}; merging again"))
        return None
    return manifest


def run_manifest(
    *,
    source: str,
    survey: Survey,
    plan: SplitPlan,
    merge_fingerprint: str,
    products: dict[str, str],
    results: Mapping[str, SubmodelResult],
    failed: dict[str, str],
    coverage: Mapping[str, float],
    alignment: AlignmentReport | None,
    timings_seconds: Mapping[str, float],
    node_health: Sequence[NodeHealthRecord] = (),
    routing: RoutingSummary | None = None,
) -> Manifest:
    """The manifest of a run: its inputs' fingerprints, products, every planned submodel's
    result (plan order), the failed ones with their reasons, rejected images, the merge's
    coverage figures (``MergeReports.coverage_figures``) and alignment, the stage timings
    (seconds, rounded to ms) and, routed among clusters, the routing summary."""
    return Manifest(
        version=__version__,
        created=datetime.now(UTC),
        source=source,
        survey_fingerprint=survey.fingerprint,
        plan_fingerprint=plan.fingerprint,
        merge_fingerprint=merge_fingerprint,
        crs_epsg=plan.crs_epsg,
        products=products,
        product_sizes=product_sizes(products),
        submodels=[results[s.id] for s in plan.submodels],
        failed_submodels=failed,
        rejected_images=survey.rejected,
        coverage=dict(coverage),
        timings_seconds={k: round(v, 3) for k, v in timings_seconds.items()},
        node_health=list(node_health),
        alignment=alignment,
        routing=routing,
    )


def configured_submodel_deployment(explicit: str | None) -> str | None:
    """The submodel deployment to use: the parameter, else the environment, else ``None`` (inline).

    ``"inline"`` (either place) forces inline mode.
    """
    name = explicit or get_settings().submodel_deployment
    if name is None or name.strip().lower() == "inline":
        return None
    return name


def work_queue_for(priority: str) -> str | None:
    """The work queue of a run's submodels: the urgent queue for ``"urgent"``, else the
    deployment's default queue (``None``)."""
    if priority == "urgent":
        return get_settings().urgent_work_queue
    return None
