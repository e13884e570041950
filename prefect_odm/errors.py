"""One exception hierarchy for the whole library.

Every error raised on purpose derives from :class:`PrefectODMError`; where a built-in exception
has the same meaning the subclass inherits it too (as rasterio does), so ``except ValueError``
still works for callers who do not know this package.
"""

from __future__ import annotations

from typing import Literal

HeaderProblem = Literal["unreadable", "truncated", "empty_file", "not_an_image"]
"""Why a file's header gives no image metadata (the header subset of ``models.RejectReason``)."""


class PrefectODMError(Exception):
    """Root of every error this package raises on purpose."""


class InputError(PrefectODMError, ValueError):
    """Bad input: a missing path, a folder without images, images without GPS, bad options."""


class NoImagesError(InputError):
    """The input location holds no usable image."""


class ImageHeaderError(InputError):
    """A file whose header cannot give image metadata.

    Attributes:
        reason: one of ``"unreadable"``, ``"truncated"``, ``"empty_file"``, ``"not_an_image"``
            (the matching :data:`prefect_odm.models.RejectReason`).
        detail: what is wrong, in words.
    """

    def __init__(self, reason: HeaderProblem, detail: str) -> None:
        """The message is ``"{reason}: {detail}"``."""
        self.reason: HeaderProblem = reason
        self.detail = detail
        super().__init__(f"{reason}: {detail}")


class PlanningError(PrefectODMError, ValueError):
    """A split plan cannot be made (too few images, a submodel larger than any node)."""


class RoutingError(PlanningError):
    """No processing cluster can take a submodel (groups, engine, node memory, all down)."""


class StorageError(PrefectODMError, OSError):
    """Reading or writing an input or output location failed."""


class NodeError(PrefectODMError):
    """A NodeODM-API node failed or answered badly.

    Attributes:
        node_url: the node's URL without any token.
        task_uuid: the NodeODM task UUID, when one exists.
        submodel_id: the submodel being processed, when known.
        last_output: the last console lines of the node's task.
    """

    def __init__(
        self,
        message: str,
        *,
        node_url: str | None = None,
        task_uuid: str | None = None,
        submodel_id: str | None = None,
        last_output: list[str] | None = None,
    ) -> None:
        """The message is ``message`` followed by the submodel, the node and the task that are
        given."""
        self.node_url = node_url
        self.task_uuid = task_uuid
        self.submodel_id = submodel_id
        self.last_output = list(last_output or [])
        parts = [message]
        if submodel_id:
            parts.append(f"submodel {submodel_id}")
        if node_url:
            parts.append(f"node {node_url}")
        if task_uuid:
            parts.append(f"task {task_uuid}")
        text = "; ".join(parts)
        if self.last_output:
            text += "\nlast output lines:\n  " + "\n  ".join(self.last_output[-10:])
        super().__init__(text)


class TransientNodeError(NodeError):
    """Connection refused, timeout, HTTP 5xx, node restarted: worth retrying, maybe elsewhere."""


class StaleTaskError(NodeError):
    """The task UUID is taken on the node by a task an interrupted run left half made (an upload
    that was never committed, or committed with the wrong images): the submodel moves on to its
    next attempt's UUID; the broken task has been removed where the node allows it."""


class DownloadError(TransientNodeError):
    """The task finished but its all.zip could not be fetched whole (retried as a download,
    never by processing the task again)."""


class PrefectStartError(PrefectODMError):
    """Prefect's temporary API server did not answer in time (a busy machine)."""


class OutOfMemoryError(NodeError, MemoryError):
    """The node's task ran out of memory (exit 137 / "Not enough memory")."""


class ProcessingFailedError(NodeError):
    """The node processed the submodel and failed for good (bad images, reconstruction failed)."""


class ForeignProductsError(ProcessingFailedError):
    """A node returned products of images it was not sent (another survey's: NodeODM's test
    mode, a broken node): the message is the one line naming the submodel, node, task and the
    first foreign images; :attr:`node_url` and :attr:`task_uuid` are set but not repeated."""

    def __init__(self, message: str, *, node_url: str, task_uuid: str) -> None:
        """``message`` as it is, the node and task kept as attributes."""
        super().__init__(message)
        self.node_url = node_url
        self.task_uuid = task_uuid


