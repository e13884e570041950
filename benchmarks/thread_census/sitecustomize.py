"""Thread census for ``bench_city.py``: on ``PYTHONPATH`` with ``BENCH_THREAD_CENSUS=DIR``, every
Python process started so samples its threads' names every 0.25 s and writes, at each new peak
count, ``DIR/threads-{pid}.json``: the peak and the names grouped (digits and URLs folded), so
the benchmark can say whose threads the peak holds. The sampler is one thread of its own (in the
census as ``thread-census``)."""

from __future__ import annotations

import json
import os
import re
import threading
import time
from collections import Counter

_FOLD = [
    (re.compile(r"https?://\S+"), "URL"),
    (re.compile(r"\d+"), "N"),
]


def _group(name: str) -> str:
    for pattern, repl in _FOLD:
        name = pattern.sub(repl, name)
    return name


def _sample(folder: str) -> None:
    path = os.path.join(folder, f"threads-{os.getpid()}.json")
    peak = 0
    while True:
        names = [t.name for t in threading.enumerate()]
        if len(names) > peak:
            peak = len(names)
            census = {"peak": peak, "groups": dict(Counter(_group(n) for n in names).most_common())}
            tmp = path + ".tmp"
            with open(tmp, "w", encoding="utf-8") as fh:
                json.dump(census, fh)
            os.replace(tmp, path)
        time.sleep(0.25)


if _folder := os.environ.get("BENCH_THREAD_CENSUS"):
    os.makedirs(_folder, exist_ok=True)
    threading.Thread(target=_sample, args=(_folder,), name="thread-census", daemon=True).start()
