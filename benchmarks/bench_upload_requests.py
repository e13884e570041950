"""What one task's upload costs a real NodeODM 2.2.4 node, by request shape (issue 33).

Starts one NodeODM in test mode (``../shared/peers``), then creates ``--tasks`` tasks of
``--files`` small JPEGs each (``--kib`` KiB) through :class:`prefect_odm.nodes.client.NodeClient`
(init, uploads, commit, the image-count check), one after the other, for each batch size in
``--batch-files``; and as many ``GET /task/{uuid}/info`` polls. Prints per task: requests sent,
the node's CPU seconds (node.js, psutil), the client's CPU seconds and the wall time. CPU
seconds, not wall, are what to compare on a shared machine.

    python benchmarks/bench_upload_requests.py --files 150 --tasks 10 --batch-files 8 75 8 75
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import uuid as uuidlib
from pathlib import Path

import psutil

from prefect_odm.nodes.client import NodeClient

REPO = Path(__file__).resolve().parents[1]
TEMPLATE = REPO.parent / "shared" / "data" / "tiny_exif"


def _cpu(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return t.user + t.system


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=150)
    parser.add_argument("--kib", type=int, default=4)
    parser.add_argument("--tasks", type=int, default=10)
    parser.add_argument(
        "--batch-files",
        type=int,
        nargs="+",
        default=[8, 75],
        help="most files per upload request (2 requests at once)",
    )
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-upload-"))
    images = work / "images"
    images.mkdir()
    payload = os.urandom(args.kib * 1024)
    files = []
    for i in range(args.files):
        path = images / f"IMG_{i:05d}.JPG"
        path.write_bytes(b"\xff\xd8" + payload)
        files.append(str(path))
    script = REPO.parent / "shared" / "peers" / "start_nodeodm.sh"
    out = subprocess.run(
        [str(script), str(work / "node"), "--test_seconds", "1", "-q", "1"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    url, pid = out[0], int(out[1])
    node = psutil.Process(pid)
    me = psutil.Process()
    try:
        client = NodeClient(url)
        client.info()
        print(f"NodeODM {url}; {args.files} files of {args.kib} KiB per task, {args.tasks} tasks")
        for batch in args.batch_files:
            per = min(batch, -(-args.files // 2))
            requests_per_task = 3 + -(-args.files // per)
            n0, c0, w0 = _cpu(node), _cpu(me), time.perf_counter()
            made = []
            for _ in range(args.tasks):
                uuid = str(uuidlib.uuid4())
                client.create_task(
                    uuid,
                    files,
                    {},
                    name="bench",
                    parallel_uploads=2,
                    upload_batch_files=batch,
                )
                made.append(uuid)
            n1, c1, w1 = _cpu(node), _cpu(me), time.perf_counter()
            print(
                f"  batches of at most {batch} files (about {requests_per_task} requests a task"
                f" with init, commit and the check): node CPU {(n1 - n0) / args.tasks:.3f} s, "
                f"client CPU {(c1 - c0) / args.tasks:.3f} s, wall {(w1 - w0) / args.tasks:.2f} s"
                " per task"
            )
            time.sleep(2.0 * args.tasks)  # the tasks run 1 s each, one at a time
            for uuid in made:
                client.remove(uuid)
        n0, c0 = _cpu(node), _cpu(me)
        polls = 200
        for _ in range(polls):
            client.task_state(made[0])
        print(
            f"  GET /task/{{uuid}}/info (what the runner polls every second per task): node CPU"
            f" {1000 * (_cpu(node) - n0) / polls:.2f} ms, client CPU"
            f" {1000 * (_cpu(me) - c0) / polls:.2f} ms"
        )
        n0, w0 = _cpu(node), time.perf_counter()
        time.sleep(20.0)
        idle = (_cpu(node) - n0) / (time.perf_counter() - w0)
        print(f"  the node idle: {1000 * idle:.1f} ms of CPU per second")
    finally:
        os.kill(pid, 15)


if __name__ == "__main__":
    sys.exit(main())
