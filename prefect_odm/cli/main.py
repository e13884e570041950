"""Command line: ``prefect-odm plan|reconstruct|merge|engine serve``.

Errors the user can fix (missing path, no images, no GPS, bad options) print one line and exit
with status 2; other failures print one line (plus the node's last lines when there are some)
and exit with status 1. Prefect's own console logging is quiet unless ``--verbose``; the run's
logs still reach the Prefect API and UI.

The parser is :mod:`prefect_odm.cli.args`, ``reconstruct`` is :mod:`prefect_odm.cli.reconstruct`,
``setup`` and ``automations`` are :mod:`prefect_odm.cli.ops`.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from prefect_odm.cli.args import build_parser, merge_options, processing_options
from prefect_odm.cli.process import (
    install_signal_handlers,
    prefect_environment,
    prefect_start_error,
    start_prefect,
)
from prefect_odm.errors import InputError, PlanningError, PrefectODMError
from prefect_odm.layout import PLAN_FILES, OutputLayout, plan_file

__all__ = ["build_parser", "main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run one ``prefect-odm`` command; returns the exit status (0, 1, 2 or 130)."""
    words = list(sys.argv[1:] if argv is None else argv)
    if words[:1] == ["engine"]:
        # The engine parses its own words, ``--help`` included (it lists ``serve``).
        from prefect_odm.engine.__main__ import main as engine_main

        return int(engine_main(words[1:]) or 0)
    args = build_parser().parse_args(words)
    install_signal_handlers()
    try:
        runner = _COMMANDS.get(args.command)  # ``engine`` after a global flag: nothing to do
        return runner(args) if runner is not None else 0
    except (InputError, PlanningError) as exc:
        print(f"prefect-odm: error: {exc}", file=sys.stderr)
        return 2
    except PrefectODMError as exc:  # a node's failure (NodeError) among them
        print(f"prefect-odm: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("prefect-odm: interrupted", file=sys.stderr)
        return 130
    except RuntimeError as exc:  # Prefect's start-up time-out, raised where it first connects
        one_line = prefect_start_error(exc)
        if one_line is None:
            raise
        print(f"prefect-odm: error: {one_line}", file=sys.stderr)
        return 1


def _reconstruct(args: argparse.Namespace) -> int:
    """``prefect-odm reconstruct`` (:mod:`prefect_odm.cli.reconstruct`)."""
    from prefect_odm.cli.reconstruct import reconstruct_command

    return reconstruct_command(args)


def _ops(args: argparse.Namespace) -> int:
    """``prefect-odm setup`` and ``automations`` (:mod:`prefect_odm.cli.ops`)."""
    from prefect_odm.cli.ops import run

    return run(args)


def _clusters(args: argparse.Namespace) -> int:
    """``prefect-odm clusters``, ``capacity`` and ``requeue`` (:mod:`prefect_odm.cli.clusters`)."""
    from prefect_odm.cli.clusters import run

    return run(args)


def _k8s_render(args: argparse.Namespace) -> int:
    """``prefect-odm k8s render``: write the work-pool template and the manifests."""
    from prefect_odm.k8s.render import RenderSettings, fleet_nodes_source, render

    settings = RenderSettings(
        namespace=args.namespace,
        work_pool=args.work_pool,
        image=args.image,
        node_image=args.node_image,
        fleet_cluster=args.fleet_cluster,
        capacity_url=args.capacity_url.rstrip("/"),
        gib_per_pod=args.gib_per_pod,
        min_replicas=args.min_replicas,
        max_replicas=args.max_replicas,
    )
    for path in render(Path(args.out), settings):
        print(path)
    print(f'runs on the NodeODM fleet: --nodes "{fleet_nodes_source(settings)}"')
    return 0


def _stac(args: argparse.Namespace) -> int:
    """``prefect-odm stac``: write a finished run's STAC catalogue, print its collection.json."""
    from prefect_odm.publish.stac import write_stac

    print(write_stac(args.run_folder))
    return 0


def _plan(args: argparse.Namespace) -> int:
    """``prefect-odm plan``: scan and plan, write the plan files, print the plan table."""
    from prefect_odm.survey.scan import check_local_images, check_output_outside_images

    check_local_images(args.images)  # before the planning imports (SciPy, Matplotlib): < 1 s
    check_output_outside_images(args.images, args.output)
    from prefect_odm.cli.reconstruct import check_output_writable

    check_output_writable(args.output)  # a file in the way, or a place no folder can be made
    _check_plan_folder(Path(args.output))
    from rich.table import Table

    from prefect_odm.cli.console import table_console
    from prefect_odm.cli.reconstruct import plan_local_images
    from prefect_odm.nodes.cluster import check_embedded_options, embedded_option_errors
    from prefect_odm.plan.picture import plan_rows, write_plan_files

    # The plan is made for the built-in engine (its memory model): its options are checked as
    # ``reconstruct`` checks them, so a plan never records an option a run would refuse.
    options = processing_options(args, embedded_option_errors)
    check_embedded_options(options.to_nodeodm())
    survey, plan = plan_local_images(args, options)
    out = Path(args.output)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"{out}: cannot write the plan here ({exc.strerror})") from None
    if not os.access(out, os.W_OK | os.X_OK):
        raise InputError(f"{out}: cannot write the plan here (not writable)")
    write_plan_files(str(out), plan, survey)
    console = table_console()
    rows = plan_rows(plan)
    count = len(plan.submodels)
    table = Table(title=f"{count} submodel{'s' if count != 1 else ''}, EPSG:{plan.crs_epsg}")
    for col in rows[0]:
        table.add_column(str(col))
    for row in rows:
        table.add_row(*(f"{v:.1f}" if isinstance(v, float) else str(v) for v in row.values()))
    console.print(table)
    for r in survey.rejected:
        console.print(f"rejected {r.name}: {r.detail or r.reason} ({r.reason})")
    written = ", ".join(PLAN_FILES[k] for k in ("survey", "geojson", "png"))
    for warning in plan.warnings:
        console.print(f"warning: {warning}")
    console.print(f"plan written to {plan_file(str(out), 'plan')}, {written}")
    return 0


