"""Prefect tasks that merge submodel products (thin wrappers over :mod:`prefect_odm.merge`).

Inputs may live in object storage: they are fetched into a local working folder first; merged
products are written locally, then stored under their final names. Each product is merged from
the inputs that have it (an ODM project without a point cloud still gives its orthophoto and
DSM), with the method its registry entry names (:attr:`prefect_odm.registry.Product.merge`).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NotRequired, Protocol, TypedDict, TypeVar, Unpack

from prefect import task
from prefect.cache_policies import NO_CACHE

from prefect_odm import progress, storage
from prefect_odm.align.report import AlignmentReport
from prefect_odm.errors import MergeError
from prefect_odm.geo import GeoJSONGeometry
from prefect_odm.merge.existing import ExistingOutput
from prefect_odm.merge.reports import (
    CoverageReport,
    DemMergeReport,
    MergeReports,
    OrthoMergeReport,
    PointCloudMergeReport,
    ProductMergeReport,
)
from prefect_odm.models import MergeOptions
from prefect_odm.ownership import Ownership
from prefect_odm.registry import PRODUCTS, MergeMethod, PointCloudFormat, ProductName

if TYPE_CHECKING:  # the merge adapters (rasterio) are imported when a task runs
    from prefect_odm.merge.blocks import RasterMergeKeywords
    from prefect_odm.merge.seamlines import OwnerLabels


def _local_inputs(inputs: Mapping[str, str], work: Path, product: str) -> dict[str, Path]:
    return {
        sid: storage.get_file(url, work / "inputs" / product / f"{sid}{Path(url).suffix}")
        for sid, url in sorted(inputs.items())
    }


def _on_progress(product: str) -> Callable[[int, int], None]:
    def callback(done: int, total: int) -> None:
        progress.emit(progress.MergeEvent(product=product, done=done, total=total))

    return callback


@dataclass(frozen=True)
class MergeContext:
    """What the merge tasks of one merge share.

    Attributes:
        work: local working folder (inputs are fetched under ``work/inputs/<product>/``).
        ownership: who owns which ground position, in ``crs_epsg``; None: from footprints.
        crs_epsg: CRS of the merged products; None: the first input's.
        options: how the products are merged.
        workers: threads of the raster merges.
        alignment: the alignment between submodels, applied to every product (None: none).
        seamlines: the owner labels the raster merges share (``seam_method='least-cost'``).
    """

    work: Path
    ownership: Ownership | None
    crs_epsg: int | None
    options: MergeOptions = field(default_factory=MergeOptions)
    workers: int = 2
    alignment: AlignmentReport | None = None
    seamlines: OwnerLabels | None = None

    def raster_keywords(self, product: str) -> RasterMergeKeywords:
        """The raster merges' run keywords (CRS, threads, progress events for ``product``)."""
        return {
            "crs_epsg": self.crs_epsg,
            "workers": self.workers,
            "progress": _on_progress(product),
        }


_Report = TypeVar("_Report", OrthoMergeReport, DemMergeReport)
_Made = TypeVar("_Made", OrthoMergeReport, DemMergeReport, covariant=True)


class _RasterMerge(Protocol[_Made]):
    """A raster merge of :mod:`prefect_odm.merge` (``merge_orthophotos``, ``merge_dems``)."""

    def __call__(
        self,
        inputs: Mapping[str, Path],
        out: Path,
        *,
        ownership: Ownership | None,
        options: MergeOptions | None = ...,
        alignment: AlignmentReport | None = ...,
        seamlines: OwnerLabels | None = ...,
        **raster: Unpack[RasterMergeKeywords],
    ) -> _Made:
        """Merge ``inputs`` (local rasters by submodel id) into ``out``; the report."""
        ...


def _fetch_and_merge(
    merge: _RasterMerge[_Report],
    inputs: Mapping[str, str],
    out: Path,
    context: MergeContext,
    product: str,
) -> _Report:
    """Fetch ``product``'s inputs into the working folder and merge them with ``merge`` in the
    merge's context."""
    return merge(
        _local_inputs(inputs, context.work, product), out, ownership=context.ownership,
        options=context.options, alignment=context.alignment, seamlines=context.seamlines,
        **context.raster_keywords(product),
    )  # fmt: skip


