"""``prefect-odm clusters`` (each cluster's live state as a table) and ``prefect-odm capacity
serve`` (the same figures over HTTP); both read a saved ``ClusterDirectoryBlock``."""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING, Any

from prefect_odm.clusters.figures import ClusterFigures

if TYPE_CHECKING:
    from prefect_odm.clusters.records import RoutingOptions


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--port must be a whole number, not {text!r}") from None
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"--port must be between 1 and 65535, not {value}")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0.1 <= value <= 3600:
        raise argparse.ArgumentTypeError(
            f"--refresh-seconds must be between 0.1 and 3600, not {text}"
        )
    return value


def add_parsers(sub: Any) -> list[argparse.ArgumentParser]:
    """Add ``clusters``, ``capacity serve`` and ``requeue`` to the sub-command parsers.

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
    from prefect_odm.cli.requeue import add_parser as _add_requeue

    return [show, serve, _add_requeue(sub)]


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not (value > 0 and value < float("inf")):
        raise argparse.ArgumentTypeError(f"must be a finite number above 0, not {text}")
    return value


def add_routing_args(rec: argparse.ArgumentParser) -> None:
    """The ``reconstruct`` options of a run routed among the clusters of a directory."""
    group = rec.add_argument_group("several clusters (a cluster directory block)")
    group.add_argument(
        "--clusters",
        metavar="BLOCK_NAME",
        help="route the submodels among the clusters of this saved cluster directory "
        "(instead of --nodes; default: $PREFECT_ODM_CLUSTER_DIRECTORY)",
    )
    group.add_argument("--groups", nargs="+", default=[], metavar="GROUP", help="your groups")
    group.add_argument("--data-region", help="region of the images' storage (nearest first)")
    group.add_argument("--region", help="your own region (its clusters after the data-near)")
    group.add_argument(
        "--submodel-timeout",
        type=_positive,
        metavar="SECONDS",
        help="cancel a submodel's node task after this long on its node (default: from the "
        "time model, 10 min to 6 h)",
    )
    group.add_argument(
        "--split-area-m2",
        type=_positive,
        metavar="M2",
        help="area rule: split-merge a survey larger than this even when one node holds it",
    )


def routing_options(args: argparse.Namespace) -> RoutingOptions | None:
    """The routing of ``reconstruct``'s ``--clusters`` and the options beside it (``None``
    without ``--clusters``: the flow still reads ``PREFECT_ODM_CLUSTER_DIRECTORY``).

    Raises:
        InputError: ``--groups``, ``--data-region``, ``--region``, ``--submodel-timeout`` or
            ``--split-area-m2`` without ``--clusters`` or the variable.
    """
    from prefect_odm.clusters.records import RoutingOptions
    from prefect_odm.errors import InputError
    from prefect_odm.settings import get_settings

    name = args.clusters or get_settings().cluster_directory
    given = [
        flag
        for flag, value in (
            ("--groups", args.groups),
            ("--data-region", args.data_region),
            ("--region", args.region),
            ("--submodel-timeout", args.submodel_timeout),
            ("--split-area-m2", args.split_area_m2),
        )
        if value
    ]
    if name is None:
        if given:
            raise InputError(f"{given[0]} needs --clusters (a cluster directory block)")
        return None
    return RoutingOptions(
        directory=name,
        groups=list(args.groups),
        data_region=args.data_region,
        local_region=args.region,
        submodel_timeout_seconds=args.submodel_timeout,
        split_area_m2=args.split_area_m2,
    )


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
    """Run ``clusters``, ``capacity serve`` or ``requeue``.

    Raises:
        InputError: no such directory block, or a pool block it names is missing.
    """
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("DO_NOT_TRACK", "1")  # the SDK's own telemetry and its notice
    from prefect_odm.blocks.clusters import load_cluster_directory
    from prefect_odm.cli.console import quiet_prefect_console
    from prefect_odm.cli.process import start_embedded_api

    quiet_prefect_console(args.verbose)
    if not os.environ.get("PREFECT_API_URL"):
        start_embedded_api()
    if args.command == "requeue":
        from prefect_odm.cli.requeue import run as _requeue

        return _requeue(args)
    directory = load_cluster_directory(args.directory)
    if args.command == "capacity":
        from prefect_odm.clusters.service import serve

        print(f"capacity of {len(directory.clusters)} clusters on http://{args.host}:{args.port}")
        serve(directory, host=args.host, port=args.port, refresh_seconds=args.refresh_seconds)
        return 0
    from prefect_odm.cli.console import table_console
    from prefect_odm.clusters.capacity import directory_figures

    table_console().print(figures_table(directory_figures(directory)))
    return 0
