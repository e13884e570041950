"""Benchmark of the built-in engine's orthophoto: the seamless renderer vs the first one.

For brighton_beach_1600 (18 images) and the 50 seneca_1200 images nearest the survey centre
(as ``bench_engine.py`` picks them), the engine's pipeline is run up to ``odm_dem`` (the cameras
of structure from motion and today's DSM), then both renderers colour the same grid in this
process: the baseline ``render_orthophoto_blocks`` of ``tests/engine/ortho_blocks.py`` (best
camera per 16-cell block, no blending, no compensation) and
:func:`~prefect_odm.engine.orthophoto.render_orthophoto_views` (occlusion-tested views, MRF
labelling, multi-band blending, exposure and vignetting compensation). Printed per renderer:

* seconds, and the ratio to the baseline;
* block-edge and view-boundary step ratios (:mod:`prefect_odm.engine.ortho_measures`; target
  <= 1.01);
* sharpness: Laplacian energy over that of the labelled views rendered from their images
  resampled to the orthophoto GSD (area average), corrected alike (target >= 0.9);
* brighton: horizontal offset to ODM's cloud ``reference/model.laz`` by sub-cell phase
  correlation (``cv2.phaseCorrelate``) of grey levels at 0.2 m (target <= 0.3 m);
* seneca: corner/centre ratio of the mean image, and of the mosaic (the median ratio of one
  ground cell seen near an image corner, r^2 > 0.5, and near an image centre, r^2 < 0.1, in
  another image) (target >= 0.95).

PNGs (overviews and crops, old | new) are written to ``--png`` for looking at.

Usage::

    python benchmarks/bench_orthophoto.py [--only brighton|seneca] [--keep DIR] [--png DIR]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from _measure import peak_mib
from bench_engine import DATA, REPO, _seneca_subset

sys.path.insert(0, str(REPO / "tests" / "engine"))  # the first renderer, the baseline
import ortho_blocks

from prefect_odm.engine import dem, footprints, ortho_measures, orthophoto
from prefect_odm.engine.camera import Scene
from prefect_odm.engine.ortho_blend import load_rgb
from prefect_odm.engine.ortho_radiometry import (
    Radiometry,
    normalised_radius2,
    sample_candidate_colours,
    smooth_cells,
)
from prefect_odm.grid import Grid

ORTHOPHOTO_RESOLUTION_CM = 5.0
COMPARE_RES_M = 0.2


def prepare(survey: str, root: Path) -> Path:
    """The task folder of ``survey`` with the stages up to ``odm_dem`` done (reused if there)."""
    sys.path.insert(0, str(REPO / "tests" / "engine"))
    from test_pipeline import make_task

    from prefect_odm.engine import pipeline

    task = root / survey
    if (task / "odm_dem" / "engine_dem.json").exists():
        return task
    images: Path | list[Path] = (
        DATA / "brighton_beach_1600" / "images" if survey == "brighton" else _seneca_subset(50)
    )
    make_task(root, images, survey)
    pipeline.run(task, {"end-with": "odm_dem", "max-concurrency": 2}, log=lambda _: None)
    return task


def load(task: Path) -> tuple[Scene, Grid, Any]:
    """Scene, orthophoto grid (as the odm_orthophoto stage makes it) and height sampler."""
    import rasterio

    scene = Scene.load(task / "opensfm")
    meta = json.loads((task / "odm_dem" / "engine_dem.json").read_text())
    dem_grid = Grid(meta["left"], meta["top"], meta["res_m"], meta["width"], meta["height"])
    with rasterio.open(task / "odm_dem" / "engine_surface.tif") as src:
        surface = src.read(1)
    gsd_cm = footprints.estimate_gsd_cm(scene, footprints.reference_ground_z_m(scene))
    res_m = max(ORTHOPHOTO_RESOLUTION_CM, gsd_cm) / 100.0
    left, bottom, right, top = dem_grid.bounds
    width, height = int(round((right - left) / res_m)), int(round((top - bottom) / res_m))
    grid = Grid(left, top, res_m, width, height)
    return scene, grid, dem.surface_sampler(surface, dem_grid, grid)


def fine_labels(coarse: np.ndarray, factor: int, grid: Grid) -> np.ndarray:
    rows = np.arange(grid.height) // factor
    cols = np.arange(grid.width) // factor
    return coarse[np.ix_(rows, cols)]


def sharpness(
    scene: Scene,
    task: Path,
    grid: Grid,
    height_at: Any,
    rgba: np.ndarray,
    labels: np.ndarray,
    radiometry: Radiometry,
) -> float:
    """Laplacian energy of ``rgba`` over that of its source images at the orthophoto's GSD.

    For each labelled view: the orthophoto's energy over its label region (away from label
    changes) and the energy of its image, area-averaged to the orthophoto GSD and corrected
    alike, over the pixels that region projects to; the ratio of the cell-weighted sums.
    """
    import cv2
    from scipy.ndimage import binary_closing, binary_dilation

    down, right = ortho_measures.label_edges(labels)
    edge = np.zeros(labels.shape, bool)
    edge[1:] |= down
    edge[:-1] |= down
    edge[:, 1:] |= right
    edge[:, :-1] |= right
    usable = (rgba[3] > 0) & (labels >= 0) & ~binary_dilation(edge, iterations=3)
    g = ortho_measures.grey(rgba)
    ours = theirs = 0.0
    for index in [int(i) for i in np.unique(labels) if i >= 0]:
        camera = scene.cameras[index]
        rr, cc = np.nonzero(usable & (labels == index))
        if len(rr) < 1000:
            continue
        rs, cs = slice(rr.min(), rr.max() + 1), slice(cc.min(), cc.max() + 1)
        mask = (usable & (labels == index))[rs, cs]
        e_ours = ortho_measures.laplacian_energy(g[rs, cs], mask)
        z = np.asarray(height_at(rr, cc), np.float32)
        gsd = (camera.center[2] - float(np.median(z))) / camera.focal_px
        scale = min(1.0, gsd / grid.resolution_m)
        dx, dy = footprints.cell_offsets(camera, grid, rr.astype(np.float32), cc.astype(np.float32))
        u, v, _ = camera.project_offsets(dx, dy, z - np.float32(camera.center[2]))
        image = load_rgb(task / "images" / camera.name).astype(np.float32)
        vv, uu = np.mgrid[0 : camera.height, 0 : camera.width].astype(np.float32) + 0.5
        image *= radiometry.factor(index, camera, uu, vv)
        small = cv2.resize(image, None, fx=scale, fy=scale, interpolation=cv2.INTER_AREA)
        src_mask = np.zeros(small.shape[:2], bool)
        iu = np.clip((u * scale).astype(np.int64), 0, small.shape[1] - 1)
        iv = np.clip((v * scale).astype(np.int64), 0, small.shape[0] - 1)
        src_mask[iv, iu] = True
        src_mask = binary_closing(src_mask, iterations=2)
        e_src = ortho_measures.laplacian_energy(small.mean(axis=-1), src_mask)
        ours += e_ours * len(rr)
        theirs += e_src * len(rr)
    return ours / theirs


def geolocation_m(rgba: np.ndarray, grid: Grid) -> tuple[float, float]:
    """(offset to ODM's cloud in metres, phase-correlation response)."""
    import cv2
    import laspy

    las = laspy.read(DATA / "brighton_beach_1600" / "reference" / "model.laz")
    f = max(1, int(round(COMPARE_RES_M / grid.resolution_m)))
    rows, cols = grid.height // f, grid.width // f
    res = grid.resolution_m * f
    g = (
        ortho_measures.grey(rgba)[: rows * f, : cols * f]
        .reshape(rows, f, cols, f)
        .mean(axis=(1, 3))
    )
    ok = (rgba[3][: rows * f, : cols * f] > 0).reshape(rows, f, cols, f).all(axis=(1, 3))
    col = np.floor((np.asarray(las.x) - grid.left) / res).astype(np.int64)
    row = np.floor((grid.top - np.asarray(las.y)) / res).astype(np.int64)
    inside = (col >= 0) & (col < cols) & (row >= 0) & (row < rows)
    index = row[inside] * cols + col[inside]
    value = (np.asarray(las.red) + np.asarray(las.green) + np.asarray(las.blue))[inside] / 3.0
    counts = np.bincount(index, minlength=rows * cols).reshape(rows, cols)
    sums = np.bincount(index, weights=value, minlength=rows * cols).reshape(rows, cols)
    both = ok & (counts > 0)
    ref = np.where(both, sums / np.maximum(counts, 1), 0.0)
    r, c = np.nonzero(both)
    window = np.s_[r.min() : r.max() + 1, c.min() : c.max() + 1]
    a = np.where(both, g, np.nan)[window]
    b = np.where(both, ref, np.nan)[window]
    a = np.where(np.isnan(a), np.nanmean(a), a).astype(np.float32)
    b = np.where(np.isnan(b), np.nanmean(b), b).astype(np.float32)
    hann = cv2.createHanningWindow((a.shape[1], a.shape[0]), cv2.CV_32F)
    (dx, dy), response = cv2.phaseCorrelate(a, b, hann)
    return math.hypot(dx, dy) * res, float(response)


def _masked_mean(values: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Mean over axis 0 of ``values`` where ``mask`` (NaN where nothing)."""
    use = mask & np.isfinite(values)
    count = use.sum(axis=0)
    total = np.where(use, values, 0.0).sum(axis=0)
    return np.where(count > 0, total / np.maximum(count, 1), np.nan)


def corner_centre(
    scene: Scene, task: Path, result: orthophoto.OrthophotoResult
) -> dict[str, float]:
    """Seneca's vignetting figures before and after the compensation."""
    from prefect_odm.engine.orthophoto import _image_source

    radiometry = result.radiometry
    total_raw = total_comp = None
    for index, camera in enumerate(scene.cameras):
        image = load_rgb(task / "images" / camera.name).astype(np.float32)
        v, u = np.mgrid[0 : camera.height, 0 : camera.width].astype(np.float32) + 0.5
        comp = image * radiometry.factor(index, camera, u, v)
        total_raw = image.mean(-1) if total_raw is None else total_raw + image.mean(-1)
        total_comp = comp.mean(-1) if total_comp is None else total_comp + comp.mean(-1)
    assert total_raw is not None and total_comp is not None
    views = result.views
    colours = sample_candidate_colours(scene, views, _image_source(task / "images"))
    figures = {
        "mean image before": ortho_measures.corner_centre_ratio(total_raw),
        "mean image after": ortho_measures.corner_centre_ratio(total_comp),
    }
    for name, rad in (("before", Radiometry.identity(len(scene.cameras))), ("after", radiometry)):
        grey = np.full(views.camera.shape, np.nan, np.float32)
        r2 = np.full(views.camera.shape, np.nan, np.float32)
        for index, camera in enumerate(scene.cameras):
            w = views.camera == index
            grey[w] = (colours[w] * rad.factor(index, camera, views.u[w], views.v[w])).mean(-1)
            r2[w] = normalised_radius2(camera, views.u[w], views.v[w])
        corner = _masked_mean(grey, r2 > 0.5)
        centre = _masked_mean(grey, r2 < 0.1)
        use = np.isfinite(corner) & np.isfinite(centre) & smooth_cells(views, colours)
        figures[f"mosaic {name}"] = float(np.median(corner[use] / centre[use]))
    return figures


def save_pngs(folder: Path, survey: str, old: np.ndarray, new: np.ndarray) -> None:
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    both = np.concatenate([old, np.zeros((4, old.shape[1], 16), np.uint8), new], axis=2)
    image = Image.fromarray(np.moveaxis(both[:3], 0, -1))
    image.thumbnail((2000, 2000))
    image.save(folder / f"{survey}_old_new.png")
    rows, cols = np.nonzero(new[3] > 0)
    for k, (fr, fc) in enumerate([(0.3, 0.3), (0.5, 0.5), (0.7, 0.6)]):
        r = int(rows.min() + fr * (rows.max() - rows.min()))
        c = int(cols.min() + fc * (cols.max() - cols.min()))
        o, n = old[:3, r : r + 600, c : c + 600], new[:3, r : r + 600, c : c + 600]
        crop = np.concatenate([o, np.zeros((3, o.shape[1], 8), np.uint8), n], axis=2)
        Image.fromarray(np.moveaxis(crop, 0, -1)).save(folder / f"{survey}_crop{k}_old_new.png")


def run_survey(survey: str, root: Path, png: Path) -> None:
    task = prepare(survey, root)
    scene, grid, height_at = load(task)
    print(
        f"\n== {survey}: {len(scene.cameras)} cameras, grid {grid.width}x{grid.height} "
        f"at {grid.resolution_m * 100:.1f} cm"
    )
    started = time.perf_counter()
    old = ortho_blocks.render_orthophoto_blocks(
        scene, task / "images", grid, height_at, log=lambda _: None
    )
    old_s = time.perf_counter() - started
    block = ortho_blocks.SELECTION_BLOCK
    old_labels = np.repeat(
        np.repeat(ortho_blocks.best_cameras(scene, grid, height_at), block, 0), block, 1
    )[: grid.height, : grid.width]
    started = time.perf_counter()
    result = orthophoto.render_orthophoto_views(scene, task / "images", grid, height_at, log=print)
    new_s = time.perf_counter() - started
    new = result.rgba
    new_labels = fine_labels(result.labels, result.views.factor, grid)
    identity = Radiometry.identity(len(scene.cameras))
    rows = []
    for name, rgba, labels, rad, seconds in (
        ("baseline (blocks)", old, old_labels, identity, old_s),
        ("seamless", new, new_labels, result.radiometry, new_s),
    ):
        blocks = ortho_measures.step_ratio(rgba, *ortho_measures.block_edges(rgba.shape[1:], block))
        views = ortho_measures.step_ratio(rgba, *ortho_measures.label_edges(labels))
        sharp = sharpness(scene, task, grid, height_at, rgba, labels, rad)
        line = (
            f"{name:18s} {seconds:7.1f} s ({seconds / old_s:5.1f}x)  block-edge step "
            f"{blocks:.3f}  view-boundary step {views:.3f}  sharpness {sharp:.3f}"
        )
        if survey == "brighton":
            offset, response = geolocation_m(rgba, grid)
            line += f"  offset to ODM {offset:.2f} m (response {response:.2f})"
        rows.append(line)
    print("\n".join(rows))
    print(
        "steps of the seamless renderer (s): "
        + ", ".join(f"{k} {v:.1f}" for k, v in result.seconds.items())
        + f"; radiometry {result.radiometry.observations} samples, spread "
        f"{result.radiometry.rms_log_before:.3f} -> {result.radiometry.rms_log_after:.3f} log"
    )
    if survey == "seneca":
        figures = corner_centre(scene, task, result)
        print("corner/centre: " + ", ".join(f"{k} {v:.3f}" for k, v in figures.items()))
    save_pngs(png, survey, old, new)
    print(f"peak memory {peak_mib():.0f} MiB; PNGs in {png}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=["brighton", "seneca"])
    parser.add_argument("--keep", type=Path, help="task folders here (reused when present)")
    parser.add_argument("--png", type=Path, default=Path("out/ortho_png"), help="PNG folder")
    args = parser.parse_args()
    surveys = [args.only] if args.only else ["brighton", "seneca"]
    with tempfile.TemporaryDirectory() as tmp:
        root = args.keep or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        for survey in surveys:
            run_survey(survey, root, args.png)


if __name__ == "__main__":
    main()
