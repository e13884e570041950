"""The photogrammetry pipeline's options: the list NodeODM's ``/options`` shows, typed values.

:data:`OPTIONS` is the pipeline's contract with the server (``name``, ``type``, ``value``,
``domain``, ``help`` as NodeODM lists them; :mod:`.options` turns it into the ``/options`` answer
and validates clients' values). :func:`settings` gives the typed value of every option for one run.
ODM options the engine does not implement are accepted and ignored, so ODM option sets pass.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping

from prefect_odm.engine.api_records import OptionEntry
from prefect_odm.errors import InputError
from prefect_odm.models import OptionValue
from prefect_odm.plan.depthmaps import PC_QUALITY_LEVELS

STAGES: tuple[str, ...] = (
    "dataset",
    "opensfm",
    "openmvs",
    "odm_dem",
    "odm_orthophoto",
    "odm_georeferencing",
    "odm_report",
)
"""Stage names, in processing order (ODM's names; ``openmvs`` is the dense matching, a no-op
with ``fast-orthophoto`` or the direct method; georeferencing after the orthophoto because the
direct method colours its points from the orthophoto)."""

METHODS: tuple[str, ...] = ("sfm", "direct")

FEATURE_QUALITY_MAX_FEATURES: dict[str, int] = {
    "ultra": 12000,
    "high": 6000,
    "medium": 4000,
    "low": 2500,
    "lowest": 1500,
}
"""ODM's ``feature-quality`` levels -> SIFT features per image."""


def option(name: str, type_: str, value: str, domain: str | list[str], help_: str) -> OptionEntry:
    """One entry of :data:`OPTIONS` as NodeODM lists it (``value``: the default, as text)."""
    return {"name": name, "type": type_, "value": value, "domain": domain, "help": help_}


def bool_option(name: str, help_: str) -> OptionEntry:
    """A boolean option, false by default (domain ``""``: no check, as NodeODM lists them)."""
    return option(name, "bool", "false", "", help_)


def enum_option(name: str, value: str, domain: list[str], help_: str) -> OptionEntry:
    """An option taking one of ``domain`` (default ``value``)."""
    return option(name, "enum", value, domain, help_)


def stage_option(name: str, value: str, help_: str) -> OptionEntry:
    """An option naming one of :data:`STAGES` (``end-with``, ``rerun-from``).

    A default outside the stages (``rerun-from``'s ``""``) is put first in the domain, as NodeODM
    does (``odmInfo.js``: ``domain.unshift(value)``), so every default is valid.
    """
    domain = list(STAGES) if value in STAGES else [value, *STAGES]
    return enum_option(name, value, domain, help_)


DEM_RESOLUTION_DEFAULT = "0"
"""The engine's ``dem-resolution`` default: automatic (ODM's is 5 cm, capped at the GSD; the
engine's dense DSM at 5 cm would hold a point in few cells, see ``stages.DENSE_DEM_TO_SPACING``)."""

FAST_ORTHOPHOTO_DEFAULT = "false"
"""The engine's ``fast-orthophoto`` default (ODM's: false, i.e. dense matching)."""

