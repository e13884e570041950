"""The record one processing of a submodel carries from its start to its result (pure: no
node, no storage), and the phase clock its steps add their times to.

:class:`SubmodelAttempt` holds what every outcome of :class:`~prefect_odm.nodes.runner.SubmodelRunner`
writes into its :class:`~prefect_odm.models.SubmodelResult` (the options, the early fingerprint,
the start, the phases), so a completed or failed result is made in one place from the few facts
its path adds: the node, the task UUID, the attempts and, for a restart, the stage.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from prefect_odm.errors import NodeError
from prefect_odm.models import OptionValue, Submodel, SubmodelResult
from prefect_odm.product_files import product_sizes

Options = dict[str, OptionValue]
"""NodeODM option name -> value, as :meth:`ProcessingOptions.to_nodeodm` gives them."""


@dataclass
class PhaseClock:
    """Seconds per phase of one submodel (summed over its attempts), for
    :attr:`~prefect_odm.models.SubmodelResult.phase_seconds`: what the operator and
    ``benchmarks/bench_city.py`` read to see where the time outside the node goes."""

    seconds: dict[str, float] = field(default_factory=dict)

    def add(self, phase: str, seconds: float) -> None:
        """Count ``seconds`` (>= 0) to ``phase``."""
        self.seconds[phase] = self.seconds.get(phase, 0.0) + max(0.0, seconds)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time the block as ``name`` (also when it raises)."""
        started = time.monotonic()
        try:
            yield
        finally:
            self.add(name, time.monotonic() - started)

    def rounded(self) -> dict[str, float]:
        """The phases, in milliseconds' precision."""
        return {k: round(v, 3) for k, v in self.seconds.items()}


@dataclass(frozen=True)
class SubmodelAttempt:
    """One processing of a submodel: what its result records whatever the outcome.

    Attributes:
        submodel: the planned submodel.
        options: the NodeODM options it is processed with.
        early_fingerprint: the fingerprint of what precedes georeferencing
            (:func:`prefect_odm.nodes.option_stages.early_options`), for a later ``rerun-from``.
        method: the pipeline named in the result.
        start: ``time.monotonic()`` when the run of the submodel began.
        clock: the phases of this path (a restart and a processing from scratch each have one).
    """

    submodel: Submodel
    options: Options
    early_fingerprint: str
    method: str
    start: float = field(default_factory=time.monotonic)
    clock: PhaseClock = field(default_factory=PhaseClock)

    def with_new_clock(self) -> SubmodelAttempt:
        """The same attempt with its own phase clock (another path of the same run)."""
        return SubmodelAttempt(
            self.submodel, self.options, self.early_fingerprint, self.method, self.start
        )

    def completed(
        self,
        products: dict[str, str],
        node_key: str | None,
        uuid: str,
        attempts: int,
        rerun_from: str | None = None,
    ) -> SubmodelResult:
        """The completed result: the stored products (product -> URL) with their sizes (one
        stat each: a later reuse checks them), where and how it ran."""
        return SubmodelResult(
            submodel_id=self.submodel.id,
            fingerprint=self.submodel.fingerprint,
            status="completed",
            products=products,
            product_sizes=product_sizes(products),
            node_url=node_key,
            task_uuid=uuid,
            attempts=attempts,
            duration_seconds=round(time.monotonic() - self.start, 3),
            method=self.method,
            options=self.options,
            early_fingerprint=self.early_fingerprint,
            rerun_from=rerun_from,
            phase_seconds=self.clock.rounded(),
        )

    def failed(
        self, last: NodeError, node_key: str | None, uuid: str | None, attempts: int
    ) -> SubmodelResult:
        """The failed result: the last error's first line and the node's last output lines."""
        return SubmodelResult(
            submodel_id=self.submodel.id,
            fingerprint=self.submodel.fingerprint,
            status="failed",
            node_url=last.node_url or node_key,
            task_uuid=last.task_uuid or uuid,
            attempts=attempts,
            duration_seconds=round(time.monotonic() - self.start, 3),
            method=self.method,
            options=self.options,
            early_fingerprint=self.early_fingerprint,
            error=str(last).split("\n")[0],
            last_output=last.last_output,
            phase_seconds=self.clock.rounded(),
        )


def first_line(exc: Exception) -> str:
    """The first line of an error's message (its type's name when it has none)."""
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
