"""Benchmark: the merge of a city's submodels, 1.8k against 10k images at ``--split 100`` (issue 33).

For each ``--images`` N: a survey at the real flight positions of
``../shared/data/layouts/freetown-1`` (1,817 positions, tiled eastwards, each copy 50 m beyond
the last, as ``bench_city.py`` tiles them; every image at the flight's median altitude, as
there), planned as ``prefect-odm plan`` plans it (``plan_split``, overlap unset). Then, per
submodel, the products the engine would return, written with the engine's own writers
(:mod:`prefect_odm.engine.writers`: tiled DEFLATE GeoTIFFs, LAZ 1.2 point format 3) over the
submodel's planned footprint (its cameras' hull buffered by half an image footprint, the ground
the ``direct`` pipeline renders): an RGBA orthophoto at ``--ortho-res`` (a texture of the ground
position, so overlaps agree), a two-band DSM at ``--dsm-res`` (heights of one surface plus a
per-submodel offset of a few centimetres, measured band 1) and ``--points-per-m2`` coloured
points. Not the engine run itself: its ``direct`` pipeline on 10,000 images is hours on this
machine; what the merge reads is the same kind of file.

Each product is merged with the library's merge (:func:`prefect_odm.merge.merge_orthophotos`,
:func:`~prefect_odm.merge.merge_dems`, :func:`~prefect_odm.merge.merge_point_clouds`;
nearest-core-camera ownership from the plan's cameras, default options) in a child process
of its own, and the bench prints its wall and CPU time, peak RSS (``VmHWM``), the output's
megapixels (points for the point cloud) and time per megapixel (per million points); then,
per product, the ratio of the largest N to the smallest (the named baseline, same run).

Usage: python benchmarks/bench_merge_city.py [--images 1800 10000] [--split 100]
       [--ortho-res 0.5] [--dsm-res 1.0] [--points-per-m2 0.25] [--keep DIR [--reuse]]

``--reuse`` merges the inputs an earlier ``--keep DIR`` run wrote there (same sizes and
options) instead of writing them again: the before and after of a merge change on the same
files (``benchmarks/compare_rasters.py`` then compares the outputs pixel by pixel).
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from _measure import peak_mib
from _merge_common import bench_folder, run_in_child

REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data"
PRODUCTS = ("orthophoto", "dsm", "point_cloud")


def city_survey(n: int) -> Any:
    """A :class:`~prefect_odm.models.Survey` of ``n`` positions: freetown-1 tiled eastwards."""
    from prefect_odm.survey.layouts import layout_survey, read_layout

    layout = read_layout(DATA / "layouts" / "freetown-1")
    base = layout_survey(layout)
    lat = np.array([im.latitude for im in base.images])
    lon = np.array([im.longitude for im in base.images])
    alt = float(np.nanmedian([im.altitude_m for im in base.images if im.altitude_m is not None]))
    width_deg = float(lon.max() - lon.min()) + 50.0 / (111_320.0 * np.cos(np.radians(lat.mean())))
    images = []
    for i in range(n):
        k, copy = i % len(base.images), i // len(base.images)
        im = base.images[k]
        images.append(
            im.model_copy(
                update={
                    "name": f"c{copy}_{im.name}",
                    "url": f"{im.url}#c{copy}",
                    "identity": f"{im.identity}:{copy}",
                    "longitude": im.longitude + copy * width_deg,
                    "altitude_m": alt,
                    "capture_time": None if im.capture_time is None else im.capture_time,
                }
            )
        )
    return base.model_copy(update={"images": images, "fingerprint": f"city-{n}"})


def _ground(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Height (m) and an RGB texture ``(3, ...)`` of ground positions (plan CRS metres)."""
    z = 30.0 + 5.0 * np.sin(x / 400.0) + 2.0 * np.sin(x / 37.0) * np.cos(y / 53.0)
    z = z + np.where(((x // 20) + (y // 15)) % 5 == 0, 6.0, 0.0)
    r = 120 + 60 * np.sin(x / 7.0)
    g = 110 + 50 * np.cos(y / 9.0)
    b = 100 + 40 * np.sin((x + y) / 13.0)
    return z.astype(np.float32), np.stack([r, g, b]).astype(np.uint8)


def write_products(plan: Any, folder: Path, args: argparse.Namespace) -> dict[str, dict[str, Path]]:
    """Per product, submodel id -> the file written over that submodel's planned footprint."""
    from rasterio.features import geometry_mask
    from shapely.geometry import shape

    from prefect_odm.engine import writers
    from prefect_odm.grid import Grid
    from prefect_odm.merge.dem import DEM_NODATA, MEASURED_DESCRIPTION

    epsg = plan.crs_epsg
    rng = np.random.default_rng(0)
    out: dict[str, dict[str, Path]] = {p: {} for p in PRODUCTS}
    for i, sm in enumerate(plan.submodels):
        footprint = shape(sm.footprint)
        offset = 0.05 * ((i % 5) - 2)  # submodels disagree by a few centimetres
        for product, res in (("orthophoto", args.ortho_res), ("dsm", args.dsm_res)):
            minx, miny, maxx, maxy = footprint.bounds
            left, top = np.floor(minx / res) * res, np.ceil(maxy / res) * res
            grid = Grid(
                left, top, res, int(np.ceil((maxx - left) / res)), int(np.ceil((top - miny) / res))
            )
            inside = ~geometry_mask([footprint], (grid.height, grid.width), grid.affine)
            xs = left + (np.arange(grid.width) + 0.5) * res
            ys = top - (np.arange(grid.height) + 0.5) * res
            xx, yy = np.meshgrid(xs, ys)
            z, rgb = _ground(xx, yy)
            path = folder / sm.id / f"{product}.tif"
            if product == "orthophoto":
                alpha = np.where(inside, 255, 0).astype(np.uint8)[None]
                writers.write_geotiff(path, np.concatenate([rgb, alpha]), grid, epsg, rgba=True)
            else:
                heights = np.where(inside, z + offset, DEM_NODATA).astype(np.float32)
                measured = np.where(inside, 1.0, DEM_NODATA).astype(np.float32)
                writers.write_geotiff(
                    path, np.stack([heights, measured]), grid, epsg, nodata=DEM_NODATA,
                    descriptions=("height", MEASURED_DESCRIPTION),
                )  # fmt: skip
            out[product][sm.id] = path
        minx, miny, maxx, maxy = footprint.bounds
        count = int(footprint.area * args.points_per_m2)
        px = rng.uniform(minx, maxx, 2 * count)
        py = rng.uniform(miny, maxy, 2 * count)
        import shapely

        keep = shapely.contains_xy(footprint, px, py)
        px, py = px[keep][:count], py[keep][:count]
        z, rgb = _ground(px, py)
        path = folder / sm.id / "point_cloud.laz"
        writers.write_laz(path, np.column_stack([px, py, z + offset]), rgb.T.copy(), epsg)
        out["point_cloud"][sm.id] = path
    return out


def kept_inputs(work: Path) -> tuple[Any, dict[str, dict[str, Path]]]:
    """The plan and per-product inputs an earlier ``--keep`` run left in ``work``.

    Raises:
        SystemExit: ``work`` holds no plan or misses a submodel's product.
    """
    from prefect_odm.models import SplitPlan

    plan_json = work / "plan.json"
    if not plan_json.is_file():
        raise SystemExit(f"--reuse: {plan_json} not found (run with --keep first)")
    plan = SplitPlan.model_validate_json(plan_json.read_text())
    names = {"orthophoto": "orthophoto.tif", "dsm": "dsm.tif", "point_cloud": "point_cloud.laz"}
    out: dict[str, dict[str, Path]] = {p: {} for p in PRODUCTS}
    for sm in plan.submodels:
        for product, name in names.items():
            path = work / "submodels" / sm.id / name
            if not path.is_file():
                raise SystemExit(f"--reuse: {path} not found")
            out[product][sm.id] = path
    return plan, out


def merge_child(
    product: str, inputs: dict[str, Path], plan_json: str, out: Path, queue: Any
) -> None:
    """One product's merge, measured in this (spawned) process."""
    from prefect_odm.merge import merge_dems, merge_orthophotos, merge_point_clouds
    from prefect_odm.models import SplitPlan
    from prefect_odm.ownership import Ownership

    plan = SplitPlan.model_validate_json(Path(plan_json).read_text())
    ownership = Ownership.from_cameras((c.x_m, c.y_m, c.submodel_id) for c in plan.cameras)
    usage0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    if product == "orthophoto":
        merge_orthophotos(inputs, out / "orthophoto.tif", ownership=ownership)
    elif product == "dsm":
        merge_dems(inputs, out / "dsm.tif", ownership=ownership)
    else:
        merge_point_clouds(
            inputs, out / "point_cloud.laz", ownership=ownership, crs_epsg=plan.crs_epsg
        )
    wall = time.perf_counter() - t0
    usage = resource.getrusage(resource.RUSAGE_SELF)
    cpu = usage.ru_utime - usage0.ru_utime + usage.ru_stime - usage0.ru_stime
    if product == "point_cloud":
        import laspy

        with laspy.open(out / "point_cloud.laz") as reader:
            size = reader.header.point_count / 1e6
    else:
        import rasterio

        with rasterio.open(out / f"{'orthophoto' if product == 'orthophoto' else 'dsm'}.tif") as ds:
            size = ds.width * ds.height / 1e6
    queue.put((wall, cpu, peak_mib(), size))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, nargs="+", default=[1800, 10000])
    parser.add_argument("--split", type=int, default=100)
    parser.add_argument("--ortho-res", type=float, default=0.5, help="metres per pixel")
    parser.add_argument("--dsm-res", type=float, default=1.0, help="metres per pixel")
    parser.add_argument("--points-per-m2", type=float, default=0.25)
    parser.add_argument("--products", nargs="+", default=list(PRODUCTS), choices=PRODUCTS)
    parser.add_argument("--keep", type=Path, default=None, help="keep inputs and outputs here")
    parser.add_argument(
        "--reuse", action="store_true", help="merge the inputs already kept in --keep DIR"
    )
    args = parser.parse_args()
    if args.reuse and args.keep is None:
        parser.error("--reuse needs --keep DIR")
    from prefect_odm.plan.planning import plan_split

    print(
        "inputs: per-submodel products written with the engine's writers over each submodel's "
        "planned footprint (not engine runs); load average "
        f"{os.getloadavg()[0]:.1f}",
        flush=True,
    )
    figures: dict[tuple[int, str], tuple[float, float, float, float]] = {}
    with bench_folder(args.keep, "bench_merge_city_") as root:
        for n in args.images:
            work = root / f"n{n}"
            plan_json = work / "plan.json"
            t0 = time.perf_counter()
            if args.reuse:
                plan, inputs = kept_inputs(work)
            else:
                plan = plan_split(city_survey(n), split=args.split)
                work.mkdir(parents=True, exist_ok=True)
                plan_json.write_text(plan.model_dump_json())
                inputs = write_products(plan, work / "submodels", args)
            megabytes = sum(p.stat().st_size for d in inputs.values() for p in d.values()) / 2**20
            print(
                f"n={n}: {len(plan.submodels)} submodels, overlap {plan.split_overlap_m:g} m; "
                f"inputs {'reused' if args.reuse else 'written'} in "
                f"{time.perf_counter() - t0:.0f} s ({megabytes:.0f} MiB)",
                flush=True,
            )
            for product in args.products:
                out = work / f"merged-{product}"
                out.mkdir(exist_ok=True)
                wall, cpu, peak, size = run_in_child(
                    merge_child, product, inputs[product], str(plan_json), out
                )
                figures[(n, product)] = (wall, cpu, peak, size)
                unit = "M points" if product == "point_cloud" else "Mpx"
                print(
                    f"  {product:<11} {wall:7.1f} s wall {cpu:7.1f} CPU-s, peak RSS {peak:6.0f} "
                    f"MiB, {size:7.1f} {unit}: {wall / size:6.2f} s and {cpu / size:6.2f} "
                    f"CPU-s per {unit}",
                    flush=True,
                )
            if args.keep is None:
                import shutil

                shutil.rmtree(work, ignore_errors=True)
    small, large = min(args.images), max(args.images)
    if small == large:
        return
    print(f"ratios n={large} / n={small} (the baseline, same run):")
    for product in args.products:
        ws, cs, ps, ss = figures[(small, product)]
        wl, cl, pl, sl = figures[(large, product)]
        print(
            f"  {product:<11} peak RSS {pl / ps:5.2f}x, size {sl / ss:5.2f}x, wall per unit "
            f"{(wl / sl) / (ws / ss):5.2f}x, CPU per unit {(cl / sl) / (cs / ss):5.2f}x"
        )


if __name__ == "__main__":
    sys.exit(main())
