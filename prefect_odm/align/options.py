"""How submodels are aligned and the thresholds of the alignment's gates (pure core: pydantic).

Every figure is in the plan CRS (projected, metres) unless its name says otherwise.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


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
    check_stages: bool = Field(
        True,
        description="Measure every stage's seams on the corrected products (orthophoto feature "
        "matches, DSM differences) and apply a stage only when it worsens no seam.",
    )
    seam_tolerance_m: float = Field(
        0.05,
        ge=0,
        description="A stage worsens a seam when, in an overlap, hypot(orthophoto median "
        "displacement, DSM p90 |dz|) grows by more than this, metres.",
    )
    max_seam_m: float = Field(
        1.0,
        gt=0,
        description="Gate: an overlap's median orthophoto displacement and median DSM step "
        "measured on the corrected products, metres.",
    )
    plausible_rotation_deg: float = Field(
        10.0,
        gt=0,
        description="A correction turning more than this is refused, even under "
        "accept_alignment (the gate is max_rotation_deg).",
    )
    plausible_shift_m: float = Field(
        25.0,
        gt=0,
        description="A correction moving a submodel's centre more than this is refused, even "
        "under accept_alignment: 5 times the GPS altitude accuracy assumed (gps_sigma_vertical_m).",
    )
    plausible_scale_change: float = Field(
        0.05, gt=0, description="A correction scaling by more than this is refused, likewise."
    )
    max_raster_lean_m: float = Field(
        0.25,
        gt=0,
        description="A tilted correction is applied to rasters as its horizontal part at the "
        "submodel's ground height; refused (all products) when that leaves more than this "
        "horizontal error at the DSM's 2nd or 98th height percentile, metres.",
    )
    min_tilt_spread_m: float = Field(
        2.0,
        ge=0,
        description="An overlap's DSM samples tell two submodels' relative tilt across the "
        "overlap only when they spread (standard deviation) at least this across it, metres "
        "(2 m: a 7 m wide band); narrower, that tilt is not solved but held at zero and the "
        "report says so (prefect_odm.align.observability).",
    )
    max_block_height_change_m: float = Field(
        0.05,
        gt=0,
        description="A refinement from the products is refused (even under accept_alignment) "
        "when it moves a connected block's sample-weighted mean height at its submodels' own "
        "centres by more than this, metres: overlaps tell only relative heights.",
    )
    refine_bowl: bool = Field(
        True,
        description="In that refinement (and in an alignment from products alone) also solve a "
        "bowl per submodel, z += b * r^2 about its DSM's centre: the doming of nadir blocks from "
        "radial distortion (James and Robson 2014). Only the bowls relative to each other are "
        "measured: the block's mean bowl is held at zero.",
    )
