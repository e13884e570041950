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

from prefect_odm.align.options import AlignmentOptions as AlignmentOptions  # re-exported
from prefect_odm.align.similarity import RasterCorrection, Similarity
from prefect_odm.align.stage_records import OverlapSeam, StageCheck, StageName
from prefect_odm.errors import PrefectODMError


class OutlierCamera(BaseModel):
    """A shared camera left out of the solve because its two submodels disagree about it."""

    overlap: str = Field(description="The overlap, 'first|second'.")
    image: str
    residual_m: float = Field(description="Distance between the two aligned centres, metres.")


class SubmodelTransform(BaseModel):
    """One submodel's correction.

    ``kind='similarity'``: ``X' = centre + translation + scale * R @ (X - centre)``.
    ``kind='height_tilt'``: ``(x', y') = c + (dx, dy) + L (x - cx, y - cy)`` with
    ``c = centre_m[:2]``, ``(dx, dy) = translation_m[:2]`` and ``L`` the 2 x 2 ``horizontal``
    (identity when None: a shift alone), and ``z' = z + p0 + px*x + py*y`` with
    ``(p0, px, py) = height_plane``, plus ``b * ((x - bx)^2 + (y - by)^2)`` with
    ``(b, bx, by) = height_bowl`` when there is one (heights in the source ``x, y``).
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
    horizontal: tuple[float, float, float, float] | None = Field(
        None,
        description="height_tilt: (a, b, d, e), the horizontal map's linear part about centre_m "
        "(a similarity in the plane: a turn about the vertical and a scale); None: identity.",
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
        (a, b, c), (d, e, f) = self.horizontal_affine()
        x, y = xyz[:, 0].copy(), xyz[:, 1].copy()
        xyz[:, 0], xyz[:, 1] = a * x + b * y + c, d * x + e * y + f
        return xyz

    def horizontal_affine(self) -> tuple[tuple[float, float, float], tuple[float, float, float]]:
        """height_tilt: ``((a, b, c), (d, e, f))`` with ``x' = a*x + b*y + c``, ``y' = d*x +
        e*y + f`` (plan CRS metres)."""
        a, b, d, e = self.horizontal or (1.0, 0.0, 0.0, 1.0)
        cx, cy, _ = self.centre_m
        dx, dy, _ = self.translation_m
        return ((a, b, cx + dx - a * cx - b * cy), (d, e, cy + dy - d * cx - e * cy))

    def raster_correction(self, reference_height_m: float) -> RasterCorrection:
        """The correction as a raster merge applies it (see :class:`RasterCorrection`)."""
        if self.kind == "similarity":
            return self.similarity().raster_correction(reference_height_m)
        return RasterCorrection(
            affine=self.horizontal_affine(),
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
    unsolved: list[str] = Field(
        default_factory=list,
        description="What the samples do not observe, so was not solved but held at zero, one "
        "line each ('first|second: ...').",
    )

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
        """Join the failures' messages, then ``ways_on``, into the one error line."""
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
    result: AlignmentResult,
    refinement: AlignmentResult | None,
    options: AlignmentOptions,
    *,
    applied: tuple[bool, bool] = (True, True),
    seams: Sequence[OverlapSeam] = (),
) -> list[GateFailure]:
    """Every gate the applied alignment fails: the camera step followed by its refinement.

    A submodel counts as tied to the block when any stage ties it to a neighbour with at least
    ``min_shared_cameras`` samples (shared cameras, or DSM samples of the refinement): with
    narrow overlaps (2 shared images) the camera step cannot tie a submodel that the
    DSM/orthophoto refinement ties well, and products in one frame (the ``direct`` pipeline)
    never fail for lack of shared cameras. The overlap figures judged are those of the last
    applied stage, the one whose correction the merge applies, and the seams measured on the
    products it corrects (``max_seam_m``); each applied stage's own transform is judged on its
    correction, rotation and scale.

    Args:
        result: the first stage (cameras, or products when there were no cameras).
        refinement: the refinement from the corrected DSMs and orthophotos, or None.
        options: the thresholds.
        applied: whether the merge applies ``result`` and ``refinement``
            (:class:`~prefect_odm.align.stage_records.StageCheck`).
        seams: the seams measured on the products as the merge corrects them.

    Returns:
        one :class:`GateFailure` per figure above its threshold (empty: all pass).
    """
    both = [(result, applied[0]), (refinement, applied[1])]
    stages = [stage for stage, on in both if stage is not None and on]
    tied = {
        sid
        for stage in (result, refinement)
        if stage is not None
        for o in stage.overlaps
        if o.n_used >= options.min_shared_cameras
        for sid in (o.first, o.second)
    }
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
        rms, text = (g.rms_after_m, "camera-vs-GPS rms m") if applied[0] else (
            g.rms_before_m, "camera-vs-GPS rms (camera step not applied) m")  # fmt: skip
        _gate(out, g.submodel_id, "max_camera_gps_rms_m", rms, o.max_camera_gps_rms_m, text)
    for ov in stages[-1].overlaps if stages else []:
        _gate(out, ov.overlap, "max_overlap_rms_m", ov.rms_after_m, o.max_overlap_rms_m, "rms m")
    for ov in result.overlaps if applied[0] else []:
        frac, text = len(ov.outliers) / max(ov.n_shared, 1), "outlier share"
        _gate(out, ov.overlap, "max_outlier_fraction", frac, o.max_outlier_fraction, text)
    for seam in seams:
        if seam.orthophoto is not None:
            text = "orthophoto displacement measured on the products, median m"
            _gate(out, seam.overlap, "max_seam_m", seam.orthophoto.median_m, o.max_seam_m, text)
        if seam.dsm is not None:
            text = "DSM step measured on the products, median |dz| m"
            _gate(out, seam.overlap, "max_seam_m", abs(seam.dsm.median_m), o.max_seam_m, text)
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
    transform, a height plane and shift solved on the products corrected by the stage before,
    each only where its :class:`~prefect_odm.align.stage_records.StageCheck` applies it (a
    stage that would worsen a measured seam, or that is beyond plausible, is not applied).

    Attributes:
        result: what the solve found (transforms, residuals): from the cameras, or from the
            products when there were no cameras.
        refinement: height, tilt and shift from the DSMs and orthophotos corrected by the
            applied ``result`` (or as they are, when it is not applied), or None.
        failures: every gate the applied stages and the measured seams failed, and every
            correction refused as beyond plausible (empty: all passed).
        accepted: the operator accepted the failures (``MergeOptions.accept_alignment``); the
            report says so.
        ground_heights_m: submodel id -> median DSM height (metres), the height at which a
            raster's horizontal correction is exact (:meth:`SubmodelTransform.raster_correction`).
        relief_m: submodel id -> the larger distance from that height to the DSM's 2nd and
            98th height percentiles, metres (how far a tilt's lean reaches).
        stages: the products as they are (``none``), then each stage, with its seams measured
            on the corrected products and whether it is applied; empty in reports written
            before stages were checked (every stage applied).
    """

    result: AlignmentResult
    refinement: AlignmentResult | None = None
    failures: list[GateFailure] = Field(default_factory=list)
    accepted: bool = False
    ground_heights_m: dict[str, float] = Field(default_factory=dict)
    relief_m: dict[str, float] = Field(default_factory=dict)
    stages: list[StageCheck] = Field(default_factory=list)

    def reference_height_m(self, submodel_id: str) -> float:
        """The submodel's ground height, else its cameras' centroid height (metres)."""
        if submodel_id in self.ground_heights_m:
            return self.ground_heights_m[submodel_id]
        return self.result.transform(submodel_id).centre_m[2]

    @property
    def first_stage(self) -> StageName:
        """``cameras`` or ``products``: the name of ``result``'s stage."""
        return "cameras" if self.result.method == "cameras" else "products"

    def stage(self, name: StageName) -> StageCheck | None:
        """The check of one stage (the applied one when it was tried twice: ``refined`` on the
        cameras and on the products as they are), or None when it was not checked."""
        named = [s for s in self.stages if s.stage == name]
        return next((s for s in named if s.applied), named[-1] if named else None)

    def applies(self, name: StageName) -> bool:
        """Whether the merge applies a stage (stages never checked are applied)."""
        check = self.stage(name)
        return check is None or check.applied

    def final_stage(self) -> StageCheck | None:
        """The last stage applied (``none`` when none is), or None when stages were not checked."""
        applied = [s for s in self.stages if s.applied or s.stage == "none"]
        return applied[-1] if applied else None

    def _steps(self, submodel_id: str) -> list[SubmodelTransform]:
        steps = []
        if self.applies(self.first_stage):
            steps.append(self.result.transform(submodel_id))
        if self.refinement is not None and self.applies("refined"):
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