OPTIONS: list[OptionEntry] = [
    option(
        "orthophoto-resolution",
        "float",
        "5",
        "float > 0.0",
        "Orthophoto resolution in cm/pixel; never finer than the estimated GSD. Default: 5",
    ),
    option(
        "dem-resolution",
        "float",
        DEM_RESOLUTION_DEFAULT,
        "positive float",
        "DSM/DTM resolution in cm/pixel, on the orthophoto's grid: rounded to the nearest whole "
        "number of orthophoto cells, never finer than one (ODM caps it at the GSD). 0: "
        "automatic, 2.4 depth-map sample spacings (GSD / the pc-quality image scale) with dense "
        "matching, 4 orthophoto cells without (fast-orthophoto, direct). Default: "
        f"{DEM_RESOLUTION_DEFAULT}",
    ),
    bool_option("dsm", "Build a digital surface model. Default: false"),
    bool_option(
        "dtm",
        "Build a digital terrain model (ground cells by the simple morphological filter, SMRF). "
        "Default: false",
    ),
    option(
        "fast-orthophoto",
        "bool",
        FAST_ORTHOPHOTO_DEFAULT,
        "",
        "Skip dense matching: the DSM and the point cloud come from the sparse tie points. "
        f"Default: {FAST_ORTHOPHOTO_DEFAULT}",
    ),
    enum_option(
        "pc-quality",
        "medium",
        list(PC_QUALITY_LEVELS),
        "Dense matching depth-map size, as ODM picks it (opendm get_depthmap_resolution and "
        "OpenMVS's --min-resolution): the largest image side x ultra 0.5, high 0.25, medium "
        "0.125, low 0.0675, lowest 0.03375, x2 below 6 MP (x0.5 above 42 MP), as a power-of-two "
        "reduction of the image that stays at least 640 px (320 at low and lowest) and never "
        "enlarges it: 1600 px images give 800 px depth maps (image scale 0.5) at medium, "
        "1200 px images keep their size. Each step up costs about 4x. Default: medium",
    ),
    option(
        "pc-sample",
        "float",
        "0",
        "positive float",
        "Keep one dense point per cube of this side in metres (0: keep all). Default: 0",
    ),
    option(
        "dem-gapfill-steps",
        "int",
        "3",
        "positive integer",
        "Fill DEM holes within resolution x 2^N of a measured cell (0: no filling); larger "
        "holes stay nodata. Default: 3",
    ),
    option(
        "smrf-scalar",
        "float",
        "1.25",
        "positive float",
        "SMRF ground filter: elevation scaling factor. Default: 1.25",
    ),
    option(
        "smrf-slope",
        "float",
        "0.15",
        "float > 0.0",
        "SMRF ground filter: slope (rise over run) of the terrain. Default: 0.15",
    ),
    option(
        "smrf-threshold",
        "float",
        "0.5",
        "positive float",
        "SMRF ground filter: elevation threshold in metres. Default: 0.5",
    ),
    option(
        "smrf-window",
        "float",
        "18.0",
        "float > 0.0",
        "SMRF ground filter: window radius in metres (largest object removed). Default: 18.0",
    ),
    option(
        "gps-accuracy",
        "float",
        "3",
        "float > 0.0",
        "Standard deviation of the GPS positions in metres: the weight of the position priors "
        "in the bundle adjustment. Default: 3",
    ),
    enum_option(
        "pipeline",
        "sfm",
        list(METHODS),
        "Reconstruction method: sfm (structure from motion with pycolmap) or direct "
        "(direct georeferencing from GPS and attitude, no SfM). Default: sfm",
    ),
    option(
        "resize-to",
        "int",
        "2048",
        "integer",
        "Resize images to this many pixels on the long side for feature extraction "
        "(-1: no resizing). Default: 2048",
    ),
    enum_option(
        "feature-quality",
        "high",
        list(FEATURE_QUALITY_MAX_FEATURES),
        "Number of SIFT features per image: ultra 12000, high 6000, medium 4000, low 2500, "
        "lowest 1500. Default: high",
    ),
    option(
        "matcher-neighbors",
        "int",
        "0",
        "positive integer",
        "Match each image with this many nearest images by GPS (0: 20). Default: 0",
    ),
    option(
        "cameras",
        "string",
        "",
        "json",
        "Camera calibrations to use instead of calibrating (the JSON text of a cameras.json, as "
        "ODM writes it and takes it with --cameras): a camera found there keeps its focal "
        "length, principal point and radial terms fixed in structure from motion. Default: none",
    ),
    stage_option("end-with", "odm_report", "End processing at this stage. Default: odm_report"),
    stage_option(
        "rerun-from", "", "Rerun processing from this stage, reusing the earlier stages' results."
    ),
    option(
        "max-concurrency",
        "int",
        str(os.cpu_count() or 1),
        "integer > 0",
        "Maximum number of threads. Default: number of CPUs",
    ),
]
"""The options of the pipeline, in the order ``/options`` lists them.

Domains are in NodeODM's vocabulary (``libs/odmInfo.js`` ``filterOptions``), which ClusterODM and
NodeODM clients check values with: ``positive integer|float`` means >= 0 (ODM's own wording), an
option that needs more says so as ``float > 0.0`` / ``integer > 0``, booleans have domain ``""``.
"""

_IGNORED_HELP = "Accepted for ODM compatibility; ignored."

# names ODM has that the engine accepts and ignores
OPTIONS += [
    bool_option(name, _IGNORED_HELP)
    for name in (
        "skip-3dmodel skip-report use-3dmesh cog build-overviews "
        "optimize-disk-space auto-boundary orthophoto-cutline pc-ept pc-copc"
    ).split()
]
OPTIONS += [
    option(name, type_, value, domain, _IGNORED_HELP)
    for name, type_, value, domain in (
        ("min-num-features", "int", "10000", "integer"),
        ("mesh-size", "int", "200000", "positive integer"),
        ("crop", "float", "3", "positive float"),
        ("split", "int", "999999", "positive integer"),
        ("split-overlap", "float", "150", "positive float"),
        ("sm-cluster", "string", "", "string"),
    )
]
OPTIONS += [
    enum_option(
        "orthophoto-compression",
        "DEFLATE",
        ["JPEG", "LZW", "PACKBITS", "DEFLATE", "LZMA", "NONE"],
        _IGNORED_HELP,
    )
]

SPECS: dict[str, OptionEntry] = {o["name"]: o for o in OPTIONS}
"""Option name -> its :data:`OPTIONS` entry."""


def _number(value: OptionValue | None) -> float:
    """``value`` as a float (ValueError when it is None or text that is not a number)."""
    if value is None:
        raise ValueError(value)
    return float(value)


def coerce(name: str, value: OptionValue | None) -> OptionValue:
    """The typed value of option ``name`` (bool, int, float or text).

    Raises:
        InputError: the value does not convert or is not in the enum's domain.
    """
    spec = SPECS[name]
    kind = spec["type"]
    try:
        if kind == "bool":
            if isinstance(value, bool):
                return value
            text = str(value).strip().lower()
            if text not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError(value)
            return text in ("true", "1", "yes")
        if kind == "int":
            number = _number(value)
            if number != int(number):
                raise ValueError(value)
            return int(number)
        if kind == "float":
            number = _number(value)
            if not math.isfinite(number):
                raise ValueError(value)
            return number
        text = "" if value is None else str(value)
        if kind == "enum" and text and text not in spec["domain"]:
            raise ValueError(value)
        return text
    except (TypeError, ValueError) as exc:
        raise InputError(f"option {name}: invalid value {value!r}") from exc


def settings(options: Mapping[str, OptionValue | None]) -> dict[str, OptionValue]:
    """Defaults of :data:`OPTIONS` overlaid with ``options`` (typed). Unknown names are ignored.

    Raises:
        InputError: a value does not convert, or ``orthophoto-resolution`` is not positive.
    """
    settings = {name: coerce(name, spec["value"]) for name, spec in SPECS.items()}
    for name, value in options.items():
        if name in SPECS and value is not None:
            settings[name] = coerce(name, value)
    resolution = settings["orthophoto-resolution"]
    if not isinstance(resolution, int | float) or resolution <= 0:
        raise InputError("option orthophoto-resolution must be greater than zero")
    return settings
