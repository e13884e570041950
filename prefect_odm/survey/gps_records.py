"""The records of the plan-time GPS checks (pure core: pydantic only).

Kept apart from :mod:`prefect_odm.survey.gps_quality` (numpy, scipy) so that :mod:`prefect_odm.models`
can type :attr:`~prefect_odm.models.SplitPlan.gps_warnings` without importing numpy.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

GpsWarningKind = Literal["altitude_trend", "altitude_jump", "implausible_speed", "position_jump"]


class GpsQualityOptions(BaseModel):
    """Thresholds of the GPS checks."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_altitude_drift_m: float = Field(10.0, gt=0, description="Altitude trend over a flight.")
    max_speed_m_s: float = Field(30.0, gt=0, description="Fastest plausible speed between shots.")
    time_resolution_s: float = Field(1.0, ge=0, description="Resolution of the capture times.")
    jump_m: float = Field(20.0, gt=0, description="A constant-velocity miss this large is a jump.")
    max_jump_share: float = Field(0.1, ge=0, le=1, description="Share of jumping shots allowed.")
    altitude_jump_m: float = Field(
        10.0, gt=0, description="An altitude this far off the flight's altitude trend is a jump."
    )
    flight_gap_s: float = Field(120.0, gt=0, description="A longer pause starts a new flight.")
    min_images: int = Field(8, ge=3, description="Shorter flights are not checked.")


class GpsWarning(BaseModel):
    """One problem the camera GPS shows before any compute."""

    kind: GpsWarningKind
    images: list[str] = Field(description="The images concerned (first and last for a trend).")
    value: float = Field(
        description="Drift (m), speed (m/s) or share of jumping shots (positions or altitudes)."
    )
    threshold: float = Field(description="The option the value exceeded, same unit.")
    message: str = Field(description="One line for a person, naming the images.")


class AltitudeCorrection(BaseModel):
    """The camera altitudes a plan uses instead of GPS altitudes it found unreliable.

    Each camera's altitude is its flight's take-off height plus its barometric height above
    take-off (DJI ``RelativeAltitude``): the plan's camera heights (``CameraPosition.z_m``) are
    these, and every node gets them as ODM's ``geo.txt``.
    """

    model_config = ConfigDict(frozen=True)

    reasons: list[GpsWarningKind] = Field(description="The GPS warnings that asked for it.")
    take_off_m: list[float] = Field(
        description="Each flight's take-off height in the GPS datum, metres, in flight order: "
        "the flight's trend of GPS minus relative altitude at its first shot."
    )
    message: str = Field(description="One line for a person: what the reconstruction uses.")
