"""The README's Quickstart measured against ODM's cloud and the single-block run
(``bench_engine.py --quickstart OUT``).

Runs, in one process tree on the same machine: brighton as one block (the engine's pipeline on
all 18 images, ``dense`` case), then the Quickstart command (``--split 10 --split-overlap-m 20``)
twice: ``own`` with ``--option cameras={}`` (no camera given) (each submodel calibrates its camera alone, as before
issue 31; the baseline) and ``shared`` (the default: one calibration for the survey). Each run
gets fresh ``PREFECT_ODM_HOME``/``PREFECT_HOME`` folders, so nothing is reused between them; a
run whose products are already in ``OUT`` is not run again (its time is then not printed).

Per submodel and for the merge: the DSM's grid against the orthophoto's and the footprint
shares (``bench_engine.dsm_against_orthophoto``); the measured heights (the DSM's measured band)
against the mean height of ODM's cloud per DSM cell (median and p90 of |dz|, signed median, tilt
of the plane fitted to dz), and against the single-block DSM (same figures, over the cells both
measure). Then the wall and CPU time of each run and ``shared / own``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

MODES = {"own": ["--option", "cameras={}"], "shared": []}
"""Quickstart run -> its extra arguments; the first is the baseline."""


def _measured(path: Path) -> tuple[Any, Any]:
    """``(heights with NaN where not measured, transform)`` of a DSM."""
    import rasterio

    from prefect_odm.registry import DSM_MEASURED_BAND, DSM_MEASURED_DESCRIPTION

    with rasterio.open(path) as src:
        z = src.read(1).astype(np.float64)
        z[z == src.nodata] = np.nan
        if src.count >= 2 and src.descriptions[1] == DSM_MEASURED_DESCRIPTION:
            z[src.read(DSM_MEASURED_BAND) != 1] = np.nan
        return z, src.transform


def _figures(diff: Any, res_m: float) -> str:
    """``median |dz|, p90, signed median, tilt`` of the finite cells of ``diff``."""
    rows, cols = np.nonzero(np.isfinite(diff))
    d = diff[rows, cols]
    if len(d) < 3:
        return "no common cells"
    a = np.column_stack([cols * res_m, rows * res_m, np.ones_like(d)])
    coef = np.linalg.lstsq(a, d, rcond=None)[0]
    tilt = float(np.degrees(np.arctan(np.hypot(*coef[:2]))))
    return (
        f"median |dz| {np.median(np.abs(d)):.2f} m, p90 {np.percentile(np.abs(d), 90):.2f} m, "
        f"signed {np.median(d):+.2f} m, tilt {tilt:.2f} deg ({len(d)} cells)"
    )


def odm_grid(z: Any, transform: Any, reference: Any) -> Any:
    """The mean height of ODM's cloud ``(n, 3)`` in each cell of the grid of ``z`` (NaN where
    no point falls)."""
    res = float(transform.a)
    col = np.floor((reference[:, 0] - transform.c) / res).astype(np.int64)
    row = np.floor((transform.f - reference[:, 1]) / res).astype(np.int64)
    ok = (col >= 0) & (col < z.shape[1]) & (row >= 0) & (row < z.shape[0])
    index = row[ok] * z.shape[1] + col[ok]
    counts = np.bincount(index, minlength=z.size)
    sums = np.bincount(index, weights=reference[ok, 2], minlength=z.size)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(counts > 0, sums / np.maximum(counts, 1), np.nan).reshape(z.shape)


def dz_grid(dsm: Path, reference: Any) -> tuple[Any, Any]:
    """``(dz with NaN where either has no height, transform)``: the DSM's measured heights minus
    ODM's cloud per cell (:func:`odm_grid`)."""
    z, transform = _measured(dsm)
    return z - odm_grid(z, transform, reference), transform


