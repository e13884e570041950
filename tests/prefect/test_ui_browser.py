"""The operator's view in a real browser: Debian's chromium driven by Playwright, against the
session's ``prefect server start`` (UI served) and a process worker.

A ``reconstruct`` deployment run on brighton (direct pipeline) places its submodels on an engine
that requires a token (given in a ``NodeODMPool`` block, never in a parameter) and fails
submodel-001. In the pages: the run names carry the survey and the submodel, the plan picture
is shown, the submodel table shows the failure. The operator mends the node, presses Retry on
the failed child and then on the parent in the page; the table then shows the failure and the
retry, the reused submodels show as Cached, and the token appears in no page and no API answer.

Screenshots go to :data:`SCREENSHOTS` (``build/ui-screenshots`` in the repository).
"""

from __future__ import annotations

import json
import re
import time
import urllib.request
import uuid
from pathlib import Path

import pytest
from odm_prefect_helpers import brighton_parameters, runs_of, wait_run

from prefect_odm.engine.launch import start_engine
from prefect_odm.settings import FAULTS_ENV

pytestmark = [pytest.mark.integration, pytest.mark.slow]

FAILING = "submodel-001"
SCREENSHOTS = Path(__file__).resolve().parents[2] / "build" / "ui-screenshots"
"""Where the screenshots of this test are written, for a person to look at."""

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
PAGE_TIMEOUT_MS = 30_000


class Pages:
    """One browser page on the UI; keeps every page's text to search for secrets."""

    def __init__(self, page, ui_url: str) -> None:
        self.page = page
        self.ui_url = ui_url
        self.seen: list[str] = []
        self.shots = 0

    def open(self, path: str, wait_text: str) -> str:
        """Go to ``path`` and wait until ``wait_text`` (a regex) shows; the page's HTML."""
        self.page.goto(f"{self.ui_url}{path}")
        return self.wait_for(wait_text)

    def wait_for(self, pattern: str, timeout_ms: int = PAGE_TIMEOUT_MS) -> str:
        self.page.get_by_text(re.compile(pattern)).first.wait_for(timeout=timeout_ms)
        html = self.page.content()
        self.seen.append(html)
        return html

    def shot(self, name: str) -> Path:
        self.shots += 1
        path = SCREENSHOTS / f"{self.shots:02d}-{name}.png"
        self.page.screenshot(path=str(path), full_page=True)
        self.seen.append(self.page.content())
        return path

    def press_retry(self) -> None:
        """Press the run page's Retry button (and confirm in the dialog when one opens)."""
        retry = self.page.get_by_role("button", name=re.compile(r"^\s*Retry\s*$"))
        retry.first.click()
        self.wait_for("This will retry flow run")  # the confirmation modal
        self.shot("retry-dialog")
        retry.last.click()  # the modal's own Retry button, last in the page
        self.page.get_by_text("This will retry flow run").wait_for(state="hidden")


