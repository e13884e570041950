"""``prefect-odm k8s render``: the work-pool base job template and the manifests a team applies.

Written from the templates in ``prefect_odm/k8s/templates`` (package data) with
:class:`string.Template` (``${name}``), which leaves Prefect's own ``{{ variable }}`` placeholders
of the job template alone. Output folder::

    work-pool/base-job-template.json   one pod per submodel: process-submodel + node sidecar
    base/                              namespace, worker + RBAC, NodeODM fleet, KEDA ScaledObject
    overlays/{overlay}/                an overlay that renames nothing

Secrets are referenced by name only; nothing here holds a credential.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path
from string import Template

from prefect_odm.errors import InputError
from prefect_odm.nodes.capacity import USABLE_MEMORY_FRACTION

BASE_FILES = (
    "namespace.yaml",
    "worker.yaml",
    "nodeodm-fleet.yaml",
    "scaledobject.yaml",
    "kustomizeconfig.yaml",
    "kustomization.yaml",
)
"""The files of ``base/``, as shipped in the templates folder."""


@dataclass(frozen=True)
class RenderSettings:
    """What the manifests are rendered with (every field a template name).

    Attributes:
        namespace: Kubernetes namespace of everything.
        work_pool: the Prefect work pool (type kubernetes) the worker reads.
        image: an image with prefect-odm installed (flow runs and the worker).
        node_image: the processing node image (NodeODM, or prefect-odm's engine).
        service_account: the worker's and the jobs' service account.
        s3_secret: secret holding AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_ENDPOINT_URL.
        prefect_secret: secret holding PREFECT_API_URL (and PREFECT_API_KEY when needed).
        fleet_cluster: the cluster name of the NodeODM fleet at the capacity endpoint.
        capacity_url: base URL of ``prefect-odm capacity serve``.
        gib_per_pod: memory of one fleet pod, GiB (the KEDA target value).
        min_replicas: fewest fleet pods.
        max_replicas: most fleet pods.
        default_memory_gib: the job template's node memory when a run sets none, GiB.
        default_deadline_seconds: the job template's activeDeadlineSeconds when a run sets none.
        grace_seconds: a fleet pod's terminationGracePeriodSeconds (its pre-stop wait).
        node_cpu: CPU request of a node.
        overlay: the example overlay's name.
        scale_down_window_seconds: the HPA's scale-down stabilization window (and KEDA's
            cooldown to zero).
        scale_down_period_seconds: at most one pod is removed per this many seconds.
        drain_quiet_seconds: a leaving pod stays until its ``/info`` has said
            ``taskQueueCount: 0`` for this long (the run's last poll and download).
        drain_poll_seconds: how often the pre-stop hook asks ``/info``.
    """

    namespace: str = "prefect-odm"
    work_pool: str = "odm-k8s"
    image: str = "prefecthq/prefect:3-python3.11"
    node_image: str = "opendronemap/nodeodm:2.2.4"
    service_account: str = "prefect-odm"
    s3_secret: str = "prefect-odm-s3"
    prefect_secret: str = "prefect-odm-api"
    fleet_cluster: str = "k8s-fleet"
    capacity_url: str = "http://prefect-odm-capacity.prefect-odm.svc:8080"
    gib_per_pod: int = 16
    min_replicas: int = 1
    max_replicas: int = 10
    default_memory_gib: int = 8
    default_deadline_seconds: int = 6 * 3600
    grace_seconds: int = 6 * 3600
    node_cpu: str = "2"
    overlay: str = "production"
    scale_down_window_seconds: int = 1800
    scale_down_period_seconds: int = 600
    drain_quiet_seconds: int = 300
    drain_poll_seconds: int = 10

    def check(self) -> None:
        """Raises :class:`InputError` (one line) for values no cluster would accept."""
        if not 0 <= self.min_replicas <= self.max_replicas:
            raise InputError(
                f"replicas: need 0 <= min ({self.min_replicas}) <= max ({self.max_replicas})"
            )
        if self.gib_per_pod <= 0 or self.default_memory_gib <= 0:
            raise InputError("memory per pod must be positive")
        if self.default_deadline_seconds < 60:
            raise InputError("the submodel deadline must be at least 60 s")
        if self.drain_poll_seconds < 1 or self.drain_quiet_seconds < 0:
            raise InputError("the pre-stop hook needs a poll of 1 s or more, a quiet time >= 0")
        if self.grace_seconds < self.drain_quiet_seconds:
            raise InputError("the grace period must be longer than the pre-stop quiet time")


def memory_request(memory_gib: float) -> str:
    """A Kubernetes memory quantity for ``memory_gib`` GiB, rounded up to whole GiB (``12Gi``)."""
    return f"{max(1, math.ceil(memory_gib - 1e-9))}Gi"


def submodel_job_variables(
    estimated_memory_gib: float, timeout_seconds: float
) -> dict[str, object]:
    """The job variables a parent sends with a submodel's run on the Kubernetes work pool.

    Args:
        estimated_memory_gib: the plan's estimate of the submodel's peak memory, GiB.
        timeout_seconds: the submodel's time-out, seconds (the Job's activeDeadlineSeconds).
    """
    return {
        "node_memory_request": memory_request(estimated_memory_gib),
        "active_deadline_seconds": max(60, int(math.ceil(timeout_seconds))),
    }


def fleet_nodes_source(s: RenderSettings) -> str:
    """The ``--nodes`` entry of runs on the rendered NodeODM fleet: its headless Service as a
    DNS source, with each pod's memory (NodeODM 2.2.4 reports its host's, not its limit):
    :data:`~prefect_odm.nodes.capacity.USABLE_MEMORY_FRACTION` of ``gib_per_pod``, as a
    plausible ``/info`` total is used."""
    gib = round(s.gib_per_pod * USABLE_MEMORY_FRACTION, 2)
    return f"dns+http://nodeodm.{s.namespace}.svc:3000?memory_gib={gib:g}"


def _template(name: str) -> str:
    return (resources.files("prefect_odm.k8s") / "templates" / name).read_text(encoding="utf-8")


def _values(s: RenderSettings) -> dict[str, str]:
    values = {k: str(v) for k, v in asdict(s).items()}
    image_name, _, tag = s.node_image.rpartition(":")
    values.update(
        node_args=json.dumps(["--port", "3000", "-q", "1"]),
        fleet_node_args=json.dumps(["--port", "3000", "-q", "1"]),
        default_memory=memory_request(s.default_memory_gib),
        default_deadline=str(s.default_deadline_seconds),
        overlay_max_replicas=str(s.max_replicas),
        node_image_name=image_name or s.node_image,
        node_image_tag=tag or "latest",
        fleet_nodes=fleet_nodes_source(s),
    )
    return values


def base_job_template(s: RenderSettings) -> dict[str, object]:
    """The work pool's base job template (``prefect work-pool create --base-job-template``)."""
    text = Template(_template("base-job-template.json")).substitute(_values(s))
    loaded: dict[str, object] = json.loads(text)
    return loaded


def render(out: Path, s: RenderSettings) -> list[Path]:
    """Write the job template, ``base/`` and the example overlay under ``out``; the files.

    Raises:
        InputError: bad settings.
    """
    s.check()
    values = _values(s)
    written: list[Path] = []

    def write(path: Path, text: str) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
        written.append(path)

    write(
        out / "work-pool" / "base-job-template.json",
        json.dumps(base_job_template(s), indent=2) + "\n",
    )
    for name in BASE_FILES:
        write(out / "base" / name, Template(_template(name)).substitute(values))
    write(
        out / "overlays" / s.overlay / "kustomization.yaml",
        Template(_template("overlay-kustomization.yaml")).substitute(values),
    )
    return written
