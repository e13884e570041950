"""A loopback stand-in for KEDA's metrics-api scaler, the HorizontalPodAutoscaler it drives and
the fleet Deployment's pods, for the scaling tests and benchmark (issue 34).

No Kubernetes cluster can run on these machines, so this plays its parts with built-in engines:

* **KEDA's metrics-api scaler** (``pkg/scalers/metrics_api_scaler.go``): ``GET`` the trigger's
  ``url``, the number at ``valueLocation`` (a dotted path), active while it is above
  ``activationTargetValue`` (0). With ``minReplicaCount: 0`` KEDA itself scales 0 -> 1 when
  active and back to 0 once inactive for ``cooldownPeriod`` (``pkg/scaling/executor/
  scale_scaledobjects.go``); above 0 the HPA decides.
* **The HPA** (kubernetes ``pkg/controller/podautoscaler``), for an external metric with
  ``metricType: AverageValue`` (``replica_calculator.go`` ``GetExternalPerPodMetricReplicas``):
  ``raw = ceil(metric / targetValue)``, unless ``|metric / (targetValue * current) - 1|`` is
  within the tolerance 0.1 (``--horizontal-pod-autoscaler-tolerance``), when ``raw = current``.
  A current count above ``maxReplicaCount`` goes straight to it (``reconcileAutoscaler``).
  Then ``horizontal.go``: ``stabilizeRecommendationWithBehaviors`` (the lowest raw value of the
  scale-up window and the highest of the scale-down window bound the change: a scale-down
  takes the highest recommendation of the last ``stabilizationWindowSeconds``), and
  ``convertDesiredReplicasWithBehaviorRate`` with ``calculateScaleUp/DownLimit...`` (each policy
  allows ``value`` pods or percent per ``periodSeconds``, counted from the replicas at the start
  of the period; ``selectPolicy: Max`` takes the largest change), clamped to [max(1, min), max].
* **The Deployment's pods**: a pod is a ``prefect-odm engine serve`` on a free loopback port
  (``start_engine``); it is listed in the node file (the headless Service's addresses) once its
  ``/info`` answers (its readiness probe). A pod removed leaves the file at once, then its
  pre-stop hook runs (the exact command of the rendered manifest, ``node -e ...``, pointed at the
  engine by ``PREFECT_ODM_DRAIN_URL``), then the engine gets SIGTERM (SIGKILL after the grace
  period). Which pod goes: the ReplicaSet's rule, the one ready for the shortest time first
  (``controller_utils.go`` ``ActivePodsWithRanks``), or a ranking the test gives.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from prefect_odm.engine.launch import EngineProcess, start_engine

HPA_TOLERANCE = 0.1
"""kube-controller-manager's ``--horizontal-pod-autoscaler-tolerance`` default."""


@dataclass(frozen=True)
class Policy:
    """One HPA scaling policy: ``value`` pods (or percent) per ``period_seconds``."""

    kind: str
    value: int
    period_seconds: float


@dataclass(frozen=True)
class Rules:
    """One direction of an HPA's ``behavior``."""

    window_seconds: float
    policies: tuple[Policy, ...]
    select: str = "Max"

    @classmethod
    def from_manifest(cls, doc: Mapping[str, Any] | None, default: Rules) -> Rules:
        if not doc:
            return default
        policies = tuple(
            Policy(p["type"], int(p["value"]), float(p["periodSeconds"]))
            for p in doc.get("policies", [])
        )
        return cls(
            float(doc.get("stabilizationWindowSeconds", default.window_seconds)),
            policies or default.policies,
            str(doc.get("selectPolicy", "Max")),
        )


# The HPA's defaults (autoscaling/v2 ``HPAScalingRules``), which KEDA passes on.
DEFAULT_UP = Rules(0.0, (Policy("Percent", 100, 15.0), Policy("Pods", 4, 15.0)))
DEFAULT_DOWN = Rules(300.0, (Policy("Percent", 100, 15.0),))


