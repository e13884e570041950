"""What the ``reconstruct`` flow needs beside its steps: its parameters' defaults with their UI
descriptions, the run's first name, the stage timer, the command that merges the stored
submodels after a failed alignment, and the planned footprint the merge checks against.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import Field, WithJsonSchema

from prefect_odm.geo import GeoJSONGeometry
from prefect_odm.layout import OutputLayout
from prefect_odm.models import SplitPlan, SubmodelResult
from prefect_odm.nodes.refs import survey_label
from prefect_odm.settings import DEFAULT_SPLIT

# Parameter defaults with their UI descriptions (pydantic FieldInfo, typed Any like Field's).
SUBMODEL_DEPLOYMENT_FIELD: Any = Field(
    None,
    description=(
        "Run each submodel as a run of this deployment ('flow/deployment', e.g. "
        "'process_submodel/process-submodel') on workers; none: inline subflows, unless "
        "PREFECT_ODM_SUBMODEL_DEPLOYMENT names one ('inline' forces inline)."
    ),
)
NODES_FIELD: Any = Field(
    None,
    description=(
        "NodeODM node URLs without credentials (a URL with ?token= or user:password@ is "
        "refused: parameters are shown here and passed to every child run). Tokens go in a "
        "NodeODMPool block (node_pool) or PREFECT_ODM_NODE_TOKENS / PREFECT_ODM_NODE_TOKEN on "
        "the workers. None: the built-in engine."
    ),
)
SPLIT_FIELD: Any = Field(
    DEFAULT_SPLIT,
    description="Target images per submodel (core images), or 'auto' from the nodes' memory.",
)
SplitParameter = Annotated[
    int | Literal["auto"],
    # Pydantic writes a one-value Literal as {"const": "auto"}, which the UI's form cannot set
    # ("split is a const and cannot be changed"): an enum of one is a choice it renders.
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "integer", "title": "images per submodel"},
                {"type": "string", "enum": ["auto"], "title": "auto"},
            ]
        }
    ),
]
"""The ``split`` parameter: images per submodel or ``"auto"``, fillable in the UI's form."""
PRIORITY_FIELD: Any = Field(
    "normal",
    description="'urgent' sends the submodel runs to the urgent work queue; never part of a fingerprint.",
)


@dataclass
class StageTimer:
    """Seconds spent in each stage of the run, and in all."""

    start: float = field(default_factory=time.monotonic)
    seconds: dict[str, float] = field(default_factory=dict)

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """Time the block as the stage ``name`` (seconds, monotonic clock)."""
        t = time.monotonic()
        yield
        self.seconds[name] = time.monotonic() - t

    def finish(self) -> dict[str, float]:
        """Add ``total`` (seconds since the timer was made) and return every stage's seconds."""
        self.seconds["total"] = time.monotonic() - self.start
        return self.seconds


def first_run_name() -> str:
    """The run's name until the survey is scanned (then ``{survey}-{fingerprint[:8]}``)."""
    from prefect.runtime import flow_run

    return f"reconstruct-{survey_label(str(flow_run.parameters.get('images', 'survey')))}"


def merge_command(layout: OutputLayout, merged: list[SubmodelResult]) -> str:
    """What to do after a failed alignment: every processed submodel is stored and reusable,
    and this command merges them (after a look at the report, with ``--accept-alignment``)."""
    folders = " ".join(layout.submodel_dir(r.submodel_id, r.fingerprint) for r in merged)
    return (
        f"Every processed submodel is stored and is reused by a rerun; to merge them anyway: "
        f"prefect-odm merge {folders} --plan {layout.plan_json} --output OUT --accept-alignment"
    )


def rerun_advice(layout: OutputLayout, result: SubmodelResult) -> str:
    """What to do when a submodel's stored products lie elsewhere than its images: they and
    every other submodel's stay stored; set that one aside and rerun, which processes it again
    and reuses the others."""
    folder = layout.submodel_dir(result.submodel_id, result.fingerprint)
    return (
        f"nothing was merged; check its node (NodeODM's test mode returns canned products), "
        f"move {folder} aside and run the same command again (it processes "
        f"{result.submodel_id} again and reuses the other submodels)"
    )


def planned_footprint(plan: SplitPlan) -> GeoJSONGeometry | None:
    """The union of the submodels' footprints (the planned area, in the plan's CRS); None
    without footprints, or when they enclose no area."""
    from shapely.geometry import mapping, shape
    from shapely.ops import unary_union

    shapes = [shape(s.footprint) for s in plan.submodels if s.footprint]
    if not shapes:
        return None
    union = mapping(unary_union(shapes))
    if union["type"] not in ("Polygon", "MultiPolygon"):
        return None  # an empty union is an empty collection: nothing was planned to cover
    return GeoJSONGeometry(type=union["type"], coordinates=union["coordinates"])
