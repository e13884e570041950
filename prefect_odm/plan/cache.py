"""A run's plan and survey, read and validated once per process.

Every submodel's flow needs the plan and the survey (image URLs). Read from storage and
validated for each submodel, that work grew with images x submodels: 0.5 s of CPU per submodel at
1,800 images, 85 s at 20,000 (issue 14). The flows of one process share one copy instead, keyed by
the files' size and modification stamp (mtime, ETag or LastModified, whichever the filesystem
gives), so a plan rewritten under the same name is read again.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

from prefect_odm import storage
from prefect_odm.errors import StorageError
from prefect_odm.layout import plan_file
from prefect_odm.models import SplitPlan, Survey

MAX_PLANS = 4
"""Plans kept per process (one per survey a long-lived worker has seen lately)."""

_STAMP_KEYS = ("size", "mtime", "ETag", "LastModified", "last_modified", "created")

_cache: OrderedDict[str, tuple[tuple[Any, ...], SplitPlan, Survey]] = OrderedDict()
_lock = threading.Lock()


def _stamp(url: str) -> tuple[Any, ...]:
    fs, path = storage.filesystem(url)
    try:
        info = fs.info(path)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise StorageError(f"{url}: cannot read ({exc})") from exc
    return tuple(str(info.get(key)) for key in _STAMP_KEYS)


def load_plan_and_survey(plan_url: str) -> tuple[SplitPlan, Survey]:
    """The plan at ``plan_url`` and the survey beside it (``survey.json``).

    The objects are shared by every caller in the process: treat them as read-only (both are
    pydantic models; derive changed copies with ``model_copy``).

    Args:
        plan_url: location of a run's ``plan/plan.json`` (local path or fsspec URL).

    Raises:
        FileNotFoundError: either file is missing.
        StorageError: either file cannot be read.
        pydantic.ValidationError: either file is not a plan or survey of this version.
    """
    survey_url = plan_file(plan_url.rsplit("/", 1)[0], "survey")
    stamp = _stamp(plan_url) + _stamp(survey_url)
    with _lock:
        hit = _cache.get(plan_url)
        if hit is not None and hit[0] == stamp:
            _cache.move_to_end(plan_url)
            return hit[1], hit[2]
    plan = SplitPlan.model_validate(storage.read_json(plan_url))
    survey = Survey.model_validate(storage.read_json(survey_url))
    with _lock:
        _cache[plan_url] = (stamp, plan, survey)
        _cache.move_to_end(plan_url)
        while len(_cache) > MAX_PLANS:
            _cache.popitem(last=False)
    return plan, survey