@dataclass(frozen=True)
class ScaledObjectSpec:
    """What the stand-in reads from a rendered ``ScaledObject`` (its metrics-api trigger)."""

    url: str
    value_location: str
    target_value: float
    activation_target_value: float
    min_replicas: int
    max_replicas: int
    cooldown_seconds: float
    scale_up: Rules
    scale_down: Rules

    @classmethod
    def from_manifest(cls, doc: Mapping[str, Any]) -> ScaledObjectSpec:
        spec = doc["spec"]
        (trigger,) = [t for t in spec["triggers"] if t["type"] == "metrics-api"]
        assert trigger.get("metricType", "AverageValue") == "AverageValue"
        meta = trigger["metadata"]
        behavior = spec.get("advanced", {}).get("horizontalPodAutoscalerConfig", {})
        behavior = behavior.get("behavior", {})
        return cls(
            url=meta["url"],
            value_location=meta["valueLocation"],
            target_value=float(meta["targetValue"]),
            activation_target_value=float(meta.get("activationTargetValue", 0)),
            min_replicas=int(spec.get("minReplicaCount", 0)),
            max_replicas=int(spec.get("maxReplicaCount", 100)),
            cooldown_seconds=float(spec.get("cooldownPeriod", 300)),
            scale_up=Rules.from_manifest(behavior.get("scaleUp"), DEFAULT_UP),
            scale_down=Rules.from_manifest(behavior.get("scaleDown"), DEFAULT_DOWN),
        )


@dataclass
class Autoscaler:
    """KEDA + the HPA's arithmetic (see the module docstring); pure, the clock given."""

    spec: ScaledObjectSpec
    recommendations: list[tuple[float, int]] = field(default_factory=list)
    up_events: list[tuple[float, int]] = field(default_factory=list)
    down_events: list[tuple[float, int]] = field(default_factory=list)
    last_active: float | None = None

    def desired(self, metric: float | None, current: int, now: float) -> int:
        """The replicas wanted now, given the metric (``None``: it could not be read) and the
        current replicas; scale events are recorded as if the result were applied."""
        s = self.spec
        if metric is None:
            return current  # a failing metric leaves the replicas as they are
        active = metric > s.activation_target_value
        if active:
            self.last_active = now
        if current == 0:
            return self._apply(max(1, s.min_replicas) if active else 0, current, now)
        idle_for = math.inf if self.last_active is None else now - self.last_active
        if not active and s.min_replicas == 0 and idle_for >= s.cooldown_seconds:
            return self._apply(0, current, now)
        if current > s.max_replicas:
            return self._apply(s.max_replicas, current, now)
        if current < max(1, s.min_replicas):
            return self._apply(max(1, s.min_replicas), current, now)
        ratio = metric / (s.target_value * current)
        raw = current if abs(1.0 - ratio) <= HPA_TOLERANCE else math.ceil(metric / s.target_value)
        return self._apply(
            self._rate(self._stabilize(raw, current, now), current, now), current, now
        )

    def _stabilize(self, raw: int, current: int, now: float) -> int:
        up_cut = now - self.spec.scale_up.window_seconds
        down_cut = now - self.spec.scale_down.window_seconds
        up = min([raw, *(r for t, r in self.recommendations if t > up_cut)])
        down = max([raw, *(r for t, r in self.recommendations if t > down_cut)])
        self.recommendations = [
            (t, r) for t, r in self.recommendations if t > min(up_cut, down_cut)
        ]
        self.recommendations.append((now, raw))
        return min(max(current, up), down)

    def _changed(self, period_seconds: float, now: float) -> tuple[int, int]:
        added = sum(n for t, n in self.up_events if t > now - period_seconds)
        deleted = sum(n for t, n in self.down_events if t > now - period_seconds)
        return added, deleted

    def _rate(self, desired: int, current: int, now: float) -> int:
        s = self.spec
        if desired > current:
            rules, pick = s.scale_up, (min if s.scale_up.select == "Min" else max)
            proposals = []
            for p in rules.policies:
                added, deleted = self._changed(p.period_seconds, now)
                start = current - added + deleted
                grown = (
                    start + p.value if p.kind == "Pods" else math.ceil(start * (1 + p.value / 100))
                )
                proposals.append(grown)
            limit = current if rules.select == "Disabled" else max(pick(proposals), current)
            return min(desired, s.max_replicas, limit)
        if desired < current:
            rules, pick = s.scale_down, (max if s.scale_down.select == "Min" else min)
            proposals = []
            for p in rules.policies:
                added, deleted = self._changed(p.period_seconds, now)
                start = current - added + deleted
                shrunk = start - p.value if p.kind == "Pods" else int(start * (1 - p.value / 100))
                proposals.append(shrunk)
            limit = current if rules.select == "Disabled" else min(pick(proposals), current)
            return max(desired, max(1, s.min_replicas), limit)
        return desired

    def _apply(self, desired: int, current: int, now: float) -> int:
        if desired > current:
            self.up_events.append((now, desired - current))
        elif desired < current:
            self.down_events.append((now, current - desired))
        return desired


