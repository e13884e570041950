"""The seams of each alignment stage, measured on the products, as pydantic records (pure core).

An alignment is applied in stages: the similarity from shared cameras (``cameras``, or
``products`` when the first stage is solved from the products alone), then the refinement from
the DSMs and orthophotos (``refined``). Each stage's seams are measured on the products it
corrects, as the merge places them (:mod:`prefect_odm.merge.overlaps_seams`); ``none`` records
the products as they are. :mod:`prefect_odm.align.stages` decides from them which stages apply.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

StageName = Literal["none", "cameras", "products", "refined"]


class DsmSeam(BaseModel):
    """Two DSMs against each other in their overlap, as corrected.

    Attributes:
        samples: co-located cells where both have a measured height (the merge's coarse
            overlap samples: about 250,000 per overlap, nearest at each coarse cell's centre).
        median_m: median of ``z_second - z_first``, metres.
        p90_m: 90th percentile of ``|z_second - z_first|``, metres.
    """

    model_config = ConfigDict(frozen=True)

    samples: int
    median_m: float
    p90_m: float


class OrthoSeam(BaseModel):
    """Two orthophotos against each other in their overlap, as corrected, by feature matches.

    Attributes:
        matches: features matched between the two (:mod:`prefect_odm.merge.overlaps_matches`).
        shift_m: median displacement ``(east, north)`` of a feature from the first to the
            second, metres.
        median_m: median length of the displacements, metres (a turn or scale between the two
            shows here, where the median displacement cancels it).
    """

    model_config = ConfigDict(frozen=True)

    matches: int
    shift_m: tuple[float, float]
    median_m: float


class OverlapSeam(BaseModel):
    """One overlap's seam measured on the corrected products (None: not measured)."""

    model_config = ConfigDict(frozen=True)

    overlap: str = Field(description="'first|second'.")
    first: str
    second: str
    orthophoto: OrthoSeam | None = None
    dsm: DsmSeam | None = None


class StageCheck(BaseModel):
    """One alignment stage, its seams measured on the products, and whether it is applied.

    Attributes:
        stage: ``none`` (the products as they are), ``cameras``, ``products`` or ``refined``.
        applied: the merge applies this stage's correction.
        seams: per overlap, the products corrected by this stage after the applied ones before.
        solver_rms_m: ``"first|second"`` -> the overlap rms the solver claims for this stage.
        reasons: why it is not applied (empty when applied).
        refused: not applied because the correction is beyond plausible or leans more than a
            raster correction can carry: ``accept_alignment`` does not apply it either.
        solved_on: for ``refined``, the stage whose corrected products it was solved on
            (``cameras``, or ``none`` when the camera step is not applied).
        notes: what else was decided (a camera step applied only with its refinement).
    """

    model_config = ConfigDict(frozen=True)

    stage: StageName
    applied: bool
    seams: list[OverlapSeam] = Field(default_factory=list)
    solver_rms_m: dict[str, float] = Field(default_factory=dict)
    reasons: list[str] = Field(default_factory=list)
    refused: bool = False
    solved_on: StageName | None = None
    notes: list[str] = Field(default_factory=list)
