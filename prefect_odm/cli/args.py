"""The ``prefect-odm`` argument parser, and the processing options it reads."""

from __future__ import annotations

import argparse
import difflib
import json
import math
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

from prefect_odm.errors import InputError
from prefect_odm.layout import PLAN_FILES
from prefect_odm.settings import DEFAULT_SPLIT, DEFAULT_SPLIT_OVERLAP_M, MAX_ASKED_SPLIT_OVERLAP_M

if TYPE_CHECKING:
    from pydantic import JsonValue

    from prefect_odm.models import MergeOptions, OptionValue, ProcessingOptions

DESCRIPTION = (
    "Split, process and merge drone surveys on NodeODM nodes or the built-in engine, as Prefect "
    "flows."
)


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
        raise argparse.ArgumentTypeError(f"--split must be at least 1, not {value}")
    return value


def _location(text: str) -> str:
    """A path or URL that is not empty (``""`` was read as the current folder)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty path")
    return text


def _overlap_value(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--split-overlap-m must be a number of metres, not {text!r}"
        ) from None
    if not (0 <= value <= MAX_ASKED_SPLIT_OVERLAP_M):
        raise argparse.ArgumentTypeError(
            f"--split-overlap-m must be 0 to {MAX_ASKED_SPLIT_OVERLAP_M:g} metres, not {text}"
        )
    return value


def _resolution_value(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--orthophoto-resolution must be a number of cm/pixel, not {text!r}"
        ) from None
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(
            f"--orthophoto-resolution must be a finite number of cm/pixel above 0, not {text}"
        )
    return value


def _node_url(text: str) -> str:
    from urllib.parse import urlparse

    from prefect_odm.nodes.sources import is_source, source_for

    if is_source(text):  # dns+http://name:port or file:///path, read again during the run
        try:
            source_for(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        return text
    try:
        parsed = urlparse(text)
        parsed.port  # noqa: B018 - raises ValueError on a port that is not a number
    except ValueError:
        parsed = None
    schemes = ("http", "https", "scaleodm+http", "scaleodm+https")
    if parsed is None or parsed.scheme not in schemes or not parsed.hostname:
        shown = text.split("?", 1)[0].rsplit("@", 1)[-1]  # never echo a token or password
        raise argparse.ArgumentTypeError(f"{shown!r} is not a node URL (expected http://host:port)")
    return text


def _nodes_file(text: str) -> str:
    """``--nodes-file PATH`` as the node source ``file:///absolute/path``."""
    from pathlib import Path

    return f"file://{Path(text).expanduser().resolve()}"


def _add_node_args(p: argparse.ArgumentParser) -> None:
    """``--nodes`` and ``--nodes-file`` (node sources: :mod:`prefect_odm.nodes.sources`)."""
    p.add_argument(
        "--nodes",
        nargs="+",
        metavar="URL",
        type=_node_url,
        help="NodeODM node URLs, or dns+http://name:port (every address one node, resolved "
        "again during the run) (default: the built-in engine)",
    )
    p.add_argument(
        "--nodes-file",
        type=_nodes_file,
        metavar="PATH",
        help="a file of node URLs, one a line, read again when it changes during the run",
    )


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
        default=None,
        help="overlap between submodels in metres (default "
        f"{DEFAULT_SPLIT_OVERLAP_M:g}, widened by the plan until every pair of neighbouring "
        "submodels can be aligned; when set, a split that cannot be aligned is refused)",
    )


def _add_option_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--orthophoto-resolution",
        type=_resolution_value,
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


_FLAG_OPTIONS = {
    "orthophoto-resolution": "--orthophoto-resolution",
    "dtm": "--dtm",
    "pipeline": "--pipeline",
}
"""NodeODM options the command line sets with a flag of its own (``--option`` may not set them
again: the two values would disagree)."""


OptionTableCheck = Callable[[dict[str, "OptionValue"]], Sequence[object]]
"""The check of an engine's option table: NodeODM options -> one problem each (its ``str`` is
the line shown); the built-in engine's is ``embedded_option_errors``."""


def processing_options(
    args: argparse.Namespace, table_check: OptionTableCheck | None = None
) -> ProcessingOptions:
    """The processing options of ``--orthophoto-resolution``, ``--dtm``, ``--pipeline`` and
    ``--option NAME=VALUE`` (a JSON value, else the text; a JSON object or list stays its text,
    as ODM's ``cameras`` and ``boundary`` take it; ``--option dsm=false`` sets the DSM field).
    The values are checked once, by :class:`~prefect_odm.models.ProcessingOptions` (the same
    check the Python API gets); the nodes' ``/options`` check follows (``table_check`` here, else
    in the flow).

    Every bad option is reported at once: one problem, one line; several, a line counting them
    and one line each (``table_check``, when given, adds what the engine's option table refuses
    among the options that passed), so a user fixes them all before the next run.

    Raises:
        InputError: an option is malformed or invalid (the message names each flag).
    """
    from prefect_odm.models import ProcessingOptions

    extra, problems = _parsed_option_words(args.option)
    if not math.isfinite(args.orthophoto_resolution):
        problems.append("--orthophoto-resolution: must be a finite number of cm/pixel")
    fields: dict[str, JsonValue] = {
        "orthophoto_resolution_cm": args.orthophoto_resolution,
        "dtm": args.dtm,
        "pipeline": args.pipeline,
    }
    if "dsm" in extra:
        fields["dsm"] = extra.pop("dsm")
    refused = _refused_fields({**fields, "extra": extra})
    problems += refused.values()
    if not problems:
        return ProcessingOptions.model_validate({**fields, "extra": extra})
    if table_check is not None and "" not in refused:
        kept = {k: v for k, v in extra.items() if k not in refused}
        passed = ProcessingOptions.model_validate({**fields, "extra": kept})
        problems += [str(p) for p in table_check(passed.to_nodeodm())]
    if len(problems) == 1:
        raise InputError(problems[0])
    lines = "\n".join(f"  - {p}" for p in problems)
    raise InputError(f"{len(problems)} problems with the options:\n{lines}")


