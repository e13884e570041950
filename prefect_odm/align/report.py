"""What the alignment found, as pydantic records for the manifest and report, and its quality gates.

Every figure is in the plan CRS (projected, metres) unless its name says otherwise. The gates
never stay silent: :func:`check_alignment` returns one :class:`GateFailure` per figure above its
threshold, naming the submodel or overlap, and :func:`raise_for_failures` turns them into an
:class:`AlignmentError` unless the operator accepted them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray
from pydantic import BaseModel, ConfigDict, Field

from prefect_odm.align.similarity import RasterCorrection, Similarity
from prefect_odm.errors import PrefectODMError


class AlignmentOptions(BaseModel):
    """How submodels are aligned, and the thresholds above which a run fails."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    gauge: Literal["auto", "mean", "gps"] = Field(
        "auto",
        description="What holds the block in place: 'mean' keeps the mean camera position, mean "
        "rotation and mean log-scale; 'gps' ties every camera to its GPS; 'auto' is 'gps' when "
        "GPS positions are given.",
    )
    loss: Literal["soft_l1", "huber", "cauchy", "linear"] = Field(
        "soft_l1", description="scipy.optimize.least_squares loss on the whitened residuals."
    )
    loss_threshold_sigmas: float = Field(
        3.0, gt=0, description="Residual (in sigmas) where the robust loss turns linear."
    )
    camera_sigma_m: float = Field(
        0.1, gt=0, description="Expected disagreement of one shared camera centre, metres."
    )
    orientation_sigma_deg: float | None = Field(
        0.1,
        gt=0,
        description="Expected disagreement of one shared camera orientation, degrees; None "
        "ignores orientations.",
    )
    gps_sigma_horizontal_m: float = Field(3.0, gt=0, description="Camera GPS accuracy, metres.")
    gps_sigma_vertical_m: float = Field(5.0, gt=0, description="Camera GPS altitude accuracy, m.")
    min_shared_cameras: int = Field(3, ge=1, description="Fewest shared cameras making an overlap.")
    outlier_min_m: float = Field(
        0.5, gt=0, description="A shared camera is never an outlier below this residual, metres."
    )
    outlier_mad_factor: float = Field(
        5.0, gt=0, description="Outlier above this many robust sigmas (1.4826 MAD) of residuals."
    )
    max_overlap_rms_m: float = Field(1.0, gt=0, description="Gate: overlap rms after alignment.")
    max_correction_m: float = Field(
        5.0, gt=0, description="Gate: largest move of a submodel's camera by its transform."
    )
    max_rotation_deg: float = Field(2.0, gt=0, description="Gate: rotation of a transform.")
    max_scale_change: float = Field(0.02, gt=0, description="Gate: |scale - 1| of a transform.")
    max_camera_gps_rms_m: float = Field(
        10.0, gt=0, description="Gate: a submodel's camera-vs-GPS rms after alignment, metres."
    )
    max_outlier_fraction: float = Field(
        0.25, ge=0, le=1, description="Gate: share of an overlap's cameras rejected as outliers."
    )
    refine_from_products: bool = Field(
        True,
        description="After the cameras, refine height, tilt and shift from the aligned DSMs and "
        "orthophotos in the overlaps (each submodel projects onto its own surface, so cameras "
        "that agree do not make products that agree).",
    )
    refine_bowl: bool = Field(
        True,
        description="In that refinement (and in an alignment from products alone) also solve a "
        "bowl per submodel, z += b * r^2 about its DSM's centre: the doming of nadir blocks from "
        "radial distortion (James and Robson 2014). Only the bowls relative to each other are "
        "measured: the block's mean bowl is held at zero.",
    )


class OutlierCamera(BaseModel):
    """A shared camera left out of the solve because its two submodels disagree about it."""

    overlap: str = Field(description="The overlap, 'first|second'.")
    image: str
    residual_m: float = Field(description="Distance between the two aligned centres, metres.")


