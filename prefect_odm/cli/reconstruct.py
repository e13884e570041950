"""``prefect-odm reconstruct``: the flow run with progress bars, and the no-change repeat.

On the embedded API (no ``PREFECT_API_URL``), a repeat of the same command into the same output,
with the inputs' listing unchanged and every product still there, is answered from the record of
the last run (``layout.LAST_RUN_FILE`` in the output root) without starting Prefect.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Literal, TypedDict

from prefect_odm import __version__, storage
from prefect_odm.cli.args import merge_options, processing_options
from prefect_odm.cli.clusters import routing_options
from prefect_odm.cli.console import quiet_prefect_console
from prefect_odm.cli.last_run_checks import _damage_since_last_run, _plan_since_last_run
from prefect_odm.cli.process import EmbeddedAPIStart, prefect_environment
from prefect_odm.errors import InputError, PlanningError
from prefect_odm.layout import LAST_RUN_FILE, OutputLayout, join
from prefect_odm.settings import get_settings

if TYPE_CHECKING:
    from pydantic import JsonValue

    from prefect_odm.clusters.records import RoutingOptions
    from prefect_odm.models import Manifest, MergeOptions, ProcessingOptions, SplitPlan, Survey
    from prefect_odm.nodes.cluster import AnsweredNodes


REJECTED_SHOWN = 5
"""Rejected images named in the summary (the report lists every one)."""


def check_output_writable(output: str) -> None:
    """Fail early, before any scanning, when a local output location cannot be written.

    Leaves nothing behind: the nearest existing folder on the path must be a folder in which a
    folder can be made (one is made and removed: permission bits do not say so for root, or on
    ``/proc``).
    """
    if not storage.is_local(output):
        _check_remote_output(output)
        return
    probe = storage.local_path(output).absolute()
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        raise InputError(f"{output}: cannot write the output here ({probe} is not a folder)")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise InputError(f"{output}: cannot write the output here ({probe} is not writable)")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".prefect-odm-probe-", dir=probe))
    except OSError as exc:
        raise InputError(
            f"{output}: cannot write the output here (no folder can be made in {probe}: "
            f"{exc.strerror or exc})"
        ) from None


def _check_remote_output(output: str) -> None:
    """Fail early when a remote output location (``s3://...``) cannot be reached: no
    credentials, no endpoint, no bucket. Its client's errors (botocore's) are not ``OSError``s,
    and one reached the command line as a traceback from the first read of the output."""
    try:
        storage.exists(output)
    except Exception as exc:  # any client error: reported in one line below
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise InputError(f"{output}: cannot reach the output location ({reason})") from None


class RunRequest(TypedDict):
    """What a ``reconstruct`` command asked for (the last-run record's ``request``).

    Attributes:
        images, nodes, split, split_overlap_m, allow_partial: the command's arguments.
        listing: SHA-256 of the inputs' listing (names, sizes, times or ETags).
        options: the processing options as JSON data.
        merge_options: the merge options as JSON data (``--accept-alignment``,
            ``--point-cloud-format``): another merge is another request.
        version: the prefect-odm version.
    """

    images: str
    listing: str
    nodes: list[str]
    split: int | str
    split_overlap_m: float
    options: dict[str, JsonValue]
    """The processing options as JSON (``ProcessingOptions.model_dump(mode="json")``)."""
    merge_options: dict[str, JsonValue]
    allow_partial: bool
    version: str


class FlowParameters(TypedDict):
    """The ``reconstruct`` flow's parameters the command line sets (see the flow)."""

    images: str
    output: str
    nodes: list[str] | None
    split: int | Literal["auto"]
    split_overlap_m: float
    allow_partial: bool
    force: bool
    options: ProcessingOptions
    merge_options: MergeOptions | None
    routing: RoutingOptions | None


def _run_request(args: argparse.Namespace, options: ProcessingOptions) -> RunRequest:
    """What this command asks for, with a listing signature of the inputs (names, sizes and
    modification times or ETags; no content is read)."""
    fs, root = storage.filesystem(args.images)
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
        "merge_options": merge_options(args).model_dump(mode="json"),
        "allow_partial": args.allow_partial,
        "version": __version__,
    }