@task(name="merge_orthophotos", cache_policy=NO_CACHE)
def fetch_and_merge_orthophotos(
    inputs: Mapping[str, str], out: Path, context: MergeContext
) -> OrthoMergeReport:
    """Merge submodel orthophotos (URLs, fetched first) into one RGBA COG at ``out`` (a local
    path); returns the report (see :func:`prefect_odm.merge.merge_orthophotos`)."""
    from prefect_odm.merge import merge_orthophotos

    return _fetch_and_merge(merge_orthophotos, inputs, out, context, "orthophoto")


@task(name="merge_dems", cache_policy=NO_CACHE)
def fetch_and_merge_dems(
    inputs: Mapping[str, str], out: Path, context: MergeContext, product: str = "dsm"
) -> DemMergeReport:
    """Merge submodel DSMs (or DTMs, ``product``) into one float32 COG at ``out``; returns the
    report (see :func:`prefect_odm.merge.merge_dems`)."""
    from prefect_odm.merge import merge_dems

    return _fetch_and_merge(merge_dems, inputs, out, context, product)


@task(name="merge_point_clouds", cache_policy=NO_CACHE)
def fetch_and_merge_point_clouds(
    inputs: Mapping[str, str], out: Path, context: MergeContext
) -> PointCloudMergeReport:
    """Merge submodel LAZ files, each cropped to its own area, into one COPC or LAZ file at
    ``out`` (``context.options.point_cloud_format``; see
    :func:`prefect_odm.merge.merge_point_clouds`)."""
    from prefect_odm.merge import merge_point_clouds as _merge

    local = _local_inputs(inputs, context.work, "point_cloud")
    return _merge(
        local,
        out,
        ownership=context.ownership,
        crs_epsg=context.crs_epsg,
        progress=_on_progress("point_cloud"),
        alignment=context.alignment,
        seamlines=context.seamlines,
        point_cloud_format=context.options.point_cloud_format,
    )


@task(name="check_coverage", cache_policy=NO_CACHE)
def check_coverage(
    merged_orthophoto: Path,
    inputs: Mapping[str, str],
    work: Path,
    planned_footprint: GeoJSONGeometry | None,
    alignment: AlignmentReport | None = None,
) -> CoverageReport:
    """Coverage of the merged orthophoto against the inputs and the planned footprint.

    Fails (:class:`MergeError`) when the merged orthophoto is empty, covers less than 99.5% of
    what the submodels cover, or less than half the planned footprint
    (:data:`prefect_odm.merge.coverage.MIN_COVERAGE_OF_PLANNED`: an estimate from camera
    positions and heights, so only a gross shortfall is an error; the figure is reported).
    With ``alignment``, each input is compared where the merge put it.
    """
    from prefect_odm.merge import coverage_report

    local = _local_inputs(inputs, work, "orthophoto")
    try:
        fixes = alignment.raster_corrections() if alignment is not None else None
        return coverage_report(merged_orthophoto, local, planned_footprint, corrections=fixes)
    except MergeError as exc:
        raise MergeError(
            str(exc).replace(str(merged_orthophoto), "the merged orthophoto")
        ) from None


DEFAULT_LOCATION_ADVICE = (
    "nothing was merged and no output was touched; give the merge that submodel's own products"
)


@task(name="refuse_misplaced_products", cache_policy=NO_CACHE)
def refuse_misplaced_products(
    products: Mapping[str, Mapping[str, str]],
    footprints: Mapping[str, Mapping[str, Any]],
    crs_epsg: int,
    advice: Mapping[str, str] | None = None,
) -> None:
    """Refuse products that do not lie where their submodel's images are, from their headers
    only, before anything reads them (see :mod:`prefect_odm.merge.locations` for the rule).

    Args:
        products: submodel id -> product name -> URL.
        footprints: submodel id -> planned footprint (GeoJSON dict in ``crs_epsg``).
        crs_epsg: the survey's CRS.
        advice: submodel id -> what to run, ending the error line (absent: a generic line).

    Raises:
        MisplacedProductError: one line naming the submodel, the file, the distance, both CRSs.
        MergeError: a product whose header cannot be read.
    """
    from prefect_odm.merge.locations import check_product_locations as _check

    told = dict(advice or {})
    _check(products, footprints, crs_epsg, lambda sid: told.get(sid, DEFAULT_LOCATION_ADVICE))


