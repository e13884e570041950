"""Which processing stage each ODM option first affects (pure core).

When a rerun differs from a finished submodel only in options that affect late stages, the node
can restart the existing task with ``rerun-from`` at the earliest affected stage instead of
processing from scratch. An option missing from the table counts as affecting everything
(guessing too late is the unsafe error: it would keep stale results).

Stage names and order are OpenDroneMap's (``opendm/config.py`` ``rerun-from`` choices), which the
built-in engine uses too. Source for the mapping: the stage that reads each option in ODM's
``stages/`` modules (``odm_dem.py`` reads dsm/dtm/dem-*, ``odm_orthophoto.py`` reads
orthophoto-*).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from prefect_odm.models import OptionValue

if TYPE_CHECKING:
    from prefect_odm.nodes.backend import NodeBackend

ODM_STAGES: tuple[str, ...] = (
    "dataset",
    "split",
    "merge",
    "opensfm",
    "openmvs",
    "odm_filterpoints",
    "odm_meshing",
    "mvs_texturing",
    "odm_georeferencing",
    "odm_dem",
    "odm_orthophoto",
    "odm_report",
    "odm_postprocess",
)
"""OpenDroneMap's stages in processing order."""

FIRST_STAGE: dict[str, str] = {
    "orthophoto-resolution": "odm_orthophoto",
    "orthophoto-compression": "odm_orthophoto",
    "orthophoto-cutline": "odm_orthophoto",
    "orthophoto-png": "odm_orthophoto",
    "orthophoto-kmz": "odm_orthophoto",
    "build-overviews": "odm_orthophoto",
    "cog": "odm_orthophoto",
    "dsm": "odm_dem",
    "dtm": "odm_dem",
    "dem-resolution": "odm_dem",
    "dem-gapfill-steps": "odm_dem",
    "dem-euclidean-map": "odm_dem",
    "dem-decimation": "odm_dem",
    "smrf-scalar": "odm_dem",
    "smrf-slope": "odm_dem",
    "smrf-threshold": "odm_dem",
    "smrf-window": "odm_dem",
}
"""Option name -> the first stage that reads it. Unlisted options affect every stage."""

FIRST = ODM_STAGES[0]


def first_stage(option: str) -> str:
    """The first stage ``option`` affects (``dataset`` for an option not in the table)."""
    return FIRST_STAGE.get(option, FIRST)


def changed_options(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """Names whose value differs (present in one mapping only counts as changed), sorted."""
    return sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))


def rerun_from_stage(
    old: Mapping[str, Any], new: Mapping[str, Any], stages: Sequence[str] = ODM_STAGES
) -> str | None:
    """The stage to restart from to turn a task run with ``old`` options into one with ``new``.

    Args:
        old, new: NodeODM option name -> value.
        stages: the node's stage order (its ``rerun-from`` domain); stages it lacks are
            mapped to the next stage it has.

    Returns:
        ``None`` when nothing changed; otherwise the earliest affected stage, which is the
        node's first stage when any changed option is unknown or early.
    """
    changed = changed_options(old, new)
    if not changed:
        return None
    order = {name: i for i, name in enumerate(ODM_STAGES)}
    earliest = min(order[first_stage(k)] for k in changed)
    later = [s for s in stages if order.get(s, -1) >= earliest]
    if earliest == 0 or not later:
        return stages[0]
    return min(later, key=lambda s: order[s])


def early_options(options: Mapping[str, OptionValue]) -> dict[str, OptionValue]:
    """The options that affect stages before ``odm_georeferencing`` (the reconstruction itself)."""
    cut = ODM_STAGES.index("odm_georeferencing")
    return {k: v for k, v in sorted(options.items()) if ODM_STAGES.index(first_stage(k)) < cut}


def node_stages(client: NodeBackend) -> list[str]:
    """The node's stage order: its ``rerun-from`` option's domain without NodeODM's empty
    "no rerun" entry (ODM's stages when it has none)."""
    for option in client.options():
        if option.name == "rerun-from" and option.domain is not None:
            return [stage for stage in option.domain if stage]
    return list(ODM_STAGES)