def _unchanged_since_last_run(output: str, request: RunRequest) -> Manifest | None:
    """The manifest of the last run into ``output`` when it was asked exactly this, the inputs'
    listing is unchanged and every product, merged and of each submodel, is still there and
    whole (:func:`_damage_since_last_run`, said in one line when not); else ``None``."""
    from prefect_odm.models import Manifest
    from prefect_odm.run_policy import rebased_manifest

    try:
        record = storage.read_json(join(output, LAST_RUN_FILE))
        if record.get("request") != request:
            return None
        url = str(record["manifest"])  # an older record's: relative to its working folder
        if storage.is_local(url) and not os.path.isabs(url):
            url = join(output, *url.split("/")[-2:])  # {root}/{fingerprint[:16]}/manifest.json
        manifest = Manifest.model_validate(storage.read_json(url))
    except (FileNotFoundError, OSError, ValueError, KeyError, TypeError):
        return None
    # an older manifest's paths are relative to its writer's working folder
    manifest = rebased_manifest(manifest, OutputLayout(output, manifest.survey_fingerprint))
    if manifest.failed_submodels:
        return None
    why = _damage_since_last_run(manifest) or _plan_since_last_run(output, manifest)
    if why is not None:
        from prefect_odm.cli.console import table_console

        table_console().print(why, markup=False)
        return None
    return manifest.model_copy(
        update={
            "submodels": [r.model_copy(update={"status": "reused"}) for r in manifest.submodels]
        }
    )


def _record_last_run(output: str, request: RunRequest, manifest: Manifest) -> None:
    """Write the record of this run (what was asked, where its manifest is) into ``output``."""
    manifest_url = OutputLayout(output, manifest.survey_fingerprint).manifest
    storage.write_json_atomic(
        join(output, LAST_RUN_FILE), {"request": request, "manifest": manifest_url}
    )


def accepted_alignment_lines(manifest: Manifest) -> list[str]:
    """The console lines of a run whose alignment failed gates the operator accepted
    (``--accept-alignment``): one heading and one line per failed gate; empty otherwise, so an
    accepted run never looks like a clean one."""
    report = manifest.alignment
    if report is None or not report.failures:
        return []
    lines = [
        f"ALIGNMENT ACCEPTED with {len(report.failures)} failed quality gate(s) "
        "(--accept-alignment): the seams may not be aligned"
    ]
    return lines + [f"  {f.message}" for f in report.failures]


def _print_summary(output: str, manifest: Manifest, note: str = "") -> None:
    """Each submodel's status, the products, gaps, rejected images, report and manifest."""
    from prefect_odm.cli.console import table_console

    out = table_console()  # paths stay on one line for scripts reading them
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
        rejected = manifest.rejected_images
        out.print(f"rejected images: {len(rejected)} (all of them in the report)", markup=False)
        for image in rejected[:REJECTED_SHOWN]:
            out.print(f"  {image.name}: {image.detail or image.reason}", markup=False)
        if len(rejected) > REJECTED_SHOWN:
            out.print(f"  ... and {len(rejected) - REJECTED_SHOWN} more", markup=False)
    for line in accepted_alignment_lines(manifest):
        out.print(line, markup=False)
    from prefect_odm.publish.surface import console_lines

    for line in console_lines(manifest):  # the pipeline; a DSM not measured, in words
        out.print(line, markup=False)
    layout = OutputLayout(output, manifest.survey_fingerprint)
    out.print(f"report: {layout.report_md}")
    out.print(f"manifest: {layout.manifest}")
    if note:
        out.print(note)


def _start_embedded_api_early() -> EmbeddedAPIStart:
    """Start Prefect's temporary API server in the background while the rest is imported.

    The flow's client finds the same (singleton) server already running; the command saves the
    few seconds its imports take. Joined before the flow starts (a start-up time-out is raised
    there as one line); the server ends with this process (:mod:`prefect_odm.cli.process`).
    """
    return EmbeddedAPIStart()


