"""Issue 30 item 7: the matrix, each case through the merge; what must refuse, at the plan.

Overlap widths 10, 20 and 50 m; the ``direct`` and ``sfm`` pipelines; a grid survey and a real
flight; the built-in engine and OpenDroneMap's real NodeODM 2.2.4 (test mode). The cases here:

==========  =======  ============================  ========  ==================================
survey      overlap  pipeline                      backend   outcome
==========  =======  ============================  ========  ==================================
grid        10 m     direct                        engine    merged; no seam shares an image
grid        20 m     direct                        engine    merged; seams by cameras, products
grid        50 m     direct                        engine    merged; every seam shares images
grid        10 m     direct, cameras-only gates    engine    refused at the plan: needs 15 m
grid        15 m     direct, cameras-only gates    engine    merged (the overlap refused named)
grid        10 m     direct, a 1 mm gate           engine    fails at the merge, names the merge
                                                             command; that command merges
brighton    20 m     direct, one photo damaged     engine    merged without it (set aside)
brighton    10 m     sfm                           engine    merged (issue 30's first case)
brighton    20 m     direct (NodeODM ignores it)   NodeODM   merged; one node fails every task
brighton    50 m     sfm                           NodeODM   merged; one node fails every task
grid        10 m     direct, cameras-only gates    NodeODM   refused before any upload
==========  =======  ============================  ========  ==================================

On NodeODM, test mode returns one canned folder for every task; it is given the cameras of the
images every submodel holds (none at 10 m: brighton at 10 m runs on the engine), as the flow
refuses a task's cameras of images it was not sent (``test_real_nodeodm_merge``).

Cases the suite already runs elsewhere are not run again here:

* brighton, sfm, ``--split 10 --split-overlap-m 20``, engine: ``test_reconstruct.brighton_run``;
  the same with ``direct``: ``test_reconstruct.test_changed_option...``;
* brighton, ``--split 9 --split-overlap-m 20`` on two real NodeODM nodes, one failing every task:
  ``test_real_nodeodm_merge`` (from Python and from the command line);
* a 144-image grid over a 150 m slope, direct, ``--split 14 --split-overlap-m 10``: ``test_slope``;
* the plan's verdict at 10, 20 and 50 m on the real layouts (1,817 and 1,452 positions, no
  pixels) and on the 600-image grid: ``test_plan_neighbours``; a GPS altitude drift refused at
  the plan: ``test_drift_refusal``.

The grid here is the issue's 600-image grid scaled down to 48 small images (320 x 240 px, 6
lines 36 m apart, shots every 27 m, 81 x 61 m footprints, ``tests/synthetic_survey.py``): at
10 m its neighbours share no image, so only the refinement from the products ties them (the
case that failed at the merge after all the compute); with the camera step alone it must be
refused at the plan, naming the overlap that ties it, and that overlap must merge. brighton at
50 m is ``--split 5`` (at ``--split 6`` the three submodels would hold the same 18 images and
the plan keeps one).

Real NodeODM in test mode returns brighton's canned products whatever it is sent, so it only
runs the real flight (brighton), and it ignores ``pipeline`` (an option of the built-in engine).
The structure-from-motion pipeline runs once (brighton at 10 m): it is the costly one.
"""

from __future__ import annotations

import json
import re
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import peers
import pytest
import rasterio
from shapely import contains_xy
from shapely.geometry import MultiPoint
from synthetic_survey import SlopeSurvey, write_slope_survey

from prefect_odm.align.report import AlignmentOptions
from prefect_odm.engine.launch import EngineProcess, start_engine
from prefect_odm.errors import PlanningError
from prefect_odm.merge.overlaps import ortho_shifts
from prefect_odm.models import Manifest, MergeOptions, ProcessingOptions, SplitPlan
from prefect_odm.plan.neighbours import untied_submodels

pytestmark = pytest.mark.integration

