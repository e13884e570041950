"""The alignment wired into the merge, on a real run (``bench_align.py --survey``; see there)."""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from align_perturb import known_error, moved_copy, products_of, recovery, submodel_folders
from prefect_odm.tasks.align import build_alignment

from prefect_odm.align import AlignmentOptions, AlignmentReport, read_shots_geojson
from prefect_odm.merge import merge_dems, merge_orthophotos, merge_point_clouds
from prefect_odm.merge.overlaps import dem_overlaps, dsm_disagreement_p90_m, ortho_shifts
from prefect_odm.models import MergeOptions, SplitPlan
from prefect_odm.ownership import Ownership

BRIGHTON = Path(__file__).resolve().parents[2] / "shared/data/brighton_beach_1600/images"


def _reconstruct(out: Path) -> Path:
    cmd = ["prefect-odm", "reconstruct", str(BRIGHTON), "-o", str(out), "--split", "10",
           "--split-overlap-m", "20"]  # fmt: skip
    subprocess.run(cmd, check=True, capture_output=True)
    return next(p for p in out.iterdir() if p.is_dir())


def _figures(
    name: str, products: dict[str, dict[str, str]], report: AlignmentReport | None
) -> None:
    fixes = report.raster_corrections() if report is not None else None
    dsms = {s: Path(p["dsm"]) for s, p in products.items()}
    orthos = {s: Path(p["orthophoto"]) for s, p in products.items()}
    overlaps = dem_overlaps(dsms, corrections=fixes)
    p90 = dsm_disagreement_p90_m(overlaps)
    for tile_m in (50.0, 20.0):
        for key, sh in ortho_shifts(orthos, corrections=fixes, tile_m=tile_m).items():
            print(f"  {name:<14} {'|'.join(key)}: orthophoto shift ({tile_m:.0f} m tiles, "
                  f"{sh.tiles} tiles) {sh.magnitude_m:.3f} m ({sh.dx_m:+.3f}, {sh.dy_m:+.3f})")  # fmt: skip
    for ov in overlaps:
        key = f"{ov.first}|{ov.second}"
        print(f"  {name:<14} {key}: DSM p90 |dz| {p90[key]:.3f} m, median step "
              f"{float(np.median(ov.dz)):+.3f} m")  # fmt: skip


def _merge_seconds(
    products: dict[str, dict[str, str]], report: AlignmentReport, plan: SplitPlan
) -> float:
    own = Ownership.from_cameras((c.x_m, c.y_m, c.submodel_id) for c in plan.cameras)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for name, merge in (("orthophoto", merge_orthophotos), ("dsm", merge_dems)):
            inputs = {s: Path(p[name]) for s, p in products.items()}
            merge(inputs, Path(tmp) / f"{name}.tif", ownership=own, alignment=report,
                  crs_epsg=plan.crs_epsg)  # fmt: skip
        clouds = {s: Path(p["point_cloud"]) for s, p in products.items()}
        merge_point_clouds(clouds, Path(tmp) / "cloud.laz", ownership=own, alignment=report,
                           crs_epsg=plan.crs_epsg)  # fmt: skip
    return time.perf_counter() - started


def _known_transform(
    survey: Path, before: AlignmentReport, gps: dict, plan: SplitPlan, bowl: bool
) -> None:  # type: ignore[type-arg]
    folders = submodel_folders(survey)
    _, shots = products_of(folders)
    sid = sorted(folders)[1]
    error = known_error(read_shots_geojson(sid, Path(shots[sid]).read_text()).centres.mean(axis=0))
    with tempfile.TemporaryDirectory() as tmp:
        moved = dict(folders)
        moved[sid] = moved_copy(folders[sid], Path(tmp) / sid, error, before.ground_heights_m[sid])
        products, moved_shots = products_of(moved)
        # a 1 deg tilt over a few hundred metres is a correction beyond the 5 m gate: accept it
        # here and print how many gates failed
        accept = MergeOptions(accept_alignment=True, alignment=AlignmentOptions(refine_bowl=bowl))
        after = build_alignment(products, moved_shots, accept, gps, plan.crs_epsg)
        assert after is not None
        pos, rot = recovery(before, after, sid, error, shots[sid])
        print(f"known transform on {sid} (3 m shift, 1.5 m height, 1 deg tilt, 0.2 % scale): "
              f"recovered within {pos:.4f} m and {rot:.4f} deg; gates failed: {len(after.failures)}")  # fmt: skip
        _figures("moved, before", products, None)
        _figures("moved, after", products, after)