def _tokens_out_of_urls(urls: list[str]) -> list[str]:
    """The node URLs without ``?token=``; each token moves into ``PREFECT_ODM_NODE_TOKENS`` of
    this process, so it reaches its node but never a flow parameter, the last-run record or a log.
    A node source is kept whole (its query is ``memory_gib``, never a token: a DNS source
    refuses any other field).

    Raises:
        InputError: ``PREFECT_ODM_NODE_TOKENS`` is set but is not a JSON object.
    """
    from prefect_odm.nodes.cluster import split_token
    from prefect_odm.nodes.sources import is_source

    public: list[str] = []
    tokens: dict[str, str] = {}
    for raw in urls:
        if is_source(raw):
            public.append(raw)
            continue
        url, token = split_token(raw)
        public.append(url)
        if token:
            tokens[url] = token
    if tokens:
        current = get_settings().node_tokens
        try:
            mapping = json.loads(current) if current else {}
        except json.JSONDecodeError:
            raise InputError(
                "PREFECT_ODM_NODE_TOKENS is not a JSON object of URL -> token"
            ) from None
        if not isinstance(mapping, dict):
            raise InputError("PREFECT_ODM_NODE_TOKENS is not a JSON object of URL -> token")
        os.environ["PREFECT_ODM_NODE_TOKENS"] = json.dumps({**mapping, **tokens})
    return public


def reconstruct_command(args: argparse.Namespace) -> int:
    """``prefect-odm reconstruct``: check the inputs, answer an unchanged repeat from the last
    run's record, else run the flow with progress bars and print the summary.

    Raises:
        InputError: the images do not exist, an option is bad, or the output is not writable.
    """
    from prefect_odm.survey.scan import check_local_images, check_output_outside_images

    check_local_images(args.images)
    check_output_outside_images(args.images, args.output)
    nodes_file = getattr(args, "nodes_file", None)
    given = [*(args.nodes or []), *([nodes_file] if nodes_file else [])]
    args.nodes = _tokens_out_of_urls(given)
    routed = routing_options(args) is not None  # the clusters' nodes check the options
    from prefect_odm.nodes.cluster import embedded_option_errors

    # every bad option at once (the built-in engine's table among them when it runs them)
    on_engine = not args.nodes and not routed
    options = processing_options(args, embedded_option_errors if on_engine else None)
    nodes: AnsweredNodes | None = None
    if on_engine:
        from prefect_odm.nodes.cluster import check_embedded_options

        # the flow checks again; here a bad option costs no Prefect start-up
        check_embedded_options(options.to_nodeodm())
    elif args.nodes and not routed:
        from prefect_odm.nodes.cluster import check_nodes_answer

        # a dead URL, an unreadable node file or an option a node refuses: before Prefect
        nodes = check_nodes_answer(args.nodes, options=options.to_nodeodm())
    check_output_writable(args.output)
    embedded_api = prefect_environment()

    request = _run_request(args, options)
    unchanged = (
        None
        if args.force or routed or not embedded_api
        else _unchanged_since_last_run(args.output, request)
    )
    if unchanged is not None:
        _print_summary(
            args.output,
            unchanged,
            note="nothing changed since the last run into this output: nothing was run (--force runs again)",
        )
        return 0
    if not routed and storage.is_local(args.images):
        _check_plan(args, options, nodes)  # the planner's refusals before Prefect starts
    manifest = _run_flow(args, options, embedded_api)
    _record_last_run(args.output, request, manifest)
    _print_summary(args.output, manifest)
    return 0


def _check_plan(
    args: argparse.Namespace, options: ProcessingOptions, nodes: AnsweredNodes | None
) -> None:
    """Scan the local images and plan them as the flow will, so that what the planner refuses
    (a survey too small; a split whose submodels are too small for structure from motion, or
    that the merge could not align at the ``--split-overlap-m`` asked; a submodel larger than
    every node; ``--split auto`` with a node whose memory is unknown) is refused before
    Prefect's temporary server starts, with the flow's own one line. The flow's rescan is
    answered by the identity cache and its plan is this one when nothing changed
    (:func:`~prefect_odm.plan.cache.plan_split_once`).

    The plan is made for the built-in engine (its identity and memory) or for the ``nodes``
    that answered at the edge (their engines and memory, as the flow's cluster has them).

    Raises:
        InputError: the survey is too small to reconstruct, or ``--split auto`` meets a node
            whose memory is unknown.
        PlanningError: the planner refuses the split, or (built-in engine) the GPS altitudes
            are unusable (the plan files are written first, as the flow writes them).
    """
    from prefect_odm.plan.checks import plan_gps_refusal
    from prefect_odm.plan.picture import write_plan_files

    survey, plan = plan_local_images(args, options, nodes=nodes, merge=merge_options(args))
    refusal = plan_gps_refusal(plan, survey)
    if refusal is not None and not args.nodes:
        # The built-in engine's plan is the flow's: written with its picture, as the flow would.
        write_plan_files(OutputLayout(args.output, survey.fingerprint).plan_dir, plan, survey)
        raise PlanningError(f"{survey.source}: {refusal}")