class SubmodelTransform(BaseModel):
    """One submodel's correction.

    ``kind='similarity'``: ``X' = centre + translation + scale * R @ (X - centre)``.
    ``kind='height_tilt'``: ``x' = x + dx``, ``y' = y + dy``, ``z' = z + p0 + px*x + py*y``
    with ``(dx, dy) = translation_m[:2]`` and ``(p0, px, py) = height_plane``, plus
    ``b * ((x - bx)^2 + (y - by)^2)`` with ``(b, bx, by) = height_bowl`` when there is one.
    """

    model_config = ConfigDict(frozen=True)

    submodel_id: str
    kind: Literal["similarity", "height_tilt"]
    scale: float = 1.0
    rotation: tuple[float, ...] = Field(description="Row-major 3x3; the tilt for height_tilt.")
    translation_m: tuple[float, float, float]
    centre_m: tuple[float, float, float]
    height_plane: tuple[float, float, float] | None = None
    height_bowl: tuple[float, float, float] | None = Field(
        None, description="(b in m per m^2, centre x, y): a bowl; None: none."
    )
    rotation_deg: float
    tilt_deg: float
    scale_change: float
    max_correction_m: float = Field(description="Largest move of the submodel's samples, metres.")
    n_samples: int = Field(description="Cameras (similarity) or DSM samples (height_tilt) seen.")

    def similarity(self) -> Similarity:
        """The transform as a :class:`Similarity` (the tilt as a rotation for height_tilt)."""
        r = tuple(tuple(self.rotation[3 * i : 3 * i + 3]) for i in range(3))
        return Similarity(self.scale, r, self.translation_m, self.centre_m)  # type: ignore[arg-type]

    def apply_points(self, points: ArrayLike) -> NDArray[np.float64]:
        """Corrected points, shape ``(n, 3)`` in and out, plan CRS metres."""
        if self.kind == "similarity":
            return self.similarity().apply(points)
        xyz = np.array(points, dtype=np.float64).reshape(-1, 3)
        p0, px, py = self.height_plane or (0.0, 0.0, 0.0)
        bow, bx, by = self.height_bowl or (0.0, 0.0, 0.0)
        xyz[:, 2] += p0 + px * xyz[:, 0] + py * xyz[:, 1]
        if bow != 0.0:
            xyz[:, 2] += bow * ((xyz[:, 0] - bx) ** 2 + (xyz[:, 1] - by) ** 2)
        xyz[:, :2] += np.asarray(self.translation_m[:2])
        return xyz

    def raster_correction(self, reference_height_m: float) -> RasterCorrection:
        """The correction as a raster merge applies it (see :class:`RasterCorrection`)."""
        if self.kind == "similarity":
            return self.similarity().raster_correction(reference_height_m)
        dx, dy, _ = self.translation_m
        return RasterCorrection(
            affine=((1.0, 0.0, dx), (0.0, 1.0, dy)),
            lean_m_per_m=(0.0, 0.0),
            reference_height_m=reference_height_m,
            z_scale=1.0,
            z_plane=self.height_plane or (0.0, 0.0, 0.0),
            z_bowl=self.height_bowl or (0.0, 0.0, 0.0),
        )


class OverlapResidual(BaseModel):
    """How well two neighbours agree in their overlap, before and after alignment."""

    overlap: str = Field(description="'first|second'.")
    first: str
    second: str
    n_shared: int = Field(description="Shared cameras (or DSM samples).")
    n_used: int = Field(description="Those left after outlier rejection.")
    rms_before_m: float
    rms_after_m: float = Field(description="Over the used samples, metres.")
    max_after_m: float
    orientation_rms_after_deg: float | None = None
    outliers: list[OutlierCamera] = Field(default_factory=list)


class SubmodelResidual(BaseModel):
    """The alignment residuals over all overlaps of one submodel."""

    submodel_id: str
    n_overlaps: int
    rms_after_m: float
    max_after_m: float


class CameraGpsResidual(BaseModel):
    """A submodel's reconstructed cameras against their GPS positions."""

    submodel_id: str
    n_cameras: int
    rms_before_m: float
    rms_after_m: float
    horizontal_rms_after_m: float
    vertical_rms_after_m: float
    mean_offset_after_m: tuple[float, float, float]


class AlignmentResult(BaseModel):
    """Everything the alignment solved and measured; goes into the manifest and report."""

    method: Literal["cameras", "dem"]
    gauge: Literal["mean", "gps"]
    transforms: list[SubmodelTransform]
    overlaps: list[OverlapResidual]
    submodels: list[SubmodelResidual]
    camera_gps: list[CameraGpsResidual] = Field(default_factory=list)
    rejected: list[OutlierCamera] = Field(default_factory=list)
    solve_seconds: float
    iterations: int

    def transform(self, submodel_id: str) -> SubmodelTransform:
        """The transform of one submodel; raises ``KeyError`` when it was not aligned."""
        for t in self.transforms:
            if t.submodel_id == submodel_id:
                return t
        raise KeyError(submodel_id)


