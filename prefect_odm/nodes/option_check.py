"""Check task options against a node's ``/options`` list before anything is uploaded (pure).

NodeODM validates options at ``/task/new/init`` (``libs/odmInfo.js`` ``filterOptions``): it
converts each value to the option's ``type`` and checks it against the ``domain``, answering one
``{name, error}`` per bad value, and it **silently drops unknown names**. This module applies the
same rules on our side so that every bad option, unknown names included, gives one clear error
before a single image is sent, and the manifest and fingerprint never carry an option the node
ignored.

Rules (NodeODM's, with the two places where we are stricter marked *):

* ``bool``: ``True``/``False`` or the text ``"true"``, ``"false"``, ``"1"``, ``"0"``.
* ``int``: an integer, or text of one; * a fractional number is refused (NodeODM's ``parseInt``
  would cut ``2.5`` to ``2`` without a word).
* ``float``: a finite number, or text of one; * ``"3abc"`` is refused (``parseFloat`` reads 3).
* ``string``/``path``: any text; ``enum``: one of the ``domain`` list, compared as text values
  exactly as given (NodeODM compares with ``indexOf``: the number ``5`` is not ``"5"``).
* domains: ``""`` (no check), ``integer``/``float`` (any), ``positive integer|float`` (>= 0, as
  NodeODM has it), ``negative ...`` (<= 0), ``percent`` (0..100), ``integer: A <= x <= B``,
  ``float > 0.0`` and the other comparisons, ``json`` (text that parses as JSON), ``string``,
  ``path``. Any other domain is an error, as it is on NodeODM ("Domain value cannot be handled").
* the built-in engine's own words are understood too (``bool``: no check; ``non-negative
  integer|float``: >= 0), although NodeODM's validator (and ClusterODM's, which checks options
  against its reference node's list) refuses them: :func:`nodeodm_understands_domain` tells.

A refused number names the range it is checked against, in plain words
(:func:`accepted_words`): ``positive float`` is "a number >= 0", as NodeODM checks it, not
"positive" (0 is a valid ``dem-resolution``: automatic).
"""

from __future__ import annotations

import difflib
import json
import math
import operator
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

BOOL_TEXT = {"true": True, "1": True, "false": False, "0": False}
_INT_TEXT = re.compile(r"^\s*[+-]?\d+\s*$")
_COMPARE: dict[str, Callable[[float, float], bool]] = {
    ">=": operator.ge,
    ">": operator.gt,
    "<=": operator.le,
    "<": operator.lt,
}
_SIGNED = re.compile(r"^(positive |negative |non-negative )?(integer|float)$")
_RANGE = re.compile(r"^(float|integer): ([\-+.\d]+) <= x <= ([\-+.\d]+)$")
_BOUND = re.compile(r"^(float|integer) (>=|>|<|<=) ([\-+.\d]+)$")


class OptionValueError(ValueError):
    """One value that does not fit its option (internal; turned into an :class:`OptionError`)."""


@dataclass(frozen=True)
class OptionError:
    """One bad option.

    Attributes:
        name: the option name as given.
        value: the value as given.
        reason: what is wrong, in words a user can act on.
    """

    name: str
    value: Any
    reason: str

    def __str__(self) -> str:
        """``option NAME=VALUE: reason``, the line the user reads."""
        return f"option {self.name}={self.value!r}: {self.reason}"


def check_options(
    options: Mapping[str, Any], node_options: Sequence[Mapping[str, Any]]
) -> list[OptionError]:
    """Check ``options`` against a node's ``/options`` list.

    Args:
        options: option name -> value, as they would be sent (``options_to_json``).
        node_options: the node's ``GET /options`` answer, entries with ``name``, ``type``,
            ``value``, ``domain``.

    Returns:
        One :class:`OptionError` per bad option, in the order of ``options``; empty when all fit.
    """
    known = {str(entry["name"]): entry for entry in node_options}
    errors: list[OptionError] = []
    for name, value in options.items():
        entry = known.get(name)
        if entry is None:
            errors.append(OptionError(name, value, _unknown_reason(name, known)))
            continue
        kind, domain = str(entry.get("type", "string")), entry.get("domain", "")
        try:
            typed = convert_value(kind, value)
        except OptionValueError as exc:
            accepted = accepted_words(domain) if kind in ("int", "float") else None
            more = f"; accepted: {accepted}" if accepted not in (None, *_ANY_NUMBER) else ""
            errors.append(OptionError(name, value, f"{exc}{more}"))
            continue
        try:
            check_domain(domain, typed)
        except OptionValueError as exc:
            errors.append(OptionError(name, value, str(exc)))
    return errors


_ANY_NUMBER = ("an integer", "a number")
"""What the unbounded domains accept: a type error already says so."""