@dataclass
class Pod:
    """One fleet pod: a built-in engine, and what happened to it (monotonic seconds)."""

    name: str
    created_at: float
    engine: EngineProcess | None = None
    ready_at: float | None = None
    deleted_at: float | None = None
    queue_when_deleted: int | None = None
    """``taskQueueCount`` of its ``/info`` when its deletion began."""
    hook_exit: int | None = None
    stopped_at: float | None = None
    tasks: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Task UUID -> its ``/task/{uuid}/info`` when the pod stopped."""

    @property
    def url(self) -> str:
        assert self.engine is not None
        return self.engine.url


def newest_ready_first(pods: Sequence[Pod]) -> list[Pod]:
    """The ReplicaSet's order of deletion among running, ready pods: ready for the shortest time
    first (``ActivePodsWithRanks``)."""
    return sorted(pods, key=lambda p: -(p.ready_at or 0.0))


def _get_json(url: str, timeout_seconds: float = 5.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout_seconds) as res:
        return json.loads(res.read())


def engine_tasks(url: str) -> dict[str, dict[str, Any]]:
    """Every task of an engine: UUID -> ``/task/{uuid}/info``."""
    uuids = [t["uuid"] for t in _get_json(f"{url}/task/list")]
    return {u: _get_json(f"{url}/task/{u}/info") for u in uuids}


@dataclass
class FleetStandIn:
    """Scales built-in engines on loopback as KEDA, the HPA and the Deployment would.

    Args:
        spec: the rendered ScaledObject's settings.
        pre_stop: the fleet container's pre-stop command (``["node", "-e", script]``).
        nodes_file: the node file the runs read (the Service's ready addresses).
        work_dir: where the engines keep their data.
        sync_seconds: how often the HPA looks (its sync period; 15 s in a cluster).
        grace_seconds: a pod's termination grace period.
        rank: the order in which pods are removed (the ReplicaSet's by default).
        engine_options: ``start_engine`` keyword arguments (``method``, ``max_parallel_tasks``).
    """

    spec: ScaledObjectSpec
    pre_stop: list[str]
    nodes_file: Path
    work_dir: Path
    sync_seconds: float = 1.0
    grace_seconds: float = 600.0
    rank: Callable[[Sequence[Pod]], list[Pod]] = newest_ready_first
    engine_options: dict[str, Any] = field(default_factory=dict)
    pods: list[Pod] = field(default_factory=list)
    events: list[tuple[float, str, Any]] = field(default_factory=list)
    """(monotonic seconds, what, detail): ``metric``, ``scale``, ``ready``, ``delete``, ``stopped``."""
    _autoscaler: Autoscaler = field(init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)
    _stop: threading.Event = field(default_factory=threading.Event, init=False)
    _threads: list[threading.Thread] = field(default_factory=list, init=False)

    def __post_init__(self) -> None:
        self._autoscaler = Autoscaler(self.spec)
        node = shutil.which(self.pre_stop[0])
        assert node is not None, f"{self.pre_stop[0]} is needed to run the pre-stop hook"
        self.pre_stop = [node, *self.pre_stop[1:]]
        self._write_nodes()

    def set_max_replicas(self, n: int) -> None:
        """An operator edits ``maxReplicaCount`` (``kubectl edit scaledobject``)."""
        self._autoscaler.spec = replace(self._autoscaler.spec, max_replicas=n)

    def start(self) -> None:
        """Start the minimum of pods, wait until they are ready, then scale in the background."""
        for _ in range(max(1, self.spec.min_replicas)):
            self._create()
        self._join_all()
        loop = threading.Thread(target=self._loop, name="hpa-stand-in", daemon=True)
        loop.start()
        self._threads.append(loop)

    def close(self) -> None:
        """Stop scaling; stop every pod still running (its tasks recorded, no pre-stop wait)."""
        self._stop.set()
        self._join_all()
        for pod in self.pods:
            if pod.engine is not None and pod.stopped_at is None:
                pod.tasks = engine_tasks(pod.url)
                pod.engine.stop()
                pod.stopped_at = time.monotonic()

    def active(self) -> list[Pod]:
        """The pods that count as replicas (created, not being deleted)."""
        with self._lock:
            return [p for p in self.pods if p.deleted_at is None]

    def _join_all(self) -> None:
        for t in list(self._threads):
            if t is not threading.current_thread():
                t.join()

    def _metric(self) -> float | None:
        try:
            value: Any = _get_json(self.spec.url)
            for part in self.spec.value_location.split("."):
                value = value[part]
            return float(value)
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def _loop(self) -> None:
        while not self._stop.wait(self.sync_seconds):
            metric = self._metric()
            self.events.append((time.monotonic(), "metric", metric))
            active = self.active()
            desired = self._autoscaler.desired(metric, len(active), time.monotonic())
            if desired != len(active):
                self.events.append((time.monotonic(), "scale", (len(active), desired)))
            for _ in range(desired - len(active)):
                thread = threading.Thread(target=self._create, daemon=True)
                self._threads.append(thread)
                thread.start()
            ready = [p for p in active if p.ready_at is not None]
            for pod in self.rank(ready)[: max(0, len(active) - desired)]:
                pod.deleted_at = time.monotonic()
                thread = threading.Thread(target=self._delete, args=(pod,), daemon=True)
                self._threads.append(thread)
                thread.start()

    def _create(self) -> None:
        with self._lock:
            pod = Pod(f"nodeodm-{len(self.pods)}", time.monotonic())
            self.pods.append(pod)
        pod.engine = start_engine(self.work_dir / pod.name, **self.engine_options)
        pod.ready_at = time.monotonic()
        self.events.append((pod.ready_at, "ready", pod.name))
        self._write_nodes()

    def _delete(self, pod: Pod) -> None:
        """Out of the Service, the pre-stop hook, then SIGTERM (SIGKILL after the grace)."""
        self._write_nodes()
        pod.queue_when_deleted = int(_get_json(f"{pod.url}/info")["taskQueueCount"])
        self.events.append((time.monotonic(), "delete", (pod.name, pod.queue_when_deleted)))
        env = {**os.environ, "PREFECT_ODM_DRAIN_URL": pod.url}
        try:
            hook = subprocess.run(self.pre_stop, env=env, timeout=self.grace_seconds, check=False)
            pod.hook_exit = hook.returncode
        except subprocess.TimeoutExpired:
            pod.hook_exit = None  # the grace period ended: the kubelet kills the container
        pod.tasks = engine_tasks(pod.url)
        assert pod.engine is not None
        pod.engine.stop()
        pod.stopped_at = time.monotonic()
        self.events.append((pod.stopped_at, "stopped", pod.name))

    def _write_nodes(self) -> None:
        with self._lock:
            urls = [p.url for p in self.pods if p.ready_at is not None and p.deleted_at is None]
            tmp = self.nodes_file.with_name(self.nodes_file.name + ".tmp")
            tmp.write_text("".join(f"{u}\n" for u in urls))
            os.replace(tmp, self.nodes_file)