def dz_lines(dsm: Path, reference: Any, single: Path | None) -> list[str]:
    """The DSM's measured heights against ODM's cloud ``(n, 3)`` and the single-block DSM."""
    import rasterio
    from rasterio.warp import Resampling, reproject

    z, transform = _measured(dsm)
    res = float(transform.a)
    lines = [f"vs ODM's cloud: {_figures(z - odm_grid(z, transform, reference), res)}"]
    if single is not None:
        other, other_transform = _measured(single)
        with rasterio.open(dsm) as src:
            crs = src.crs
        on_grid = np.full(z.shape, np.nan)
        reproject(
            other, on_grid, src_transform=other_transform, src_crs=crs, dst_transform=transform,
            dst_crs=crs, resampling=Resampling.nearest, src_nodata=np.nan, dst_nodata=np.nan,
        )  # fmt: skip
        lines.append(f"vs the single block: {_figures(z - on_grid, res)}")
    return lines


def run_quickstart(images: Path, out: Path, extra: list[str]) -> tuple[float, float] | None:
    """Run the Quickstart into ``out`` unless it holds a merged DSM; ``(wall seconds, CPU
    seconds of the command and every process it waited for: the engine and its tasks)``, or
    None when it was not run."""
    import resource

    if sorted(out.glob("*/merged/dsm.tif")):
        return None
    env = dict(os.environ)
    env["PREFECT_ODM_HOME"] = tempfile.mkdtemp(prefix="quickstart-odm-")
    env["PREFECT_HOME"] = tempfile.mkdtemp(prefix="quickstart-prefect-")
    command = [
        sys.executable, "-m", "prefect_odm.cli", "reconstruct", str(images),
        "--output", str(out), "--split", "10", "--split-overlap-m", "20", *extra,
    ]  # fmt: skip
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run(command, check=True, env=env, stdout=subprocess.DEVNULL)
    seconds = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return seconds, cpu


def render(survey: Path, reference: Any, folder: Path, label: str) -> list[Path]:
    """PNGs of a run's merged products: the DSM's hillshade, its measured heights minus ODM's
    cloud (blue -1 m .. red +1 m, grey where either has none) and the orthophoto, 1/4 size."""
    import cv2
    import rasterio

    folder.mkdir(parents=True, exist_ok=True)
    merged = survey / "merged"
    with rasterio.open(merged / "dsm.tif") as src:
        z = src.read(1).astype(np.float64)
        z[z == src.nodata] = np.nan
        res = float(src.res[0])
    gy, gx = np.gradient(np.where(np.isfinite(z), z, np.nanmedian(z)), res)
    shade = np.clip(255 * (0.5 + 0.5 * (-gx - gy) / np.sqrt(2 + gx * gx + gy * gy)), 0, 255)
    paths = [folder / f"{label}_dsm_hillshade.png", folder / f"{label}_dz_vs_odm.png"]
    cv2.imwrite(str(paths[0]), np.where(np.isfinite(z), shade, 0).astype(np.uint8))
    measured, transform = _measured(merged / "dsm.tif")
    col = np.floor((reference[:, 0] - transform.c) / res).astype(np.int64)
    row = np.floor((transform.f - reference[:, 1]) / res).astype(np.int64)
    ok = (col >= 0) & (col < z.shape[1]) & (row >= 0) & (row < z.shape[0])
    sums = np.zeros(z.shape)
    counts = np.zeros(z.shape)
    np.add.at(sums, (row[ok], col[ok]), reference[ok, 2])
    np.add.at(counts, (row[ok], col[ok]), 1)
    with np.errstate(invalid="ignore", divide="ignore"):
        dz = measured - sums / counts
    t = np.clip((dz + 1.0) / 2.0, 0, 1)  # -1 m blue, 0 white, +1 m red
    bgr = np.stack([255 * np.minimum(1, 2 - 2 * t), 255 * (1 - np.abs(2 * t - 1)),
                    255 * np.minimum(1, 2 * t)], axis=-1)  # fmt: skip
    bgr[~np.isfinite(dz)] = 96
    cv2.imwrite(str(paths[1]), bgr.astype(np.uint8))
    with rasterio.open(merged / "odm_orthophoto.tif") as src:
        rgba = src.read(out_shape=(src.count, src.height // 4, src.width // 4))
    paths.append(folder / f"{label}_orthophoto.png")
    cv2.imwrite(str(paths[2]), np.moveaxis(rgba[[2, 1, 0]], 0, -1))
    return paths
