"""Unit tests of the option check against a node's ``/options`` list (NodeODM's rules)."""

from __future__ import annotations

import operator
import re
from typing import Any

import pytest

from prefect_odm.nodes.option_check import (
    OptionError,
    accepted_words,
    check_options,
    format_option_errors,
    nodeodm_understands_domain,
)


def opt(name: str, type_: str, domain: Any = "", value: str = "") -> dict[str, Any]:
    return {"name": name, "type": type_, "value": value, "domain": domain, "help": ""}


# entries as NodeODM 2.2.4 lists them (GET /options in test mode)
NODE_OPTIONS = [
    opt("dsm", "bool", "", "false"),
    opt("max-concurrency", "int", "positive integer", "4"),
    opt("min-num-features", "int", "integer", "10000"),
    opt("orthophoto-resolution", "float", "float > 0.0", "5"),
    opt("dem-gapfill-steps", "int", "integer: 1 <= x <= 14", "3"),
    opt("crop", "float", "positive float", "3"),
    opt("feature-quality", "enum", ["ultra", "high", "medium", "low", "lowest"], "high"),
    opt("boundary", "string", "json", ""),
    opt("sm-cluster", "string", "string", ""),
    opt("pc-quality-pct", "float", "percent", "50"),
    opt("weird", "int", "integer or something", "1"),
]


def errors_of(**options: Any) -> dict[str, str]:
    named = {k.replace("_", "-"): v for k, v in options.items()}
    return {e.name: e.reason for e in check_options(named, NODE_OPTIONS)}


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("dsm", True),
        ("dsm", "false"),
        ("dsm", "1"),
        ("max-concurrency", 0),
        ("max-concurrency", "8"),
        ("max-concurrency", 8.0),
        ("min-num-features", -5),
        ("orthophoto-resolution", 2.5),
        ("orthophoto-resolution", "0.1"),
        ("dem-gapfill-steps", 14),
        ("crop", 0),
        ("feature-quality", "ultra"),
        ("boundary", '{"type": "Polygon"}'),
        ("sm-cluster", "http://x"),
        ("pc-quality-pct", 100),
    ],
)
def test_valid_values(name: str, value: Any) -> None:
    assert check_options({name: value}, NODE_OPTIONS) == []


@pytest.mark.parametrize(
    ("name", "value", "reason"),
    [
        ("dsm", "maybe", "not a boolean"),
        ("dsm", 1, "not a boolean"),  # NodeODM refuses the number 1 too
        ("max-concurrency", -1, "outside the accepted range: an integer >= 0"),
        ("max-concurrency", 2.5, "not an integer"),  # NodeODM would cut it to 2
        ("max-concurrency", True, "not an integer"),
        ("min-num-features", "ten", "not an integer"),
        ("orthophoto-resolution", 0, "outside the accepted range: a number > 0"),
        (
            "orthophoto-resolution",
            "3abc",
            "not a number; accepted: a number > 0",
        ),  # NodeODM would read 3
        ("orthophoto-resolution", float("nan"), "not a finite number"),
        ("dem-gapfill-steps", 15, "outside the accepted range: an integer from 1 to 14"),
        ("crop", -0.5, "outside the accepted range: a number >= 0"),
        ("feature-quality", "best", "not one of ultra, high, medium, low, lowest"),
        ("feature-quality", 5, "an enum value must be given as text"),
        ("boundary", "{not json", "not JSON text"),
        ("boundary", 3, "not JSON text"),
        ("pc-quality-pct", 101, "outside the accepted range: a number from 0 to 100"),
        ("weird", 1, "cannot be checked"),
    ],
)
def test_invalid_values(name: str, value: Any, reason: str) -> None:
    errors = check_options({name: value}, NODE_OPTIONS)
    assert len(errors) == 1
    assert errors[0].name == name and reason in errors[0].reason


def test_unknown_name_with_a_suggestion() -> None:
    reason = errors_of(feature_qualty="high")["feature-qualty"]
    assert "unknown option" in reason and "feature-quality" in reason


def test_one_error_per_bad_option_in_the_given_order() -> None:
    options = {"dsm": "x", "crop": 1, "nope": 1, "max-concurrency": -3}
    errors = check_options(options, NODE_OPTIONS)
    assert [e.name for e in errors] == ["dsm", "nope", "max-concurrency"]
    message = format_option_errors(errors, "http://node:3000")
    assert message.startswith("3 option(s) not accepted by http://node:3000")
    assert message.count("\n  - option ") == 3
    assert str(errors[0]) == "option dsm='x': not a boolean (true, false, 1 or 0)"


def test_the_engine_words_are_understood_but_flagged() -> None:
    engine = [opt("dtm", "bool", "bool", "false"), opt("crop", "float", "non-negative float", "3")]
    assert check_options({"dtm": True, "crop": 0}, engine) == []
    assert check_options({"crop": -1}, engine) == [
        OptionError("crop", -1, "outside the accepted range: a number >= 0")
    ]
    assert not nodeodm_understands_domain("bool")
    assert not nodeodm_understands_domain("non-negative integer")
    for entry in NODE_OPTIONS[:-1]:
        assert nodeodm_understands_domain(entry["domain"]), entry
    assert not nodeodm_understands_domain("integer or something")


def _words_accept(words: str, value: float) -> bool:
    """Whether ``value`` is in the range ``words`` says (``a number >= 0``, ``an integer
    from 1 to 14``), read as a user reads it."""
    if words.startswith("an integer") and not float(value).is_integer():
        return False
    if match := re.search(r"from (\S+) to (\S+)$", words):
        return float(match.group(1)) <= value <= float(match.group(2))
    if match := re.search(r"(>=|>|<=|<) (\S+)$", words):
        ops = {">=": operator.ge, ">": operator.gt, "<=": operator.le, "<": operator.lt}
        return bool(ops[match.group(1)](value, float(match.group(2))))
    return True


def test_each_numeric_option_of_the_engine_says_the_range_it_accepts() -> None:
    """``--option dem-resolution=-1`` said "not a positive float (>= 0)" (a new user's trial):
    0 is accepted (automatic), so "positive" was untrue. Every numeric option of the built-in
    engine's table is refused naming the option, the value and the range it accepts, and the
    range said is the range checked."""
    from prefect_odm.engine.pipeline_options import OPTIONS

    [error] = check_options({"dem-resolution": -1}, OPTIONS)
    assert str(error) == "option dem-resolution=-1: outside the accepted range: a number >= 0"
    checked = 0
    for entry in OPTIONS:
        words = accepted_words(entry["domain"])
        if words is None or entry["type"] not in ("int", "float"):
            continue
        for value in (-1, 0, 0.5, 1, 14, 15, 101, 1e6):
            if entry["type"] == "int" and not float(value).is_integer():
                continue
            errors = check_options({entry["name"]: value}, OPTIONS)
            assert (errors == []) == _words_accept(words, value), (entry["name"], value, words)
            if errors and words not in ("an integer", "a number"):
                assert errors[0].reason == f"outside the accepted range: {words}"
                assert str(errors[0]).startswith(f"option {entry['name']}={value!r}: ")
            checked += 1
    assert checked > 60
    [typo] = check_options({"dem-gapfill-steps": "three"}, OPTIONS)
    assert typo.reason == "not an integer; accepted: an integer >= 0"