class GateFailure(BaseModel):
    """One figure above its threshold."""

    subject: str = Field(description="The submodel id, or the overlap 'first|second'.")
    figure: str = Field(description="The option naming the figure, e.g. 'max_overlap_rms_m'.")
    value: float
    threshold: float
    message: str


class AlignmentError(PrefectODMError, ValueError):
    """The alignment's residuals or corrections are above their thresholds.

    Attributes:
        failures: every failed gate, each naming its submodel or overlap and figure.
        ways_on: what the operator can do next (the command that merges the stored
            submodels), or empty.
    """

    def __init__(self, failures: Sequence[GateFailure], ways_on: str = "") -> None:
        self.failures = list(failures)
        self.ways_on = ways_on
        lines = "; ".join(f.message for f in self.failures)
        more = f". {ways_on}" if ways_on else ""
        super().__init__(f"alignment quality gates failed ({len(self.failures)}): {lines}{more}")


def _gate(
    out: list[GateFailure], subject: str, figure: str, value: float, limit: float, text: str
) -> None:
    if value > limit:
        out.append(
            GateFailure(
                subject=subject,
                figure=figure,
                value=value,
                threshold=limit,
                message=f"{subject}: {text} {value:.3g} > {figure}={limit:g}",
            )
        )


def check_alignment(result: AlignmentResult, options: AlignmentOptions) -> list[GateFailure]:
    """Every quality gate the alignment fails, in submodel then overlap order (empty: all pass).

    Args:
        result: what :func:`~prefect_odm.align.align_submodels` or
            :func:`~prefect_odm.align.align_heights` returned.
        options: the thresholds.

    Returns:
        one :class:`GateFailure` per figure above its threshold; also one per submodel that no
        overlap ties to the others when the block has several submodels (``min_overlaps``).
    """
    out: list[GateFailure] = []
    o = options
    several = len(result.transforms) > 1
    overlaps_of = {s.submodel_id: s.n_overlaps for s in result.submodels}
    for t in result.transforms:
        sid = t.submodel_id
        _gate(out, sid, "max_correction_m", t.max_correction_m, o.max_correction_m, "correction m")
        _gate(out, sid, "max_rotation_deg", t.rotation_deg, o.max_rotation_deg, "rotation deg")
        _gate(out, sid, "max_scale_change", abs(t.scale_change), o.max_scale_change, "scale change")
        if several and overlaps_of.get(sid, 0) == 0:
            _gate(out, sid, "min_overlaps", 1.0, 0.0, "no overlap ties it to the block; missing")
    for g in result.camera_gps:
        text = "camera-vs-GPS rms m"
        _gate(
            out, g.submodel_id, "max_camera_gps_rms_m", g.rms_after_m, o.max_camera_gps_rms_m, text
        )
    for ov in result.overlaps:
        _gate(out, ov.overlap, "max_overlap_rms_m", ov.rms_after_m, o.max_overlap_rms_m, "rms m")
        frac = len(ov.outliers) / max(ov.n_shared, 1)
        text = "outlier share"
        _gate(out, ov.overlap, "max_outlier_fraction", frac, o.max_outlier_fraction, text)
    return out


def check_report(
    result: AlignmentResult, refinement: AlignmentResult | None, options: AlignmentOptions
) -> list[GateFailure]:
    """Every gate the applied alignment fails: the camera step followed by its refinement.

    A submodel counts as tied to the block when any stage ties it to a neighbour with at least
    ``min_shared_cameras`` samples (shared cameras, or DSM samples of the refinement): with
    narrow overlaps (2 shared images) the camera step cannot tie a submodel that the
    DSM/orthophoto refinement ties well, and products in one frame (the ``direct`` pipeline)
    never fail for lack of shared cameras. The overlap figures judged are those of the last
    stage, the one whose correction the merge applies; each stage's own transform is judged on
    its correction, rotation and scale.

    Args:
        result: the first stage (cameras, or products when there were no cameras).
        refinement: the refinement from the corrected DSMs and orthophotos, or None.
        options: the thresholds.

    Returns:
        one :class:`GateFailure` per figure above its threshold (empty: all pass).
    """
    stages = [result] if refinement is None else [result, refinement]
    tied = {
        sid
        for stage in stages
        for o in stage.overlaps
        if o.n_used >= options.min_shared_cameras
        for sid in (o.first, o.second)
    }
    final = stages[-1]
    out: list[GateFailure] = []
    o = options
    for stage in stages:
        for t in stage.transforms:
            sid, text = t.submodel_id, "correction m"
            _gate(out, sid, "max_correction_m", t.max_correction_m, o.max_correction_m, text)
            _gate(out, sid, "max_rotation_deg", t.rotation_deg, o.max_rotation_deg, "rotation deg")
            text = "scale change"
            _gate(out, sid, "max_scale_change", abs(t.scale_change), o.max_scale_change, text)
    if len(result.transforms) > 1:
        for t in result.transforms:
            if t.submodel_id not in tied:
                text = "no overlap ties it to the block (by cameras or products); missing"
                _gate(out, t.submodel_id, "min_overlaps", 1.0, 0.0, text)
    for g in result.camera_gps:
        text = "camera-vs-GPS rms m"
        _gate(
            out, g.submodel_id, "max_camera_gps_rms_m", g.rms_after_m, o.max_camera_gps_rms_m, text
        )
    for ov in final.overlaps:
        _gate(out, ov.overlap, "max_overlap_rms_m", ov.rms_after_m, o.max_overlap_rms_m, "rms m")
    for ov in result.overlaps:
        frac, text = len(ov.outliers) / max(ov.n_shared, 1), "outlier share"
        _gate(out, ov.overlap, "max_outlier_fraction", frac, o.max_outlier_fraction, text)
    return out


