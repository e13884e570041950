"""Command line of the built-in engine.

``python -m prefect_odm.engine serve --port 3000 --data-dir DIR [...]`` runs the NodeODM-compatible
server; ``python -m prefect_odm.engine run-task TASK_DIR`` is the entry point of one task process
(started by the server, not by hand); ``python -m prefect_odm.engine watch`` is the watchdog of
:func:`prefect_odm.engine.launch.guard_process`. ``prefect-odm engine ...`` delegates to :func:`main`.
"""

from __future__ import annotations

import argparse
import logging
import math
import sys
from collections.abc import Sequence
from pathlib import Path

from prefect_odm.engine.faults import Faults
from prefect_odm.engine.store import DEFAULT_CLEANUP_HOURS
from prefect_odm.errors import InputError


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"a TCP port is 0 to 65535, not {port}")
    return port


def _at_least_one(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def _positive_gib(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of GiB: {text!r}") from None
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"must be a finite number of GiB above 0, not {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``python -m prefect_odm.engine``."""
    parser = argparse.ArgumentParser(
        prog="prefect-odm engine",
        description="The built-in NodeODM-compatible processing node of prefect-odm.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the NodeODM-compatible HTTP server")
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    serve.add_argument("--port", type=_port, default=3000, help="TCP port (default 3000)")
    serve.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help="task table and task folders (default: $PREFECT_ODM_HOME/engine-serve, "
        "i.e. ~/.cache/prefect-odm/engine-serve)",
    )
    serve.add_argument("--token", default=None, help="require ?token=TOKEN on every request")
    serve.add_argument(
        "--max-parallel-tasks", type=_at_least_one, default=1, help="tasks run at once"
    )
    serve.add_argument(
        "--method", choices=("sfm", "direct"), default=None, help="default 'pipeline' option"
    )
    serve.add_argument("--max-images", type=int, default=None, help="most images per task")
    serve.add_argument("--max-upload-mb", type=float, default=None, help="largest file, MiB")
    serve.add_argument(
        "--memory-gib",
        type=_positive_gib,
        default=None,
        help="memory /info reports, GiB (default: the machine's, or its cgroup's limit in a "
        "container when smaller)",
    )
    serve.add_argument(
        "--cleanup-hours",
        type=float,
        default=DEFAULT_CLEANUP_HOURS,
        help="delete finished tasks and uncommitted uploads after this many hours (0: never)",
    )
    serve.add_argument(
        "--faults",
        default=None,
        help="fault injection as JSON (see prefect_odm.engine.faults); default: "
        "$PREFECT_ODM_ENGINE_FAULTS or none",
    )
    serve.add_argument("--log-level", default="INFO", help="logging level of the engine")
    serve.add_argument(
        "--parent-pid",
        type=int,
        default=None,
        help="stop when this process (the engine's starter) ends",
    )
    sub.add_parser("watch", help="stop the processes listed on stdin when stdin closes")
    run = sub.add_parser("run-task", help="run one task process (used by the server)")
    run.add_argument("task_dir", type=Path)
    return parser


def _default_data_dir() -> Path:
    """``$PREFECT_ODM_HOME/engine-serve``: the data folder of ``serve`` without ``--data-dir``."""
    from prefect_odm.settings import prefect_odm_home

    return prefect_odm_home() / "engine-serve"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the engine command line; returns the process exit code."""
    args = build_parser().parse_args(list(argv) if argv is not None else None)
    if args.command == "watch":
        from prefect_odm.engine.launch import watch

        return watch(sys.stdin.buffer)
    if args.command == "run-task":
        from prefect_odm.engine.runner import run_task

        logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
        return run_task(args.task_dir)
    logging.basicConfig(
        level=getattr(logging, str(args.log_level).upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        faults = Faults.from_json(args.faults) if args.faults else Faults.from_env()
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    from prefect_odm.engine.server import EngineConfig, serve

    config = EngineConfig(
        data_dir=args.data_dir or _default_data_dir(),
        host=args.host,
        port=args.port,
        token=args.token or None,
        max_parallel_tasks=args.max_parallel_tasks,
        method=args.method,
        max_images=args.max_images,
        max_upload_mb=args.max_upload_mb,
        memory_gib=args.memory_gib,
        cleanup_hours=args.cleanup_hours,
        faults=faults,
    )
    if faults.active:
        logging.getLogger("prefect_odm.engine").warning("fault injection on: %s", faults.to_dict())
    serve(config, parent_pid=args.parent_pid)
    return 0


if __name__ == "__main__":
    sys.exit(main())
