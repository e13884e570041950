"""Every environment variable prefect-odm reads, and the defaults written once.

All variables carry the ``PREFECT_ODM_`` prefix and are read through :func:`get_settings`, which
reads the environment at each call (tests and the command line change it at run time). Nothing
else in the package reads ``os.environ`` for its own settings; Prefect's own variables
(``PREFECT_API_URL`` and the like) stay Prefect's.

| variable | field | meaning |
|---|---|---|
| ``PREFECT_ODM_HOME`` | ``home`` | machine-local state: the embedded engine's data, the slot ledger |
| ``PREFECT_ODM_NODE_TOKEN`` | ``node_token`` | token sent to every node given by URL |
| ``PREFECT_ODM_NODE_TOKENS`` | ``node_tokens`` | JSON object of node URL -> token |
| ``PREFECT_ODM_SUBMODEL_DEPLOYMENT`` | ``submodel_deployment`` | run submodels as runs of this deployment |
| ``PREFECT_ODM_URGENT_WORK_QUEUE`` | ``urgent_work_queue`` | work queue of ``priority="urgent"`` submodels |
| ``PREFECT_ODM_ENGINE_FAULTS`` | ``engine_faults`` | fault injection for the built-in engine (tests) |
| ``PREFECT_ODM_POD_NODE`` | ``pod_node`` | the processing node beside the flow in its pod (Kubernetes) |
| ``PREFECT_ODM_CLUSTER`` | ``cluster`` | the cluster (of a cluster directory) whose worker this is |
| ``PREFECT_ODM_CLUSTER_DIRECTORY`` | ``cluster_directory`` | route a run's submodels with this cluster directory block |
| ``PREFECT_ODM_SCALEODM_STAGING`` | ``scaleodm_staging`` | ``s3://`` prefix where ScaleODM tasks read and write |
| ``PREFECT_ODM_SCALEODM_S3_ENDPOINT`` | ``scaleodm_s3_endpoint`` | S3 endpoint ScaleODM's workflows use |
| ``PREFECT_ODM_SCALEODM_MEMORY_GIB`` | ``scaleodm_memory_gib`` | memory of one ScaleODM task, GiB |
| ``PREFECT_ODM_SCALEODM_MAX_PARALLEL_TASKS`` | ``scaleodm_max_parallel_tasks`` | ScaleODM tasks at once |
| ``PREFECT_ODM_NODE_UPLOAD_REQUESTS`` | ``node_upload_requests`` | upload requests one node gets at once |
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_SPLIT = 100
"""Target images per submodel when none is given (ODM's ``split`` has no default; 100 keeps a
submodel within about 8 GiB on the built-in engine and 20 GiB on ODM)."""

DEFAULT_SPLIT_OVERLAP_M = 50.0
"""Overlap between neighbouring submodels in metres when none is given (ODM's
``split-overlap`` default is 150 m; 50 m keeps two image rows at common flight heights)."""

MAX_ASKED_SPLIT_OVERLAP_M = 1000.0
"""The widest split overlap a run may ask, metres: beyond a kilometre every submodel holds most
of a survey of city blocks, and the planner's geometry overflows (a 1e100 m buffer)."""

URGENT_WORK_QUEUE = "urgent"
"""Work queue of urgent submodel runs when ``PREFECT_ODM_URGENT_WORK_QUEUE`` is not set."""

DEFAULT_NODE_UPLOAD_REQUESTS = 2
"""Upload requests one node receives at once from a process when none is set (issue 33: a
node's request handling, not the loopback network, bounds uploads; figures in
``benchmarks/RESULTS.md``)."""

FAULTS_ENV = "PREFECT_ODM_ENGINE_FAULTS"
"""The variable the built-in engine's fault injection is read from (tests set it on a child)."""


class Settings(BaseSettings):
    """prefect-odm's settings from ``PREFECT_ODM_*`` environment variables."""

    model_config = SettingsConfigDict(
        env_prefix="PREFECT_ODM_", env_ignore_empty=True, extra="ignore"
    )

    home: Path = Field(
        default_factory=lambda: Path.home() / ".cache" / "prefect-odm",
        description="Machine-local state: the embedded engine's data folder and the slot ledger.",
    )
    node_token: SecretStr | None = Field(
        None, description="Token sent to every node given by URL that has no token of its own."
    )
    node_tokens: str | None = Field(
        None, description="JSON object mapping node URL to token (see cluster.token_for)."
    )
    submodel_deployment: str | None = Field(
        None, description="Deployment (flow/deployment) whose runs process the submodels."
    )
    urgent_work_queue: str = Field(
        URGENT_WORK_QUEUE, description="Work queue of the submodels of urgent runs."
    )
    engine_faults: str | None = Field(
        None, description="JSON fault list for the built-in engine; tests only."
    )
    pod_node: str | None = Field(
        None,
        description="URL of the processing node in the flow's own pod (the Kubernetes job "
        "template sets http://127.0.0.1:3000); used when a submodel run is given no nodes.",
    )
    cluster: str | None = Field(
        None,
        description="Name of the cluster (in the cluster directory) whose worker runs this "
        "process: a submodel run taken from the global queue runs on its nodes.",
    )
    cluster_directory: str | None = Field(
        None, description="Cluster directory block a reconstruct run routes its submodels with."
    )
    scaleodm_staging: str | None = Field(
        None, description="s3://bucket/prefix under which each ScaleODM task reads and writes."
    )
    scaleodm_s3_endpoint: str | None = Field(
        None, description="S3 endpoint sent to ScaleODM as s3Endpoint (its default when unset)."
    )
    scaleodm_memory_gib: float = Field(
        32.0, gt=0, description="Memory one ScaleODM task may use, GiB (its /info has none)."
    )
    scaleodm_max_parallel_tasks: int = Field(
        4, ge=1, description="ScaleODM tasks this library runs at once per server."
    )
    node_upload_requests: int = Field(
        DEFAULT_NODE_UPLOAD_REQUESTS,
        ge=1,
        description="Upload requests one node receives at once from this process, across "
        "every submodel uploading to it (prefect_odm.nodes.upload_lanes).",
    )


def get_settings() -> Settings:
    """The settings as the environment holds them now (read at each call, never cached)."""
    return Settings()


def prefect_odm_home() -> Path:
    """``$PREFECT_ODM_HOME`` or ``~/.cache/prefect-odm``: machine-local state lives here."""
    return get_settings().home
