"""A run's plan and survey, read and validated once per process; a survey planned once.

Every submodel's flow needs the plan and the survey (image URLs). Read from storage and
validated for each submodel, that work grew with images x submodels: 0.5 s of CPU per submodel at
1,800 images, 85 s at 20,000 (issue 14). The flows of one process share one copy instead, keyed by
the files' size and modification stamp (mtime, ETag or LastModified, whichever the filesystem
gives), so a plan rewritten under the same name is read again.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, Literal

from prefect_odm import storage
from prefect_odm.errors import StorageError
from prefect_odm.layout import plan_file
from prefect_odm.models import MergeOptions, ProcessingOptions, SplitPlan, Survey

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


_last_split: list[tuple[tuple[Any, ...], Survey, SplitPlan]] = []


def plan_split_once(
    survey: Survey,
    *,
    split: int | Literal["auto"],
    split_overlap_m: float | None,
    options: ProcessingOptions | None,
    engine_identity: str,
    node_memory_gib: Sequence[float],
    merge_options: MergeOptions | None,
    keep: bool = False,
) -> SplitPlan:
    """:func:`~prefect_odm.plan.planning.plan_split` of ``survey``, or the plan a call with
    ``keep`` left in this process when it planned an equal survey with equal arguments.

    ``prefect-odm reconstruct`` plans local images at its edge (the planner's refusals before
    Prefect starts) with ``keep``, then its flow plans the same survey again: 10 CPU-s at 50,000
    images (issue 33). The planner is deterministic, so the second plan is the first. The plan
    is shared by both callers: treat it as read-only. Every call takes the kept plan away (one
    entry at most, held from the edge to its flow), so a long-lived worker running many flows
    holds no plan between them.

    Raises:
        PlanningError: see :func:`~prefect_odm.plan.planning.plan_split`.
    """
    from prefect_odm.plan.planning import plan_split

    key = (split, split_overlap_m, options, engine_identity, tuple(node_memory_gib), merge_options)
    with _lock:
        last = _last_split[0] if _last_split else None
        _last_split.clear()
    if last is not None and last[0] == key and (last[1] is survey or last[1] == survey):
        return last[2]
    plan = plan_split(
        survey,
        split=split,
        split_overlap_m=split_overlap_m,
        options=options,
        engine_identity=engine_identity,
        node_memory_gib=node_memory_gib,
        merge_options=merge_options,
    )
    if keep:
        with _lock:
            _last_split[:] = [(key, survey, plan)]
    return plan
