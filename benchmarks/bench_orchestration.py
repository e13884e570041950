"""Orchestration overhead per submodel, and upload throughput to one node.

1. Overhead: 20 small submodels of seneca (the engine's fast ``direct`` method) run one after another through :class:`prefect_odm.nodes.runner.SubmodelRunner`
   against a built-in engine on 127.0.0.1. Per submodel, the time *not* spent in the engine
   (its reported processing time) and not in transfers (upload and download calls, timed) is the
   orchestration overhead: placement, polling, verification, storing, result records.
2. Upload throughput: the seneca images uploaded as one task with :meth:`NodeClient.create_task`
   (batches of up to 8 files per request, 4 in parallel, each retried) against the baseline of
   one plain multipart HTTP POST of the same files to ``/task/new`` in the same run.

    python benchmarks/bench_orchestration.py [--submodels 20] [--upload-repeat 5] [--upload-only]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
import uuid
from pathlib import Path

import requests

from prefect_odm.engine.launch import start_engine
from prefect_odm.layout import OutputLayout
from prefect_odm.models import ProcessingOptions
from prefect_odm.nodes.client import NodeClient
from prefect_odm.nodes.pool import NodePool, PoolNode
from prefect_odm.nodes.runner import SubmodelRunner
from prefect_odm.plan.planning import plan_split
from prefect_odm.settings import FAULTS_ENV
from prefect_odm.survey.scan import scan_images

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def overhead(n_submodels: int, tmp: Path) -> None:
    survey = scan_images(str(DATA / "seneca_1200" / "images"))
    split = max(1, len(survey.images) // n_submodels)
    plan = plan_split(
        survey,
        split=split,
        split_overlap_m=0,
        min_submodel_images=1,
        options=ProcessingOptions(pipeline="direct"),
    )
    plan = plan.model_copy(update={"submodels": plan.submodels[:n_submodels]})
    timed: dict[str, float] = {"upload": 0.0, "download": 0.0}

    def timing(key: str, call):  # type: ignore[no-untyped-def]
        t = time.perf_counter()
        try:
            return call()
        finally:
            timed[key] += time.perf_counter() - t

    class TimedClient(NodeClient):
        def create_task(self, *a, **k):  # type: ignore[no-untyped-def]
            return timing("upload", lambda: super(TimedClient, self).create_task(*a, **k))

        def download(self, *a, **k):  # type: ignore[no-untyped-def]
            return timing("download", lambda: super(TimedClient, self).download(*a, **k))

    with start_engine(tmp / "node", max_parallel_tasks=1, method="direct") as engine:
        client = TimedClient(engine.url)
        pool = NodePool([PoolNode(client.url, memory_gib=64, max_parallel_tasks=1)])
        layout = OutputLayout(str(tmp / "out"), survey.fingerprint)
        runner = SubmodelRunner(
            plan, survey, layout, pool, {client.url: client}, poll_interval_seconds=0.2
        )
        rows = []
        for sm in plan.submodels:
            timed.update(upload=0.0, download=0.0)
            t = time.perf_counter()
            result = runner.run(sm.id)
            total = time.perf_counter() - t
            assert result.status == "completed", result.error
            state = client.task_state(result.task_uuid or "")
            engine_s = max(0.0, (state.processing_time_ms if state else 0) / 1000.0)
            rows.append((total, engine_s, timed["upload"], timed["download"]))
    over = [t - e - u - d for t, e, u, d in rows]
    print(
        f"overhead: {len(rows)} small submodels of ~{split} images, sequential, runner level (no Prefect)"
    )
    print(f"  total per submodel   median {statistics.median(r[0] for r in rows):.3f} s")
    print(f"  engine processing    median {statistics.median(r[1] for r in rows):.3f} s")
    print(f"  upload + download    median {statistics.median(r[2] + r[3] for r in rows):.3f} s")
    print(f"  orchestration        median {statistics.median(over):.3f} s, max {max(over):.3f} s")
    print(
        "  (polling at 0.2 s: up to one poll interval of each figure is waiting for the next poll)"
    )


def upload(tmp: Path, repeat: int) -> None:
    files = sorted((DATA / "seneca_1200" / "images").glob("*.jpg"))
    size_mb = sum(f.stat().st_size for f in files) / 1e6
    faults = json.dumps({"stand_in_pipeline": True, "slow_seconds": 3600})
    baselines, ours = [], []
    with start_engine(
        tmp / "upload-node", max_parallel_tasks=1, extra_env={FAULTS_ENV: faults}
    ) as engine:
        client = NodeClient(engine.url)
        for i in range(repeat):  # alternated, so load on the machine falls on both alike
            t = time.perf_counter()
            fields = [("images", (f.name, f.read_bytes(), "image/jpeg")) for f in files]
            res = requests.post(
                f"{engine.url}/task/new", files=fields, data={"name": "baseline"}, timeout=600
            )
            baselines.append(time.perf_counter() - t)
            assert "uuid" in res.json(), res.text
            t = time.perf_counter()
            client.create_task(str(uuid.uuid4()), [str(f) for f in files], {}, name=f"ours-{i}")
            ours.append(time.perf_counter() - t)
    baseline, mine = statistics.median(baselines), statistics.median(ours)
    print(
        f"upload: {len(files)} seneca images, {size_mb:.1f} MB, one node on 127.0.0.1, "
        f"median of {repeat}"
    )
    print(
        f"  baseline (one multipart POST /task/new): {baseline:6.2f} s  {size_mb / baseline:6.1f} MB/s"
    )
    print(f"  ours (init, batches x4, commit):         {mine:6.2f} s  {size_mb / mine:6.1f} MB/s")
    print(
        f"  throughput ratio ours/baseline: {baseline / mine:.2f} "
        f"(per run: {', '.join(f'{b / o:.2f}' for b, o in zip(baselines, ours, strict=True))})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--submodels", type=int, default=20)
    parser.add_argument("--upload-repeat", type=int, default=5)
    parser.add_argument("--upload-only", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if not args.upload_only:
            overhead(args.submodels, Path(tmp))
        upload(Path(tmp), args.upload_repeat)


if __name__ == "__main__":
    main()