def _api(api_url: str, path: str, body: dict | None = None) -> str:
    """The raw text of an API answer (POST with ``body``, else GET)."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(
        f"{api_url}{path}", data=data, headers={"content-type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=30) as res:
        return res.read().decode()


def _artifact_id(api_url: str, key: str) -> str:
    found = json.loads(_api(api_url, "/artifacts/filter", {"artifacts": {"key": {"any_": [key]}}}))
    assert found, key
    return str(sorted(found, key=lambda a: a["created"])[-1]["id"])


def test_operator_view_failure_retry_from_the_pages(
    prefect_server, worker, brighton_images, tmp_path
):
    from playwright.sync_api import sync_playwright
    from prefect_odm.blocks import NodeODM, NodeODMPool
    from pydantic import SecretStr

    from prefect_odm.nodes.refs import survey_label

    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    for old in SCREENSHOTS.glob("*.png"):
        old.unlink()
    token = f"ui-secret-{uuid.uuid4().hex}"
    engine_dir, output = tmp_path / "engine", tmp_path / "out"
    faults = json.dumps({"fail_task_name": f"^{FAILING}-"})
    engine = start_engine(
        engine_dir, token=token, method="direct", max_parallel_tasks=2,
        extra_env={FAULTS_ENV: faults},
    )  # fmt: skip
    pool_name = f"ui-pool-{uuid.uuid4().hex[:8]}"
    NodeODMPool(nodes=[NodeODM(url=engine.url, token=SecretStr(token))]).save(pool_name)
    api_url = prefect_server.api_url
    ui_url = api_url.removesuffix("/api")
    t0 = time.monotonic()
    try:
        from prefect.deployments import run_deployment

        params = brighton_parameters(brighton_images, output, node_pool=pool_name)
        parent_run = run_deployment(
            "reconstruct/reconstruct", parameters=params, timeout=0, as_subflow=False
        )
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            pages = Pages(page, ui_url)
            _first_round(pages, parent_run.id, output, brighton_images, survey_label)
            # The operator mends the node: same port, data folder and token, no fault.
            engine.stop()
            engine = start_engine(
                engine_dir, port=engine.port, token=token, method="direct", max_parallel_tasks=2
            )
            _retry_round(pages, parent_run.id, output)
            _split_is_fillable_in_the_form(pages, api_url)
            browser.close()
        answers = {
            path: _api(api_url, path, {"limit": 200})
            for path in (
                "/flow_runs/filter",
                "/task_runs/filter",
                "/artifacts/filter",
                "/logs/filter",
                "/block_documents/filter",
            )
        }
        answers.update({f"page {n}": html for n, html in enumerate(pages.seen)})
        leaks = {
            where: text[max(0, text.index(token) - 300) : text.index(token)]
            for where, text in answers.items()
            if token in text
        }
        assert not leaks, leaks  # where the token shows, with the text before it
        print(f"\nUI browser test: {time.monotonic() - t0:.1f} s; screenshots in {SCREENSHOTS}")
    finally:
        engine.stop()


def _first_round(pages: Pages, parent_id, output: Path, images: Path, survey_label) -> None:
    """The first round fails on submodel-001: names, plan picture and the failure in the pages."""
    parent = wait_run(parent_id)
    assert parent.state.type.value == "FAILED", parent.state
    survey = json.loads(next(output.glob("*/plan/survey.json")).read_text())
    run_name = f"{survey_label(str(images))}-{survey['fingerprint'][:8]}"
    assert parent.name == run_name and run_name.startswith("brighton_beach_1600-")
    assert FAILING in (parent.state.message or ""), parent.state.message
    children = {c.parameters["submodel_id"]: c for c in runs_of("process-submodel", output)}
    assert len(children) >= 2 and children[FAILING].state.type.value == "FAILED"
    assert {c.name for c in children.values()} == {f"{run_name}-{sid}" for sid in children}
    assert all(c.parameters["node_pool"] and not c.parameters["nodes"] for c in children.values())

    pages.open(f"/runs/flow-run/{parent_id}", re.escape(run_name))
    pages.shot("parent-failed")
    html = pages.open(f"/runs/flow-run/{children[FAILING].id}", re.escape(f"{run_name}-{FAILING}"))
    assert "Injected failure" in html or pages.wait_for("Injected failure")
    pages.shot("child-failed")

    fp12 = survey["fingerprint"][:12]
    plan_id = _artifact_id(pages.ui_url + "/api", f"plan-report-{fp12}")
    pages.open(f"/artifacts/artifact/{plan_id}", "Split plan")
    img = pages.page.locator('img[src^="data:image/png;base64,"]').first
    img.wait_for(timeout=PAGE_TIMEOUT_MS)
    assert img.evaluate("i => i.complete && i.naturalWidth") > 100  # the picture is shown
    pages.shot("plan-artifact")

    table_id = _artifact_id(pages.ui_url + "/api", f"submodels-{fp12}")
    html = pages.open(f"/artifacts/artifact/{table_id}", FAILING)
    pages.wait_for("Injected failure")
    pages.shot("submodel-table-failed")
    assert "failed" in pages.page.content()


def _retry_round(pages: Pages, parent_id, output: Path) -> None:
    """Retry pressed on the child, then on the parent: the history and Cached in the pages."""
    child = next(
        c for c in runs_of("process-submodel", output) if c.parameters["submodel_id"] == FAILING
    )
    pages.open(f"/runs/flow-run/{child.id}", "Failed")
    pages.press_retry()
    pages.shot("child-retry-pressed")
    child = wait_run(child.id)
    assert child.state.type.value == "COMPLETED", child.state
    pages.open(f"/runs/flow-run/{parent_id}", "Failed")
    pages.press_retry()
    parent = wait_run(parent_id)
    assert parent.state.type.value == "COMPLETED", parent.state

    pages.open(f"/runs/flow-run/{parent_id}", "Completed")
    pages.shot("parent-completed")
    pages.page.get_by_text("Task Runs", exact=True).first.click()
    pages.wait_for(r"reuse-submodel-00\d")
    pages.wait_for("Cached")
    pages.shot("parent-task-runs-cached")

    survey_fp = json.loads(next(output.glob("*/plan/survey.json")).read_text())["fingerprint"]
    table_id = _artifact_id(pages.ui_url + "/api", f"submodels-{survey_fp[:12]}")
    pages.open(f"/artifacts/artifact/{table_id}", FAILING)
    pages.wait_for(r"run 1 Failed: .*Injected failure.*; run 2 Completed")
    pages.wait_for("cached")
    pages.shot("submodel-table-after-retry")
    report_id = _artifact_id(pages.ui_url + "/api", f"report-{survey_fp[:12]}")
    pages.open(f"/artifacts/artifact/{report_id}", "Reconstruction of")
    img = pages.page.locator('img[src^="data:image/png;base64,"]').first
    img.wait_for(timeout=PAGE_TIMEOUT_MS)
    assert img.evaluate("i => i.complete && i.naturalWidth") > 100
    pages.shot("report-artifact")


def _split_is_fillable_in_the_form(pages: Pages, api_url: str) -> None:
    """The reconstruct deployment's run form offers ``split`` as a number or "auto" (no
    "split is a const and cannot be changed")."""
    found = json.loads(
        _api(api_url, "/deployments/filter", {"deployments": {"name": {"any_": ["reconstruct"]}}})
    )
    pages.open(f"/deployments/deployment/{found[0]['id']}/run", "split")
    pages.page.get_by_text("auto", exact=True).first.click()  # split's choice of "auto"
    pages.shot("run-form-split-auto")
    body = pages.page.inner_text("body")
    assert "is a const" not in body and "cannot be changed" not in body
