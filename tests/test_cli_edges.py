"""Bad input at the command line's edge: one line naming the thing and the problem, exit status 2,
nothing written; tokens given in node URLs never reach parameters or files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from prefect_odm.cli.reconstruct import _tokens_out_of_urls
from prefect_odm.layout import PLAN_FILES

PREFECT_ODM = Path(sys.executable).with_name("prefect-odm")
"""The installed command (the console script of the environment running the tests)."""


def _run(
    args: list[str], tmp_path: Path, cwd: Path | None = None, **env_vars: str
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env.update(PREFECT_ODM_HOME=str(tmp_path / "home"), PREFECT_HOME=str(tmp_path / "ph"))
    env.update(env_vars)
    return subprocess.run(
        [str(PREFECT_ODM), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        cwd=cwd,
    )


def _one_error_line(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    return lines[-1]


def _prefect_started(tmp_path: Path) -> bool:
    """Whether the command started Prefect's temporary API (it creates its database)."""
    return any((tmp_path / "ph").rglob("*.db"))


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--option", "=1"], "the option has no name"),
        (["--option", "orthophoto-resolution=3"], "set it with --orthophoto-resolution"),
    ],
)
def test_reconstruct_refuses_bad_options_before_any_work(
    flags, expected, brighton_images, tmp_path
):
    out = tmp_path / "out"
    proc = _run(["reconstruct", str(brighton_images), "--output", str(out), *flags], tmp_path)
    line = _one_error_line(proc)
    assert line.startswith("prefect-odm: error:") and expected in line, line
    assert not out.exists()


@pytest.mark.parametrize(
    ("node", "shown"),
    [
        ("127.0.0.1:3000", "'127.0.0.1:3000'"),
        ("ftp://127.0.0.1:21", "'ftp://127.0.0.1:21'"),
        ("http://127.0.0.1:port", "'http://127.0.0.1:port'"),
        ("admin:s3cret@node?token=t0ken", "'node'"),
    ],
)
def test_a_node_that_is_not_a_url_is_refused_by_the_parser(node, shown, brighton_images, tmp_path):
    out = tmp_path / "out"
    proc = _run(
        ["reconstruct", str(brighton_images), "--output", str(out), "--nodes", node], tmp_path
    )
    line = _one_error_line(proc)
    assert f"argument --nodes: {shown} is not a node URL (expected http://host:port)" in line
    assert "s3cret" not in proc.stderr and "t0ken" not in proc.stderr
    assert not out.exists()