def _aligned(products, shots, gps, plan, bowl: bool, check: bool):  # type: ignore[no-untyped-def]
    """``(seconds, report)`` of ``build_alignment`` with or without the stage checks."""
    options = MergeOptions(alignment=AlignmentOptions(refine_bowl=bowl, check_stages=check),
                           accept_alignment=True)  # fmt: skip
    started = time.perf_counter()
    report = build_alignment(products, shots, options, gps, plan.crs_epsg)
    assert report is not None
    return time.perf_counter() - started, report


def _stages(report: AlignmentReport) -> None:
    """Each stage's seams measured on the products it corrects, beside the solver's rms."""
    for st in report.stages:
        state = "applied" if st.applied else "NOT APPLIED"
        print(f"stage {st.stage} ({state}){': ' + '; '.join(st.reasons) if st.reasons else ''}")
        for seam in st.seams:
            o, d = seam.orthophoto, seam.dsm
            ortho = (f"orthophoto shift ({o.shift_m[0]:+.3f}, {o.shift_m[1]:+.3f}) m, median "
                     f"{o.median_m:.3f} m ({o.matches} matches)") if o else "orthophoto -"  # fmt: skip
            dsm = f"DSM median {d.median_m:+.3f} m, p90 {d.p90_m:.3f} m" if d else "DSM -"
            solver = st.solver_rms_m.get(seam.overlap)
            claim = f", solver rms {solver:.3f} m" if solver is not None else ""
            print(f"  {seam.overlap}: {ortho}; {dsm}{claim}")
    for f in report.failures:
        print(f"  gate: {f.message}")


def bench_survey(where: str, bowl: bool = True) -> None:
    """Print the figures of the module docstring of ``bench_align.py`` for a real run
    (``bowl``: with ``AlignmentOptions.refine_bowl``)."""
    with tempfile.TemporaryDirectory() as tmp:
        survey = _reconstruct(Path(tmp)) if where == "reconstruct" else Path(where)
        plan = SplitPlan.model_validate_json((survey / "plan" / "plan.json").read_text())
        gps = {c.name: (c.x_m, c.y_m, c.z_m) for c in plan.cameras if c.z_m is not None}
        products, shots = products_of(submodel_folders(survey))
        unchecked_s, _ = _aligned(products, shots, gps, plan, bowl, check=False)
        align_s, report = _aligned(products, shots, gps, plan, bowl, check=True)
        merge_s = _merge_seconds(products, report, plan)
        print(f"{survey}: {len(products)} submodels")
        print(f"alignment {align_s:.2f} s (solve {report.result.solve_seconds:.2f} s), merge "
              f"(baseline: orthophoto + DSM + point cloud, aligned) {merge_s:.2f} s, ratio "
              f"{align_s / merge_s:.1%}; without the stage checks (check_stages=False, as "
              f"before issue 31) {unchecked_s:.2f} s, {unchecked_s / merge_s:.1%}")  # fmt: skip
        _stages(report)
        _figures("before", products, None)
        _figures("after cameras", products, AlignmentReport(
            result=report.result, ground_heights_m=report.ground_heights_m))  # fmt: skip
        _figures("after refined", products, report)
        _known_transform(survey, report, gps, plan, bowl)
    sys.stdout.flush()