GRID = SlopeSurvey(
    lines=6,
    per_line=8,
    line_spacing_m=36.0,
    shot_spacing_m=27.0,
    rise_m=0.0,
    width_px=320,
    height_px=240,
    focal_px=275.0,
)
GRID_SPLIT = 12
BRIGHTON_SPLIT = 6
CAMERAS_ONLY = MergeOptions(alignment=AlignmentOptions(refine_from_products=False))
DIRECT = ProcessingOptions(pipeline="direct")
REFUSAL = re.compile(
    r"^\S+: (submodel-\d{3}) / (submodel-\d{3}) share (\d+) images?; the alignment needs 3: "
    r"use --split-overlap-m (\d+) or more$"
)


@dataclass
class Case:
    """One run of the matrix: the manifest, its plan and the folder of its survey."""

    manifest: Manifest
    plan: SplitPlan
    survey_dir: Path


def run(images: Path, out: Path, **kwargs: object) -> Case:
    from prefect_odm.flows import reconstruct

    manifest = reconstruct(images=str(images), output=str(out), **kwargs)
    survey_dir = Path(manifest.products["orthophoto"]).parents[1]
    plan = SplitPlan.model_validate_json((survey_dir / "plan" / "plan.json").read_text())
    return Case(manifest, plan, survey_dir)


def covered_share_of_camera_hull(case: Case) -> float:
    """Share of the cameras' convex hull the merged orthophoto covers (alpha > 0, 1 m lattice)."""
    hull = MultiPoint([(c.x_m, c.y_m) for c in case.plan.cameras]).convex_hull
    with rasterio.open(case.manifest.products["orthophoto"]) as ds:
        step = max(1, int(1.0 / ds.res[0]))
        alpha = ds.read(4)[::step, ::step]
        rows, cols = np.mgrid[0 : ds.height : step, 0 : ds.width : step]
        xs, ys = rasterio.transform.xy(ds.transform, rows.ravel(), cols.ravel())
    inside = contains_xy(hull, np.asarray(xs), np.asarray(ys))
    return float((alpha.ravel()[inside] > 0).mean())


def check_merged(case: Case, overlap_m: float) -> None:
    """Every submodel processed and merged, every gate passed, nothing accepted, the merged
    orthophoto over the whole survey, and the plan's seams what the alignment tied."""
    m = case.manifest
    assert case.plan.split_overlap_m == overlap_m and case.plan.split_overlap_asked_m is None
    assert len(m.submodels) >= 2
    assert {r.status for r in m.submodels} == {"completed"}
    assert {"orthophoto", "dsm", "point_cloud"} <= set(m.products)
    assert m.alignment is not None
    assert m.alignment.failures == [] and not m.alignment.accepted
    ids = [sm.id for sm in case.plan.submodels]
    assert case.plan.neighbours and not untied_submodels(case.plan.neighbours, ids)
    with rasterio.open(m.products["orthophoto"]) as ds:
        assert ds.crs.to_epsg() == case.plan.crs_epsg
    assert covered_share_of_camera_hull(case) >= 0.97
    print(
        f"\n{case.survey_dir.name}: {len(m.submodels)} submodels, seams "
        + ", ".join(f"{p.shared_images}/{p.tied_by}" for p in case.plan.neighbours)
    )


def task_count(url: str) -> int:
    with urllib.request.urlopen(f"{url}/task/list", timeout=10) as res:
        return len(json.loads(res.read()))


def check_refused(caught: pytest.ExceptionInfo[PlanningError], out: Path) -> int:
    """One line naming the pair and the overlap needed; nothing written. Returns the overlap
    it names, metres."""
    text = str(caught.value)
    found = REFUSAL.match(text)
    assert found, text
    assert int(found.group(3)) < 3
    assert not list(out.rglob("plan.json")) and not list(out.rglob("submodels/*/*"))
    return int(found.group(4))


# ----------------------------------------------------------------------------- the grid, engine


@pytest.fixture(scope="module")
def grid_images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("grid") / "images"
    write_slope_survey(folder, GRID)
    return folder