def _parsed_option_words(words: Sequence[str]) -> tuple[dict[str, JsonValue], list[str]]:
    """``--option NAME=VALUE`` words as name -> value, and a line per malformed word."""
    extra: dict[str, JsonValue] = {}
    problems: list[str] = []
    for item in words:
        if "=" not in item:
            problems.append(f"--option {item!r}: expected NAME=VALUE")
            continue
        name, value = item.split("=", 1)
        name = name.strip()
        if not name:
            problems.append(f"--option {item!r}: the option has no name (expected NAME=VALUE)")
        elif name in _FLAG_OPTIONS:
            problems.append(f"--option {name}: set it with {_FLAG_OPTIONS[name]} instead")
        else:
            try:
                parsed = json.loads(value)
            except json.JSONDecodeError:
                parsed = value
            # an object or a list stays the JSON text ODM takes (cameras, boundary)
            extra[name] = value if isinstance(parsed, dict | list) else parsed
    return extra, problems


def _refused_fields(data: dict[str, JsonValue]) -> dict[str, str]:
    """What :class:`~prefect_odm.models.ProcessingOptions` refuses in ``data``: the ``extra``
    option's name (``""`` for a field) -> one line naming the flag or option, every one."""
    from pydantic import ValidationError

    from prefect_odm.models import ProcessingOptions

    try:
        ProcessingOptions.model_validate(data)
    except ValidationError as exc:
        refused: dict[str, str] = {}
        for error in exc.errors():
            loc = [str(part) for part in error["loc"]]
            message = str(error["msg"]).removeprefix("Value error, ")
            if loc[:1] == ["extra"] and len(loc) >= 2:
                name = loc[1]
                flag = "--option" if loc[2:3] == ["[key]"] else f"--option {name}"
                refused.setdefault(name, f"{flag}: {message}")
            else:
                where = loc[0] if loc else "options"
                flag = {"orthophoto_resolution_cm": "--orthophoto-resolution"}.get(
                    where, f"--option {where}"
                )
                refused.setdefault("", f"{flag}: {message}")
        return refused
    return {}


