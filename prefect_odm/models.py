"""Persisted records: the survey, the split plan, submodel results and the run manifest.

Pydantic models at the edges (flow parameters, JSON written next to the outputs) so that Prefect
validates them and shows their schema. Coordinates of the plan are in the plan's projected CRS
(``crs_epsg``, a UTM zone), in metres; geometries are GeoJSON-like dicts in that CRS.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from prefect_odm.align.report import AlignmentOptions, AlignmentReport
from prefect_odm.clusters.records import RoutingSummary
from prefect_odm.errors import HeaderProblem as HeaderProblem  # re-exported
from prefect_odm.registry import PointCloudFormat
from prefect_odm.registry import ProductName as ProductName  # re-exported
from prefect_odm.survey.gps_records import AltitudeCorrection, GpsWarning

OptionValue = str | int | float | bool

RejectReason = Literal[
    "no_gps",
    "gps_zero",
    "unreadable",
    "truncated",
    "empty_file",
    "not_an_image",
    "duplicate",
    "position_outlier",
    "low_altitude",
]


ImageFormat = Literal["JPEG", "TIFF", "PNG", "OTHER"]
"""An image's file format, from its magic bytes (``OTHER``: a format Pillow may know)."""


class CaptureMetadata(BaseModel):
    """What an image's header says about the shot: size, position, attitude, camera, time.

        The one declaration of these fields: the header reader's :class:`ImageMetadata`, the survey's
        :class:`ImageRecord` and the built-in engine's ``ImageMeta`` all derive from it.
        Latitude/longitude are WGS 84 degrees (EPSG:4326, south and west negative), ``None`` when the
        file has no GPS IFD; ``altitude_m`` is the EXIF GPS altitude (metres above sea level as the
        camera records it); ``relative_altitude_m`` is DJI's height above the take-off point (not above the ground below);
    ``above_ground_altitude_m`` the height above the ground under the camera where a camera writes
    it (XMP ``Camera:AboveGroundAltitude``). Angles
        are degrees as DJI writes them (gimbal pitch -90 = nadir, yaw clockwise from north).
    """

    model_config = ConfigDict(frozen=True)

    # The frame header (JPEG SOF, TIFF ImageWidth/ImageLength).
    width: int
    height: int
    # EXIF GPS IFD.
    latitude: float | None = None
    longitude: float | None = None
    altitude_m: float | None = None
    # DJI XMP.
    relative_altitude_m: float | None = Field(None, description="drone-dji:RelativeAltitude")
    gimbal_pitch_deg: float | None = Field(None, description="drone-dji:GimbalPitchDegree")
    gimbal_yaw_deg: float | None = Field(None, description="drone-dji:GimbalYawDegree")
    flight_yaw_deg: float | None = Field(None, description="drone-dji:FlightYawDegree")
    # XMP Camera: namespace (Parrot, Sentera, MicaSense): height above the ground below.
    above_ground_altitude_m: float | None = Field(
        None, description="Camera:AboveGroundAltitude, metres above the ground under the camera"
    )
    # EXIF IFD0 Make and Model, EXIF IFD FocalLength and FocalLengthIn35mmFilm.
    make: str | None = None
    model: str | None = None
    focal_length_mm: float | None = None
    focal_length_35mm: float | None = None
    # EXIF DateTimeOriginal, else IFD0 DateTime (naive: the camera's clock).
    capture_time: datetime | None = None

    @property
    def megapixels(self) -> float:
        """Image size in millions of pixels."""
        return self.width * self.height / 1e6

    @property
    def has_gps(self) -> bool:
        """Whether the header gave a GPS latitude and longitude."""
        return self.latitude is not None and self.longitude is not None

    def capture_fields(self) -> dict[str, Any]:
        """The :class:`CaptureMetadata` fields of this object, by name (to build another model)."""
        return {name: getattr(self, name) for name in CaptureMetadata.model_fields}


class ImageMetadata(CaptureMetadata):
    """Metadata of one image as read from its header (:mod:`prefect_odm.survey.exif`).

    ``focal_plane_x_resolution_px_per_mm`` is EXIF ``FocalPlaneXResolution`` converted to pixels
    per millimetre with ``FocalPlaneResolutionUnit`` (default inch); ``None`` when absent, zero or
    without an absolute unit.
    """

    format: ImageFormat
    focal_plane_x_resolution_px_per_mm: float | None = None


class ImageFile(BaseModel):
    """Where an image is and what its content is (the file part of :class:`ImageRecord`)."""

    model_config = ConfigDict(frozen=True)

    name: str = Field(description="Path relative to the survey root, with forward slashes.")
    url: str = Field(description="Full local path or fsspec URL of the file.")
    identity: str = Field(
        description="Content identity, e.g. 'sha256:<hex>' or 'etag:<etag>:<size>'."
    )
    size_bytes: int