@pytest.fixture(scope="module")
def engine(prefect_api: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineProcess]:
    """One built-in engine for the module's runs (two task slots), and a private home."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PREFECT_ODM_HOME", str(tmp_path_factory.mktemp("odm-home")))
        with start_engine(tmp_path_factory.mktemp("engine"), max_parallel_tasks=2) as node:
            yield node


def grid_run(engine: EngineProcess, images: Path, out: Path, overlap_m: int, **kw: object) -> Case:
    return run(
        images, out, nodes=[engine.url], split=GRID_SPLIT, split_overlap_m=overlap_m,
        options=DIRECT, **kw,
    )  # fmt: skip


@pytest.fixture(scope="module")
def grid_at_10_m(
    engine: EngineProcess, grid_images: Path, tmp_path_factory: pytest.TempPathFactory
) -> Case:
    return grid_run(engine, grid_images, tmp_path_factory.mktemp("grid-10") / "out", 10)


def test_grid_at_10_m_direct_through_the_merge(grid_at_10_m: Case) -> None:
    """The issue's grid at 10 m: no seam shares an image, so nothing ties the submodels but the
    refinement from their products. It processed every submodel, then failed the gates; now it
    merges, every gate passed."""
    case = grid_at_10_m
    check_merged(case, 10)
    pairs = case.plan.neighbours
    assert all(p.shared_images == 0 and p.tied_by == "products" for p in pairs)
    assert case.manifest.alignment is not None
    assert case.manifest.alignment.result.overlaps == []  # no camera ties anything
    refinement = case.manifest.alignment.refinement
    assert refinement is not None
    assert {o.overlap for o in refinement.overlaps} >= {f"{p.first}|{p.second}" for p in pairs}


@pytest.mark.parametrize("overlap_m", [20, 50])
def test_grid_direct_through_the_merge(
    engine: EngineProcess, grid_images: Path, tmp_path: Path, overlap_m: int
) -> None:
    """At 20 m some seams share images and some only products; at 50 m every seam shares
    images."""
    case = grid_run(engine, grid_images, tmp_path / "out", overlap_m)
    check_merged(case, overlap_m)
    ties = {p.tied_by for p in case.plan.neighbours}
    assert ties == ({"cameras", "products"} if overlap_m == 20 else {"cameras"})


def test_grid_cameras_only_is_refused_at_the_plan_then_merges_at_the_overlap_named(
    engine: EngineProcess, grid_images: Path, tmp_path: Path
) -> None:
    """Without the refinement from products, 10 m is refused before anything reaches the node,
    in one line naming the pair and the overlap needed; that overlap merges, tied by cameras."""
    out = tmp_path / "out"
    asked = {"nodes": [engine.url], "split": GRID_SPLIT, "options": DIRECT}
    tasks_before = task_count(engine.url)
    with pytest.raises(PlanningError) as caught:
        run(grid_images, out, split_overlap_m=10, merge_options=CAMERAS_ONLY, **asked)
    needed = check_refused(caught, out)
    assert task_count(engine.url) == tasks_before  # nothing reached the node
    assert needed == 15
    case = run(grid_images, out, split_overlap_m=needed, merge_options=CAMERAS_ONLY, **asked)
    check_merged(case, needed)
    assert case.manifest.alignment is not None and case.manifest.alignment.refinement is None
    by_cameras = case.manifest.alignment.result.overlaps
    tied = {sid for o in by_cameras if o.n_used >= 3 for sid in (o.first, o.second)}
    assert tied == {sm.id for sm in case.plan.submodels}


def test_a_merge_that_fails_its_gates_names_the_command_that_merges_the_stored_submodels(
    engine: EngineProcess,
    grid_images: Path,
    grid_at_10_m: Case,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    prefect_api: str,
) -> None:
    """What can still fail at the merge leaves every processed submodel reusable and names the
    command that merges them: the 10 m grid again, with a correction gate (1 mm) its 4-5 mm
    refinement fails. Nothing is processed again; the command it names merges."""
    from prefect_odm.align import AlignmentError
    from prefect_odm.cli import main

    out = grid_at_10_m.survey_dir.parent
    tasks_before = task_count(engine.url)
    strict = MergeOptions(alignment=AlignmentOptions(max_correction_m=0.001))
    with pytest.raises(AlignmentError) as caught:
        grid_run(engine, grid_images, out, 10, merge_options=strict)
    assert task_count(engine.url) == tasks_before  # every submodel reused
    text = str(caught.value)
    assert text.startswith("alignment quality gates failed (")
    assert "max_correction_m=0.001" in text
    command = text.split("to merge them anyway: ", 1)[1].split()
    assert command[:2] == ["prefect-odm", "merge"] and command[-1] == "--accept-alignment"
    folders = command[2 : command.index("--plan")]
    assert len(folders) == len(grid_at_10_m.plan.submodels)
    assert all(Path(f).is_dir() for f in folders)
    merged = tmp_path / "merged"
    words = [merged if w == "OUT" else w for w in command[2:]]
    monkeypatch.setenv("PREFECT_API_URL", prefect_api)
    assert main(["merge", *map(str, words)]) == 0
    [manifest_path] = merged.glob("*/manifest.json")
    manifest = Manifest.model_validate_json(manifest_path.read_text())
    assert {"orthophoto", "dsm", "point_cloud"} <= set(manifest.products)
    with (
        rasterio.open(manifest.products["orthophoto"]) as ds,
        rasterio.open(grid_at_10_m.manifest.products["orthophoto"]) as first,
    ):
        assert (ds.width, ds.height, ds.transform) == (first.width, first.height, first.transform)


# ----------------------------------------------------------------------------- brighton, engine


@pytest.fixture(scope="module")
def brighton_damaged(brighton_images: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """brighton with DJI_0020.JPG damaged: header, GPS and end marker intact, its entropy-coded
    data scrambled from the middle on (seeded), so that Pillow cannot decode it."""
    from PIL import Image

    folder = tmp_path_factory.mktemp("damaged") / "images"
    folder.mkdir()
    for src in sorted(brighton_images.glob("*.JPG")):
        if src.name != "DJI_0020.JPG":
            (folder / src.name).symlink_to(src)
    data = bytearray((brighton_images / "DJI_0020.JPG").read_bytes())
    start = data.rindex(b"\xff\xda")  # the (last) start of scan
    middle = (start + len(data)) // 2
    rng = np.random.default_rng(31)  # a seed whose bytes Pillow cannot decode (30 decodes)
    data[middle : len(data) - 2] = rng.integers(0, 256, len(data) - 2 - middle, np.uint8).tobytes()
    assert data[:2] == b"\xff\xd8" and data[-2:] == b"\xff\xd9"
    (folder / "DJI_0020.JPG").write_bytes(bytes(data))
    with Image.open(folder / "DJI_0020.JPG") as image:
        assert image.getexif().get_ifd(0x8825)  # the GPS is still read
        with pytest.raises(OSError):
            image.load()
    return folder


def test_brighton_direct_at_20_m_with_a_damaged_photo_through_the_merge(
    engine: EngineProcess, brighton_damaged: Path, tmp_path: Path
) -> None:
    """brighton --split 9 --split-overlap-m 20 --pipeline direct with one photo that does not
    decode whole: the scan names it and sets it aside, the run completes without it."""
    case = run(
        brighton_damaged, tmp_path / "out", nodes=[engine.url], split=9, split_overlap_m=20,
        options=DIRECT,
    )  # fmt: skip
    check_merged(case, 20)
    [rejected] = case.manifest.rejected_images
    assert (rejected.name, rejected.reason) == ("DJI_0020.JPG", "unreadable")
    assert "does not decode whole" in rejected.detail
    assert len(case.plan.cameras) == 17
    assert "DJI_0020.JPG" not in {c.name for c in case.plan.cameras}


def test_brighton_sfm_at_10_m_through_the_merge(
    engine: EngineProcess, brighton_images: Path, tmp_path: Path
) -> None:
    """Issue 30's first case: brighton --split 6 --split-overlap-m 10 with structure from
    motion (2-4 shared images per seam) failed ``no overlap ties it to the block``."""
    case = run(
        brighton_images, tmp_path / "out", nodes=[engine.url], split=BRIGHTON_SPLIT,
        split_overlap_m=10,
    )  # fmt: skip
    check_merged(case, 10)
    assert len(case.manifest.submodels) == 3
    assert case.manifest.alignment is not None
    assert case.manifest.alignment.refinement is not None
    # the acceptance: the orthophoto shift between submodels, median over the seams, <= 0.2 m
    # (phase correlation on 20 m tiles, as bench_narrow_overlap.py measures it; 0.237 m when
    # the refinement only shifted each submodel, 0.052 m with a turn and scale in the plane)
    orthos = {
        d.name.rsplit("-", 1)[0]: d / "odm_orthophoto.tif"
        for d in sorted((case.survey_dir / "submodels").iterdir())
    }
    corrections = case.manifest.alignment.raster_corrections()
    shifts = ortho_shifts(orthos, corrections=corrections, tile_m=20.0)
    assert len(shifts) == 3
    assert float(np.median([s.magnitude_m for s in shifts.values()])) <= 0.2


# ----------------------------------------------------------------------------- real NodeODM


@pytest.fixture(scope="module")
def nodeodm_pair(
    prefect_api: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[peers.NodeODM, peers.NodeODM]]:
    """Two real NodeODM 2.2.4 in test mode, the first failing every task."""
    peers.require_node()
    work = tmp_path_factory.mktemp("nodeodm")
    failing = peers.start_nodeodm(work / "failing", ["--test_fail_tasks"])
    healthy = peers.start_nodeodm(work / "healthy")
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("PREFECT_ODM_HOME", str(tmp_path_factory.mktemp("odm-home")))
            yield failing, healthy
    finally:
        failing.stop()
        healthy.stop()


@pytest.mark.parametrize(
    ("split", "overlap_m", "options"), [(6, 20, DIRECT), (5, 50, ProcessingOptions())]
)
def test_brighton_on_real_nodeodm_through_the_merge(
    nodeodm_pair: tuple[peers.NodeODM, peers.NodeODM],
    brighton_images: Path,
    tmp_path: Path,
    split: int,
    overlap_m: int,
    options: ProcessingOptions,
) -> None:
    """20 m (``--split 6``: 3 submodels, 6 images in all three) and 50 m (``--split 5``: 3
    submodels of 17-18 images) on two real nodes, one failing every task: every submodel ends
    on the healthy node, and ODM's products go through the merge. NodeODM drops ``pipeline``
    (not in its ``/options``). Test mode returns one canned folder for every task, so it holds
    the cameras of the images all submodels are sent (``peers.canned_products_of``; at 10 m no
    image is in all three, and the flow refuses cameras of images a task was not sent)."""
    failing, healthy = nodeodm_pair
    shared = peers.images_of_every_submodel(brighton_images, split, overlap_m)
    peers.canned_products_of(healthy.work, shared)
    case = run(
        brighton_images, tmp_path / "out", nodes=[failing.url, healthy.url],
        split=split, split_overlap_m=overlap_m, options=options,
    )  # fmt: skip
    check_merged(case, overlap_m)
    health = {h.url: h for h in case.manifest.node_health}
    assert health[healthy.url.rstrip("/")].tasks_completed == len(case.manifest.submodels)
    assert health[failing.url.rstrip("/")].tasks_failed >= 1  # it was tried, and failed


def test_grid_cameras_only_is_refused_before_any_upload_to_real_nodeodm(
    nodeodm_pair: tuple[peers.NodeODM, peers.NodeODM], grid_images: Path, tmp_path: Path
) -> None:
    failing, healthy = nodeodm_pair
    out = tmp_path / "out"
    before = task_count(healthy.url), task_count(failing.url)
    with pytest.raises(PlanningError) as caught:
        run(
            grid_images, out, nodes=[failing.url, healthy.url], split=GRID_SPLIT,
            split_overlap_m=10, options=DIRECT, merge_options=CAMERAS_ONLY,
        )  # fmt: skip
    assert check_refused(caught, out) == 15
    assert (task_count(healthy.url), task_count(failing.url)) == before
