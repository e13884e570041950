"""Split planning: balance, overlap in metres, determinism, core areas vs ownership, layouts."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import shapely
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyproj import Geod
from shapely.geometry import shape

from prefect_odm.errors import PlanningError
from prefect_odm.geo import project_lonlat, survey_utm_epsg, utm_epsg
from prefect_odm.models import ImageRecord, ProcessingOptions, SplitPlan, Survey
from prefect_odm.ownership import Ownership
from prefect_odm.plan.coverage_gaps import find_coverage_gaps
from prefect_odm.plan.partition import default_min_submodel_images, rebalanced_sizes, target_sizes
from prefect_odm.plan.picture import plan_geojson, plan_markdown, plan_png, plan_rows
from prefect_odm.plan.planning import plan_from_positions, plan_split
from prefect_odm.survey.flight_checks import find_sequence_gaps, flight_tail_mask
from prefect_odm.survey.layouts import layout_survey, read_file_list, read_layout
from prefect_odm.survey.scan import scan_images

# ----------------------------------------------------------------------------- helpers


def _balanced(core_counts: list[int], split: int) -> bool:
    """Equal cores: every size within +-20 % of ``split`` but one."""
    if len(core_counts) == 1:
        return True
    outside = [c for c in core_counts if not 0.8 * split <= c <= 1.2 * split]
    return len(outside) <= 1


def check_load_balance(x: np.ndarray, y: np.ndarray, split: int, overlap_m: float) -> None:
    """The plan's largest submodel (core + overlap) processes no more images than with equal
    cores, its cores are no smaller than the smallest equal core or the minimum size, and
    the count of submodels is that of the equal cores."""
    plan = plan_from_positions(x, y, split=split, split_overlap_m=overlap_m)
    equal = plan_from_positions(x, y, split=split, split_overlap_m=overlap_m, balance_load=False)
    assert _balanced(equal.core_counts().tolist(), split)
    assert plan.k == equal.k
    loads = [len(m) for m in plan.members]
    assert max(loads) <= max(len(m) for m in equal.members)
    smallest = min(default_min_submodel_images(split), int(equal.core_counts().min()))
    assert int(plan.core_counts().min()) >= smallest


def check_plan(plan: SplitPlan, survey: Survey) -> None:
    """The acceptance invariants of a plan."""
    names = {im.name for im in survey.images}
    in_any = set().union(*(set(sm.image_names) for sm in plan.submodels))
    assert in_any == names, "every image in at least one submodel"
    cores = [set(sm.core_image_names) for sm in plan.submodels]
    assert sum(len(c) for c in cores) == len(names) and set().union(*cores) == names
    for sm in plan.submodels:
        assert set(sm.core_image_names) <= set(sm.image_names)
        assert sm.overlap_image_count == len(sm.image_names) - len(sm.core_image_names)
        assert sm.image_names == sorted(sm.image_names)
        assert sm.area_m2 > 0
        assert sm.estimated_memory_gib > 0
    cameras = {c.name: c for c in plan.cameras}
    xs = np.array([cameras[im.name].x_m for im in survey.images])
    ys = np.array([cameras[im.name].y_m for im in survey.images])
    check_load_balance(xs, ys, plan.split, plan.split_overlap_m)
    assert [sm.id for sm in plan.submodels] == [
        f"submodel-{i:03d}" for i in range(len(plan.submodels))
    ]
    # Overlap in metres: every camera within split_overlap_m of a core area is in that submodel.
    pos = {c.name: (c.x_m, c.y_m) for c in plan.cameras}
    xy = np.array([pos[n] for n in sorted(pos)])
    order = sorted(pos)
    points = shapely.points(xy)
    for sm in plan.submodels:
        area = shape(sm.core_area)
        d = shapely.distance(area, points)
        near = {order[i] for i in np.flatnonzero(d <= plan.split_overlap_m - 0.01)}
        assert near <= set(sm.image_names), f"{sm.id} misses cameras inside its overlap"
    # Neighbouring submodels (touching core areas) share images when the overlap is positive.
    if plan.split_overlap_m >= 1 and len(plan.submodels) > 1:
        areas = [shape(sm.core_area) for sm in plan.submodels]
        for i, a in enumerate(areas):
            for j in range(i + 1, len(areas)):
                if a.distance(areas[j]) < 1e-3:
                    shared = set(plan.submodels[i].image_names) & set(plan.submodels[j].image_names)
                    b_near = shapely.distance(
                        a, shapely.points([pos[n] for n in plan.submodels[j].core_image_names])
                    )
                    if np.any(b_near <= plan.split_overlap_m - 0.01):
                        assert shared


def check_core_areas_match_ownership(plan: SplitPlan, samples: int = 4000, seed: int = 0) -> None:
    own = Ownership.from_cameras((c.x_m, c.y_m, c.submodel_id) for c in plan.cameras)
    areas = {sm.id: shape(sm.core_area) for sm in plan.submodels}
    union = shapely.union_all(list(areas.values()))
    minx, miny, maxx, maxy = union.bounds
    rng = np.random.default_rng(seed)
    x = rng.uniform(minx, maxx, samples)
    y = rng.uniform(miny, maxy, samples)
    inside = shapely.contains_xy(union, x, y)
    x, y = x[inside], y[inside]
    owners = own.owner_of_points(x, y)
    boundary = shapely.union_all([a.boundary for a in areas.values()])
    far_from_edges = shapely.distance(boundary, shapely.points(np.column_stack([x, y]))) > 0.01
    for sid, area in areas.items():
        hit = shapely.contains_xy(area, x, y)
        assert np.array_equal(hit[far_from_edges], (owners == sid)[far_from_edges]), sid


def shuffled(survey: Survey, seed: int) -> Survey:
    images = list(survey.images)
    random.Random(seed).shuffle(images)
    return survey.model_copy(update={"images": images})


def plan_json(plan: SplitPlan) -> str:
    return plan.model_dump_json()


def survey_from_lonlat(lon, lat, *, alt=100.0, prefix="img") -> Survey:
    from prefect_odm.fingerprints import survey_fingerprint

    images = [
        ImageRecord(
            name=f"{prefix}_{i:05d}.jpg",
            url=f"/nowhere/{prefix}_{i:05d}.jpg",
            identity=f"sha256:{i:064x}",
            size_bytes=1,
            width=4000,
            height=3000,
            latitude=float(la),
            longitude=float(lo),
            altitude_m=alt,
        )
        for i, (lo, la) in enumerate(zip(lon, lat, strict=True))
    ]
    return Survey(
        source="generated",
        images=images,
        crs_epsg=survey_utm_epsg(lat, lon),
        fingerprint=survey_fingerprint(im.identity for im in images),
        cameras={"unknown": len(images)},
    )


# ----------------------------------------------------------------------------- target sizes


@pytest.mark.parametrize("n", [1, 5, 99, 100, 119, 120, 121, 150, 159, 160, 167, 1000, 1817, 12345])
@pytest.mark.parametrize("split", [10, 50, 100])
def test_target_sizes(n: int, split: int) -> None:
    sizes = target_sizes(n, split)
    assert sum(sizes) == n
    assert _balanced(sizes, split)
    if n <= split:
        assert sizes == [n]
    assert min(sizes) >= min(n, max(5, split // 4))


# ----------------------------------------------------------------------------- real surveys


@pytest.fixture(scope="module")
def brighton_survey(brighton_images: Path) -> Survey:
    return scan_images(str(brighton_images))


@pytest.fixture(scope="module")
def seneca_survey(seneca_images: Path) -> Survey:
    return scan_images(str(seneca_images))


def test_brighton_split_10_gives_two_submodels(brighton_survey: Survey) -> None:
    plan = plan_split(brighton_survey, split=10, split_overlap_m=15)
    assert len(plan.submodels) == 2
    assert [len(sm.core_image_names) for sm in plan.submodels] == [9, 9]
    check_plan(plan, brighton_survey)
    check_core_areas_match_ownership(plan)
    assert plan.crs_epsg == 32615


def test_brighton_split_6_with_default_overlap_has_no_identical_submodels(
    brighton_survey: Survey, caplog: pytest.LogCaptureFixture
) -> None:
    # issue 13: the 50 m overlap made three submodels of all 18 images (one task, reused 3x).
    with caplog.at_level("WARNING", logger="prefect_odm.plan.planning"):
        plan = plan_split(brighton_survey, split=6)
    sets = [frozenset(sm.image_names) for sm in plan.submodels]
    assert len(set(sets)) == len(sets) == 1
    (only,) = plan.submodels
    names = sorted(im.name for im in brighton_survey.images)
    assert only.image_names == only.core_image_names == names and only.overlap_image_count == 0
    assert {c.submodel_id for c in plan.cameras} == {only.id}
    assert len({sm.fingerprint for sm in plan.submodels}) == len(plan.submodels)
    check_core_areas_match_ownership(plan)
    # the warnings describe the plan kept: one submodel, each image processed once
    assert not any("processed" in w for w in plan.warnings), plan.warnings
    assert any("(3 planned, 1 kept)" in w for w in plan.warnings), plan.warnings
    assert "merged into it (3 planned, 1 kept)" in caplog.text
    # The warnings are not part of the stored plan: plan.json round-trips to the same plan.
    assert "warnings" not in plan.model_dump(mode="json")


def test_brighton_single_submodel_when_split_large(brighton_survey: Survey) -> None:
    plan = plan_split(brighton_survey, split=100)
    assert len(plan.submodels) == 1
    assert plan.submodels[0].overlap_image_count == 0
    assert len(plan.submodels[0].image_names) == 18


@pytest.mark.parametrize(("split", "overlap_m"), [(50, 30.0), (40, 60.0), (20, 25.0)])
def test_seneca(seneca_survey: Survey, split: int, overlap_m: float) -> None:
    plan = plan_split(seneca_survey, split=split, split_overlap_m=overlap_m)
    assert len(plan.submodels) >= 3
    check_plan(plan, seneca_survey)
    check_core_areas_match_ownership(plan)
    again = plan_split(shuffled(seneca_survey, 7), split=split, split_overlap_m=overlap_m)
    assert plan_json(again) == plan_json(plan)
    # the duplication warning gives the figures of this plan's table
    processed = sum(len(sm.image_names) for sm in plan.submodels)
    factor = processed / len(seneca_survey.images)
    warned = [w for w in plan.warnings if "times on average" in w]
    if factor > 1.5:
        assert warned == [
            f"the split overlap of {overlap_m:g} m makes each image processed {factor:.1f} times "
            f"on average ({processed} images processed for {len(seneca_survey.images)}); use a "
            "smaller --split-overlap-m or fewer submodels"
        ]
    else:
        assert not warned


def test_renamed_input_gives_the_same_partition(seneca_survey: Survey) -> None:
    renamed = seneca_survey.model_copy(
        update={
            "images": [
                im.model_copy(update={"name": f"renamed/{i:04d}.jpg"})
                for i, im in enumerate(reversed(seneca_survey.images))
            ]
        }
    )
    a = plan_split(seneca_survey, split=50, split_overlap_m=30)
    b = plan_split(renamed, split=50, split_overlap_m=30)
    by_id_a = {im.name: im.identity for im in seneca_survey.images}
    by_id_b = {im.name: im.identity for im in renamed.images}
    part_a = {by_id_a[c.name]: c.submodel_id for c in a.cameras}
    part_b = {by_id_b[c.name]: c.submodel_id for c in b.cameras}
    assert part_a == part_b
    assert [sm.fingerprint for sm in a.submodels] == [sm.fingerprint for sm in b.submodels]
    assert [sm.core_area for sm in a.submodels] == [sm.core_area for sm in b.submodels]


def test_fingerprints_follow_options(seneca_survey: Survey) -> None:
    a = plan_split(seneca_survey, split=50)
    b = plan_split(seneca_survey, split=50, options=ProcessingOptions(orthophoto_resolution_cm=2.0))
    pairs = zip(a.submodels, b.submodels, strict=True)
    assert all(x.fingerprint != y.fingerprint for x, y in pairs)
    assert a.fingerprint != b.fingerprint
    assert len({sm.fingerprint for sm in a.submodels}) == len(a.submodels)


def test_submodel_larger_than_any_node(seneca_survey: Survey) -> None:
    with pytest.raises(PlanningError, match="more than the largest node"):
        plan_split(seneca_survey, split=100, node_memory_gib=[1.5, 2.0])


def test_split_auto(seneca_survey: Survey) -> None:
    with pytest.raises(PlanningError, match="node_memory_gib"):
        plan_split(seneca_survey, split="auto")
    plan = plan_split(seneca_survey, split="auto", split_overlap_m=30, node_memory_gib=[2.0, 2.2])
    assert plan.split < 167
    assert all(sm.estimated_memory_gib <= 2.2 for sm in plan.submodels)
    check_plan(plan, seneca_survey)


def test_plan_visuals(seneca_survey: Survey, tmp_path: Path) -> None:
    plan = plan_split(seneca_survey, split=50, split_overlap_m=30)
    gj = plan_geojson(plan)
    assert gj["crs"]["properties"]["name"].endswith(str(plan.crs_epsg))
    kinds = [f["properties"]["kind"] for f in gj["features"]]
    assert kinds.count("core_area") == kinds.count("footprint") == len(plan.submodels)
    assert kinds.count("camera") == 167
    json.dumps(gj)
    rows = plan_rows(plan)
    assert [r["submodel"] for r in rows] == [sm.id for sm in plan.submodels]
    assert set(rows[0]) == {
        "submodel",
        "images",
        "overlap_images",
        "area_m2",
        "estimated_memory_gib",
    }
    png = tmp_path / "plan.png"
    plan_png(plan, png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = plan_markdown(plan, seneca_survey)
    assert "| submodel-000 |" in md and "Rejected images" in md


# ----------------------------------------------------------------------------- layouts


@pytest.fixture(scope="module")
def layouts_dir(data_dir: Path) -> Path:
    return data_dir / "layouts"


@pytest.mark.parametrize(("name", "count"), [("agung-2", 1817), ("freetown-1", 1452)])
def test_layouts(layouts_dir: Path, name: str, count: int) -> None:
    layout = read_layout(layouts_dir / name)
    assert len(layout) == count
    survey = layout_survey(layout)
    plan = plan_split(survey, split=100, split_overlap_m=50)
    assert len(plan.submodels) >= 14
    check_plan(plan, survey)
    check_core_areas_match_ownership(plan, samples=3000)
    again = plan_split(shuffled(survey, 1), split=100, split_overlap_m=50)
    assert plan_json(again) == plan_json(plan)


@pytest.mark.parametrize("name", ["agung-2", "freetown-1"])
def test_plan_png_colours_neighbours_apart(layouts_dir: Path, name: str, tmp_path: Path) -> None:
    """On the real layouts at ``--split 50`` (30-40 submodels, more than the ten colours), no two
    submodels whose cores touch share a colour, and the map is drawn."""
    from shapely.geometry import shape

    from prefect_odm.plan.picture import submodel_colours

    plan = plan_split(layout_survey(read_layout(layouts_dir / name)), split=50)
    assert len(plan.submodels) > 10
    colours = submodel_colours(plan)
    cores = {sm.id: shape(sm.core_area) for sm in plan.submodels}
    touching = [
        (a, b) for a in cores for b in cores if a < b and cores[a].buffer(1e-6).intersects(cores[b])
    ]
    assert len(touching) >= len(plan.submodels)  # a mesh of neighbours, not a row
    assert all(colours[a] != colours[b] for a, b in touching)
    assert len(set(colours.values())) <= 10
    plan_png(plan, tmp_path / "plan.png")
    assert (tmp_path / "plan.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("name", ["agung-2", "freetown-1"])
@pytest.mark.parametrize("split", [50, 100])
def test_inner_and_edge_submodels_process_about_the_same_images(
    layouts_dir: Path, name: str, split: int
) -> None:
    """Equal cores leave inner submodels 1.3-1.45x the mean load (core + overlap) at the
    default 50 m overlap; rebalanced cores bring the largest within 1.15x, without processing
    more images in all."""
    x, y = read_layout(layouts_dir / name).projected()
    plan = plan_from_positions(x, y, split=split)
    equal = plan_from_positions(x, y, split=split, balance_load=False)
    loads = np.array([len(m) for m in plan.members])
    equal_loads = np.array([len(m) for m in equal.members])
    assert equal_loads.max() > 1.3 * equal_loads.mean()  # the imbalance this fixes
    assert loads.max() <= 1.15 * loads.mean()
    assert loads.sum() <= equal_loads.sum()
    assert plan.k == equal.k and plan.core_counts().sum() == len(x)
    # the same plan from the same positions, in any order
    perm = np.random.default_rng(0).permutation(len(x))
    again = plan_from_positions(x[perm], y[perm], split=split)
    assert np.array_equal(again.labels[np.argsort(perm)], plan.labels)


def test_rebalanced_sizes_move_load_and_keep_the_minimum() -> None:
    sizes, weights = rebalanced_sizes([50, 50, 50], [75, 160, 80], 150, 30)
    assert sum(sizes) == 150 and len(weights) == 3
    assert sizes[1] < 50 < min(sizes[0], sizes[2])  # the loaded one shrinks, the others grow
    sizes, _ = rebalanced_sizes([40, 40, 40, 40], [400, 40, 40, 40], 160, 35)
    assert sum(sizes) == 160 and min(sizes) >= 35
    assert rebalanced_sizes([10, 10], [20, 20], 20, 5)[0] == [10, 10]


def test_freetown_gaps_and_tails(layouts_dir: Path) -> None:
    layout = read_layout(layouts_dir / "freetown-1")
    x, y = layout.projected()
    # Complete survey: no gap in any flight's shot sequence.
    assert find_sequence_gaps(layout.capture_time, x, y) == []
    # Take-off / landing tails: a leading run in each of the 4 flights (tasks).
    tails = flight_tail_mask(layout.capture_time, x, y)
    tasks = np.array([s.split("/")[2] for s in layout.source_files])
    for task in sorted(set(tasks)):
        sel = np.flatnonzero(tasks == task)
        order = sel[np.argsort([layout.capture_time[i] for i in sel], kind="stable")]
        assert tails[order[:15]].all(), f"{task}: transit to the first line not identified"
        inner = tails[order[40:-10]]
        assert not inner.any(), f"{task}: survey lines flagged as tail"
    assert 60 <= tails.sum() <= 140
    # Tails: the transit is straight and off the line axis; its yaw differs from the lines' ~+-90.
    yaw = layout.flight_yaw_deg
    assert np.median(np.abs(np.abs(yaw[~tails]) - 90)) < 2
    # Remove the listed images: every removed shot inside a flight is reported as a gap.
    removed = read_file_list(layouts_dir / "freetown-1" / "images-to-delete-for-gaps.txt")
    assert len(removed) == 32
    holed = layout.without(removed)
    assert len(holed) == 1452 - 32
    hx, hy = holed.projected(layout.crs_epsg)
    gaps = find_sequence_gaps(holed.capture_time, hx, hy)
    assert gaps
    assert sum(g.missing for g in gaps) >= 28
    windows = [
        (
            holed.capture_time[g.before],
            holed.capture_time[g.after],
            holed.source_files[g.before].split("/")[2],
        )
        for g in gaps
    ]
    index = {s.removeprefix("./"): i for i, s in enumerate(layout.source_files)}
    explained = 0
    inside_flight = 0
    for source in removed:
        i = index[source.removeprefix("./")]
        task = layout.source_files[i].split("/")[2]
        t = layout.capture_time[i]
        flight_times = sorted(layout.capture_time[j] for j in np.flatnonzero(tasks == task))
        if (
            t in (flight_times[0], flight_times[-1])
            or t in flight_times[1:2]
            or t in flight_times[-2:-1]
        ):
            continue  # a missing first/last shot leaves nothing to see
        inside_flight += 1
        if any(a < t < b and task == wt for a, b, wt in windows):
            explained += 1
    assert explained == inside_flight
    # And the plan of the holed survey still covers every image.
    survey = layout_survey(holed)
    plan = plan_split(survey, split=100, split_overlap_m=50)
    check_plan(plan, survey)


def test_coverage_gap_found_in_a_hole() -> None:
    gx, gy = np.meshgrid(np.arange(0, 600, 20.0), np.arange(0, 400, 40.0))
    x, y = gx.ravel(), gy.ravel()
    hole = np.hypot(x - 300, y - 200) < 90
    gaps = find_coverage_gaps(x[~hole], y[~hole])
    assert gaps and np.hypot(gaps[0].x_m - 300, gaps[0].y_m - 200) < 40
    assert find_coverage_gaps(x, y) == []


# ----------------------------------------------------------------------------- UTM boundary


def test_survey_straddling_a_utm_boundary_is_planned_in_one_crs() -> None:
    # 1.6 km x 1.2 km lawnmower centred on the 15/16 zone boundary (-90 degrees) at 45 N.
    geod = Geod(ellps="WGS84")
    lon0, lat0 = -90.0, 45.0
    lons, lats = [], []
    for row in range(12):
        for col in range(40):
            lo, la, _ = geod.fwd(lon0, lat0, 90.0, -800.0 + col * 40.0)
            lo, la, _ = geod.fwd(lo, la, 0.0, -600.0 + row * 100.0)
            lons.append(lo)
            lats.append(la)
    lons_a, lats_a = np.array(lons), np.array(lats)
    assert {utm_epsg(la, lo) for lo, la in zip(lons_a, lats_a, strict=True)} == {32615, 32616}
    survey = survey_from_lonlat(lons_a, lats_a)
    assert survey.crs_epsg in (32615, 32616)
    plan = plan_split(survey, split=60, split_overlap_m=40)
    assert plan.crs_epsg == survey.crs_epsg
    check_plan(plan, survey)
    check_core_areas_match_ownership(plan)
    # Distances in the single CRS agree with geodesic distances to better than 0.1 %.
    pos = {c.name: (c.x_m, c.y_m) for c in plan.cameras}
    names = [im.name for im in survey.images]
    a, b = survey.images[0], survey.images[-1]
    _, _, true_m = geod.inv(a.longitude, a.latitude, b.longitude, b.latitude)
    planned = float(np.hypot(*(np.subtract(pos[names[-1]], pos[names[0]]))))
    assert planned == pytest.approx(true_m, rel=1e-3)
    x, _ = project_lonlat(lons_a, lats_a, plan.crs_epsg)
    assert np.all(np.isfinite(x))


# ----------------------------------------------------------------------------- properties


@st.composite
def generated_positions(draw):
    kind = draw(st.sampled_from(["uniform", "clusters", "lawnmower", "line"]))
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    n = draw(st.integers(8, 400))
    if kind == "uniform":
        xy = rng.uniform(0, draw(st.floats(50, 3000)), size=(n, 2))
    elif kind == "clusters":
        centres = rng.uniform(0, 2000, size=(draw(st.integers(1, 5)), 2))
        xy = centres[rng.integers(0, len(centres), n)] + rng.normal(0, 60, size=(n, 2))
    elif kind == "lawnmower":
        cols = max(2, int(np.sqrt(n)))
        xy = np.array([(i % cols * 20.0, i // cols * 50.0) for i in range(n)]) + rng.normal(
            0, 0.5, (n, 2)
        )
    else:
        t = np.sort(rng.uniform(0, 3000, n))
        xy = np.column_stack([t, 0.02 * t + rng.normal(0, 1.0, n)])
    split = draw(st.integers(3, 80))
    overlap = draw(st.sampled_from([0.0, 10.0, 35.0, 80.0]))
    return xy + np.array([400_000.0, 5_000_000.0]), split, overlap, seed


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(generated_positions())
def test_property_plan_invariants(case) -> None:
    xy, split, overlap, seed = case
    n = len(xy)
    plan = plan_from_positions(xy[:, 0], xy[:, 1], split=split, split_overlap_m=overlap)
    counts = plan.core_counts().tolist()
    assert sum(counts) == n
    check_load_balance(xy[:, 0], xy[:, 1], split, overlap)
    # Every position in at least one submodel, and in its own core submodel.
    for i, members in enumerate(plan.members):
        assert set(np.flatnonzero(plan.labels == i)) <= set(members.tolist())
    assert set(np.concatenate(plan.members).tolist()) == set(range(n))
    # Overlap in metres.
    assert plan.core_areas is not None
    pts = shapely.points(xy)
    for i, area in enumerate(plan.core_areas):
        near = np.flatnonzero(shapely.distance(area, pts) <= overlap - 1e-6)
        assert set(near.tolist()) <= set(plan.members[i].tolist())
    # Core areas partition the clip region and agree with nearest-core-camera ownership.
    own = Ownership(xy[:, 0], xy[:, 1], tuple(str(v) for v in plan.labels))
    rng = np.random.default_rng(seed)
    minx, miny, maxx, maxy = plan.clip.bounds
    qx, qy = rng.uniform(minx, maxx, 500), rng.uniform(miny, maxy, 500)
    keep = shapely.contains_xy(plan.clip, qx, qy)
    qx, qy = qx[keep], qy[keep]
    owner = own.owner_of_points(qx, qy)
    edges = shapely.union_all([a.boundary for a in plan.core_areas if not a.is_empty])
    clear = shapely.distance(edges, shapely.points(np.column_stack([qx, qy]))) > 1e-3
    for i, area in enumerate(plan.core_areas):
        hit = shapely.contains_xy(area, qx, qy)
        assert np.array_equal(hit[clear], (owner == str(i))[clear])
    # Shuffled input, same plan.
    perm = np.random.default_rng(seed + 1).permutation(n)
    again = plan_from_positions(xy[perm, 0], xy[perm, 1], split=split, split_overlap_m=overlap)
    assert np.array_equal(again.labels[np.argsort(perm)], plan.labels)
    assert [a.wkb for a in again.core_areas] == [a.wkb for a in plan.core_areas]
    assert [sorted(perm[m].tolist()) for m in again.members] == [m.tolist() for m in plan.members]


def test_duplicate_positions_share_a_submodel() -> None:
    xy = np.repeat(np.random.default_rng(0).uniform(0, 500, size=(60, 2)), 2, axis=0)
    plan = plan_from_positions(xy[:, 0], xy[:, 1], split=15, split_overlap_m=10)
    assert np.array_equal(plan.labels[0::2], plan.labels[1::2])


def test_planning_errors() -> None:
    with pytest.raises(PlanningError):
        plan_from_positions([], [], split=10)
    with pytest.raises(PlanningError):
        plan_from_positions([0.0, float("nan")], [0.0, 1.0], split=10)
    with pytest.raises(PlanningError):
        target_sizes(10, 0)


@pytest.mark.parametrize(
    ("xs", "ys", "parts"),
    [
        ([0.0], [0.0], [1]),
        ([0.0, 10.0], [0.0, 0.0], [2]),
        ([0.0] * 50, [0.0] * 50, [50]),  # every image at one spot: one submodel, no empty ones
        ([0.0] * 30 + [100.0] * 30, [0.0] * 60, [30, 30]),
        (list(np.arange(100) * 10.0), list(np.arange(100) * 5.0), [10] * 10),  # exactly collinear
    ],
)
def test_degenerate_layouts(xs, ys, parts) -> None:
    x = np.asarray(xs) + 500_000.0
    y = np.asarray(ys) + 4_000_000.0
    plan = plan_from_positions(x, y, split=10, split_overlap_m=20)
    assert plan.core_counts().tolist() == parts
    assert plan.core_areas is not None
    assert all(a.area > 0 for a in plan.core_areas)


def test_planning_modules_do_not_import_prefect_or_pyodm() -> None:
    import subprocess
    import sys

    code = (
        "import sys\n"
        "import prefect_odm.survey.exif, prefect_odm.geo, prefect_odm.survey.layouts, prefect_odm.plan.memory\n"
        "import prefect_odm.plan.planning, prefect_odm.plan.picture, prefect_odm.survey.scan\n"
        "bad = sorted(m for m in ('prefect', 'pyodm', 'matplotlib') if m in sys.modules)\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_plan_report_lists_a_gap_left_by_removed_images(tmp_path):
    """Two shots removed from the middle of a brighton flight line show up in the plan report."""
    from prefect_odm.plan.picture import plan_markdown, survey_gaps
    from prefect_odm.survey.scan import scan_images as scan

    src = (
        Path(__file__).resolve().parents[1].parent
        / "shared"
        / "data"
        / "brighton_beach_1600"
        / "images"
    )
    full = scan(str(src))
    names = [im.name for im in sorted(full.images, key=lambda im: im.capture_time)]
    removed = set(names[2:4])
    for path in sorted(src.glob("*.JPG")):
        if path.name not in removed:
            (tmp_path / path.name).symlink_to(path)
    survey = scan(str(tmp_path))
    plan = plan_split(survey, split=20)
    gaps = survey_gaps(plan, survey)
    assert any(g["missing"] >= 1 for g in gaps["sequence_gaps"])
    assert "missing shot" in plan_markdown(plan, survey)
    assert survey_gaps(plan_split(full, split=20), full)["sequence_gaps"] == []


@pytest.mark.parametrize("split", [8, 10])
def test_the_map_draws_cores_only_where_the_images_are(brighton_survey, tmp_path, split):
    """plan.png filled brighton's cores out to the ownership clip, ~150 m beyond the cameras
    (a new user's trial, ``--split 8``): the drawn cores are clipped to the survey's image
    footprint, so what is filled is what ``area_m2`` counts, and every camera is inside."""
    from prefect_odm.plan.picture import drawn_core_areas

    plan = plan_split(brighton_survey, split=split)
    drawn = {sid: shape(g) for sid, g in drawn_core_areas(plan).items()}
    survey = shapely.union_all([shape(sm.footprint) for sm in plan.submodels]).convex_hull
    for sm in plan.submodels:
        assert drawn[sm.id].difference(survey.buffer(0.01)).is_empty
        assert shape(sm.core_area).area > drawn[sm.id].area  # the plan's reach further
        assert drawn[sm.id].area == pytest.approx(sm.area_m2, rel=0.01)
    cameras = shapely.points([(c.x_m, c.y_m) for c in plan.cameras])
    assert all(shapely.union_all(list(drawn.values())).buffer(0.01).contains(cameras))
    plan_png(plan, tmp_path / "plan.png")
    assert (tmp_path / "plan.png").read_bytes().startswith(b"\x89PNG")