def test_infinite_overlap_is_refused(brighton_images, tmp_path):
    proc = _run(["plan", str(brighton_images), "--split-overlap-m", "inf"], tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "--split-overlap-m must be 0 to 1000 metres, not inf" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_plan_into_an_unwritable_place_is_one_line(brighton_images, tmp_path):
    """A path under a regular file cannot be created, for root too."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    proc = _run(["plan", str(brighton_images), "--output", str(blocker / "plan")], tmp_path)
    line = _one_error_line(proc)
    assert line.endswith(f"cannot write the output here ({blocker} is not a folder)"), line
    proc = _run(["plan", str(brighton_images), "--output", str(blocker)], tmp_path)
    line = _one_error_line(proc)
    assert line.endswith(f"{blocker}: cannot write the output here ({blocker} is not a folder)")


@pytest.mark.parametrize("content", [None, "not json at all"])
def test_merge_with_a_bad_plan_file_is_one_line(content, tmp_path):
    plan = tmp_path / "plan.json"
    if content is not None:
        plan.write_text(content)
    proc = _run(
        ["merge", str(tmp_path), "--plan", str(plan), "--output", str(tmp_path / "m")], tmp_path
    )
    line = _one_error_line(proc)
    assert f"--plan {plan}" in line
    assert not (tmp_path / "m").exists() and not _prefect_started(tmp_path)


def test_tokens_move_out_of_node_urls_into_the_environment(monkeypatch):
    monkeypatch.setenv("PREFECT_ODM_NODE_TOKENS", json.dumps({"http://127.0.0.1:2": "other"}))
    urls = _tokens_out_of_urls(["http://127.0.0.1:1?token=s3cret", "http://127.0.0.1:2"])
    assert urls == ["http://127.0.0.1:1", "http://127.0.0.1:2"]
    assert json.loads(os.environ["PREFECT_ODM_NODE_TOKENS"]) == {
        "http://127.0.0.1:1": "s3cret",
        "http://127.0.0.1:2": "other",
    }
    source = "dns+http://nodeodm.odm.svc:3000?memory_gib=8"  # a source keeps its memory
    assert _tokens_out_of_urls([source]) == [source]


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--option", "fast-orthophoto"], "expected NAME=VALUE"),
        (["--option", "min-num-features=NaN"], "min-num-features: nan is not a finite number"),
        (["--option", "bad name=1"], "'bad name' is not an ODM option name"),
        (["--orthophoto-resolution", "-2"], "must be a finite number of cm/pixel above 0, not -2"),
        (["--orthophoto-resolution", "inf"], "--orthophoto-resolution must be a finite number"),
        (["--orthophoto-resolution", "fine"], "must be a number of cm/pixel, not 'fine'"),
        (["--split", "0"], "--split must be at least 1, not 0"),
        (["--split-overlap-m", "nan"], "--split-overlap-m must be 0 to 1000 metres, not nan"),
        (["--split-overlap-m", "1e308"], "--split-overlap-m must be 0 to 1000 metres, not 1e308"),
        (["--split-overlap-m", "1001"], "must be 0 to 1000 metres"),
        (["--outp", "x"], "unrecognized arguments: --outp x"),  # no abbreviation of --output
        (["--pipeline", "magic"], "invalid choice: 'magic'"),
    ],
)
def test_plan_refuses_bad_values_in_one_line(flags, expected, brighton_images, tmp_path):
    out = tmp_path / "plan"
    proc = _run(["plan", str(brighton_images), "--output", str(out), *flags], tmp_path)
    line = _one_error_line(proc)
    assert "error:" in line and expected in line, line
    assert not out.exists()


def test_a_mistyped_required_flag_is_named_not_reported_missing(brighton_images, tmp_path):
    """``reconstruct IMAGES --outp x``: argparse checks required flags before unknown ones."""
    proc = _run(["reconstruct", str(brighton_images), "--outp", str(tmp_path / "x")], tmp_path)
    line = _one_error_line(proc)
    assert line == (
        "prefect-odm reconstruct: error: unrecognized arguments: --outp (did you mean "
        "--output?) (see --help)"
    ), line
    assert not (tmp_path / "x").exists() and not _prefect_started(tmp_path)
    proc = _run(["reconstruct", str(brighton_images)], tmp_path)
    assert "the following arguments are required: --output/-o" in _one_error_line(proc)


@pytest.mark.parametrize("command", ["plan", "reconstruct"])
def test_an_empty_images_argument_is_refused(command, tmp_path):
    """``""`` was read as the current folder (and refused as holding the output)."""
    proc = _run([command, "", "--output", str(tmp_path / "out")], tmp_path)
    assert "argument images: an empty path" in _one_error_line(proc)
    assert not (tmp_path / "out").exists()


def test_missing_images_folder_is_one_line(tmp_path):
    out = tmp_path / "out"
    proc = _run(["reconstruct", str(tmp_path / "nowhere"), "--output", str(out)], tmp_path)
    line = _one_error_line(proc)
    assert f"{tmp_path / 'nowhere'}: does not exist" in line
    assert not out.exists() and not _prefect_started(tmp_path)


def test_unknown_option_name_is_refused_before_the_plan(brighton_images, tmp_path):
    """Checked against the given node's ``/options`` (a built-in engine started as an external
    node) before anything is written."""
    from prefect_odm.engine.launch import start_engine

    out = tmp_path / "out"
    args = ["reconstruct", str(brighton_images), "--output", str(out), "--pipeline", "direct"]
    with start_engine(tmp_path / "node") as node:
        proc = _run([*args, "--nodes", node.url, "--option", "orthophoto-resolutoin=3"], tmp_path)
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines[0].startswith("prefect-odm: error: 1 option(s) not accepted by"), proc.stderr
    assert "orthophoto-resolutoin=3: unknown option" in lines[1], proc.stderr
    assert "did you mean orthophoto-resolution" in lines[1] and len(lines) == 2, proc.stderr
    assert not list(out.glob("*/plan/plan.json"))
    assert not _prefect_started(tmp_path)  # the node's /options asked at the edge


def test_unknown_option_name_is_refused_before_the_plan_on_the_built_in_engine(
    brighton_images, tmp_path
):
    """Without --nodes the options are checked against the built-in engine's option table
    before it is started and before anything is written."""
    out = tmp_path / "out"
    args = ["reconstruct", str(brighton_images), "--output", str(out), "--pipeline", "direct"]
    proc = _run([*args, "--option", "orthophoto-resolutoin=3"], tmp_path)
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines[0] == (
        "prefect-odm: error: 1 option(s) not accepted by the built-in engine (from its /options):"
    ), proc.stderr
    assert "orthophoto-resolutoin=3: unknown option" in lines[1] and len(lines) == 2, proc.stderr
    assert not out.exists()


def test_python_api_validates_options_as_the_command_line_does():
    from pydantic import ValidationError

    from prefect_odm.errors import PlanningError
    from prefect_odm.models import ProcessingOptions
    from prefect_odm.plan.planning import plan_split

    for extra in ({"orthophoto-resolution": "abc"}, {"": 1}, {"crop": float("inf")}):
        with pytest.raises(ValidationError):
            ProcessingOptions(extra=extra)
    with pytest.raises(ValidationError):
        ProcessingOptions(orthophoto_resolution_cm=float("inf"))
    with pytest.raises(PlanningError, match="finite"):
        plan_split(None, split_overlap_m=float("inf"))  # type: ignore[arg-type]


def test_stray_files_in_a_survey_are_listed_as_skipped(brighton_images, tmp_path):
    survey = tmp_path / "survey"
    survey.mkdir()
    for image in sorted(brighton_images.glob("*.JPG"))[:4]:
        (survey / image.name).symlink_to(image)
    (survey / "README.txt").write_text("flight notes")
    (survey / ".DS_Store").write_bytes(b"\0")  # hidden files are not part of a survey
    (survey / "IMG_9999.JPG").symlink_to(tmp_path / "gone.JPG")  # a link that leads nowhere
    proc = _run(["plan", str(survey), "--output", str(tmp_path / "plan")], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "rejected README.txt: not an image file name" in proc.stdout
    assert "skipped (not_an_image)" in proc.stdout
    assert ".DS_Store" not in proc.stdout
    assert f"IMG_9999.JPG: a symbolic link to {tmp_path / 'gone.JPG'}, which does not exist" in (
        proc.stdout
    )
    survey_json = json.loads((tmp_path / "plan" / "survey.json").read_text())
    assert sorted(r["name"] for r in survey_json["rejected"]) == ["IMG_9999.JPG", "README.txt"]


def test_merge_of_an_archive_with_escaping_entries_is_refused(tmp_path):
    import zipfile

    archive = tmp_path / "all.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("odm_orthophoto/odm_orthophoto.tif", b"II*\0")
        zf.writestr("../../escaped.txt", b"outside")
    out = tmp_path / "m"
    proc = _run(["merge", str(archive), "--output", str(out)], tmp_path)
    line = _one_error_line(proc)
    assert str(archive) in line and "'../../escaped.txt' would leave" in line, line
    assert not (tmp_path.parent / "escaped.txt").exists()
    assert not list(out.glob("*/merged/*"))
    assert not _prefect_started(tmp_path)  # the archive's listing read at the edge


def test_slow_prefect_start_is_one_line(brighton_images, tmp_path):
    proc = _run(
        ["reconstruct", str(brighton_images), "--output", str(tmp_path / "out")],
        tmp_path,
        PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="1",  # whole seconds
    )
    assert proc.returncode == 1, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines[-1].startswith("prefect-odm: error: Prefect's temporary API server did not")
    assert "Traceback" not in proc.stderr and "RuntimeError" not in proc.stderr
    assert not (tmp_path / "out").exists()


def test_an_empty_images_folder_is_refused_before_prefect_starts(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "notes.txt").write_text("no photos here")
    out = tmp_path / "out"
    line = _one_error_line(_run(["reconstruct", str(empty), "--output", str(out)], tmp_path))
    assert (
        line
        == f"prefect-odm: error: {empty}: no image files (.jpg, .jpeg, .tif, .tiff, .png) found"
    )
    assert not out.exists() and not _prefect_started(tmp_path)


def test_a_bad_option_value_on_the_built_in_engine_is_refused_before_prefect_starts(
    brighton_images, tmp_path
):
    out = tmp_path / "out"
    proc = _run(
        ["reconstruct", str(brighton_images), "--output", str(out), "--option", "pc-quality=x"],
        tmp_path,
    )
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert "not accepted by the built-in engine" in lines[0] and len(lines) == 2, proc.stderr
    assert "pc-quality='x': not one of" in lines[1], proc.stderr
    assert not out.exists() and not _prefect_started(tmp_path)


def test_an_output_where_no_folder_can_be_made_is_refused(brighton_images, tmp_path):
    """``/proc`` is a folder that permission bits call writable for root, yet nothing can be
    made in it: the probe makes (and removes) a folder instead of trusting the bits."""
    out = "/proc/prefect-odm-nowhere/out"
    line = _one_error_line(_run(["reconstruct", str(brighton_images), "--output", out], tmp_path))
    assert line.startswith(
        f"prefect-odm: error: {out}: cannot write the output here (no folder can be made in /proc:"
    ), line
    assert not _prefect_started(tmp_path)


def test_an_s3_output_that_cannot_be_reached_is_refused_in_one_line(brighton_images, tmp_path):
    """No credentials (and no metadata service), or an endpoint where nothing listens: one
    line and exit 2 before Prefect starts (it was exit 1 with botocore's traceback)."""
    out = "s3://prefect-odm-nowhere/out"
    no_keys = {
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"),
        "AWS_CONFIG_FILE": str(tmp_path / "none"),
    }
    cases = [
        (
            # the endpoint keeps every request on loopback, were one sent
            {
                **no_keys,
                "AWS_EC2_METADATA_DISABLED": "true",
                "AWS_ENDPOINT_URL": "http://127.0.0.1:9",
            },
            "Unable to locate credentials",
        ),
        (
            {
                "AWS_ENDPOINT_URL": "http://127.0.0.1:9",
                "AWS_ACCESS_KEY_ID": "k",
                "AWS_SECRET_ACCESS_KEY": "s",
            },
            "Could not connect to the endpoint URL",
        ),
    ]
    for extra, reason in cases:
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        env.update(
            PREFECT_ODM_HOME=str(tmp_path / "home"), PREFECT_HOME=str(tmp_path / "ph"), **extra
        )
        env.pop("PREFECT_API_URL", None)
        proc = subprocess.run(
            [sys.executable, "-m", "prefect_odm.cli", "reconstruct", str(brighton_images), "--output", out],
            capture_output=True, text=True, env=env, timeout=300,
        )  # fmt: skip
        line = _one_error_line(proc)
        assert line.startswith(f"prefect-odm: error: {out}: cannot reach the output location ("), (
            line
        )
        assert reason in line, line
    assert not _prefect_started(tmp_path)


def test_merge_of_a_missing_input_is_refused_before_prefect_starts(tmp_path):
    missing = tmp_path / "no-such-project"
    proc = _run(["merge", str(missing), "--output", str(tmp_path / "m")], tmp_path)
    line = _one_error_line(proc)
    assert line == f"prefect-odm: error: {missing}: no such file or folder"
    assert not _prefect_started(tmp_path) and not (tmp_path / "m").exists()


@pytest.mark.parametrize(
    "argv",
    [
        ["-v", "reconstruct", "x", "-o", "y"],
        ["reconstruct", "x", "-o", "y", "-v"],
        ["setup", "-v", "--pool", "odm"],
        ["automations", "create", "-v"],
        ["merge", "x", "-o", "y", "-v"],
    ],
)
def test_verbose_goes_before_or_after_the_command(argv):
    from prefect_odm.cli.args import build_parser

    assert build_parser().parse_args(argv).verbose is True
    assert build_parser().parse_args(["plan", "x"]).verbose is False


def test_the_summary_names_the_rejected_images(capsys, tmp_path):
    from prefect_odm.cli.reconstruct import REJECTED_SHOWN, _print_summary
    from prefect_odm.models import Manifest, RejectedImage

    rejected = [
        RejectedImage(
            name=f"IMG_{i}.JPG",
            url=f"/x/IMG_{i}.JPG",
            reason="truncated",
            detail="truncated JPEG has no end-of-image marker (50000 bytes)",
        )
        for i in range(REJECTED_SHOWN + 2)
    ]
    manifest = Manifest.model_construct(
        submodels=[],
        products={},
        failed_submodels={},
        rejected_images=rejected,
        survey_fingerprint="f" * 16,
    )
    _print_summary(str(tmp_path), manifest)
    out = capsys.readouterr().out
    assert f"rejected images: {REJECTED_SHOWN + 2} (all of them in the report)" in out
    assert "  IMG_0.JPG: truncated JPEG has no end-of-image marker (50000 bytes)" in out
    assert f"IMG_{REJECTED_SHOWN - 1}.JPG" in out and f"IMG_{REJECTED_SHOWN}.JPG" not in out
    assert "... and 2 more" in out


def test_engine_help_lists_its_commands(capsys):
    """``prefect-odm engine --help`` is the engine's own help (it names ``serve``), not the
    top-level parser's pass-through help."""
    from prefect_odm.cli import main

    with pytest.raises(SystemExit) as stopped:
        main(["engine", "--help"])
    assert stopped.value.code == 0
    out = capsys.readouterr().out
    assert "serve" in out and "run the NodeODM-compatible HTTP server" in out


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--port", "99999"], "argument --port: a TCP port is 0 to 65535, not 99999"),
        (["--port", "web"], "argument --port: not a port number: 'web'"),
        (["--max-parallel-tasks", "0"], "argument --max-parallel-tasks: must be at least 1, not 0"),
        (
            ["--memory-gib", "0"],
            "argument --memory-gib: must be a finite number of GiB above 0, not 0",
        ),
        (["--memory-gib", "lots"], "argument --memory-gib: not a number of GiB: 'lots'"),
    ],
)
def test_engine_serve_refuses_bad_numbers_in_one_line(argv, expected, capsys):
    from prefect_odm.cli import main

    with pytest.raises(SystemExit) as stopped:
        main(["engine", "serve", *argv])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1].endswith(expected) and "Traceback" not in err


