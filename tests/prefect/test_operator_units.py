"""The operator's view, unit by unit: credentials refused at the flows' edge, run names, the
submodel board's counts, and the parameter schema as the UI's form reads it."""

from __future__ import annotations

import json

import pytest

from prefect_odm.errors import InputError
from prefect_odm.nodes.refs import refuse_credentials, submodel_run_name, survey_label
from prefect_odm.progress import SubmodelBoard

SECRET = "s3cr3t-unit"


@pytest.mark.parametrize(
    ("url", "what"),
    [
        (f"http://10.0.0.5:3000/?token={SECRET}", "?token="),
        (f"http://odm:{SECRET}@10.0.0.5:3000", "user:password@"),
        (f"https://cluster.example/odm?x=1&TOKEN={SECRET}", "?TOKEN="),
    ],
)
def test_node_urls_with_credentials_are_refused_without_echoing_them(url, what):
    with pytest.raises(InputError) as info:
        refuse_credentials(["http://10.0.0.6:3000", url])
    message = str(info.value)
    assert SECRET not in message
    assert what in message and "NodeODMPool" in message and "PREFECT_ODM_NODE_TOKENS" in message


def test_bare_node_urls_pass():
    refuse_credentials(["http://10.0.0.5:3000", "https://cluster.example/odm?queue=2"])
    refuse_credentials(None)


def test_flows_refuse_a_token_before_any_work(prefect_api, tmp_path):
    from prefect_odm.flows import reconstruct

    with pytest.raises(InputError, match="NodeODMPool"):
        reconstruct(
            images=str(tmp_path / "missing"),
            output=str(tmp_path / "out"),
            nodes=[f"http://127.0.0.1:9/?token={SECRET}"],
        )
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("source", "label"),
    [
        ("/data/brighton_beach_1600/images", "brighton_beach_1600"),
        ("/data/brighton_beach_1600/images/", "brighton_beach_1600"),
        ("s3://bucket/city 2026/DCIM", "city-2026"),
        ("survey-7", "survey-7"),
    ],
)
def test_survey_labels(source, label):
    assert survey_label(source) == label
    assert submodel_run_name(source, "3f2a9c1d77", "submodel-002") == (
        f"{label}-3f2a9c1d-submodel-002"
    )


def test_progress_counts_done_against_planned():
    board = SubmodelBoard(["submodel-000", "submodel-001", "submodel-002"])
    board.update("submodel-000", state="cached")
    board.update("submodel-001", state="failed", error="Injected failure")
    board.update("submodel-002", state="processing", fraction=0.5)
    counts = board.counts()
    assert (counts.done, counts.cached, counts.failed, counts.running, counts.waiting) == (
        1,
        1,
        1,
        1,
        0,
    )
    assert counts.percent_done == pytest.approx(100 / 3)  # a failed submodel is not done
    board.update("submodel-002", state="completed")
    assert board.counts().percent_done < 100
    board.update("submodel-001", state="completed")
    assert board.counts().percent_done == 100
    assert [r.submodel_id for r in board.in_flight()] == []


def test_every_reconstruct_parameter_is_fillable_in_the_ui_form():
    """The UI's form cannot set a ``const`` (it says "split is a const and cannot be
    changed"); ``split`` must offer a number and the choice "auto", and the server's validation
    of the deployment's schema must accept both."""
    from prefect.utilities.callables import parameter_schema
    from prefect.utilities.schema_tools import validate
    from prefect_odm.flows import reconstruct

    schema = parameter_schema(reconstruct).model_dump_for_openapi()
    assert '"const"' not in json.dumps(schema)
    split = schema["properties"]["split"]
    assert {"type": "string", "enum": ["auto"], "title": "auto"} in split["anyOf"]
    assert "NodeODMPool" in schema["properties"]["nodes"]["description"]
    for value in ("auto", 50):
        validate({"images": "/x", "output": "/y", "split": value}, schema, raise_on_error=True)
    with pytest.raises(Exception, match="split|auto"):
        validate({"images": "/x", "output": "/y", "split": "half"}, schema, raise_on_error=True)
