"""Command line: ``prefect-odm plan|reconstruct|merge|engine serve``.

Errors the user can fix (missing path, no images, no GPS, bad options) print one line and exit
with status 2; other failures print one line (plus the node's last lines when there are some)
and exit with status 1. Prefect's own console logging is quiet unless ``--verbose``; the run's
logs still reach the Prefect API and UI.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from prefect_odm import __version__
from prefect_odm.errors import InputError, NodeError, PlanningError, PrefectODMError
from prefect_odm.settings import DEFAULT_SPLIT, DEFAULT_SPLIT_OVERLAP_M


def _split_value(text: str) -> int | str:
    if text == "auto":
        return "auto"
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--split must be a whole number or 'auto', not {text!r}"
        ) from None
    if value < 1:
        raise argparse.ArgumentTypeError("--split must be at least 1")
    return value


def _overlap_value(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--split-overlap-m must be a number of metres, not {text!r}"
        ) from None
    if not value >= 0:
        raise argparse.ArgumentTypeError("--split-overlap-m must be 0 or more metres")
    return value


def _add_split_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--split",
        type=_split_value,
        default=DEFAULT_SPLIT,
        help=f"target images per submodel, or 'auto' (default {DEFAULT_SPLIT})",
    )
    p.add_argument(
        "--split-overlap-m",
        type=_overlap_value,
        default=DEFAULT_SPLIT_OVERLAP_M,
        help=f"overlap between submodels in metres (default {DEFAULT_SPLIT_OVERLAP_M:g})",
    )


def _add_option_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--orthophoto-resolution",
        type=float,
        default=5.0,
        help="orthophoto resolution, cm/pixel (default 5)",
    )
    p.add_argument("--dtm", action="store_true", help="also build a digital terrain model")
    p.add_argument(
        "--pipeline",
        choices=["sfm", "direct"],
        default="sfm",
        help="built-in engine method (default sfm)",
    )
    p.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="any other ODM option, repeatable",
    )


def _options(args: argparse.Namespace) -> Any:
    from prefect_odm.models import ProcessingOptions

    extra: dict[str, Any] = {}
    for item in args.option:
        if "=" not in item:
            raise InputError(f"--option {item!r}: expected NAME=VALUE")
        name, value = item.split("=", 1)
        try:
            extra[name] = json.loads(value)
        except json.JSONDecodeError:
            extra[name] = value
    from pydantic import ValidationError

    try:
        return ProcessingOptions(
            orthophoto_resolution_cm=args.orthophoto_resolution,
            dtm=args.dtm,
            pipeline=args.pipeline,
            extra=extra,
        )
    except ValidationError as exc:
        first = exc.errors()[0]
        where = str(first["loc"][0]) if first["loc"] else "options"
        flag = {"orthophoto_resolution_cm": "--orthophoto-resolution"}.get(
            where, f"--option {where}"
        )
        raise InputError(f"{flag}: {first['msg']}") from None


def _check_output_writable(output: str) -> None:
    """Fail early, before any scanning, when a local output location cannot be written.

    Creates nothing: the nearest existing folder on the path must be a writable folder.
    """
    from prefect_odm.storage import is_local, local_path

    if not is_local(output):
        return
    probe = local_path(output).absolute()
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        raise InputError(f"{output}: cannot write the output here ({probe} is not a folder)")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise InputError(f"{output}: cannot write the output here ({probe} is not writable)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="prefect-odm", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--verbose", "-v", action="store_true", help="show Prefect's run logs on the console"
    )
    sub = parser.add_subparsers(dest="command", required=True)

    rec = sub.add_parser("reconstruct", help="split, process and merge a survey")
    rec.add_argument("images", help="folder or fsspec URL of geotagged images")
    rec.add_argument("--output", "-o", required=True, help="output folder or fsspec URL")
    rec.add_argument(
        "--nodes", nargs="+", metavar="URL", help="NodeODM node URLs (default: the built-in engine)"
    )
    _add_split_args(rec)
    _add_option_args(rec)
    rec.add_argument(
        "--allow-partial", action="store_true", help="merge what finished and list failed submodels"
    )
    rec.add_argument("--force", action="store_true", help="process every submodel again")

    plan = sub.add_parser("plan", help="scan and plan a survey without processing it")
    plan.add_argument("images", help="folder or fsspec URL of geotagged images")
    plan.add_argument(
        "--output",
        "-o",
        default="plan",
        help="folder for plan.json, plan.geojson, plan.png (default ./plan)",
    )
    _add_split_args(plan)
    _add_option_args(plan)

    mrg = sub.add_parser("merge", help="merge OpenDroneMap outputs made elsewhere")
    mrg.add_argument(
        "inputs",
        nargs="+",
        help="ODM project folders, all.zip files or folders of them (paths or URLs)",
    )
    mrg.add_argument("--output", "-o", required=True, help="output folder or fsspec URL")
    mrg.add_argument(
        "--plan",
        help="plan.json of the prefect-odm run that made the inputs (same seams as its merge)",
    )

    slots = sub.add_parser(
        "slots", help="inspect or reset the memory slots (global concurrency limit)"
    )
    slots.add_argument("--name", default="prefect-odm-memory-gib", help="limit name")
    slots.add_argument(
        "--reset", action="store_true", help="set active slots to 0 (nothing may be running)"
    )

    from prefect_odm.cli_ops import add_parsers as _add_ops_parsers

    _add_ops_parsers(sub)  # setup, automations create

    eng = sub.add_parser("engine", help="the built-in NodeODM-compatible engine")
    eng.add_argument("engine_args", nargs=argparse.REMAINDER, help="e.g. serve --port 3000")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "engine":
        from prefect_odm.engine.__main__ import main as engine_main

        return int(engine_main(args.engine_args) or 0)
    try:
        if args.command == "plan":
            return _plan(args)
        if args.command == "reconstruct":
            return _reconstruct(args)
        if args.command in ("setup", "automations"):
            from prefect_odm.cli_ops import run as _run_ops

            return _run_ops(args)
        if args.command == "slots":
            return _slots(args)
        if args.command == "merge":
            return _merge_existing(args)
    except (InputError, PlanningError) as exc:
        print(f"prefect-odm: error: {exc}", file=sys.stderr)
        return 2
    except NodeError as exc:
        print(f"prefect-odm: error: {exc}", file=sys.stderr)
        return 1
    except PrefectODMError as exc:
        print(f"prefect-odm: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("prefect-odm: interrupted", file=sys.stderr)
        return 130
    return 0


def _plan(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from prefect_odm.cluster import EMBEDDED_ENGINE_IDENTITY, embedded_memory_gib
    from prefect_odm.planning import plan_submodels
    from prefect_odm.planviz import plan_geojson, plan_png, plan_rows
    from prefect_odm.scan import scan_survey
    from prefect_odm.storage import write_json_atomic

    survey = scan_survey(args.images)
    plan = plan_submodels(
        survey,
        split=args.split,
        split_overlap_m=args.split_overlap_m,
        options=_options(args),
        engine_identity=EMBEDDED_ENGINE_IDENTITY,
        node_memory_gib=[embedded_memory_gib()],
    )
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(str(out / "survey.json"), survey.model_dump(mode="json"))
    write_json_atomic(str(out / "plan.json"), plan.model_dump(mode="json"))
    write_json_atomic(str(out / "plan.geojson"), plan_geojson(plan))
    plan_png(plan, out / "plan.png")
    console = Console()
    rows = plan_rows(plan)
    table = Table(title=f"{len(plan.submodels)} submodels, EPSG:{plan.crs_epsg}")
    for col in rows[0]:
        table.add_column(str(col))
    for row in rows:
        table.add_row(*(f"{v:.1f}" if isinstance(v, float) else str(v) for v in row.values()))
    console.print(table)
    for r in survey.rejected:
        console.print(f"rejected {r.name}: {r.reason} {r.detail}")
    console.print(f"plan written to {out}/plan.json, plan.geojson, plan.png")
    return 0


def _merge_existing(args: argparse.Namespace) -> int:
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    from prefect_odm.flows.merge_existing import merge_existing

    _quiet_prefect_console(args.verbose)
    manifest = merge_existing(inputs=args.inputs, output=args.output, plan=args.plan)
    for name, url in sorted(manifest.products.items()):
        print(f"{name}: {url}")
    return 0


def _slots(args: argparse.Namespace) -> int:
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    from prefect_odm.tasks.admission import reset_slots, slots_status

    _quiet_prefect_console(args.verbose)
    if args.reset:
        reset_slots(args.name)
        print(f"{args.name}: active slots reset to 0")
    status = slots_status(args.name)
    if status["limit"] is None:
        print(f"{args.name}: no such concurrency limit (it is created by the first run)")
        return 0
    print(f"{args.name}: {status['active_slots']} of {status['limit']} GiB slots in use")
    for h in status["holders"]:
        state = "running" if h["alive"] else "dead (released at the next run)"
        print(f"  pid {h['pid']}: {h['slots']} slots for {h['what']} [{state}]")
    return 0


def _quiet_prefect_console(verbose: bool) -> None:
    if verbose:
        return
    for name in (
        "prefect",
        "prefect.flow_runs",
        "prefect.task_runs",
        "prefect.server",
        "uvicorn",
        "prefect_odm",
    ):
        for handler in logging.getLogger(name).handlers:
            if not handler.__class__.__name__.startswith("APILogHandler"):
                handler.setLevel(logging.CRITICAL + 1)


LAST_RUN = ".prefect-odm-last-run.json"
"""Record, in the output root, of the last command-line run: what was asked and what it made."""


def _run_request(args: argparse.Namespace, options: Any) -> dict[str, Any]:
    """What this command asks for, with a listing signature of the inputs (names, sizes and
    modification times or ETags; no content is read)."""
    import hashlib

    from prefect_odm.storage import filesystem

    fs, root = filesystem(args.images)
    try:
        found = fs.find(root, detail=True) if fs.isdir(root) else {}
    except OSError:
        found = {}
    rows = sorted(
        (
            name,
            info.get("size"),
            str(info.get("mtime") or info.get("ETag") or info.get("LastModified") or ""),
        )
        for name, info in found.items()
    )
    return {
        "images": args.images,
        "listing": hashlib.sha256(json.dumps(rows, default=str).encode()).hexdigest(),
        "nodes": sorted(args.nodes or []),
        "split": args.split,
        "split_overlap_m": args.split_overlap_m,
        "options": options.model_dump(mode="json"),
        "allow_partial": args.allow_partial,
        "version": __version__,
    }


def _unchanged_since_last_run(output: str, request: dict[str, Any]) -> Any:
    """The manifest of the last run into ``output`` when it was asked exactly this, the inputs'
    listing is unchanged and every product is still there; else ``None``."""
    from prefect_odm import storage
    from prefect_odm.layout import join
    from prefect_odm.models import Manifest

    try:
        record = storage.read_json(join(output, LAST_RUN))
        if record.get("request") != request:
            return None
        manifest = Manifest.model_validate(storage.read_json(record["manifest"]))
    except (FileNotFoundError, OSError, ValueError, KeyError, TypeError):
        return None
    if manifest.failed_submodels or not all(storage.exists(u) for u in manifest.products.values()):
        return None
    return manifest.model_copy(
        update={
            "submodels": [r.model_copy(update={"status": "reused"}) for r in manifest.submodels]
        }
    )


def _record_last_run(output: str, request: dict[str, Any], manifest: Any) -> None:
    from prefect_odm import storage
    from prefect_odm.layout import OutputLayout, join

    manifest_url = OutputLayout(output, manifest.survey_fingerprint).manifest
    storage.write_json_atomic(
        join(output, LAST_RUN), {"request": request, "manifest": manifest_url}
    )


def _print_summary(output: str, manifest: Any, note: str = "") -> None:
    from rich.console import Console

    from prefect_odm.layout import OutputLayout

    out = Console()
    for r in manifest.submodels:
        detail = f" ({r.error})" if r.error else ""
        out.print(f"{r.submodel_id}: {r.status}{detail}")
    for name, url in sorted(manifest.products.items()):
        out.print(f"{name}: {url}")
    if manifest.failed_submodels:
        out.print(
            f"gaps: {len(manifest.failed_submodels)} submodel(s) failed, listed in the manifest"
        )
    if manifest.rejected_images:
        out.print(f"rejected images: {len(manifest.rejected_images)} (reasons in the report)")
    layout = OutputLayout(output, manifest.survey_fingerprint)
    out.print(f"report: {layout.report_dir}/report.md")
    out.print(f"manifest: {layout.manifest}")
    if note:
        out.print(note)


def _start_embedded_api_early() -> threading.Thread:
    """Start Prefect's temporary API server in the background while the rest is imported.

    The flow's client finds the same (singleton) server already running; the command saves the
    few seconds its imports take. Joined before the flow starts.
    """

    def start() -> None:
        from prefect.server.api.server import SubprocessASGIServer

        SubprocessASGIServer().start()

    thread = threading.Thread(target=start, name="prefect-api-start", daemon=True)
    thread.start()
    return thread


def _reconstruct(args: argparse.Namespace) -> int:
    from prefect_odm.storage import is_local, local_path

    if is_local(args.images) and not local_path(args.images).exists():
        raise InputError(f"{args.images}: does not exist")
    options = _options(args)
    _check_output_writable(args.output)
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
    # The embedded server would try to send telemetry; this machine may have no route out.
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    embedded_api = not os.environ.get("PREFECT_API_URL")

    request = _run_request(args, options)
    unchanged = (
        None if args.force or not embedded_api else _unchanged_since_last_run(args.output, request)
    )
    if unchanged is not None:
        _print_summary(
            args.output,
            unchanged,
            note="nothing changed since the last run into this output: nothing was run (--force runs again)",
        )
        return 0

    # Prefect fully imported in this thread (and its console quiet) before the API starts in
    # the background: two threads importing prefect at once break its plugin start-up.
    import prefect  # noqa: F401
    from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

    _quiet_prefect_console(args.verbose)
    early_server = _start_embedded_api_early() if embedded_api else None

    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from prefect_odm import progress as events
    from prefect_odm.flows import reconstruct

    _quiet_prefect_console(args.verbose)
    console = Console(stderr=True)
    bars: dict[str, Any] = {}
    lock = threading.Lock()
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.fields[state]}"),
        TimeElapsedColumn(),
        console=console,
        transient=False,
        disable=not console.is_terminal,
    ) as bar:
        stage = bar.add_task("stage", total=None, state="starting Prefect")

        def listen(event: dict[str, Any]) -> None:
            with lock:
                if event["kind"] == "stage":
                    bar.update(stage, state=event["name"])
                elif event["kind"] == "plan":
                    for sid in event["submodels"]:
                        bars[sid] = bar.add_task(sid, total=1.0, state="waiting")
                elif event["kind"] == "submodel" and event["id"] in bars:
                    bar.update(
                        bars[event["id"]],
                        completed=event.get("fraction", 0.0),
                        state=event["state"],
                    )
                elif event["kind"] == "merge":
                    bar.update(
                        stage, state=f"merge {event['product']} {event['done']}/{event['total']}"
                    )

        unsubscribe = events.subscribe(listen)
        if early_server is not None:
            early_server.join()
        try:
            # The heartbeat costs ~1 s per flow run; it only matters with a real server.
            settings = {PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None} if embedded_api else {}
            with temporary_settings(settings):
                manifest = reconstruct(
                    images=args.images,
                    output=args.output,
                    nodes=args.nodes,
                    split=args.split,
                    split_overlap_m=args.split_overlap_m,
                    options=options,
                    allow_partial=args.allow_partial,
                    force=args.force,
                )
        finally:
            unsubscribe()
    _record_last_run(args.output, request, manifest)
    _print_summary(args.output, manifest)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