class OneLineParser(argparse.ArgumentParser):
    """An argument parser whose errors are one line (``prefect-odm: error: ...``, exit 2), as
    every other bad input of the command line; ``--help`` still shows the usage."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """argparse's parser without abbreviations (``--outp`` was taken for ``--output``, and a
        later flag sharing a prefix would change what an old command line means)."""
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        """argparse's, keeping the words for :meth:`error` (a subcommand's parser is given its
        own words here)."""
        self._words = list(sys.argv[1:] if args is None else args)
        return super().parse_known_args(args, namespace)

    def error(self, message: str) -> NoReturn:
        """Exit with status 2 and one line naming the subcommand and the problem (argparse's
        hook). A flag this parser does not know is named before a missing required one
        (argparse checks required flags first: ``--outp x`` was reported as "--output is
        required"), with the nearest flag it knows."""
        known = list(self._option_string_actions)
        unknown = [
            w.split("=", 1)[0]
            for w in getattr(self, "_words", [])
            if w.startswith("--") and w.split("=", 1)[0] not in known
        ]
        if unknown and message.startswith("the following arguments are required"):
            close = difflib.get_close_matches(unknown[0], known, n=1)
            message = f"unrecognized arguments: {' '.join(unknown)}" + (
                f" (did you mean {close[0]}?)" if close else ""
            )
        sub = self.prog.removeprefix("prefect-odm").strip()
        where = f" {sub}" if sub else ""
        self.exit(2, f"prefect-odm{where}: error: {message} (see --help)\n")


def _add_accept_alignment(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--accept-alignment",
        action="store_true",
        help="merge even when the alignment between submodels fails its quality gates "
        "(the report then says so)",
    )
    p.add_argument(
        "--point-cloud-format",
        choices=["copc", "laz"],
        default="copc",
        help="merged point cloud as COPC (odm_georeferenced_model.copc.laz, streamed by QGIS "
        "and web viewers) or as a plain LAZ (odm_georeferenced_model.laz); default copc",
    )


def merge_options(args: argparse.Namespace) -> MergeOptions:
    """The merge options of the command line (``--accept-alignment``, ``--point-cloud-format``)."""
    from prefect_odm.models import MergeOptions

    return MergeOptions(
        accept_alignment=bool(getattr(args, "accept_alignment", False)),
        point_cloud_format=getattr(args, "point_cloud_format", "copc"),
    )


def _add_slots_and_stac_parsers(sub: Any) -> argparse.ArgumentParser:
    """The ``slots`` and ``stac`` sub-commands; returns ``slots`` (it takes ``-v`` too)."""
    slots: argparse.ArgumentParser = sub.add_parser(
        "slots", help="inspect or reset the memory slots (global concurrency limit)"
    )
    slots.add_argument("--name", default="prefect-odm-memory-gib", help="limit name")
    slots.add_argument(
        "--reset", action="store_true", help="set active slots to 0 (nothing may be running)"
    )

    stac = sub.add_parser(
        "stac", help="write the STAC catalogue of a finished run (stac/collection.json)"
    )
    stac.add_argument(
        "run_folder",
        help="the run's folder (holding manifest.json) or its output root; path or URL",
    )
    return slots


def _add_k8s_parser(sub: Any) -> None:
    """The ``k8s render`` sub-command: Kubernetes manifests and the work-pool job template."""
    k8s = sub.add_parser("k8s", help="Kubernetes manifests and the work-pool job template")
    k8s_sub = k8s.add_subparsers(dest="k8s_command", required=True, parser_class=OneLineParser)
    k8s_render = k8s_sub.add_parser("render", help="write the job template and the manifests")
    k8s_render.add_argument("--out", required=True, help="folder to write into")
    for flag, kind, default, what in (
        ("--namespace", str, "prefect-odm", "Kubernetes namespace"),
        ("--work-pool", str, "odm-k8s", "Prefect work pool of type kubernetes"),
        ("--image", str, "prefecthq/prefect:3-python3.11", "image with prefect-odm installed"),
        ("--node-image", str, "opendronemap/nodeodm:2.2.4", "processing node image"),
        ("--fleet-cluster", str, "k8s-fleet", "the fleet's cluster name at the capacity endpoint"),
        (
            "--capacity-url",
            str,
            "http://prefect-odm-capacity.prefect-odm.svc:8080",
            "capacity endpoint",
        ),
        ("--gib-per-pod", int, 16, "memory of one fleet pod, GiB (KEDA's target value)"),
        ("--min-replicas", int, 1, "fewest fleet pods (keep 1 for runs reading it by dns+)"),
        ("--max-replicas", int, 10, "most fleet pods"),
    ):
        k8s_render.add_argument(
            flag, type=kind, default=default, help=f"{what} (default {default})"
        )


def build_parser() -> argparse.ArgumentParser:
    """The parser of every ``prefect-odm`` sub-command."""
    parser = OneLineParser(prog="prefect-odm", description=DESCRIPTION)
    parser.add_argument(
        "--verbose", "-v", action="store_true", help="show Prefect's run logs on the console"
    )
    sub = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)

    rec = sub.add_parser("reconstruct", help="split, process and merge a survey")
    rec.add_argument("images", type=_location, help="folder or fsspec URL of geotagged images")
    rec.add_argument("--output", "-o", required=True, help="output folder or fsspec URL")
    _add_node_args(rec)
    _add_split_args(rec)
    _add_option_args(rec)
    rec.add_argument(
        "--allow-partial", action="store_true", help="merge what finished and list failed submodels"
    )
    rec.add_argument("--force", action="store_true", help="process every submodel again")
    _add_accept_alignment(rec)
    from prefect_odm.cli.clusters import add_routing_args

    add_routing_args(rec)  # --clusters and the options of a run routed among clusters

    plan = sub.add_parser("plan", help="scan and plan a survey without processing it")
    plan.add_argument("images", type=_location, help="folder or fsspec URL of geotagged images")
    plan.add_argument(
        "--output",
        "-o",
        default="plan",
        help=f"folder for {', '.join(PLAN_FILES[k] for k in ('plan', 'survey', 'geojson', 'png'))}"
        " (default ./plan)",
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
    _add_accept_alignment(mrg)

    slots = _add_slots_and_stac_parsers(sub)

    from prefect_odm.cli.ops import add_parsers as _add_ops_parsers

    ops = _add_ops_parsers(sub)  # setup, automations create
    from prefect_odm.cli.clusters import add_parsers as _add_cluster_parsers

    ops += _add_cluster_parsers(sub)  # clusters, capacity serve

    for command in (rec, plan, mrg, slots, *ops):  # -v after the command too; absent: the top's
        command.add_argument(
            "--verbose",
            "-v",
            action="store_true",
            default=argparse.SUPPRESS,
            help="show Prefect's run logs on the console",
        )

    _add_k8s_parser(sub)

    eng = sub.add_parser("engine", help="the built-in NodeODM-compatible engine")
    eng.add_argument("engine_args", nargs=argparse.REMAINDER, help="e.g. serve --port 3000")
    return parser