@task(name="find_existing_outputs", cache_policy=NO_CACHE)
def collect_existing_outputs(inputs: list[str], work: Path) -> list[ExistingOutput]:
    """Every OpenDroneMap output found at ``inputs`` (zip members extracted into ``work``),
    sorted by id (see :func:`prefect_odm.merge.find_existing_outputs`)."""
    from prefect_odm.merge import find_existing_outputs as _find

    return _find(inputs, work)


@dataclass(frozen=True)
class MergedProducts:
    """What :func:`merge_products` stored: product name -> URL, and the merge reports."""

    stored: dict[str, str]
    reports: MergeReports


@dataclass
class _MergeRun:
    """One merge's context, its staged outputs and their reports (product name -> each)."""

    context: MergeContext
    staged: dict[ProductName, Path] = field(default_factory=dict)
    reports: dict[ProductName, ProductMergeReport] = field(default_factory=dict)

    def merge(self, name: ProductName, method: MergeMethod, inputs: Mapping[str, str]) -> None:
        """Merge one product into the staging folder with its registry method."""
        out = self.context.work / PRODUCTS[name].merged_file_name(
            self.context.options.point_cloud_format
        )
        report: ProductMergeReport
        if method == "orthophoto":
            report = fetch_and_merge_orthophotos(inputs, out, self.context)
        elif method == "dem":
            report = fetch_and_merge_dems(inputs, out, self.context, product=name)
        else:
            report = fetch_and_merge_point_clouds(inputs, out, self.context)
        self.reports[name] = report
        self.staged[name] = out


def _inputs_of(products: Mapping[str, Mapping[str, str]], name: str) -> dict[str, str]:
    """Submodel id -> URL of product ``name``, for the inputs that have it."""
    return {sid: p[name] for sid, p in sorted(products.items()) if name in p}


def _derived_ownership(
    products: Mapping[str, Mapping[str, str]], work: Path, crs_epsg: int | None
) -> Ownership | None:
    """The ownership of outputs merged without a plan, from each input's footprint in its first
    raster product (its orthophoto when it has one); None without any raster (the point-cloud
    merge then derives one from the clouds' bounds)."""
    from prefect_odm.merge import ownership_from_rasters

    rasters = [name for name, p in PRODUCTS.items() if p.kind == "raster"]
    local: dict[str, Path] = {}
    for sid, prods in sorted(products.items()):
        name = next((n for n in rasters if n in prods), None)
        if name is not None:
            local |= _local_inputs({sid: prods[name]}, work, name)
    return ownership_from_rasters(local, crs_epsg=crs_epsg) if local else None


def _shared_seamlines(
    products: Mapping[str, Mapping[str, str]],
    work: Path,
    ownership: Ownership | None,
    crs_epsg: int | None,
    options: MergeOptions,
    alignment: AlignmentReport | None = None,
) -> OwnerLabels | None:
    """The least-cost owner labels of this merge, from the orthophotos and DSMs together where
    the alignment puts them (:func:`prefect_odm.merge.seamline_rasters.merge_seamlines`); None for
    other seam methods."""
    from prefect_odm.merge.seam_methods import LABEL_SEAM_METHODS
    from prefect_odm.merge.seamline_rasters import merge_seamlines

    ortho, dsm = _inputs_of(products, "orthophoto"), _inputs_of(products, "dsm")
    if options.seam_method not in LABEL_SEAM_METHODS or ownership is None or not (ortho or dsm):
        return None
    return merge_seamlines(
        ownership,
        orthophotos=_local_inputs(ortho, work, "orthophoto"),
        dsms=_local_inputs(dsm, work, "dsm"),
        crs_epsg=crs_epsg,
        colour_balance=options.colour_balance,
        alignment=alignment.raster_corrections() if alignment is not None else None,
    )


