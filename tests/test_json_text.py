"""storage.json_text: orjson's speed, ``json.dumps(indent=2, sort_keys=True, default=str)``'s
text byte for byte, including where orjson alone would write otherwise."""

from __future__ import annotations

import dataclasses
import datetime
import enum
import json
import random
import struct
from typing import Any

import numpy as np
import pytest

from prefect_odm.storage import json_text


class _Colour(enum.Enum):
    RED = 1


@dataclasses.dataclass
class _Point:
    x_m: float = 1.0


def _reference(value: Any) -> bytes:
    return (json.dumps(value, indent=2, sort_keys=True, default=str) + "\n").encode()


@pytest.mark.parametrize(
    "value",
    [
        {"b": 1, "a": [1.5, None, "x", True], "c": {}, "d": []},
        {"nan": float("nan"), "inf": float("-inf")},
        {1: 2, 10: 3},
        {"big": 2**70},
        {"name": "IMG_é.jpg"},
        {"small": 1e-7, "smaller": 3.25e-05, "text": "1e-7 0.00001"},
        {"when": datetime.datetime(2026, 1, 1, 9), "day": datetime.date(2026, 1, 2)},
        {"enum": _Colour.RED, "dataclass": _Point(), "tuple": (1, 2)},
        {"np_float": np.float64(1.5), "np_int": np.int64(3), "array": np.arange(3)},
        [],
        "text",
    ],
)
def test_json_text_is_the_json_modules_text(value: Any) -> None:
    assert json_text(value) == _reference(value)


def test_json_text_floats_as_json_writes_them() -> None:
    rng = random.Random(33)
    values = [struct.unpack("d", rng.randbytes(8))[0] for _ in range(5000)]
    values += [rng.uniform(-1, 1) * 10.0 ** rng.randint(-12, 20) for _ in range(5000)]
    values = [v for v in values if v == v and abs(v) != float("inf")]
    for v in values[:: len(values) // 200]:  # one at a time: each may fall back alone
        assert json_text({"v": v}) == _reference({"v": v})
    assert json_text({"v": values}) == _reference({"v": values})
