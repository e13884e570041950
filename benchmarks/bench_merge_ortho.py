"""Benchmark: orthophoto merge of 4 synthetic RGBA submodels vs ``rasterio.merge.merge``.

Four ``SIZE x SIZE`` RGBA GeoTIFFs in a 2 x 2 layout overlapping by ``--overlap`` (20 %) of their
side are written to a temporary folder (one of them 15 DN brighter, so balancing has work to do).
Then, in child processes of this same run (so each peak memory is measured alone):

- baseline: ``rasterio.merge.merge(paths, dst_path=...)`` (first input wins, no blending, no
  balancing, the whole mosaic in memory), writing a tiled DEFLATE GeoTIFF without overviews;
- ours: :func:`prefect_odm.merge.merge_orthophotos` with ``--workers`` threads (seams,
  feathering, colour balancing, DEFLATE COG with overviews, validated).

With ``--growth`` the same is repeated with inputs twice as large (a mosaic four times larger)
and the growth of our peak memory is printed.

Usage::

    python benchmarks/bench_merge_ortho.py --size 8000 --workers 2 [--growth] [--keep DIR]

Peak memory is the child's peak resident set (``VmHWM``; includes Python and libraries).
"""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
from _measure import peak_mib
from _merge_common import bench_folder, rgba_profile, run_in_child

EPSG = 32615
LEFT, TOP, RES = 500_000.0, 5_000_000.0, 0.05


def _texture(rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    yy, xx = np.meshgrid(rows.astype(np.float32), cols.astype(np.float32), indexing="ij")
    base = 110 + 45 * np.sin(xx / 37.0) * np.cos(yy / 53.0) + 20 * np.sin((xx + yy) / 211.0)
    edges = np.where(((xx // 400) + (yy // 300)) % 5 == 0, 40.0, 0.0)
    return np.stack([base + edges, base * 0.9 + edges, base * 0.8 + edges + 10])


def make_inputs(folder: Path, size: int, overlap: float) -> dict[str, Path]:
    """Write four overlapping RGBA submodels; returns id -> path."""
    import rasterio

    step = int(round(size * (1 - overlap)))
    out = {}
    for n, (r, c) in enumerate([(0, 0), (0, 1), (1, 0), (1, 1)]):
        sid = f"submodel_{n:04d}"
        row0, col0 = r * step, c * step
        path = folder / f"{sid}.tif"
        left, top = LEFT + col0 * RES, TOP - row0 * RES
        profile = rgba_profile(size, size, left, top, RES, EPSG, 512, BIGTIFF="IF_SAFER")
        with rasterio.open(path, "w", **profile) as dst:
            for r0 in range(0, size, 1024):
                h = min(1024, size - r0)
                rgb = _texture(np.arange(row0 + r0, row0 + r0 + h), np.arange(col0, col0 + size))
                rgb += 15 if n == 1 else 0
                data = np.empty((4, h, size), np.uint8)
                data[:3] = np.clip(rgb, 0, 255).astype(np.uint8)
                data[3] = 255
                dst.write(data, window=rasterio.windows.Window(0, r0, size, h))
        out[sid] = path
    return out


def cameras(size: int, overlap: float) -> list[tuple[float, float, str]]:
    step = size * (1 - overlap)
    cams = []
    for n, (r, c) in enumerate([(0, 0), (0, 1), (1, 0), (1, 1)]):
        x = LEFT + (c * step + size / 2) * RES
        y = TOP - (r * step + size / 2) * RES
        cams.append((x, y, f"submodel_{n:04d}"))
    return cams


def _run_baseline(inputs: dict[str, Path], out: Path, queue: Any) -> None:
    from rasterio.merge import merge

    t = time.perf_counter()
    merge(
        [str(inputs[k]) for k in sorted(inputs)],
        dst_path=str(out),
        dst_kwds={
            "tiled": True,
            "blockxsize": 512,
            "blockysize": 512,
            "compress": "DEFLATE",
            "predictor": 2,
            "BIGTIFF": "IF_SAFER",
        },
    )
    queue.put((time.perf_counter() - t, peak_mib()))


def _run_ours(inputs: dict[str, Path], out: Path, workers: int, cams: list, queue: Any) -> None:
    from prefect_odm.merge import merge_orthophotos
    from prefect_odm.ownership import Ownership

    t = time.perf_counter()
    report = merge_orthophotos(inputs, out, ownership=Ownership.from_cameras(cams), workers=workers)
    queue.put(
        (
            time.perf_counter() - t,
            peak_mib(),
            report.seam_mean_abs_diff_before,
            report.seam_mean_abs_diff_after,
            report.width,
            report.height,
        )
    )


def run(size: int, overlap: float, workers: int, folder: Path) -> dict[str, float]:
    folder.mkdir(parents=True, exist_ok=True)
    t = time.perf_counter()
    inputs = make_inputs(folder, size, overlap)
    print(f"[{size}] wrote 4 inputs of {size}x{size} RGBA in {time.perf_counter() - t:.1f} s")
    base_s, base_mib = run_in_child(_run_baseline, inputs, folder / "baseline.tif")
    ours = run_in_child(_run_ours, inputs, folder / "ours.tif", workers, cameras(size, overlap))
    ours_s, ours_mib, before, after, width, height = ours
    print(
        f"[{size}] mosaic {width}x{height} ({width * height / 1e6:.0f} Mpx)\n"
        f"  rasterio.merge.merge : {base_s:7.1f} s  peak {base_mib:7.0f} MiB\n"
        f"  merge_orthophotos    : {ours_s:7.1f} s  peak {ours_mib:7.0f} MiB  "
        f"(workers={workers}; seam |diff| {before:.1f} -> {after:.2f} DN)\n"
        f"  time ratio ours/baseline = {ours_s / base_s:.2f}   "
        f"memory ratio = {ours_mib / base_mib:.2f}"
    )
    return {"ours_s": ours_s, "ours_mib": ours_mib, "base_s": base_s, "base_mib": base_mib}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", type=int, default=8000, help="side of each input, pixels")
    parser.add_argument("--overlap", type=float, default=0.2, help="overlap fraction")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--growth", action="store_true", help="also run inputs twice as large")
    parser.add_argument("--keep", type=Path, default=None, help="keep the files in this folder")
    args = parser.parse_args()
    with bench_folder(args.keep, "bench_merge_ortho_") as root:
        first = run(args.size, args.overlap, args.workers, root / f"s{args.size}")
        if args.growth:
            if not args.keep:
                shutil.rmtree(root / f"s{args.size}", ignore_errors=True)
            second = run(2 * args.size, args.overlap, args.workers, root / f"s{2 * args.size}")
            growth = second["ours_mib"] / first["ours_mib"] - 1
            print(
                f"mosaic 4x larger: our peak memory {first['ours_mib']:.0f} -> "
                f"{second['ours_mib']:.0f} MiB (growth {growth:+.1%}); baseline "
                f"{first['base_mib']:.0f} -> {second['base_mib']:.0f} MiB"
            )


if __name__ == "__main__":
    main()