def accepted_words(domain: Any) -> str | None:
    """What a numeric domain accepts, in words: ``positive float`` (NodeODM's, >= 0) is ``a
    number >= 0``, ``integer: 1 <= x <= 14`` is ``an integer from 1 to 14``, ``float > 0.0`` is
    ``a number > 0``, ``percent`` is ``a number from 0 to 100``; None for any other domain."""
    text = "" if isinstance(domain, list | tuple) else str(domain or "").strip()
    if text == "percent":
        return "a number from 0 to 100"
    for pattern in (_SIGNED, _RANGE, _BOUND):
        if match := pattern.match(text):
            break
    else:
        return None
    kind = match.group(2) if pattern is _SIGNED else match.group(1)
    noun = "an integer" if kind == "integer" else "a number"
    if pattern is _RANGE:
        return f"{noun} from {float(match.group(2)):g} to {float(match.group(3)):g}"
    if pattern is _BOUND:
        return f"{noun} {match.group(2)} {float(match.group(3)):g}"
    sign = match.group(1)
    if sign in ("positive ", "non-negative "):
        return f"{noun} >= 0"
    return f"{noun} <= 0" if sign == "negative " else noun


def format_option_errors(errors: Sequence[OptionError], node_url: str) -> str:
    """One message for all bad options (one line each), naming the node whose list was used."""
    lines = "\n".join(f"  - {error}" for error in errors)
    return f"{len(errors)} option(s) not accepted by {node_url} (from its /options):\n{lines}"


def _unknown_reason(name: str, known: Mapping[str, Any]) -> str:
    close = difflib.get_close_matches(name, list(known), n=3)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    return f"unknown option: the node does not list it and would drop it silently{hint}"


def convert_value(kind: str, value: Any) -> Any:
    """``value`` converted to NodeODM's option ``kind`` (bool, int, float, string, path, enum).

    Raises:
        OptionValueError: the value is not of that type.
    """
    if kind == "bool":
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in BOOL_TEXT:
            return BOOL_TEXT[value.strip().lower()]
        raise OptionValueError("not a boolean (true, false, 1 or 0)")
    if kind == "int":
        return _to_int(value)
    if kind == "float":
        return _to_float(value)
    if kind in ("string", "path", "enum"):
        if isinstance(value, str):
            return value
        if kind == "enum":
            raise OptionValueError("an enum value must be given as text")
        if isinstance(value, int | float) and not isinstance(value, bool):
            return value  # NodeODM passes it on unchanged (a ``json`` domain then refuses it)
        raise OptionValueError("not text")
    raise OptionValueError(f"the node lists type {kind!r}, which cannot be checked")


def _to_int(value: Any) -> int:
    if isinstance(value, bool):
        raise OptionValueError("not an integer")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    if isinstance(value, str) and _INT_TEXT.match(value):
        return int(value)
    raise OptionValueError("not an integer")


def _to_float(value: Any) -> float:
    if isinstance(value, bool):
        raise OptionValueError("not a number")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise OptionValueError("not a number") from None
    if not math.isfinite(number):
        raise OptionValueError("not a finite number")
    return number


def check_domain(domain: Any, value: Any) -> None:
    """Check a converted value against an option's ``domain`` (NodeODM's ``checkDomain``).

    Raises:
        OptionValueError: the value is outside the domain, or the domain is not understood.
    """
    if isinstance(domain, list | tuple):
        if value not in domain:
            raise OptionValueError(f"not one of {', '.join(map(str, domain))}")
        return
    text = str(domain or "").strip()
    if not text or text in ("string", "path", "bool"):
        return
    if text == "json":
        try:
            if not isinstance(value, str):
                raise TypeError(value)
            json.loads(value)
        except (TypeError, ValueError):
            raise OptionValueError("not JSON text") from None
        return
    outside = f"outside the accepted range: {accepted_words(text)}"
    if text == "percent":
        _require(0 <= _number(value) <= 100, outside)
        return
    if match := _SIGNED.match(text):
        sign, kind = match.groups()
        number = _number(value)
        if sign in ("positive ", "non-negative "):
            _require(number >= 0, outside)
        elif sign == "negative ":
            _require(number <= 0, outside)
        elif kind == "integer":
            _require(float(number).is_integer(), "not an integer")
        return
    if match := _RANGE.match(text):
        low, high = float(match.group(2)), float(match.group(3))
        _require(low <= _number(value) <= high, outside)
        return
    if match := _BOUND.match(text):
        bound = float(match.group(3))
        _require(_COMPARE[match.group(2)](_number(value), bound), outside)
        return
    raise OptionValueError(f"the node's domain {text!r} cannot be checked (NodeODM refuses it too)")


def nodeodm_understands_domain(domain: Any) -> bool:
    """True when NodeODM 2.2's ``filterOptions`` can check a value against ``domain``.

    A node that lists other domains cannot be fronted by ClusterODM, which validates with the
    same code (``libs/odmOptions.js``) against its reference node's list.
    """
    if isinstance(domain, list | tuple):
        return True
    text = str(domain or "").strip()
    if not text or text in ("json", "percent", "string", "path"):
        return True
    if text.startswith("non-negative "):
        return False
    return any(p.match(text) for p in (_SIGNED, _RANGE, _BOUND))


def _number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise OptionValueError("not a number")
    return float(value)


def _require(condition: bool, reason: str) -> None:
    if not condition:
        raise OptionValueError(reason)