def raise_for_failures(failures: Sequence[GateFailure], *, accept: bool = False) -> None:
    """Raise :class:`AlignmentError` for any failure unless ``accept`` (the operator's option).

    When accepted the caller must still record ``failures`` in the report and manifest.
    """
    if failures and not accept:
        raise AlignmentError(failures)


class AlignmentReport(BaseModel):
    """The alignment a merge applied, its gates and what the operator decided.

    A submodel's correction is its ``result`` transform, then (when present) its ``refinement``
    transform, a height plane and shift solved on the products already corrected by ``result``.

    Attributes:
        result: what the solve found (transforms, residuals): from the cameras, or from the
            products when there were no cameras.
        refinement: height, tilt and shift from the DSMs and orthophotos corrected by
            ``result`` (cameras only), or None.
        failures: every gate ``result`` and ``refinement`` failed (empty: all passed).
        accepted: the operator accepted the failures (``MergeOptions.accept_alignment``); the
            report says so.
        ground_heights_m: submodel id -> median DSM height (metres), the height at which a
            raster's horizontal correction is exact (:meth:`SubmodelTransform.raster_correction`).
    """

    result: AlignmentResult
    refinement: AlignmentResult | None = None
    failures: list[GateFailure] = Field(default_factory=list)
    accepted: bool = False
    ground_heights_m: dict[str, float] = Field(default_factory=dict)

    def reference_height_m(self, submodel_id: str) -> float:
        """The submodel's ground height, else its cameras' centroid height (metres)."""
        if submodel_id in self.ground_heights_m:
            return self.ground_heights_m[submodel_id]
        return self.result.transform(submodel_id).centre_m[2]

    def _steps(self, submodel_id: str) -> list[SubmodelTransform]:
        steps = [self.result.transform(submodel_id)]
        if self.refinement is not None:
            steps.append(self.refinement.transform(submodel_id))
        return [t for t in steps if not is_identity(t)]

    def moving_ids(self) -> list[str]:
        """The submodels whose correction moves anything (the others stay byte-identical)."""
        return [t.submodel_id for t in self.result.transforms if self._steps(t.submodel_id)]

    def apply_points(self, submodel_id: str, points: ArrayLike) -> NDArray[np.float64]:
        """Corrected points of one submodel, shape ``(n, 3)`` in and out, plan CRS metres."""
        xyz = np.array(points, dtype=np.float64).reshape(-1, 3)
        for step in self._steps(submodel_id):
            xyz = step.apply_points(xyz)
        return xyz

    def raster_corrections(self) -> dict[str, RasterCorrection]:
        """Submodel id -> its raster correction, for the submodels whose correction moves."""
        out: dict[str, RasterCorrection] = {}
        for sid in self.moving_ids():
            ref = self.reference_height_m(sid)
            steps = [t.raster_correction(ref) for t in self._steps(sid)]
            out[sid] = steps[0] if len(steps) == 1 else steps[0].then(steps[1])
        return out


IDENTITY_TOLERANCE_M = 1e-6
"""A transform moving no sample by more than this (metres) is the identity: not applied."""


def is_identity(transform: SubmodelTransform) -> bool:
    """Whether ``transform`` moves nothing (so the products stay byte-identical)."""
    return transform.max_correction_m <= IDENTITY_TOLERANCE_M and (
        transform.kind == "height_tilt" or abs(transform.scale_change) <= 1e-12
    )