def _check_plan_folder(folder: Path) -> None:
    """Refuse, before the scan, a ``plan --output`` whose files another plan would replace and
    lose: a folder holding anything but a plan's files (the default ``plan`` is a common folder
    name), or a run's own ``<fingerprint>/plan/``, which the run's reruns read.

    Raises:
        InputError: one line naming the folder and what is in it.
    """
    if not folder.is_dir():
        return
    run = folder.absolute().parent
    if folder.name == "plan" and ((run / "submodels").is_dir() or (run / "manifest.json").exists()):
        raise InputError(
            f"{folder}: the plan of the run in {run}, which its reruns read; give --output "
            "another folder"
        )
    others = sorted(p.name for p in folder.iterdir() if p.name not in PLAN_FILES.values())
    if others:
        shown = ", ".join(others[:3]) + (f" and {len(others) - 3} more" if len(others) > 3 else "")
        raise InputError(
            f"{folder}: holds files that are not a plan's ({shown}); give --output an empty or "
            "new folder, or a folder an earlier `prefect-odm plan` wrote"
        )


def _check_plan_file(url: str) -> None:
    """Raise :class:`InputError` (one line) unless ``url`` is a readable prefect-odm plan.json."""
    from pydantic import ValidationError

    from prefect_odm.models import SplitPlan
    from prefect_odm.storage import read_json

    try:
        SplitPlan.model_validate(read_json(url))
    except FileNotFoundError:
        raise InputError(f"--plan {url}: no such file") from None
    except (OSError, ValueError, ValidationError) as exc:
        reason = "not a prefect-odm plan.json" if isinstance(exc, ValueError) else str(exc)
        raise InputError(f"--plan {url}: {reason}") from None


def _check_existing_merge(inputs: list[str], plan: str | None) -> None:
    """Refuse, before Prefect starts and from listings, ``shots.geojson`` and product headers
    only, every merge the flow would refuse from its inputs: a file that is no archive, an
    escaping member, no product, a plan of another run or survey, a submodel missing, products
    far from their planned footprint (:mod:`prefect_odm.merge.existing_checks`).

    Raises:
        InputError: one line naming the file and the problem (exit status 2: these are inputs
            the user gave, not a node's canned products as in ``reconstruct``).
    """
    from prefect_odm.errors import MergeError
    from prefect_odm.merge.existing_checks import check_existing_merge

    try:
        check_existing_merge(inputs, plan)
    except MergeError as exc:  # MisplacedProductError; a product whose header cannot be read
        raise InputError(str(exc)) from None


def _merge_existing(args: argparse.Namespace) -> int:
    """``prefect-odm merge``: the ``merge_existing`` flow; prints the products."""
    prefect_environment()
    from prefect_odm.cli.reconstruct import check_output_writable
    from prefect_odm.storage import check_inputs_exist

    check_inputs_exist(args.inputs)  # before Prefect is imported and started
    check_output_writable(args.output)
    if args.plan is not None:
        _check_plan_file(args.plan)
    _check_existing_merge(args.inputs, args.plan)
    from prefect_odm.flows.merge_existing import merge_existing

    start_prefect(args.verbose)
    manifest = merge_existing(
        inputs=args.inputs, output=args.output, plan=args.plan, options=merge_options(args)
    )
    for name, url in sorted(manifest.products.items()):
        print(f"{name}: {url}")
    from prefect_odm.cli.reconstruct import accepted_alignment_lines

    for line in accepted_alignment_lines(manifest):  # as reconstruct says it
        print(line)
    layout = OutputLayout(args.output, manifest.survey_fingerprint)
    print(f"report: {layout.report_md}")
    print(f"manifest: {layout.manifest}")
    return 0


def _slots(args: argparse.Namespace) -> int:
    """``prefect-odm slots``: the memory limit's use and holders (``--reset``: clear it)."""
    embedded_api = prefect_environment()
    from prefect_odm.tasks.admission import reset_slots, slots_status

    start_prefect(args.verbose)
    if args.reset:
        reset_slots(args.name)
        print(f"{args.name}: active slots reset to 0")
    status = slots_status(args.name)
    if status["limit"] is None:
        print(f"{args.name}: no such concurrency limit (it is created by the first run)")
        return 0
    print(f"{args.name}: {status['active_slots']} of {status['limit']} GiB slots in use")
    for h in status["holders"]:
        if h["alive"]:
            state = "running" if h["held"] else "waiting for its slots"
        else:
            state = "dead (released at the next run)"
        print(f"  pid {h['pid']}: {h['slots']} slots for {h['what']} [{state}]")
    named = sum(h["slots"] for h in status["holders"] if h["held"] or not h["alive"])
    unnamed = (status["active_slots"] or 0) - named
    if unnamed > 0:
        where = (
            "released at the next run on this machine"
            if embedded_api
            else "held from another machine, or until their lease expires"
        )
        print(f"  {unnamed} slots held by no process on this machine [{where}]")
    return 0


_COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "plan": _plan,
    "reconstruct": _reconstruct,
    "setup": _ops,
    "automations": _ops,
    "clusters": _clusters,
    "capacity": _clusters,
    "requeue": _clusters,
    "slots": _slots,
    "merge": _merge_existing,
    "k8s": _k8s_render,
    "stac": _stac,
}
"""Subcommand -> what runs it (the modules behind them are imported only when they run)."""
