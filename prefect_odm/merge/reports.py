"""What each merge reports, as pydantic models (pure core: no I/O).

The merge functions return these; the Prefect tasks and flows pass them on as these models
(never as dictionaries); ``report/merge.json`` is :meth:`MergeReports.json_dict` (each report's
``model_dump(mode="json")``, the same keys the reports had as dicts), validated back into a
:class:`MergeReports` once, where a stored ``merge.json`` is read; ``report.md`` and the manifest
read their typed fields.
"""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict, Field, JsonValue

from prefect_odm.align.report import AlignmentReport
from prefect_odm.align.stage_records import DsmSeam
from prefect_odm.merge.balance import GainOffset
from prefect_odm.registry import ProductName


class _Report(BaseModel):
    """Frozen; unknown keys of a stored report are ignored when it is read back."""

    model_config = ConfigDict(frozen=True, extra="ignore")


class ProductMergeReport(_Report):
    """The figures every product merge reports.

    Attributes:
        path: the merged file.
        submodel_ids: the merged submodels, sorted.
        crs_wkt, crs_epsg: the output CRS (``crs_epsg`` None when it has no EPSG code).
        ownership_from_footprints: whether the ownership was derived from the inputs' own
            footprints (no split plan) rather than given.
        elapsed_seconds: wall time of the merge.
    """

    path: str
    submodel_ids: tuple[str, ...]
    crs_wkt: str
    crs_epsg: int | None
    ownership_from_footprints: bool
    elapsed_seconds: float


class RasterMergeReport(ProductMergeReport):
    """The figures every raster merge reports (orthophoto and DEM reports extend it).

    Attributes:
        resolution_m: output pixel size, CRS units.
        width, height: output grid size, pixels.
        pixels: output pixels with data.
        union_pixels: grid pixels where at least one input has data.
        covered_area_m2: ``pixels`` times the pixel area, square CRS units.
        coverage_of_union: ``pixels / union_pixels``.
        warped: inputs warped onto the output grid (another CRS, resolution or pixel phase).
    """

    resolution_m: float
    width: int
    height: int
    pixels: int
    union_pixels: int
    covered_area_m2: float
    coverage_of_union: float
    warped: tuple[str, ...]


class SeamQuality(_Report):
    """Colour difference between two submodels along their seam.

    Attributes:
        a, b: submodel ids (a < b).
        pixels: pixels in the seam band where both have data.
        mean_abs_diff_before: mean absolute difference over RGB without balancing, DN.
        mean_abs_diff_after: the same after colour balancing, DN.
    """

    a: str
    b: str
    pixels: int
    mean_abs_diff_before: float
    mean_abs_diff_after: float


class OrthoMergeReport(RasterMergeReport):
    """What an orthophoto merge produced (figures for the manifest and report).

    Attributes:
        seams: per pair of neighbouring submodels, sorted by ids.
        seam_mean_abs_diff_before, seam_mean_abs_diff_after: mean absolute RGB difference over
            every seam band pixel, without and with colour balancing, DN (0 without seams).
        colour_correction: the gain and offset applied to each submodel.
        workers, block_size: threads and block side (pixels) the merge ran with.
        phase_seconds: wall time of each phase (plan, colour_balance, blocks, cog).
    """

    seams: tuple[SeamQuality, ...]
    seam_mean_abs_diff_before: float
    seam_mean_abs_diff_after: float
    colour_correction: dict[str, GainOffset]
    workers: int
    block_size: int
    phase_seconds: dict[str, float] = Field(default_factory=dict)


class DemMergeReport(RasterMergeReport):
    """What a DEM merge produced (figures for the manifest and report).

    Attributes:
        vertical_offsets_m: offset removed from each submodel (subtracted), metres.
        overlap_median_diff_m: ``"a|b"`` -> median of ``z_a - z_b`` in the overlap before the
            offsets (after the alignment's heights when ``heights_from_alignment``), metres.
        heights_from_alignment: heights and tilts came from the alignment between submodels
            (no free offsets were solved).
        overlap_seams: ``"a|b"`` -> the two inputs against each other as merged (after the
            alignment's corrections), on the cells both measured: what ``report.md`` shows
            for the applied alignment stage.
    """

    vertical_offsets_m: dict[str, float]
    overlap_median_diff_m: dict[str, float]
    overlap_seams: dict[str, DsmSeam] = Field(default_factory=dict)
    heights_from_alignment: bool = False


