"""Processing options of the built-in engine: the ``/options`` list and NodeODM-style validation.

The option list comes from the photogrammetry pipeline (``pipeline.OPTIONS``); this module only
turns it into NodeODM's ``/options`` answer and checks a client's ``[{"name", "value"}]`` list
against it the way NodeODM does: a bad enum, a number out of its domain or a non-boolean gives a
per-option error list; unknown names are dropped (and reported by the engine in the task output).
"""

from __future__ import annotations

import importlib
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

from pydantic import JsonValue

from prefect_odm.engine.api_records import (
    ClientOption,
    GivenOption,
    OptionEntry,
    TypedOptions,
)
from prefect_odm.errors import InputError
from prefect_odm.models import OptionValue
from prefect_odm.nodes.option_check import BOOL_TEXT, OptionValueError, check_domain

PIPELINE_MODULE = "prefect_odm.engine.pipeline"


class Pipeline(Protocol):
    """The contract of :mod:`prefect_odm.engine.pipeline` (see that module)."""

    STAGES: tuple[str, ...]
    OPTIONS: list[OptionEntry]

    def run(
        self,
        task_dir: Any,
        options: Mapping[str, OptionValue | None],
        *,
        rerun_from: str | None = ...,
        log: Any = ...,
    ) -> None:
        """Process ``task_dir/images`` into ODM's outputs with the typed ``options``, from the
        stage ``rerun_from`` on, one progress line at a time to ``log``."""
        ...


def load_pipeline(*, stand_in: bool = False) -> Pipeline:
    """Import the photogrammetry pipeline (or the stand-in of :mod:`.faults`).

    Raises:
        ImportError: the pipeline (or pycolmap, which it needs) is not installed.
    """
    if stand_in:
        from prefect_odm.engine.faults import STAND_IN_PIPELINE

        return STAND_IN_PIPELINE
    return cast(Pipeline, importlib.import_module(PIPELINE_MODULE))


@dataclass(frozen=True)
class OptionSpec:
    """One entry of ``/options``: NodeODM's ``name``, ``type``, ``value``, ``domain``, ``help``."""

    name: str
    type: str
    value: str
    domain: str | list[str]
    help: str = ""

    def to_dict(self) -> OptionEntry:
        """The entry as NodeODM answers it (``value`` always a string)."""
        domain = list(self.domain) if isinstance(self.domain, list) else self.domain
        return {
            "name": self.name,
            "type": self.type,
            "value": self.value,
            "domain": domain,
            "help": self.help,
        }


@dataclass(frozen=True)
class ValidatedOptions:
    """The outcome of :func:`validate_options`.

    Attributes:
        typed: option name -> typed value for EVERY known option (defaults filled in).
        given: the known options as the client gave them, ``[{"name", "value"}]`` (typed values).
        ignored: names of unknown options, dropped.
        errors: ``[{"name", "error"}]`` for invalid values (empty when valid).
    """

    typed: TypedOptions
    given: list[GivenOption]
    ignored: list[str] = field(default_factory=list)
    errors: list[dict[str, str]] = field(default_factory=list)


def option_specs(
    raw_options: Iterable[OptionEntry], *, method: str | None = None
) -> list[OptionSpec]:
    """Build the option list from a pipeline's ``OPTIONS``.

    Args:
        raw_options: ``pipeline.OPTIONS`` entries.
        method: when given, the default of the ``pipeline`` option (``"sfm"`` or ``"direct"``).

    Raises:
        InputError: ``method`` is not in the ``pipeline`` option's domain.
    """
    specs: list[OptionSpec] = []
    for entry in raw_options:
        domain = entry["domain"]
        spec = OptionSpec(
            name=entry["name"],
            type=entry["type"],
            value=entry["value"],
            domain=list(domain) if isinstance(domain, list) else domain,
            help=entry["help"],
        )
        if method is not None and spec.name == "pipeline":
            if isinstance(spec.domain, list) and method not in spec.domain:
                raise InputError(f"unknown method {method!r}; expected one of {spec.domain}")
            spec = OptionSpec(spec.name, spec.type, method, spec.domain, spec.help)
        specs.append(spec)
    return specs


