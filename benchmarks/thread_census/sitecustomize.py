"""Thread census for ``bench_city.py``: on ``PYTHONPATH`` with ``BENCH_THREAD_CENSUS=DIR``, every
Python process started so samples its threads' names every 0.25 s and writes, at each new peak
count, ``DIR/threads-{pid}.json``: the peak and the names grouped (digits and URLs folded), so
the benchmark can say whose threads the peak holds; and every 5 s ``DIR/stacks-{pid}.json``:
what the upload threads and the task runner's workers (the submodel runs) were doing at each
sample (the innermost frame and the next four outside the threading and socket plumbing, counted), to tell waiting for the node's answer from
waiting in the lane, for the interpreter or for the Prefect API. The sampler is one thread of its own (in the
census as ``thread-census``)."""

from __future__ import annotations

import json
import os
import re
import sys
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


def _where(frame: object) -> str:
    """What a thread is doing, from its innermost frames: the first frame outside the standard
    library's waiting and socket plumbing names it (``function (file)``)."""
    f = frame
    seen = []
    while f is not None and len(seen) < 40:
        code = f.f_code  # type: ignore[attr-defined]
        seen.append(f"{code.co_name} ({os.path.basename(code.co_filename)})")
        f = f.f_back  # type: ignore[attr-defined]
    plumbing = ("threading.py", "_base.py", "_synchronization.py", "socket.py", "selectors.py")
    ours = [f for f in seen if not f.endswith(tuple(p + ")" for p in plumbing))]
    return " < ".join(seen[:1] + ours[:4])


def _sample(folder: str) -> None:
    path = os.path.join(folder, f"threads-{os.getpid()}.json")
    stacks_path = os.path.join(folder, f"stacks-{os.getpid()}.json")
    stacks: Counter[str] = Counter()
    ticks = 0
    peak = 0
    while True:
        ticks += 1
        by_id = {t.ident: _group(t.name) for t in threading.enumerate()}
        for ident, frame in sys._current_frames().items():
            group = by_id.get(ident, "?")
            if group.startswith(("upload-", "ThreadPoolExecutor-")):
                stacks[f"{group}: {_where(frame)}"] += 1
        if ticks % 20 == 0:
            with open(stacks_path + ".tmp", "w", encoding="utf-8") as fh:
                json.dump({"samples": ticks, "stacks": dict(stacks.most_common(80))}, fh)
            os.replace(stacks_path + ".tmp", stacks_path)
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
