"""Unit tests of the option check against a node's ``/options`` list (NodeODM's rules)."""

from __future__ import annotations

from typing import Any

import pytest

from prefect_odm.nodes.option_check import (
    OptionError,
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
        ("max-concurrency", -1, "not a positive integer"),
        ("max-concurrency", 2.5, "not an integer"),  # NodeODM would cut it to 2
        ("max-concurrency", True, "not an integer"),
        ("min-num-features", "ten", "not an integer"),
        ("orthophoto-resolution", 0, "out of range (float > 0.0)"),
        ("orthophoto-resolution", "3abc", "not a number"),  # NodeODM would read 3
        ("orthophoto-resolution", float("nan"), "not a finite number"),
        ("dem-gapfill-steps", 15, "out of range (integer: 1 <= x <= 14)"),
        ("crop", -0.5, "not a positive float"),
        ("feature-quality", "best", "not one of ultra, high, medium, low, lowest"),
        ("feature-quality", 5, "an enum value must be given as text"),
        ("boundary", "{not json", "not JSON text"),
        ("boundary", 3, "not JSON text"),
        ("pc-quality-pct", 101, "not a percentage (0 to 100)"),
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
        OptionError("crop", -1, "not a non-negative float (>= 0)")
    ]
    assert not nodeodm_understands_domain("bool")
    assert not nodeodm_understands_domain("non-negative integer")
    for entry in NODE_OPTIONS[:-1]:
        assert nodeodm_understands_domain(entry["domain"]), entry
    assert not nodeodm_understands_domain("integer or something")
