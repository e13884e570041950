"""The plan files' JSON writer gives json.dumps' exact text (prefect_odm.storage.indented_json)."""

from __future__ import annotations

import enum
import json
import math
import random
from datetime import datetime
from pathlib import Path

from prefect_odm import storage
from prefect_odm.storage import indented_json


class Colour(enum.StrEnum):
    RED = "red"


class Level(enum.IntEnum):
    HIGH = 3


def random_value(rng: random.Random, depth: int = 0) -> object:
    leaves = [
        None,
        True,
        False,
        0,
        -7,
        2**70,
        0.1,
        -1e-7,
        1e300,
        math.nan,
        math.inf,
        -math.inf,
        "",
        'é\u2028"\\\n\x00',
        "plain",
        Colour.RED,
        Level.HIGH,
        datetime(2026, 1, 2, 3, 4, 5),
        Path("a/b"),
    ]
    if depth > 3 or rng.random() < 0.4:
        return rng.choice(leaves)
    if rng.random() < 0.5:
        kind = rng.choice([list, tuple])
        return kind(random_value(rng, depth + 1) for _ in range(rng.randrange(4)))
    keys = rng.sample(["b", "a", "z", "é", "10", "2"], rng.randrange(4))
    value: dict[object, object] = {k: random_value(rng, depth + 1) for k in keys}
    if rng.random() < 0.3:
        value = {rng.choice([1, 2.5, True, None, -3]): value.get("a")}
    return value


def test_the_text_is_json_dumps_text() -> None:
    rng = random.Random(33)
    for _ in range(3000):
        value = random_value(rng)
        expected = json.dumps(value, indent=2, sort_keys=True, default=str)
        assert indented_json(value) == expected, value


def test_a_key_json_cannot_write_is_refused_as_json_refuses_it(tmp_path: Path) -> None:
    for writer in (indented_json, lambda v: json.dumps(v, indent=2, sort_keys=True)):
        try:
            writer({(1, 2): 3})
        except TypeError as exc:
            assert "keys must be str" in str(exc)
        else:
            raise AssertionError("a tuple key was written")
    url = str(tmp_path / "x.json")
    storage.write_json_atomic(url, {"b": [1, 2.0], "a": {}})
    assert Path(url).read_text() == '{\n  "a": {},\n  "b": [\n    1,\n    2.0\n  ]\n}\n'