# Base order: pydantic lists the fields of the last base first, so the file fields lead.
class ImageRecord(CaptureMetadata, ImageFile):
    """One accepted image of a survey: its file and its :class:`CaptureMetadata`.

    Attributes are in the units their names give; latitude/longitude are WGS 84 degrees
    (EPSG:4326) and always present (images without GPS are rejected), altitudes are metres as
    recorded by the camera (absolute GPS altitude; DJI relative altitude is above the take-off
    point).
    """

    latitude: float
    longitude: float

    @property
    def camera(self) -> str:
        """'make model' as one label, 'unknown' when EXIF has neither."""
        return " ".join(p for p in (self.make, self.model) if p) or "unknown"


class RejectedImage(BaseModel):
    """An input file left out of the survey, with the reason."""

    model_config = ConfigDict(frozen=True)

    name: str
    url: str
    reason: RejectReason
    detail: str = ""


class Survey(BaseModel):
    """The scanned survey: accepted images (sorted by name) and rejected files with reasons."""

    source: str = Field(description="The images location as given (path or fsspec URL).")
    images: list[ImageRecord]
    rejected: list[RejectedImage] = Field(default_factory=list)
    crs_epsg: int = Field(description="EPSG code of the survey's UTM zone (WGS 84 / UTM).")
    fingerprint: str = Field(description="Hash of the sorted image identities.")
    cameras: dict[str, int] = Field(
        default_factory=dict, description="Camera label -> image count."
    )


OWN_FIELD_OPTIONS = {
    "orthophoto-resolution": "orthophoto_resolution_cm",
    "dsm": "dsm",
    "dtm": "dtm",
    "pipeline": "pipeline",
}
"""ODM options that a :class:`ProcessingOptions` field sets (``extra`` may not set them again)."""


def _checked_option_name(name: str) -> str:
    """An ODM option name: non-empty text without spaces or ``=`` that no field of
    :class:`ProcessingOptions` sets.

    Raises:
        ValueError: it is not (the message names it).
    """
    if not name or name != name.strip() or " " in name or "=" in name:
        raise ValueError(f"{name!r} is not an ODM option name")
    if name in OWN_FIELD_OPTIONS:
        raise ValueError(f"{name} is set by its own field {OWN_FIELD_OPTIONS[name]}")
    return name


def _finite_option_value(value: OptionValue) -> OptionValue:
    """A number is finite (the node's own check is :mod:`prefect_odm.nodes.option_check`).

    Raises:
        ValueError: NaN or an infinity.
    """
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{value} is not a finite number")
    return value


OptionName = Annotated[str, AfterValidator(_checked_option_name)]
"""An ``extra`` option's name, checked per key (pydantic reports every bad one at once)."""
CheckedOptionValue = Annotated[OptionValue, AfterValidator(_finite_option_value)]
"""An ``extra`` option's value, checked per key (the error's location names the option)."""


class ProcessingOptions(BaseModel):
    """Options sent to every NodeODM node for every submodel.

    Names follow OpenDroneMap's options; ``extra`` passes any other ODM option through unchanged.
    """

    model_config = ConfigDict(frozen=True)

    orthophoto_resolution_cm: float = Field(
        5.0,
        gt=0,
        allow_inf_nan=False,
        description="ODM 'orthophoto-resolution' in cm/pixel (capped at the GSD).",
    )
    dsm: bool = Field(True, description="Build a digital surface model (ODM 'dsm').")
    dtm: bool = Field(False, description="Build a digital terrain model (ODM 'dtm').")
    pipeline: Literal["sfm", "direct"] = Field(
        "sfm",
        description=(
            "Built-in engine method: 'sfm' (structure from motion) or 'direct' (direct "
            "georeferencing from GPS and attitude). Ignored by a real NodeODM."
        ),
    )
    extra: dict[OptionName, CheckedOptionValue] = Field(
        default_factory=dict,
        description=(
            "Other ODM options by name, passed as given (a name without spaces that no field "
            "sets; a finite number). Every bad option is reported, each at its own location."
        ),
    )

    def to_nodeodm(self) -> dict[str, OptionValue]:
        """Options as the NodeODM name -> value mapping (sorted by name)."""
        out: dict[str, OptionValue] = {
            "orthophoto-resolution": self.orthophoto_resolution_cm,
            "dsm": self.dsm,
            "dtm": self.dtm,
            "pipeline": self.pipeline,
        }
        out.update(self.extra)
        return dict(sorted(out.items()))


class CameraPosition(BaseModel):
    """A camera's position in the plan CRS and the submodel whose core it belongs to."""

    model_config = ConfigDict(frozen=True)

    name: str
    x_m: float
    y_m: float
    z_m: float | None = None
    submodel_id: str


