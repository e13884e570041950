"""The Kubernetes manifests and work-pool template that ``prefect-odm k8s render`` writes,
validated offline (no cluster can run here): core kinds with kubernetes-validate (strict, against
Kubernetes 1.33's schemas), KEDA's ScaledObject against tests/keda_scaledobject_schema.json,
``kubectl kustomize`` of the shipped overlay, and the job template rendered by prefect-kubernetes'
own job configuration for a fake flow run."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import uuid
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from prefect_odm.cli import main
from prefect_odm.k8s.render import RenderSettings, base_job_template, submodel_job_variables

KUBERNETES_VERSION = "1.33.0"
"""Native sidecars (an init container with restartPolicy Always) are GA from 1.33."""

KEDA_SCHEMA = json.loads((Path(__file__).parent / "keda_scaledobject_schema.json").read_text())


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    out = tmp_path_factory.mktemp("k8s")
    assert (
        main(["k8s", "render", "--out", str(out), "--gib-per-pod", "16", "--max-replicas", "8"])
        == 0
    )
    return out


def test_runs_on_the_fleet_are_given_each_pods_memory(tmp_path, capsys):
    """NodeODM in a pod reports its host's memory: the rendered fleet's ``--nodes`` source
    carries the pod's (90 % of ``--gib-per-pod``, as a plausible ``/info`` total is used), and
    the DNS source reads it back."""
    from prefect_odm.nodes.sources import source_for

    assert main(["k8s", "render", "--out", str(tmp_path), "--gib-per-pod", "16"]) == 0
    spec = "dns+http://nodeodm.prefect-odm.svc:3000?memory_gib=14.4"
    assert (
        capsys.readouterr().out.splitlines()[-1] == f'runs on the NodeODM fleet: --nodes "{spec}"'
    )
    fleet = (tmp_path / "base" / "nodeodm-fleet.yaml").read_text()
    assert f'--nodes "{spec}"' in fleet
    assert source_for(spec).memory_gib == 14.4


def _documents(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _without_prefect_quirk(job: dict) -> dict:
    """prefect-kubernetes refuses a template without ``parallelism`` and ``completions`` in the
    POD spec (its own default template has them there); Kubernetes drops them (not strict)."""
    job = json.loads(json.dumps(job))
    for key in ("parallelism", "completions"):
        job["spec"]["template"]["spec"].pop(key)
    return job


def _validate(doc: dict) -> None:
    if doc["apiVersion"].startswith("keda.sh/"):
        # Weaker than KEDA's own CRD schema: only the fields KEDA's ScaledObject and
        # metrics-api scaler documentation lists, kept in the project.
        jsonschema.validate(doc, KEDA_SCHEMA)
    else:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def test_every_rendered_manifest_validates(rendered):
    kinds = []
    for path in sorted((rendered / "base").glob("*.yaml")):
        if path.name.startswith("kustom"):
            continue
        for doc in _documents(path):
            _validate(doc)
            kinds.append(doc["kind"])
    manifest = base_job_template(RenderSettings())["job_configuration"]["job_manifest"]
    job = json.loads(json.dumps(manifest).replace('"{{ ', '"').replace(' }}"', '"'))
    assert set(job["spec"]["template"]["spec"]) >= {"initContainers", "containers"}
    assert sorted(kinds) == sorted(
        ["Namespace", "ServiceAccount", "Role", "RoleBinding", "Deployment", "Deployment",
         "Service", "ScaledObject"]
    )  # fmt: skip
    print(f"{len(kinds)} manifests valid against Kubernetes {KUBERNETES_VERSION} / KEDA schema")
    assert job["kind"] == "Job"


def test_a_bad_manifest_is_refused():
    with pytest.raises(kubernetes_validate.ValidationError):
        _validate(
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": "x"},
                "spec": {"clusterIp": "None"},
            }
        )
    with pytest.raises(jsonschema.ValidationError):
        _validate({"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject", "metadata": {"name": "x"},
                   "spec": {"scaleTargetRef": {"name": "x"}, "triggers": [{"type": "metrics-api", "metadata": {"url": "u"}}]}})  # fmt: skip


def test_overlay_keeps_every_reference(rendered, tmp_path):
    built = subprocess.run(
        ["kubectl", "kustomize", str(rendered / "overlays" / "production")],
        check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    docs = [d for d in yaml.safe_load_all(built) if d]
    by = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    scaled = by[("ScaledObject", "nodeodm")]
    assert ("Deployment", scaled["spec"]["scaleTargetRef"]["name"]) in by
    assert scaled["spec"]["maxReplicaCount"] == 8
    trigger = scaled["spec"]["triggers"][0]
    assert trigger["metadata"]["valueLocation"] == "wanted_memory_gib"
    assert trigger["metadata"]["targetValue"] == "16"
    worker = by[("Deployment", "prefect-worker")]["spec"]["template"]["spec"]
    assert ("ServiceAccount", worker["serviceAccountName"]) in by
    binding = by[("RoleBinding", "prefect-odm")]
    assert ("Role", binding["roleRef"]["name"]) in by
    fleet = by[("Deployment", "nodeodm")]
    service = by[("Service", "nodeodm")]
    assert service["spec"]["clusterIP"] == "None"
    labels = fleet["spec"]["template"]["metadata"]["labels"]
    assert all(labels.get(k) == v for k, v in service["spec"]["selector"].items())
    template = base_job_template(RenderSettings())
    props = template["variables"]["properties"]
    assert ("ServiceAccount", props["service_account_name"]["default"]) in by
    for doc in docs:
        _validate(doc)
    # With a name prefix, the shipped nameReference configuration renames the target too.
    prefixed = tmp_path / "prefixed"
    prefixed.mkdir()
    shutil.copytree(rendered / "base", tmp_path / "base")
    (prefixed / "kustomization.yaml").write_text("resources: [../base]\nnamePrefix: team-a-\n")
    docs = [d for d in yaml.safe_load_all(subprocess.run(
        ["kubectl", "kustomize", str(prefixed)], check=True, capture_output=True, text=True
    ).stdout) if d]  # fmt: skip
    names = {(d["kind"], d["metadata"]["name"]) for d in docs}
    target = next(d for d in docs if d["kind"] == "ScaledObject")["spec"]["scaleTargetRef"]["name"]
    assert target == "team-a-nodeodm" and ("Deployment", target) in names


def test_prefect_kubernetes_renders_the_submodel_memory_and_deadline(prefect_api):
    from prefect.client.schemas.objects import FlowRun
    from prefect_kubernetes.worker import KubernetesWorkerJobConfiguration

    template = base_job_template(RenderSettings())
    values = submodel_job_variables(estimated_memory_gib=11.3, timeout_seconds=5400)
    config = asyncio.run(
        KubernetesWorkerJobConfiguration.from_template_and_values(template, values)
    )
    flow_run = FlowRun(id=uuid.uuid4(), name="submodel-003", flow_id=uuid.uuid4())
    config.prepare_for_flow_run(flow_run)
    job = config.job_manifest
    pod = job["spec"]["template"]["spec"]
    node = pod["initContainers"][0]
    print(
        f"node memory {node['resources']['requests']['memory']}, deadline {job['spec']['activeDeadlineSeconds']} s"
    )
    assert node["resources"]["requests"]["memory"] == "12Gi"
    assert node["resources"]["limits"]["memory"] == "12Gi"
    assert node["restartPolicy"] == "Always"  # a native sidecar
    assert job["spec"]["activeDeadlineSeconds"] == 5400
    flow = pod["containers"][0]
    env = {e["name"]: e.get("value") for e in flow["env"]}
    assert env["PREFECT_ODM_POD_NODE"] == "http://127.0.0.1:3000"
    assert env["PREFECT__FLOW_RUN_ID"] == str(flow_run.id)
    kubernetes_validate.validate(_without_prefect_quirk(job), KUBERNETES_VERSION, strict=True)