def _to_text(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def parse_options_text(
    text: str | list[JsonValue] | dict[str, JsonValue] | None,
) -> list[ClientOption]:
    """Parse the ``options`` field (JSON text of ``[{"name": .., "value": ..}]``).

    An empty field means no options. A JSON object ``{"name": value}`` is accepted too, and so
    is the already parsed list (or object) a JSON request body carries.

    Raises:
        InputError: the text is not JSON or not a list of ``{"name", "value"}`` objects.
    """
    if isinstance(text, list | dict):
        data: JsonValue = text
    elif text is None or not str(text).strip():
        return []
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InputError(f"Invalid options: {exc}") from exc
    if isinstance(data, dict):
        return [{"name": k, "value": v} for k, v in data.items()]
    if not isinstance(data, list):
        raise InputError('Invalid options: expected a JSON list of {"name", "value"} objects')
    items: list[ClientOption] = []
    for item in data:
        if not isinstance(item, dict) or "name" not in item:
            raise InputError('Invalid options: expected a JSON list of {"name", "value"} objects')
        items.append({"name": str(item["name"]), "value": item.get("value")})
    return items


def _check_number_domain(value: float, domain: str) -> str | None:
    """Return an error text when ``value`` is outside a NodeODM number domain, else None.

    NodeODM's rules (:func:`prefect_odm.nodes.option_check.check_domain`): ``positive`` means >= 0,
    ``float > 0.0`` and the other comparisons, ``integer: A <= x <= B``, ``percent``.
    """
    try:
        check_domain(domain, value)
    except OptionValueError as exc:
        return str(exc)
    return None


def coerce_value(spec: OptionSpec, value: JsonValue) -> OptionValue:
    """Convert a client value to the option's type and check its domain.

    Raises:
        InputError: the value cannot be converted or is outside the domain (message is the
            per-option error text).
    """
    if spec.type == "bool":
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in BOOL_TEXT:
            return BOOL_TEXT[value.strip().lower()]
        raise InputError(f"Invalid boolean value: {value!r}")
    if spec.type in ("int", "float"):
        if not isinstance(value, int | float | str) or isinstance(value, bool):
            raise InputError(f"Invalid {spec.type} value: {value!r}")
        try:
            number: int | float = float(value)
        except ValueError as exc:
            raise InputError(f"Invalid {spec.type} value: {value!r}") from exc
        if not math.isfinite(number):
            raise InputError(f"Invalid {spec.type} value: {value!r}")
        if spec.type == "int":
            if number != int(number):
                raise InputError(f"Invalid int value: {value!r}")
            number = int(number)
        problem = _check_number_domain(number, str(spec.domain))
        if problem:
            raise InputError(f"Value {value!r} {problem} ({spec.domain})")
        return number
    if spec.type == "enum":
        text = _to_text(value)
        if not isinstance(spec.domain, list) or text not in spec.domain:
            raise InputError(f"Invalid value {text!r}: must be one of {spec.domain}")
        return text
    if value is None:
        return ""
    return _to_text(value) if not isinstance(value, str) else value


def default_value(spec: OptionSpec) -> OptionValue | None:
    """The typed default of an option (``None`` when the default is empty or not convertible)."""
    if spec.value == "":
        return None if spec.type != "string" else ""
    try:
        return coerce_value(spec, spec.value)
    except InputError:
        return None


def validate_options(
    given: Iterable[ClientOption], specs: Iterable[OptionSpec]
) -> ValidatedOptions:
    """Check client options against the option list, as NodeODM does.

    Args:
        given: ``[{"name", "value"}]`` from the client.
        specs: the engine's option list.

    Returns:
        The typed options (defaults filled in), the known given options, the ignored names and
        the per-option errors. The caller decides what to do with errors.
    """
    by_name = {spec.name: spec for spec in specs}
    typed = {name: default_value(spec) for name, spec in by_name.items()}
    kept: list[GivenOption] = []
    ignored: list[str] = []
    errors: list[dict[str, str]] = []
    for item in given:
        name = item["name"]
        spec = by_name.get(name)
        if spec is None:
            ignored.append(name)
            continue
        try:
            value = coerce_value(spec, item.get("value"))
        except InputError as exc:
            errors.append({"name": name, "error": str(exc)})
            continue
        typed[name] = value
        kept = [o for o in kept if o["name"] != name]
        kept.append({"name": name, "value": value})
    return ValidatedOptions(typed=typed, given=kept, ignored=ignored, errors=errors)