class Submodel(BaseModel):
    """One planned submodel.

    ``image_names`` is everything the node processes (core plus overlap images), sorted;
    ``core_image_names`` are the images the submodel owns. ``core_area`` and ``footprint`` are
    GeoJSON Polygon/MultiPolygon dicts in the plan CRS (metres). ``area_m2`` is the part of the
    core area inside the survey's image footprint (every camera's hull buffered by half an
    image footprint), m²: the core area itself reaches out to a buffer well beyond the images.
    """

    id: str
    image_names: list[str]
    core_image_names: list[str]
    overlap_image_count: int
    core_area: dict[str, Any]
    footprint: dict[str, Any]
    area_m2: float
    estimated_memory_gib: float
    fingerprint: str


class NeighbourPair(BaseModel):
    """What the alignment will have to tie two neighbouring submodels with (issue 30).

    Neighbours are submodels whose core areas share a boundary (the seams of the merge). Figures
    come from the plan, before any compute (:mod:`prefect_odm.plan.neighbours`).
    """

    model_config = ConfigDict(frozen=True)

    first: str = Field(description="The first submodel id (the smaller).")
    second: str = Field(description="The second submodel id.")
    shared_images: int = Field(description="Images processed by both submodels.")
    footprint_overlap_m2: float = Field(
        description="Area where the two submodels' ground footprints overlap (each its cameras' "
        "hull buffered by half an image footprint), m^2: where their DSMs and orthophotos can "
        "overlap."
    )
    tied_by: Literal["cameras", "products", "none"] = Field(
        description="What the alignment can tie the pair with: 'cameras' when they share at "
        "least AlignmentOptions.min_shared_cameras images, else 'products' when the refinement "
        "from DSMs and orthophotos runs and the footprints overlap, else 'none'."
    )


class SplitPlan(BaseModel):
    """The partition of a survey into submodels, in one projected CRS."""

    survey_fingerprint: str
    crs_epsg: int
    split: int
    split_overlap_m: float
    min_submodel_images: int
    options: ProcessingOptions
    engine_identity: str
    submodels: list[Submodel]
    cameras: list[CameraPosition]
    fingerprint: str
    gps_warnings: list[GpsWarning] = Field(
        default_factory=list,
        description="What the camera GPS shows wrong before compute (gps_quality.check_gps): "
        "altitude trends, implausible speeds, jumping positions. Not in the fingerprint.",
    )
    altitude_correction: AltitudeCorrection | None = Field(
        None,
        description="Set when the plan replaced unreliable GPS altitudes by take-off height + "
        "relative altitude (plan/altitudes.py): the cameras' z_m are those, every node gets them "
        "as geo.txt. Enters the fingerprints through the cameras' heights.",
    )
    neighbours: list[NeighbourPair] = Field(
        default_factory=list,
        description="Every pair of neighbouring submodels with what the alignment will have to "
        "tie it (shared images, footprint overlap). Not in the fingerprint.",
    )
    split_overlap_asked_m: float | None = Field(
        None,
        description="The split overlap asked for when the planner widened it so that every "
        "pair of neighbours can be aligned (None: not widened; split_overlap_m is the one "
        "used). Not in the fingerprint.",
    )
    warnings: list[str] = Field(default_factory=list, exclude=True)
    """What the planner found wasteful (overlap, merged duplicate submodels); not stored in
    ``plan.json`` nor in the fingerprint, shown by the command line and the flow's log."""

    def submodel(self, submodel_id: str) -> Submodel:
        """The submodel with this id; raises KeyError naming it when absent."""
        for sm in self.submodels:
            if sm.id == submodel_id:
                return sm
        raise KeyError(f"no submodel {submodel_id!r} in plan {self.fingerprint[:12]}")


class SubmodelResult(BaseModel):
    """What processing one submodel produced (or why it failed)."""

    submodel_id: str
    fingerprint: str
    status: Literal["completed", "reused", "failed"]
    products: dict[str, str] = Field(
        default_factory=dict, description="Product name -> URL of the stored file."
    )
    product_sizes: dict[str, int] = Field(default_factory=dict, description="Product -> bytes.")
    node_url: str | None = None
    cluster: str | None = Field(
        None, description="The cluster whose nodes processed it (None: no cluster directory)."
    )
    task_uuid: str | None = None
    attempts: int = 0
    duration_seconds: float = 0.0
    method: str | None = Field(None, description="Engine method that made the outputs.")
    options: dict[str, OptionValue] = Field(
        default_factory=dict, description="NodeODM options used."
    )
    early_fingerprint: str | None = Field(
        None,
        description="Fingerprint without late-stage options: equal means rerun-from can reuse the task.",
    )
    rerun_from: str | None = Field(
        None, description="Stage an existing task was restarted from, if any."
    )
    error: str | None = None
    last_output: list[str] = Field(default_factory=list)
    phase_seconds: dict[str, float] = Field(
        default_factory=dict,
        description=(
            "Where the submodel's time went, seconds summed over its attempts: waiting_for_node "
            "(memory slots and a node lease), upload, processing (on the node, from commit to "
            "finished), download, store (products to the output location)."
        ),
    )


