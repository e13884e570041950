"""When a merge has read a source for the last time (pure: the order of its pairs or blocks).

A merge visits its work items (overlapping pairs, blocks) in a fixed order; a source that no
item from the ``n``-th on reads can be closed and its per-source state dropped before item ``n``.
Readers that close such sources hold open only those of the items around the current one, so
their memory does not grow with the number of inputs (a 100-submodel merge held every input
open on each thread: about 0.6-0.9 MiB each outside GDAL's block cache).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class SourceLifetimes:
    """The index of the last work item that reads each source.

    Attributes:
        last_use: submodel id -> index of the last item reading it (items counted from 0).
    """

    last_use: Mapping[str, int]

    @classmethod
    def of_items(cls, uses: Iterable[Iterable[str]]) -> SourceLifetimes:
        """The lifetimes of items given in order, each as the submodel ids it reads."""
        last: dict[str, int] = {}
        for n, ids in enumerate(uses):
            for sid in ids:
                last[sid] = n
        return cls(last)

    def finished(self, submodel_ids: Iterable[str], item: int) -> list[str]:
        """Those of ``submodel_ids`` that no item from ``item`` on reads (an unknown id is
        read by none)."""
        return [sid for sid in submodel_ids if self.last_use.get(sid, -1) < item]
