"""``prefect-odm clusters`` (each cluster's live state as a table) and ``prefect-odm capacity
serve`` (the same figures over HTTP); both read a saved ``ClusterDirectoryBlock``."""

from __future__ import annotations

import argparse
import os
from typing import Any

from prefect_odm.clusters.figures import ClusterFigures


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--port must be a whole number, not {text!r}") from None
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError("--port must be between 1 and 65535")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0.1 <= value <= 3600:
        raise argparse.ArgumentTypeError("--refresh-seconds must be between 0.1 and 3600")
    return value


def add_parsers(sub: Any) -> list[argparse.ArgumentParser]:
    """Add ``clusters`` and ``capacity serve`` to the sub-command parsers.

    Returns:
        Their parsers (the caller adds ``-v`` to them).
    """
    show = sub.add_parser("clusters", help="each cluster's live state (nodes, memory, queue)")
    show.add_argument(
        "--directory", required=True, metavar="BLOCK_NAME", help="saved cluster directory block"
    )
    cap = sub.add_parser("capacity", help="the clusters' capacity figures over HTTP")
    cap_sub = cap.add_subparsers(dest="capacity_command", required=True)
    serve = cap_sub.add_parser("serve", help="serve /health, /clusters, /metrics (FastAPI)")
    serve.add_argument(
        "--directory", required=True, metavar="BLOCK_NAME", help="saved cluster directory block"
    )
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on")
    serve.add_argument("--port", type=_port, default=8900, help="port (default 8900)")
    serve.add_argument(
        "--refresh-seconds",
        type=_seconds,
        default=5.0,
        help="how often the figures are read again (default 5)",
    )
    return [show, serve]


def _age(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def figures_table(figures: list[ClusterFigures]) -> Any:
    """A rich table of the figures: nodes up of total, memory wanted/running/free, queue."""
    from rich.table import Table

    table = Table(title="clusters")
    for col in ("cluster", "nodes up", "memory GiB", "wanted GiB", "running GiB", "free GiB"):
        table.add_column(col, justify="left" if col == "cluster" else "right")
    for col in ("queue depth", "oldest waiting", "state"):
        table.add_column(col, justify="right")
    for f in figures:
        cap = f.memory_capacity_gib
        free = "?" if cap is None else f"{max(0.0, cap - f.wanted_memory_gib):.1f}"
        table.add_row(
            f.cluster,
            f"{f.nodes_up}/{f.nodes_total}",
            "?" if cap is None else f"{cap:.1f}",
            f"{f.wanted_memory_gib:.1f}",
            f"{f.running_memory_gib:.1f}",
            free,
            str(f.queue_depth),
            _age(f.oldest_waiting_seconds) if f.queue_depth else "-",
            "READY" if f.ready else "NOT READY",
        )
    return table


def run(args: argparse.Namespace) -> int:
    """Run ``clusters`` or ``capacity serve``.

    Raises:
        InputError: no such directory block, or a pool block it names is missing.
    """
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    from prefect_odm.blocks.clusters import load_cluster_directory
    from prefect_odm.cli.console import quiet_prefect_console
    from prefect_odm.cli.process import start_embedded_api

    quiet_prefect_console(args.verbose)
    if not os.environ.get("PREFECT_API_URL"):
        start_embedded_api()
    directory = load_cluster_directory(args.directory)
    if args.command == "capacity":
        from prefect_odm.clusters.service import serve

        print(f"capacity of {len(directory.clusters)} clusters on http://{args.host}:{args.port}")
        serve(directory, host=args.host, port=args.port, refresh_seconds=args.refresh_seconds)
        return 0
    from rich.console import Console

    from prefect_odm.clusters.capacity import directory_figures

    Console(soft_wrap=True).print(figures_table(directory_figures(directory)))
    return 0