class NodeHealthRecord(BaseModel):
    """One node's record in a run, as the manifest and ``report.md`` show it.

    ``health`` is the node's circuit-breaker state at the end of the run (``healthy``,
    ``suspected``, ``probing``: :class:`prefect_odm.nodes.health.Health`); the counts are
    this run's tasks on the node and its failed requests.
    """

    model_config = ConfigDict(frozen=True)

    url: str
    health: Literal["healthy", "suspected", "probing"]
    tasks_completed: int = 0
    tasks_failed: int = 0
    tasks_failed_fast: int = 0
    request_failures: int = 0
    last_error: str = ""


class Manifest(BaseModel):
    """Written last, next to the merged products: what this run produced and from what."""

    version: str
    created: datetime
    source: str
    survey_fingerprint: str
    plan_fingerprint: str
    merge_fingerprint: str
    crs_epsg: int
    products: dict[str, str]
    product_sizes: dict[str, int] = Field(default_factory=dict, description="Product -> bytes.")
    submodels: list[SubmodelResult]
    failed_submodels: dict[str, str] = Field(default_factory=dict)
    rejected_images: list[RejectedImage] = Field(default_factory=list)
    coverage: dict[str, float] = Field(default_factory=dict)
    timings_seconds: dict[str, float] = Field(default_factory=dict)
    node_health: list[NodeHealthRecord] = Field(default_factory=list)
    """Each node's record in this run (``HealthBook.report()``: state, tasks completed and
    failed, fast failures, request failures, last error); empty when no submodel ran here."""
    alignment: AlignmentReport | None = Field(
        None,
        description="Each submodel's transform and residuals, the failed gates and whether the "
        "operator accepted them; None when the merge did not align.",
    )
    routing: RoutingSummary | None = Field(
        None,
        description="Where each submodel was routed and why, failovers and the dead-letter "
        "queue (None: no cluster directory).",
    )


class MergeOptions(BaseModel):
    """How submodels are merged; part of the merge fingerprint (a change merges again).

    The defaults are the merge of prefect-odm 0.1.0. Each merge function takes the fields it
    uses; :func:`prefect_odm.fingerprints.merge_fingerprint` hashes them all.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    seam_method: Literal["ownership", "least-cost"] = Field(
        "ownership",
        description="Where seams run: 'ownership' = the boundary between the submodels' own "
        "areas (nearest core camera); 'least-cost' = moved within the overlap onto the cut of "
        "least colour difference, object height and DSM slope.",
    )
    orthophoto_feather_m: float = Field(
        2.0, ge=0, description="Width of the orthophoto's feathered band around a seam, metres."
    )
    colour_balance: bool = Field(
        True, description="Gain and offset per band and submodel, solved jointly over overlaps."
    )
    dem_feather_m: float = Field(
        10.0, ge=0, description="Distance over which DEMs blend towards a data edge, metres."
    )
    remove_vertical_offsets: bool = Field(
        True,
        description="Without an alignment: remove constant height offsets between DEMs, solved "
        "jointly and bounded by max_dem_offset_m. With one, heights come from the alignment.",
    )
    max_dem_offset_m: float = Field(
        5.0,
        gt=0,
        description="Largest plausible height offset between DEMs, metres: a larger solved "
        "offset fails the merge naming the submodel (never applied: it would flatten a slope).",
    )
    align: bool = Field(
        True,
        description="Align the submodels to each other (cameras they share, else their DSMs and "
        "orthophotos in the overlaps) and apply the transforms before merging.",
    )
    alignment: AlignmentOptions = Field(
        default_factory=AlignmentOptions,
        description="The alignment's solver settings and quality gate thresholds.",
    )
    accept_alignment: bool = Field(
        False,
        description="Merge even when alignment quality gates fail; the report then says so.",
    )
    point_cloud_format: PointCloudFormat = Field(
        "copc",
        description="How the merged point cloud is written: 'copc' = a COPC file "
        "(odm_georeferenced_model.copc.laz: LAZ 1.4 with an octree, read by range request by "
        "QGIS, PDAL and web viewers); 'laz' = a plain LAZ (odm_georeferenced_model.laz) in the "
        "submodels' point format, as ODM writes it.",
    )