def plan_local_images(
    args: argparse.Namespace,
    options: ProcessingOptions,
    *,
    nodes: AnsweredNodes | None = None,
    merge: MergeOptions | None = None,
) -> tuple[Survey, SplitPlan]:
    """Scan ``args.images`` and plan it with ``args.split`` and ``args.split_overlap_m`` as the
    flow does: for the built-in engine (its identity and memory), or for ``nodes`` (their
    engines and memory; ``--split auto`` sized by every node's, as the flow's
    ``_node_memory``). ``prefect-odm plan`` and ``reconstruct``'s edge both call it.
    The flow's own scan then finds every image in the identity cache (no file read) and its
    plan is this one (:func:`~prefect_odm.plan.cache.plan_split_once`).

    Raises:
        InputError: the images cannot be read or are too few to reconstruct, or
            ``--split auto`` meets a node whose memory is unknown.
        PlanningError: the planner refuses the split (a submodel larger than every node
            among its reasons).
    """
    from prefect_odm.nodes.capacity import memory_for_auto_split
    from prefect_odm.nodes.cluster import EMBEDDED_ENGINE_IDENTITY, embedded_memory_gib
    from prefect_odm.plan.cache import plan_split_once
    from prefect_odm.run_policy import check_survey_size
    from prefect_odm.survey.scan import scan_images

    identity, memory = EMBEDDED_ENGINE_IDENTITY, [embedded_memory_gib()]
    if nodes is not None:
        identity = nodes.engine_identity
        auto = args.split == "auto"
        memory = memory_for_auto_split(nodes.memory_by_node) if auto else nodes.node_memory_gib
    with _records_kept():
        survey = scan_images(args.images)
        check_survey_size(survey, args.images)
        plan = plan_split_once(
            survey,
            split=args.split,
            split_overlap_m=args.split_overlap_m,
            options=options,
            engine_identity=identity,
            node_memory_gib=memory,
            merge_options=merge,
            keep=True,  # for the flow's own plan_split_once, in this process, to take
        )
    return survey, plan


@contextmanager
def _records_kept() -> Iterator[None]:
    """Python's cyclic garbage collector paused while a survey is scanned and planned, then
    what the command made frozen (kept out of later collections): the survey's and plan's
    records live until the command ends, and every full collection walked all of them again
    (2.5 of 8 CPU-s for a 50,000-image scan and plan; issue 33). One collection before the
    freeze frees the cycles made while paused, so none is kept for good (the command line's
    ``main`` may run many times in one process, as the tests run it)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.collect()
        gc.freeze()
        if was_enabled:
            gc.enable()


def _run_flow(args: argparse.Namespace, options: ProcessingOptions, embedded_api: bool) -> Manifest:
    """The ``reconstruct`` flow run, its progress shown live on a terminal (stage, counts, one
    line per submodel in flight, merge) and as plain lines when stderr is not one."""
    # Prefect fully imported in this thread (and its console quiet) before the API starts in
    # the background: two threads importing prefect at once break its plugin start-up.
    import prefect  # noqa: F401
    from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

    quiet_prefect_console(args.verbose)
    early_server = _start_embedded_api_early() if embedded_api else None

    from rich.console import Console

    from prefect_odm import progress as events
    from prefect_odm.cli.console import LiveProgress
    from prefect_odm.flows import reconstruct

    quiet_prefect_console(args.verbose)
    with LiveProgress(Console(stderr=True)) as view:
        unsubscribe = events.subscribe(view.listen)
        if early_server is not None:
            early_server.join()
        try:
            # The heartbeat costs ~1 s per flow run; it only matters with a real server.
            settings = {PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None} if embedded_api else {}
            with temporary_settings(settings):
                manifest: Manifest = reconstruct(**_flow_parameters(args, options))
                return manifest
        finally:
            unsubscribe()


def _flow_parameters(args: argparse.Namespace, options: ProcessingOptions) -> FlowParameters:
    """The ``reconstruct`` flow's parameters from the command line."""
    return FlowParameters(
        images=args.images,
        output=args.output,
        nodes=args.nodes,
        split=args.split,
        split_overlap_m=args.split_overlap_m,
        allow_partial=args.allow_partial,
        force=args.force,
        options=options,
        merge_options=merge_options(args),
        routing=routing_options(args),
    )
