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
measure). Then the wall time of each run and ``shared / own``.
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


def dz_lines(dsm: Path, reference: Any, single: Path | None) -> list[str]:
    """The DSM's measured heights against ODM's cloud ``(n, 3)`` and the single-block DSM."""
    import rasterio
    from rasterio.warp import Resampling, reproject

    z, transform = _measured(dsm)
    res = float(transform.a)
    col = np.floor((reference[:, 0] - transform.c) / res).astype(np.int64)
    row = np.floor((transform.f - reference[:, 1]) / res).astype(np.int64)
    ok = (col >= 0) & (col < z.shape[1]) & (row >= 0) & (row < z.shape[0])
    index = row[ok] * z.shape[1] + col[ok]
    counts = np.bincount(index, minlength=z.size)
    sums = np.bincount(index, weights=reference[ok, 2], minlength=z.size)
    with np.errstate(invalid="ignore", divide="ignore"):
        odm = np.where(counts > 0, sums / np.maximum(counts, 1), np.nan).reshape(z.shape)
    lines = [f"vs ODM's cloud: {_figures(z - odm, res)}"]
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


def run_quickstart(images: Path, out: Path, extra: list[str]) -> float | None:
    """Run the Quickstart into ``out`` unless it holds a merged DSM; seconds, or None."""
    if sorted(out.glob("*/merged/dsm.tif")):
        return None
    env = dict(os.environ)
    env["PREFECT_ODM_HOME"] = tempfile.mkdtemp(prefix="quickstart-odm-")
    env["PREFECT_HOME"] = tempfile.mkdtemp(prefix="quickstart-prefect-")
    command = [
        sys.executable, "-m", "prefect_odm.cli", "reconstruct", str(images),
        "--output", str(out), "--split", "10", "--split-overlap-m", "20", *extra,
    ]  # fmt: skip
    started = time.perf_counter()
    subprocess.run(command, check=True, env=env, stdout=subprocess.DEVNULL)
    return time.perf_counter() - started