class SubmodelPoints(_Report):
    """Points read from and kept of one submodel."""

    submodel_id: str
    points_in: int
    points_kept: int


class PointCloudMergeReport(ProductMergeReport):
    """What a point-cloud merge produced (figures for the manifest and report).

    Attributes:
        points_in, points_kept: points read from all inputs and written.
        per_submodel: the same per input, sorted by id.
        point_format, las_version: of the written file.
        scales, offsets: header scales and offsets ``(x, y, z)``.
        mins, maxs: header bounds ``(x, y, z)`` of the merged cloud, CRS units.
        reprojected: inputs reprojected from another CRS.
        copc: whether the file is a COPC (never, for now).
        points_per_second: ``points_in / elapsed_seconds``.
    """

    points_in: int
    points_kept: int
    per_submodel: tuple[SubmodelPoints, ...]
    point_format: int
    las_version: str
    scales: tuple[float, float, float]
    offsets: tuple[float, float, float]
    mins: tuple[float, float, float]
    maxs: tuple[float, float, float]
    reprojected: tuple[str, ...]
    copc: bool
    points_per_second: float


class SubmodelCoverage(_Report):
    """One input's covered area (square CRS units) and the fraction the merged product covers."""

    submodel_id: str
    covered_area_m2: float
    covered_by_merged_fraction: float


class CoverageReport(_Report):
    """Covered areas of a merged orthophoto against its inputs and the planned footprint.

    Attributes:
        merged_area_m2: area where the merged orthophoto has data, square CRS units.
        union_area_m2: area where at least one input has data.
        coverage_of_union: ``|merged ∩ union| / |union|``.
        planned_area_m2, coverage_of_planned: the footprint's area and ``|merged ∩ planned| /
            |planned|``, None without a footprint.
        per_submodel: each input's coverage, sorted by id.
        cell_size_m: side of the decimated cells the areas were counted on.
        elapsed_seconds: wall time of the check.
    """

    merged_area_m2: float
    union_area_m2: float
    coverage_of_union: float
    planned_area_m2: float | None
    coverage_of_planned: float | None
    per_submodel: tuple[SubmodelCoverage, ...]
    cell_size_m: float
    elapsed_seconds: float

    def figures(self) -> dict[str, float]:
        """The numeric figures that are set, by name (the manifest's ``coverage``)."""
        return {
            k: float(v)
            for k, v in self.model_dump().items()
            if isinstance(v, int | float) and not isinstance(v, bool)
        }


class MergeReports(_Report):
    """The reports of one merge, by product, plus the coverage check (``report/merge.json``)."""

    orthophoto: OrthoMergeReport | None = None
    dsm: DemMergeReport | None = None
    dtm: DemMergeReport | None = None
    point_cloud: PointCloudMergeReport | None = None
    coverage: CoverageReport | None = None
    alignment: AlignmentReport | None = None

    @classmethod
    def of_products(
        cls,
        products: Mapping[ProductName, ProductMergeReport],
        *,
        coverage: CoverageReport | None = None,
        alignment: AlignmentReport | None = None,
    ) -> MergeReports:
        """The reports of one merge from each product's report (by product name).

        Raises:
            pydantic.ValidationError: a name that is not a product, or a report of another
                product's kind (an orthophoto report as ``dsm``).
        """
        return cls.model_validate({**products, "coverage": coverage, "alignment": alignment})

    def coverage_figures(self) -> dict[str, float]:
        """The coverage check's numeric figures (the manifest's ``coverage``); empty without one."""
        return self.coverage.figures() if self.coverage is not None else {}

    def json_dict(self) -> dict[str, JsonValue]:
        """Product (or ``coverage``) -> its report as JSON-ready data; products not merged are
        left out (the layout of ``merge.json``)."""
        return {
            name: report.model_dump(mode="json")
            for name in type(self).model_fields
            if (report := getattr(self, name)) is not None
        }
