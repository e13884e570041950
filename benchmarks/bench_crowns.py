"""Tree crowns in the engine's DSM against OpenDroneMap's own cloud of brighton (issue 35 item 3).

Reads DSMs (an engine task folder's ``odm_dem/dsm.tif``, a submodel's or a merged ``dsm.tif``;
two bands: heights and the measured flag) and ``brighton_beach_1600/reference/model.laz`` (ODM
from the full-resolution images), puts ODM's points on the DSM's grid and calls a cell an ODM
*crown cell* where ODM's highest point stands more than ``--min-height-m`` (2 m) above a ground
taken as the 15 m minimum filter of ODM's cell maxima (smoothed by a 15 m mean) and the mean
excess green ``(2G - R - B) / (R + G + B)`` of its points is above ``--min-exg`` (0.05). A crude,
stated definition: it counts only crowns ODM's cloud measures (its own holes count for neither),
and dark or yellowed crowns are missed. Crown height: our cell height above the same ground
against ODM's highest point's (the medians over the cells, and their ratio), and above the same
filter of our own measured heights (a DSM lying 1 m low reads its crowns 1 m low against ODM's
ground, not against its own).

For each DSM it prints ODM's crown area, the share of those cells ours measures (measured band
1) and has a height for (filled too), and the crown heights where ours measured and where ours
filled; writes ``crowns.png`` beside the DSM or ``--png``.

``--steps`` (task folders with ``opensfm/`` and ``images/`` only) re-runs the dense stage's steps
on the task's scene with the engine's own functions and prints, per step, the share of ODM's
crown cells (and of all the cells ODM measures) that still have a height and the crown height:

1. *matched*: semi-global matching with its uniqueness and speckle filters but no left-right check
   (``dense.match_pair(lr_check_px=None)``); a cell has a height when a pair has a point in it, the
   median of the pairs' cell means;
2. *left-right check*: the engine's pairs (``lr_check_px=1``);
3. *2 pairs agree*: fusion's agreement test alone (two pairs within 0.3 m of the median);
4. *share of the pairs*: and the agreeing pairs at least a third of those seeing the cell;
5. *isolated dropped*: the engine's fusion (``dense_fusion.fuse_pairs`` defaults);
6. *DSM measured*: the task's DSM's measured band;
7. *DTM*: the crown cells the task's DTM (SMRF) leaves under 1 m below the DSM (taken as ground);

plus the fusion without the left-right check (what the check costs after fusion).

Usage::

    python benchmarks/bench_crowns.py TASK_FOLDER_OR_DSM ... [--steps] [--png OUT.png]
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import laspy
import numpy as np
import rasterio
from numpy.typing import NDArray
from scipy import ndimage

REFERENCE = (
    Path(__file__).resolve().parents[1] / "../shared/data/brighton_beach_1600/reference/model.laz"
)
GROUND_WINDOW_M = 15.0
DTM_GROUND_M = 1.0
"""A crown cell whose DTM lies within this of its DSM height was taken as ground by SMRF."""


@dataclass
class Crowns:
    """ODM's crown cells on a DSM's grid (all arrays of the grid's shape)."""

    crown: NDArray[np.bool_]  # ODM crown cells
    has: NDArray[np.bool_]  # cells ODM's cloud has points in
    ground: NDArray[np.float64]  # the ground under ODM's crowns, metres
    odm_h: NDArray[np.float64]  # ODM's highest point above it, metres
    cell_m: float
    footprint: NDArray[np.bool_]  # the DSM's cells with a height (the orthophoto's footprint)
    own_ground: NDArray[np.float64]  # the same ground from the DSM's own measured heights


def odm_cells(
    ds: rasterio.DatasetReader,
) -> tuple[NDArray[np.bool_], NDArray[np.float64], NDArray[np.float64]]:
    """ODM's points on the DSM grid: ``(has points, cell maximum z (m), mean excess green)``."""
    las = laspy.read(REFERENCE)
    t = ds.transform
    x, y, z = np.asarray(las.x), np.asarray(las.y), np.asarray(las.z)
    r = np.floor((t.f - y) / -t.e).astype(np.int64)
    c = np.floor((x - t.c) / t.a).astype(np.int64)
    ok = (r >= 0) & (r < ds.height) & (c >= 0) & (c < ds.width)
    idx = r[ok] * ds.width + c[ok]
    red, green, blue = (
        np.asarray(getattr(las, k))[ok].astype(np.float64) for k in ("red", "green", "blue")
    )
    size = ds.width * ds.height
    count = np.bincount(idx, minlength=size)
    zmax = np.full(size, -np.inf)
    np.maximum.at(zmax, idx, z[ok])
    exg = (2 * green - red - blue) / np.maximum(red + green + blue, 1.0)
    mean_exg = np.bincount(idx, weights=exg, minlength=size) / np.maximum(count, 1)
    shape = (ds.height, ds.width)
    return count.reshape(shape) > 0, zmax.reshape(shape), mean_exg.reshape(shape)


def crown_cells(ds: rasterio.DatasetReader, min_height_m: float, min_exg: float) -> Crowns:
    """ODM's crown cells on ``ds``'s grid (definition in the module docstring).

    Raises:
        SystemExit: ODM's cloud has no crown cell on the grid.
    """
    has, zmax, exg = odm_cells(ds)
    cell_m = float(ds.res[0])
    ground = local_ground(has, zmax, cell_m)
    odm_h = np.where(has, zmax - ground, 0.0)
    crown = has & (odm_h > min_height_m) & (exg > min_exg)
    if not crown.any():
        raise SystemExit(f"{ds.name}: no ODM crown cells on this DSM's grid")
    z = ds.read(1).astype(np.float64)
    measured = (z != ds.nodata) & (ds.read(2) == 1 if ds.count >= 2 else True)
    own = local_ground(measured, z, cell_m)
    return Crowns(crown, has, ground, odm_h, cell_m, z != ds.nodata, own)


def local_ground(known: NDArray[np.bool_], z: NDArray[Any], cell_m: float) -> NDArray[np.float64]:
    """The ground under crowns: the :data:`GROUND_WINDOW_M` minimum filter of the ``known``
    heights, smoothed by a mean of the same window (metres, every cell)."""
    win = max(1, int(round(GROUND_WINDOW_M / cell_m)))
    ground = ndimage.minimum_filter(np.where(known, z, np.inf), size=win)
    fill = np.median(z[known]) if known.any() else 0.0
    return np.asarray(
        ndimage.uniform_filter(np.where(np.isfinite(ground), ground, fill), size=win), np.float64
    )


def height_line(crowns: Crowns, z: NDArray[Any], sel: NDArray[np.bool_]) -> str:
    """``ours X m, ODM Y m, R% (above its own ground: ...)``: median crown heights over ``sel``
    above ODM's ground, and ours above the ground of our own measured heights (which no vertical
    offset or tilt of the DSM against ODM's cloud changes)."""
    if not sel.any():
        return "no cell"
    ours = float(np.median(z[sel] - crowns.ground[sel]))
    own = float(np.median(z[sel] - crowns.own_ground[sel]))
    odm = float(np.median(crowns.odm_h[sel]))
    return (
        f"ours {ours:.2f} m, ODM {odm:.2f} m, {ours / odm:.0%} "
        f"(above its own ground {own:.2f} m, {own / odm:.0%})"
    )


def step_line(name: str, crowns: Crowns, heights: NDArray[Any]) -> str:
    """One step: the shares of ODM's crown cells and of its cells that have a height (finite in
    ``heights``) and the crown height there."""
    valid = np.isfinite(heights)
    crown = crowns.crown
    inside = crown & crowns.footprint
    return (
        f"  {name:<34} crown cells {np.mean(valid[crown]):6.1%} ({np.mean(valid[inside]):6.1%} of "
        f"those in the footprint)  ODM's cells {np.mean(valid[crowns.has]):6.1%}  crown height "
        f"{height_line(crowns, heights, crown & valid)}"
    )


def _pairs(task: Path, lr_check_px: int | None) -> list[Any]:
    """The task's stereo pairs' points, matched as the dense stage matches them (2 threads)."""
    import json
    from concurrent.futures import ThreadPoolExecutor

    import cv2

    from prefect_odm.engine.camera import Scene
    from prefect_odm.engine.dense import match_pair, select_pairs

    scene = Scene.load(task / "opensfm")
    scale = float(json.loads((task / "openmvs" / "dense.json").read_text())["image_scale"])
    pairs = select_pairs(scene.cameras, scene.points_xyz)
    cams = scene.cameras

    def match(pair: Any) -> Any:
        first, second = cams[pair.first], cams[pair.second]
        points = scene.points_xyz
        return match_pair(first, second, task / "images", points, scale, lr_check_px=lr_check_px)

    threads = cv2.getNumThreads()
    cv2.setNumThreads(1)
    try:
        with ThreadPoolExecutor(max_workers=2) as pool:
            return list(pool.map(match, pairs))
    finally:
        cv2.setNumThreads(threads)


def _points_in(pairs: list[Any], grid: Any, cells: NDArray[np.bool_]) -> str:
    """The pairs' points in ``cells`` and the mean number of pairs with a point per cell."""
    from prefect_odm.engine.dense_fusion import cell_index

    flat, points, seeing = cells.reshape(-1), 0, 0
    for pair in pairs:
        index = cell_index(pair.xyz, grid)
        inside = index[index >= 0]
        points += int(flat[inside].sum())
        seeing += int(flat[np.unique(inside)].sum())
    return f"{points} points, {seeing / max(1, int(flat.sum())):.2f} pairs per cell"


def steps(task: Path, ds: rasterio.DatasetReader, crowns: Crowns) -> None:
    """Print the per-step survival of ODM's crown cells (module docstring) for an engine task."""
    from prefect_odm.engine.dense_fusion import fuse_pairs
    from prefect_odm.grid import Grid

    t = ds.transform
    grid = Grid(left=t.c, top=t.f, resolution_m=t.a, width=ds.width, height=ds.height)
    every = {"tolerance_m": np.inf, "min_pairs": 1, "min_agreeing_share": 0.0}
    print(f"{task}: per step, on the DSM's {grid.resolution_m:.3f} m grid")
    raw, checked = _pairs(task, None), _pairs(task, 1)
    for name, pairs in (("without", raw), ("with", checked)):
        print(
            f"  pair points in ODM's crown cells {name} the left-right check: {_points_in(pairs, grid, crowns.crown)}"
        )
    for name, pairs, options in (
        ("1 matched (no left-right check)", raw, {**every, "min_measured_neighbours": 0}),
        ("2 after the left-right check", checked, {**every, "min_measured_neighbours": 0}),
        ("3 two pairs agree (0.3 m)", checked, {"min_agreeing_share": 0.0, "min_measured_neighbours": 0}),
        ("4 and a third of the pairs", checked, {"min_measured_neighbours": 0}),
        ("5 isolated dropped (fused)", checked, {}),
        ("  5' fused, no left-right check", raw, {}),
    ):  # fmt: skip
        print(step_line(name, crowns, fuse_pairs(pairs, grid, **options).heights))
    z = ds.read(1).astype(np.float64)
    z[(z == ds.nodata) | (ds.read(2) != 1)] = np.nan
    print(step_line("6 DSM measured", crowns, z))
    dtm_path = task / "odm_dem" / "dtm.tif"
    if dtm_path.exists():
        with rasterio.open(dtm_path) as dtm:
            ground = np.isfinite(z) & (z - dtm.read(1) < DTM_GROUND_M)
        share = float(np.mean(ground[crowns.crown & np.isfinite(z)]))
        print(f"  7 DTM: of the measured crown cells, SMRF took {share:.1%} as ground")


def report(dsm: Path, crowns: Crowns, z: NDArray[Any], flag: NDArray[Any], nodata: float) -> None:
    """Print the crown figures of one DSM."""
    crown, cell_m = crowns.crown, crowns.cell_m
    n = int(crown.sum())
    valid, measured = z != nodata, flag == 1
    print(
        f"{dsm}: ODM crown cells {n} ({n * cell_m**2:.0f} m2 of "
        f"{int(crowns.has.sum()) * cell_m**2:.0f} m2 ODM measures)"
    )
    print(
        f"  ours measured {np.mean(measured[crown]):.1%}, with a height {np.mean(valid[crown]):.1%}"
    )
    for name, sel in (("measured", crown & measured), ("filled", crown & valid & ~measured)):
        print(f"  crown height where ours {name}: {height_line(crowns, z, sel)}")


def crown_summary(dsm: Path, min_height_m: float = 2.0, min_exg: float = 0.05) -> str:
    """One line for ``bench_engine.py --quickstart``: ODM's crown cells on ``dsm``'s grid, the
    share ours measures and the crown heights where it does (ours / ODM)."""
    with rasterio.open(dsm) as ds:
        z, flag = ds.read(1), ds.read(2) if ds.count >= 2 else ds.read(1) != ds.nodata
        crowns = crown_cells(ds, min_height_m, min_exg)
    crown = crowns.crown
    measured = crown & (flag == 1)
    return (
        f"ODM's crown cells {int(crown.sum())} ({crown.sum() * crowns.cell_m**2:.0f} m2): ours "
        f"measures {np.mean(measured[crown]):.1%} ({np.mean(measured[crown & crowns.footprint]):.1%}"
        f" of those in its footprint), crown height {height_line(crowns, z, measured)}"
    )


def render(png: Path, crowns: Crowns, measured: NDArray[np.bool_]) -> None:
    """ODM's heights beside our kept (green) and lost (red) crown cells."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    crown = crowns.crown
    img = np.zeros((*crown.shape, 3))
    img[~crown & measured] = (0.6, 0.6, 0.6)
    img[crown & measured] = (0.0, 0.7, 0.0)
    img[crown & ~measured] = (0.9, 0.0, 0.0)
    fig, ax = plt.subplots(1, 2, figsize=(14, 7))
    ax[0].imshow(np.where(crowns.has, crowns.odm_h, np.nan), vmin=0, vmax=12)
    ax[0].set_title("ODM's cloud: height above ground (m)")
    ax[1].imshow(img)
    ax[1].set_title("ours measured: crown kept green, crown lost red, other grey")
    fig.savefig(png, dpi=70, bbox_inches="tight")
    plt.close(fig)
    print(f"  wrote {png}")


def main() -> None:
    """Print the crown figures of each DSM (and the steps of each task) and render the PNGs."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("task", type=Path, nargs="+", help="engine task folders or DSMs")
    parser.add_argument("--min-height-m", type=float, default=2.0)
    parser.add_argument("--min-exg", type=float, default=0.05)
    parser.add_argument("--steps", action="store_true", help="per-step survival (task folders)")
    parser.add_argument("--png", type=Path, default=None, help="the PNG (one DSM only)")
    args = parser.parse_args()
    for task in args.task:
        dsm = task if task.is_file() else task / "odm_dem" / "dsm.tif"
        with rasterio.open(dsm) as ds:
            if ds.count < 2:
                raise SystemExit(f"{dsm}: no measured band (band 2)")
            z, flag = ds.read(1), ds.read(2)
            crowns = crown_cells(ds, args.min_height_m, args.min_exg)
            report(dsm, crowns, z, flag, float(ds.nodata))
            if args.steps:
                if task.is_file():
                    raise SystemExit(f"{task}: --steps needs an engine task folder")
                steps(task, ds, crowns)
        png = args.png if args.png and len(args.task) == 1 else dsm.with_name("crowns.png")
        render(png, crowns, flag == 1)


if __name__ == "__main__":
    main()