class OutputValidationError(PrefectODMError, ValueError):
    """A downloaded or merged output does not open or lacks what it must carry (CRS, points)."""


class MergeError(PrefectODMError):
    """Merging submodel outputs failed or produced an unacceptable result (empty, half empty)."""


class MisplacedProductError(MergeError, ValueError):
    """A submodel's product does not lie where the submodel's images are (a node that returns
    canned products, e.g. NodeODM's test mode, or another survey's outputs); refused before the
    merge reads it (:mod:`prefect_odm.merge.locations`).

    Attributes:
        submodel_id: the submodel.
        path: the product file (URL or local path).
        distance_m: from the product's footprint to the submodel's planned footprint, metres.
        product_crs, survey_crs: the product's CRS and the survey's (``EPSG:...``).
        others: the other submodels whose products lie elsewhere too, sorted.
    """

    def __init__(
        self,
        submodel_id: str,
        path: str,
        distance_m: float,
        product_crs: str,
        survey_crs: str,
        advice: str,
        others: tuple[str, ...] = (),
    ) -> None:
        """One line: submodel, file, distance, both CRSs, the ``others`` (further submodels
        whose products lie elsewhere too), then ``advice`` (what to run)."""
        self.submodel_id = submodel_id
        self.others = others
        self.path = path
        self.distance_m = distance_m
        self.product_crs = product_crs
        self.survey_crs = survey_crs
        super().__init__(
            f"{submodel_id}: {path} lies {format_distance(distance_m)} from its images "
            f"({product_crs} product, survey {survey_crs}): not this submodel's products"
            + (_others(others) if others else "")
            + f"; {advice}"
        )


def _others(ids: tuple[str, ...]) -> str:
    shown = ", ".join(ids[:3]) + (", ..." if len(ids) > 3 else "")
    return f" (nor are {len(ids)} other submodels': {shown})"


def format_distance(distance_m: float) -> str:
    """``412 m``, ``8.4 km`` or ``8,412 km``: metres below 1 km, one decimal below 100 km."""
    if distance_m < 1000:
        return f"{distance_m:,.0f} m"
    if distance_m < 100_000:
        return f"{distance_m / 1000:.1f} km"
    return f"{distance_m / 1000:,.0f} km"


class SubmodelFailedError(NodeError):
    """A submodel failed for good; ``result`` is its :class:`~prefect_odm.models.SubmodelResult`."""

    def __init__(self, result: object) -> None:
        """Carry ``result`` and take the message, node, task and last lines from it."""
        self.result = result
        super().__init__(
            str(getattr(result, "error", "") or "failed"),
            node_url=getattr(result, "node_url", None),
            task_uuid=getattr(result, "task_uuid", None),
            submodel_id=getattr(result, "submodel_id", None),
            last_output=getattr(result, "last_output", None),
        )


class RunCancelledError(PrefectODMError):
    """The run was cancelled; remote tasks were cancelled and their slots freed."""


class IncompleteRunError(PrefectODMError):
    """Some planned submodels failed and ``allow_partial`` is off.

    Attributes:
        failed: submodel id -> reason.
    """

    def __init__(self, failed: dict[str, str]) -> None:
        """The message counts the failed submodels and lists each with its reason, sorted by id
        (the id once: a reason that starts with it is not prefixed again)."""
        self.failed = dict(failed)
        lines = "\n".join(
            f"  {why}" if why.startswith(f"{sid} ") else f"  {sid}: {why}"
            for sid, why in sorted(self.failed.items())
        )
        super().__init__(f"{len(self.failed)} submodel(s) failed:\n{lines}")


# -- the built-in engine --


class EngineError(InputError):
    """A request the built-in engine refuses; the message is sent as ``{"error": message}``.

    Attributes:
        no_retry: sending the same request again cannot help (NodeODM's ``noRetry``).
    """

    def __init__(self, message: str, *, no_retry: bool = False) -> None:
        """The message is the node's error text."""
        super().__init__(message)
        self.no_retry = no_retry


# -- Prefect deployments --


class DeploymentRunError(PrefectODMError):
    """A deployment run could not be created, retried or followed (e.g. the server rejected a
    retry, or runs were still unfinished when the wait timed out)."""