@pytest.mark.parametrize(
    ("option", "expected"),
    [
        ("foo=bar", "option foo='bar': unknown option"),
        (
            "dem-gapfill-steps=-5",
            "option dem-gapfill-steps=-5: outside the accepted range: an integer >= 0",
        ),
    ],
)
def test_plan_refuses_the_options_reconstruct_refuses(option, expected, brighton_images, tmp_path):
    """``plan`` plans for the built-in engine and checks options as ``reconstruct`` does: a plan
    never records an option the run would refuse, and an earlier plan is left as it was."""
    out = tmp_path / "plan"
    out.mkdir()
    (out / "plan.json").write_text("earlier")
    proc = _run(["plan", str(brighton_images), "--output", str(out), "--option", option], tmp_path)
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines[0].startswith("prefect-odm: error: 1 option(s) not accepted by the built-in")
    assert expected in lines[1] and len(lines) == 2, proc.stderr
    assert [p.name for p in out.iterdir()] == ["plan.json"]
    assert (out / "plan.json").read_text() == "earlier"


def test_plan_table_and_warnings_describe_the_plan_kept(brighton_images, tmp_path):
    """With an overlap wider than the survey both submodels hold all 18 images and are merged
    into one: the warnings and the table describe that one submodel (1.0x, no duplication
    warning), and the area is within the images' footprint, not the ownership buffer."""
    out = tmp_path / "plan"
    proc = _run(
        ["plan", str(brighton_images), "--output", str(out), "--split", "10",
         "--split-overlap-m", "50"],
        tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "1 submodel, EPSG:32615" in proc.stdout
    assert "processed" not in proc.stdout, proc.stdout  # 1.0x: no duplication warning
    assert "(2 planned, 1 kept)" in proc.stdout
    plan = json.loads((out / "plan.json").read_text())
    [sm] = plan["submodels"]
    # brighton's 18 cameras span about 84 x 84 m; each image covers about 60 x 34 m
    assert 8_000 < sm["area_m2"] < 25_000, sm["area_m2"]
    assert "survey.json" in proc.stdout.splitlines()[-1]


@pytest.mark.parametrize("command", ["reconstruct", "plan"])
@pytest.mark.parametrize("where", ["products", ".", "sub/../products"])
def test_an_output_inside_the_images_folder_is_refused(command, where, brighton_images, tmp_path):
    """The scan lists the images folder recursively: an output inside it would be read back as
    rejected images at every rerun. Refused before anything is written, in one line."""
    images = tmp_path / "survey"
    images.mkdir()
    names = sorted(p.name for p in brighton_images.glob("*.JPG"))[:3]
    for name in names:
        (images / name).symlink_to(brighton_images / name)
    (images / "sub").mkdir()
    out = images / where
    proc = _run([command, str(images), "--output", str(out)], tmp_path)
    line = _one_error_line(proc)
    assert f"the output is inside the images location {images}" in line, line
    assert sorted(p.name for p in images.iterdir()) == [*names, "sub"]  # nothing written
    assert not _prefect_started(tmp_path)


def test_the_python_api_refuses_an_output_inside_the_images_before_the_scan(tmp_path):
    from prefect_odm.flows import reconstruct

    from prefect_odm.errors import InputError
    from prefect_odm.survey.scan import check_output_outside_images

    images = tmp_path / "survey"
    images.mkdir()
    with pytest.raises(InputError, match="the output is inside the images location"):
        reconstruct.fn(images=str(images), output=str(images / "out"), nodes=None)
    for images_url, output_url in [
        ("s3://bucket/survey", "s3://bucket/survey/out"),
        ("s3://bucket/survey/", "s3://bucket/survey"),
    ]:
        with pytest.raises(InputError, match=output_url):
            check_output_outside_images(images_url, output_url)
    # beside it, a sibling with the same prefix, or the images inside the output: accepted
    check_output_outside_images(str(images), str(tmp_path / "out"))
    check_output_outside_images(str(images), str(tmp_path / "survey-out"))
    check_output_outside_images("s3://bucket/survey", "s3://bucket/survey-out")
    check_output_outside_images("s3://bucket/survey", str(images / "out"))
    check_output_outside_images(str(images), str(tmp_path))


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_dead_node_url_is_refused_before_prefect_starts(brighton_images, tmp_path):
    """A dead ``--nodes`` URL: one line saying what the connection came to (not urllib3's nested
    reprs), exit 2, no output folder and no Prefect database (refused before Prefect starts)."""
    out = tmp_path / "out"
    url = f"http://127.0.0.1:{_closed_port()}"
    proc = _run(
        ["reconstruct", str(brighton_images), "--output", str(out), "--nodes", url], tmp_path
    )
    line = _one_error_line(proc)
    assert (
        line == f"prefect-odm: error: no node answers: {url} (GET /info failed: connection refused)"
    )
    assert not out.exists()
    assert not (tmp_path / "ph" / "prefect.db").exists()


def test_prefect_home_in_a_missing_folder_is_created(tmp_path):
    """``PREFECT_HOME`` naming a folder whose parent does not exist: the temporary server used to
    die on "unable to open database file" and the command waited out its 120 s start-up."""
    home = tmp_path / "not" / "yet" / "prefect"
    proc = _run(["slots"], tmp_path, PREFECT_HOME=str(home))
    assert proc.returncode == 0, proc.stderr
    assert "no such concurrency limit" in proc.stdout
    assert "Failed to create the Prefect home" not in proc.stderr
    assert (home / "prefect.db").exists()


def test_plan_refuses_a_survey_too_small_to_reconstruct(data_dir, tmp_path):
    """``plan`` of two usable images wrote a one-submodel plan that ``reconstruct`` then refused
    after starting Prefect; both refuse it now, with the same line, and ``plan`` writes nothing."""
    images = data_dir / "tiny_exif" / "images"
    out = tmp_path / "plan"
    line = _one_error_line(_run(["plan", str(images), "--output", str(out)], tmp_path))
    assert line == (
        f"prefect-odm: error: {images}: 2 usable image(s); a reconstruction needs at least 3 "
        "overlapping geotagged images"
    )
    assert not (out / "plan.json").exists()


def test_copies_of_one_image_are_named_with_the_image_they_copy(brighton_images, tmp_path):
    """Six copies of one image (a new user's trial): the refusal said "1 usable image(s)" and
    named none of the five set aside; it names them and the image they copy, and the plan of
    a survey with a copy lists it so."""
    import json
    import shutil

    folder = tmp_path / "copies"
    folder.mkdir()
    for n in range(1, 7):
        shutil.copy(brighton_images / "DJI_0018.JPG", folder / f"IMG_{n}.JPG")
    line = _one_error_line(_run(["plan", str(folder), "--output", str(tmp_path / "p")], tmp_path))
    assert line == (
        f"prefect-odm: error: {folder}: 1 usable image(s), 5 set aside (IMG_2.JPG, IMG_3.JPG, "
        "IMG_4.JPG, IMG_5.JPG, IMG_6.JPG: same bytes as IMG_1.JPG); a reconstruction needs at "
        "least 3 overlapping geotagged images"
    )
    survey = tmp_path / "survey"
    shutil.copytree(brighton_images, survey)
    shutil.copy(survey / "DJI_0018.JPG", survey / "DJI_0018_copy.JPG")
    proc = _run(["plan", str(survey), "--output", str(tmp_path / "plan")], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "rejected DJI_0018_copy.JPG: same bytes as DJI_0018.JPG (duplicate)" in proc.stdout
    [aside] = json.loads((tmp_path / "plan" / "survey.json").read_text())["rejected"]
    assert (aside["name"], aside["detail"]) == ("DJI_0018_copy.JPG", "same bytes as DJI_0018.JPG")


# ------------------------------------------- refused at the edge, before Prefect's start-up


def test_merge_of_a_file_or_of_nothing_is_refused_before_prefect_starts(tmp_path):
    """A file that is no archive, a folder with no ODM product, a ``.zip`` that is not one: the
    flow's one line, before Prefect starts (they came after its 10-27 s start-up)."""
    text = tmp_path / "odm_orthophoto.tif.txt"
    text.write_text("not a project")
    empty = tmp_path / "empty"
    empty.mkdir()
    fake_zip = tmp_path / "all.zip"
    fake_zip.write_text("not an archive")
    cases = [
        (text, f"{text}: a file, not an OpenDroneMap project folder, a folder of them or an all.zip"),
        (empty, "no OpenDroneMap product (odm_orthophoto/odm_orthophoto.tif, odm_dem/dsm.tif, "
                f"odm_dem/dtm.tif, odm_georeferencing/odm_georeferenced_model.laz) found in {empty}"),
        (fake_zip, f"{fake_zip} is not a zip archive: File is not a zip file"),
    ]  # fmt: skip
    for given, expected in cases:
        out = tmp_path / "m"
        line = _one_error_line(_run(["merge", str(given), "--output", str(out)], tmp_path))
        assert line == f"prefect-odm: error: {expected}", line
        assert not out.exists()
    assert not _prefect_started(tmp_path)


def test_a_bad_nodes_file_is_refused_before_prefect_starts(brighton_images, tmp_path):
    """A missing ``--nodes-file``, one with a line that is no node URL, one listing only a dead
    node: one line each (the flow's), exit 2, before Prefect starts."""
    out = tmp_path / "out"
    missing = tmp_path / "nodes.txt"
    args = ["reconstruct", str(brighton_images), "--output", str(out), "--nodes-file"]
    line = _one_error_line(_run([*args, str(missing)], tmp_path))
    assert (
        line
        == f"prefect-odm: error: {missing}: cannot read the node file (No such file or directory)"
    )
    malformed = tmp_path / "bad-nodes.txt"
    malformed.write_text("node-a:3000\n")
    line = _one_error_line(_run([*args, str(malformed)], tmp_path))
    assert line.startswith(f"prefect-odm: error: {malformed}") and "node-a:3000" in line, line
    dead = tmp_path / "dead-nodes.txt"
    url = f"http://127.0.0.1:{_closed_port()}"
    dead.write_text(f"{url}\n")
    line = _one_error_line(_run([*args, str(dead)], tmp_path))
    assert (
        line == f"prefect-odm: error: no node answers: {url} (GET /info failed: connection refused)"
    )
    assert not out.exists() and not _prefect_started(tmp_path)


def test_a_split_the_planner_refuses_is_refused_before_prefect_starts(
    brighton_images, data_dir, tmp_path
):
    """``--split 3 --split-overlap-m 0`` makes submodels too small for structure from motion,
    and a survey of two usable images is too small to reconstruct: the flow's line, before
    Prefect starts (the planner runs at the edge on the local images)."""
    out = tmp_path / "out"
    flags = ["--split", "3", "--split-overlap-m", "0"]
    proc = _run(["reconstruct", str(brighton_images), "--output", str(out), *flags], tmp_path)
    line = _one_error_line(proc)
    assert line == (
        f"prefect-odm: error: {brighton_images}: submodel-000 would reconstruct 3 images by "
        "structure from motion, fewer than the 8 a submodel needs to reconstruct reliably: use a "
        "larger --split, a wider --split-overlap-m, or --pipeline direct"
    ), line
    tiny = data_dir / "tiny_exif" / "images"
    line = _one_error_line(_run(["reconstruct", str(tiny), "--output", str(out)], tmp_path))
    assert line == (
        f"prefect-odm: error: {tiny}: 2 usable image(s); a reconstruction needs at least 3 "
        "overlapping geotagged images"
    )
    assert not out.exists() and not _prefect_started(tmp_path)


def test_an_unwritable_output_is_refused_before_prefect_starts(brighton_images, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    for command in (["reconstruct", str(brighton_images)], ["merge", str(tmp_path)]):
        line = _one_error_line(_run([*command, "--output", str(blocker / "out")], tmp_path))
        assert line.endswith(f"cannot write the output here ({blocker} is not a folder)"), line
    assert not _prefect_started(tmp_path)


def test_every_bad_option_is_reported_at_once_before_prefect_starts(brighton_images, tmp_path):
    """Six bad options, of every kind (malformed, a flag's, a bad name, a value pydantic refuses,
    two the built-in engine's table refuses): one line each under a count, in one run."""
    out = tmp_path / "out"
    options = ["fast-orthophoto", "dtm=true", "bad name=1", "min-num-features=NaN", "foo=bar",
               "pc-quality=x"]  # fmt: skip
    flags = [w for option in options for w in ("--option", option)]
    for command in ("reconstruct", "plan"):
        proc = _run([command, str(brighton_images), "--output", str(out), *flags], tmp_path)
        assert proc.returncode == 2, proc.stderr
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        assert lines == [
            "prefect-odm: error: 6 problems with the options:",
            "  - --option 'fast-orthophoto': expected NAME=VALUE",
            "  - --option dtm: set it with --dtm instead",
            "  - --option: 'bad name' is not an ODM option name",
            "  - --option min-num-features: nan is not a finite number",
            "  - option foo='bar': unknown option: the node does not list it and would drop it "
            "silently",
            "  - option pc-quality='x': not one of ultra, high, medium, low, lowest",
        ], proc.stderr
    assert not out.exists() and not _prefect_started(tmp_path)


def test_the_python_api_reports_every_bad_extra_option():
    from pydantic import ValidationError

    from prefect_odm.models import ProcessingOptions

    with pytest.raises(ValidationError) as caught:
        ProcessingOptions(extra={"bad name": 1, "crop": float("inf"), "dsm": True, "ok": 3})
    where = {tuple(map(str, e["loc"])) for e in caught.value.errors()}
    assert where == {("extra", "bad name", "[key]"), ("extra", "crop"), ("extra", "dsm", "[key]")}


def test_a_submodel_larger_than_every_node_is_refused_before_prefect_starts(
    brighton_images, tmp_path
):
    """A node of 1 GiB (a built-in engine reporting it, as one in a pod limited to 1 GiB
    does): brighton's one submodel needs an estimated 1.9 GiB, and ``--split auto`` finds no
    size that fits. Both are the flow's own lines, made at the edge from the node's ``/info``
    before Prefect starts; nothing is uploaded or written."""
    import httpx

    from prefect_odm.engine.launch import start_engine

    out = tmp_path / "out"
    args = ["reconstruct", str(brighton_images), "--output", str(out)]
    with start_engine(tmp_path / "node", memory_gib=1.0) as node:
        assert httpx.get(f"{node.url}/info").json()["totalMemory"] == 2**30
        line = _one_error_line(_run([*args, "--nodes", node.url], tmp_path))
        assert line.startswith("prefect-odm: error: submodel-000 needs an estimated "), line
        assert line.endswith(
            "GiB for 18 images (0 of them overlap), more than the largest node (0.9 GiB); "
            "lower the split (--split) or the split overlap (--split-overlap-m)"
        ), line
        line = _one_error_line(_run([*args, "--nodes", node.url, "--split", "auto"], tmp_path))
        assert line.startswith(
            "prefect-odm: error: no submodel fits in the largest node (0.9 GiB): even 1 image of"
        ), line
        tasks = httpx.get(f"{node.url}/task/list").json()
    assert tasks == []
    assert not out.exists() and not _prefect_started(tmp_path)


def test_plan_keeps_a_folder_that_is_not_a_plan_and_a_runs_plan(brighton_images, tmp_path):
    """``plan --output`` (default ``plan``) never replaces files it did not write, nor the plan a
    run's reruns read; a folder an earlier ``plan`` wrote is planned again."""
    notes = tmp_path / "plan"
    notes.mkdir()
    (notes / "notes.txt").write_text("the flight's notes")
    proc = _run(["plan", str(brighton_images)], tmp_path, cwd=tmp_path)  # --output plan
    line = _one_error_line(proc)
    assert line == (
        "prefect-odm: error: plan: holds files that are not a plan's (notes.txt); give --output an empty or new "
        "folder, or a folder an earlier `prefect-odm plan` wrote"
    ), line
    assert sorted(p.name for p in notes.iterdir()) == ["notes.txt"]
    run_plan = tmp_path / "out" / "0123456789abcdef" / "plan"
    run_plan.mkdir(parents=True)
    (run_plan.parent / "submodels").mkdir()
    (run_plan / "plan.json").write_text('{"kept": true}')
    proc = _run(["plan", str(brighton_images), "--output", str(run_plan)], tmp_path)
    line = _one_error_line(proc)
    assert line.startswith(
        f"prefect-odm: error: {run_plan}: the plan of the run in {run_plan.parent}"
    ), line
    assert (run_plan / "plan.json").read_text() == '{"kept": true}'
    again = tmp_path / "again"
    for _ in range(2):
        proc = _run(["plan", str(brighton_images), "--output", str(again)], tmp_path)
        assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in again.iterdir()) == sorted(PLAN_FILES.values())
