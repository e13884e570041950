"""Tree crowns in the engine's DSM against OpenDroneMap's own cloud of brighton (issue 35 item 3).

Reads an engine task folder's ``odm_dem/dsm.tif`` (or a merged ``dsm.tif``) (two bands: heights and the measured flag) and
``brighton_beach_1600/reference/model.laz`` (ODM from the full-resolution images), puts ODM's
points on the DSM's grid and calls a cell an ODM *crown cell* where ODM's highest point stands
more than ``--min-height-m`` (2 m) above a ground taken as the 15 m minimum filter of ODM's cell
maxima (smoothed by a 15 m mean) and the mean excess green ``(2G - R - B) / (R + G + B)`` of its
points is above ``--min-exg`` (0.05). A crude, stated definition: it counts only crowns ODM's cloud
measures (its own holes count for neither), and dark or yellowed crowns are missed.

Prints ODM's crown area, the share of those cells ours measures (measured band 1) and has a
height for (filled too), and the median crown height above the same ground of ours over ODM's
(where ours measured, and where ours filled); writes ``crowns.png`` beside the DSM or to
``--png``. It does not say which step of the dense pipeline loses the rest (not measured yet).

Usage::

    python benchmarks/bench_crowns.py TASK_FOLDER_OR_DSM [--png OUT.png]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import laspy
import numpy as np
import rasterio
from numpy.typing import NDArray
from scipy import ndimage

REFERENCE = (
    Path(__file__).resolve().parents[1] / "../shared/data/brighton_beach_1600/reference/model.laz"
)
GROUND_WINDOW_M = 15.0


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


def main() -> None:
    """Print the crown figures of one task folder and render the PNG."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("task", type=Path, help="engine task folder (odm_dem/dsm.tif) or a DSM")
    parser.add_argument("--min-height-m", type=float, default=2.0)
    parser.add_argument("--min-exg", type=float, default=0.05)
    parser.add_argument("--png", type=Path, default=None)
    args = parser.parse_args()
    dsm = args.task if args.task.is_file() else args.task / "odm_dem" / "dsm.tif"
    with rasterio.open(dsm) as ds:
        if ds.count < 2:
            raise SystemExit(f"{dsm}: no measured band (band 2)")
        z, flag, nodata, cell_m = ds.read(1), ds.read(2), ds.nodata, ds.res[0]
        has, zmax, exg = odm_cells(ds)
    win = max(1, int(round(GROUND_WINDOW_M / cell_m)))
    ground = ndimage.minimum_filter(np.where(has, zmax, np.inf), size=win)
    ground = ndimage.uniform_filter(
        np.where(np.isfinite(ground), ground, np.median(zmax[has])), size=win
    )
    odm_h = np.where(has, zmax - ground, 0.0)
    crown = has & (odm_h > args.min_height_m) & (exg > args.min_exg)
    n = int(crown.sum())
    if n == 0:
        raise SystemExit("no ODM crown cells on this DSM's grid")
    valid, measured = z != nodata, flag == 1
    ours_h = z - ground
    print(
        f"ODM crown cells: {n} ({n * cell_m**2:.0f} m2 of {int(has.sum()) * cell_m**2:.0f} m2 ODM measures)"
    )
    print(
        f"  ours measured {np.mean(measured[crown]):.1%}, with a height {np.mean(valid[crown]):.1%}"
    )
    for name, sel in (("measured", crown & measured), ("filled", crown & valid & ~measured)):
        if sel.any():
            ours, odm = float(np.median(ours_h[sel])), float(np.median(odm_h[sel]))
            print(
                f"  crown height where ours {name}: ours {ours:.2f} m, ODM {odm:.2f} m, {ours / odm:.0%}"
            )
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    img = np.zeros((*z.shape, 3))
    img[~crown & measured] = (0.6, 0.6, 0.6)
    img[crown & measured] = (0.0, 0.7, 0.0)
    img[crown & ~measured] = (0.9, 0.0, 0.0)
    fig, ax = plt.subplots(1, 2, figsize=(14, 7))
    ax[0].imshow(np.where(has, odm_h, np.nan), vmin=0, vmax=12)
    ax[0].set_title("ODM's cloud: height above ground (m)")
    ax[1].imshow(img)
    ax[1].set_title("ours measured: crown kept green, crown lost red, other grey")
    png = args.png or dsm.with_name("crowns.png")
    fig.savefig(png, dpi=70, bbox_inches="tight")
    print(f"  wrote {png}")


if __name__ == "__main__":
    main()
