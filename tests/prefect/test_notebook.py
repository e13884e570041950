"""The example notebook runs from top to bottom (nbclient) and shows the orthophoto."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

NOTEBOOK = Path(__file__).resolve().parents[2] / "examples" / "reconstruct.ipynb"


def test_example_notebook_plans_reconstructs_and_shows_the_orthophoto(
    prefect_server, brighton_images, tmp_path, monkeypatch
):
    import nbclient
    import nbformat

    # the kernel is a subprocess: it takes the server and paths from the environment
    monkeypatch.setenv("PREFECT_API_URL", prefect_server.api_url)
    monkeypatch.setenv("PREFECT_ODM_HOME", str(tmp_path / "odm-home"))
    monkeypatch.setenv("PREFECT_ODM_EXAMPLE_IMAGES", str(brighton_images))
    monkeypatch.setenv("PREFECT_ODM_EXAMPLE_OUTPUT", str(tmp_path / "out"))
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(
        nb,
        timeout=600,
        kernel_name="python3",
        resources={"metadata": {"path": str(NOTEBOOK.parent)}},
    )
    client.execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    assert any("image/png" in o.get("data", {}) for o in outputs), "the orthophoto is shown"
    assert list((tmp_path / "out").glob("*/merged/odm_orthophoto.tif"))