class MergeKeywords(TypedDict):
    """The keywords of :func:`merge_products`.

    Attributes:
        ownership: who owns which ground position; ``None``: from each input's footprint (its
            orthophoto, else its first raster product).
        crs_epsg: CRS of the merged products (and of ``ownership``).
        planned_footprint: GeoJSON polygon of the planned area in ``crs_epsg``, for coverage.
        options: how the products are merged; None (or absent) for the defaults.
        alignment: what the ``align_submodels`` task solved, applied to every product and
            recorded in the reports; None (or absent): the products as they are.
        check_locations: refuse products that do not lie near their submodel's cameras
            (``ownership``'s, each submodel's hull; :mod:`prefect_odm.merge.locations`) before
            anything is read; absent: True. The flows check against the plan's footprints
            before the alignment and pass False.
    """

    ownership: Ownership | None
    crs_epsg: int | None
    planned_footprint: GeoJSONGeometry | None
    options: NotRequired[MergeOptions | None]
    alignment: NotRequired[AlignmentReport | None]
    check_locations: NotRequired[bool]


def merge_products(
    products: Mapping[str, Mapping[str, str]],
    layout_merged: Callable[[str, PointCloudFormat], str],
    **kw: Unpack[MergeKeywords],
) -> MergedProducts:
    """Merge each product from the inputs that have it, check coverage, store the results.

    Args:
        products: submodel id -> product name -> URL.
        layout_merged: (product name, point-cloud format) -> URL where the merged product is
            stored (:meth:`prefect_odm.layout.OutputLayout.merged_product`).
        **kw: ``ownership``, ``crs_epsg``, ``planned_footprint``, ``options``, ``alignment``,
            ``check_locations`` (see :class:`MergeKeywords`).

    Returns:
        The stored URLs and the reports (``coverage`` when an orthophoto was merged). Every
        product is complete in a local staging folder before any is stored.

    Raises:
        MisplacedProductError: a product lies far from its submodel's cameras (nothing read
            or written).
        MergeError: no input has any product, or a merge or the coverage check failed.
    """
    ownership, crs_epsg = kw["ownership"], kw["crs_epsg"]
    if not any(name in p for p in products.values() for name in PRODUCTS):
        raise MergeError("nothing to merge: no input has a product")
    if kw.get("check_locations", True) and ownership is not None and crs_epsg is not None:
        from prefect_odm.merge.locations import check_product_locations as _check
        from prefect_odm.merge.locations import footprints_from_ownership

        _check(
            products, footprints_from_ownership(ownership), crs_epsg,
            lambda _sid: DEFAULT_LOCATION_ADVICE,
        )  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="prefect-odm-merge-") as tmp:
        work = Path(tmp)
        if ownership is None:
            ownership = _derived_ownership(products, work, crs_epsg)
        alignment = kw.get("alignment")
        options = kw.get("options") or MergeOptions()
        seamlines = _shared_seamlines(products, work, ownership, crs_epsg, options, alignment)
        context = MergeContext(
            work, ownership, crs_epsg, options, alignment=alignment, seamlines=seamlines
        )
        run = _MergeRun(context)
        for name, product in PRODUCTS.items():
            inputs = _inputs_of(products, name)
            if inputs:
                run.merge(name, product.merge, inputs)
        coverage = None
        if "orthophoto" in run.staged:
            coverage = check_coverage(
                run.staged["orthophoto"],
                _inputs_of(products, "orthophoto"),
                work,
                kw["planned_footprint"],
                alignment,
            )
        stored: dict[str, str] = {}
        for staged, path in run.staged.items():
            stored[staged] = layout_merged(staged, options.point_cloud_format)
            storage.put_file(path, stored[staged])
            # the report names the stored product, not the staging file deleted below
            run.reports[staged] = run.reports[staged].model_copy(update={"path": stored[staged]})
    reports = MergeReports.of_products(run.reports, coverage=coverage, alignment=alignment)
    return MergedProducts(stored=stored, reports=reports)
