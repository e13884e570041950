"""Benchmark: DEM merge of 4 synthetic two-band DSMs vs ``rasterio.merge.merge`` of the same files.

Four ``SIZE x SIZE`` float32 DSMs in a 2 x 2 layout overlapping by ``--overlap`` (20 %) of their
side are written to a temporary folder as the engine writes them (256-pixel tiles, DEFLATE level 1,
predictor 3, :func:`prefect_odm.engine.writers.write_geotiff`): band 1 heights (a sloping,
textured surface with "buildings", nodata -9999 outside a footprint with ragged corners), band 2
the measured flag (:data:`prefect_odm.merge.dem.MEASURED_DESCRIPTION`; 0 in gap-filled patches).
One input sits 0.3 m higher, so the vertical-offset solve has work to do.
Then, alternately ``--repeat`` times, in child processes of this same run (so each peak memory is
measured alone), three baselines of ``rasterio.merge.merge(paths, ...)`` (first input wins, no
blending, no offsets, the whole mosaic in memory, one thread) and ours:

- ``plain``: ``rasterio.merge`` writing a plain tiled (512) DEFLATE GeoTIFF of both bands,
  predictor 3, GDAL's default level (6), no overviews, not a COG (the issue's baseline);
- ``level1``: the same at DEFLATE level 1, ours' level (the same compression, no overviews);
- ``cog``: the same product as ours: ``rasterio.merge`` into an uncompressed tiled GeoTIFF, its
  average overviews built there and copied into a validated COG compressed as ours
  (:data:`prefect_odm.merge.dem.DEM_COG_OPTIONS`: DEFLATE level 1, predictor 3) with
  ``--workers`` compression threads (:mod:`prefect_odm.merge.cog`, ours' own steps);
- ours: :func:`prefect_odm.merge.merge_dems` with ``--workers`` threads (vertical offsets, seams,
  edge-distance blending of heights and of the measured band, DEFLATE level 1 COG with
  overviews).

With ``--growth`` the same is repeated with inputs twice as large (a mosaic four times larger)
and the growth of our peak memory is printed. ``--keep DIR`` keeps the inputs and outputs (to
compare outputs of two versions byte for byte).

Usage::

    python benchmarks/bench_merge_dem.py --size 4000 --workers 2 --repeat 3 [--growth] [--keep DIR]

CPU is the child's user + system time (all threads) during the merge, imports left out: on a
shared machine it says how much work each merge does when the wall times say mostly how busy the
machine was. Peak memory is the child's peak resident set (``VmHWM``; includes Python and
libraries). The 1-minute load average before each run is printed with it.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
from _measure import peak_mib
from _merge_common import bench_folder, run_in_child

EPSG = 32615
LEFT, TOP, RES = 500_000.0, 5_000_000.0, 0.05
STRIP = 1024


def _surface(rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    yy, xx = np.meshgrid(rows.astype(np.float32), cols.astype(np.float32), indexing="ij")
    ground = 30.0 + 0.002 * xx - 0.001 * yy + 0.4 * np.sin(xx / 97.0) * np.cos(yy / 131.0)
    roofs = np.where(((xx // 300) + (yy // 220)) % 4 == 0, 6.0, 0.0)
    return (ground + roofs).astype(np.float32)


def _footprint(r0: int, h: int, size: int) -> np.ndarray:
    """Valid cells of one strip: the square less ragged corners (a drone block's footprint)."""
    yy, xx = np.meshgrid(np.arange(r0, r0 + h), np.arange(size), indexing="ij")
    c = size / 2
    ragged = 0.08 * size * np.sin(xx / 53.0) * np.cos(yy / 71.0)
    return (np.abs(xx - c) + np.abs(yy - c)) < 0.85 * size + ragged  # type: ignore[no-any-return]


def make_inputs(folder: Path, size: int, overlap: float) -> dict[str, Path]:
    """Write four overlapping two-band DSMs; returns id -> path."""
    import rasterio
    from rasterio.transform import from_origin

    from prefect_odm.merge.dem import DEM_NODATA, MEASURED_DESCRIPTION

    step = int(round(size * (1 - overlap)))
    out = {}
    for n, (r, c) in enumerate([(0, 0), (0, 1), (1, 0), (1, 1)]):
        sid = f"submodel_{n:04d}"
        row0, col0 = r * step, c * step
        path = folder / f"{sid}.tif"
        profile = {
            "driver": "GTiff", "width": size, "height": size, "count": 2, "dtype": "float32",
            "crs": f"EPSG:{EPSG}", "nodata": DEM_NODATA, "tiled": True, "blockxsize": 256,
            "blockysize": 256, "compress": "DEFLATE", "zlevel": 1, "predictor": 3,
            "BIGTIFF": "IF_SAFER",
            "transform": from_origin(LEFT + col0 * RES, TOP - row0 * RES, RES, RES),
        }  # fmt: skip
        with rasterio.open(path, "w", **profile) as dst:
            dst.set_band_description(2, MEASURED_DESCRIPTION)
            for r0 in range(0, size, STRIP):
                h = min(STRIP, size - r0)
                rows = np.arange(row0 + r0, row0 + r0 + h)
                z = _surface(rows, np.arange(col0, col0 + size)) + (0.3 if n == 1 else 0.0)
                ok = _footprint(r0, h, size)
                yy, xx = np.meshgrid(rows, np.arange(col0, col0 + size), indexing="ij")
                flag = np.where(((xx // 180) * 7 + (yy // 140) * 3) % 11 == 0, 0.0, 1.0)
                data = np.stack([np.where(ok, z, DEM_NODATA), np.where(ok, flag, DEM_NODATA)])
                dst.write(data.astype(np.float32), window=rasterio.windows.Window(0, r0, size, h))
        out[sid] = path
    return out


def cameras(size: int, overlap: float) -> list[tuple[float, float, str]]:
    """One core camera at the centre of each input ``(x_m, y_m, submodel_id)``."""
    step = size * (1 - overlap)
    cams = []
    for n, (r, c) in enumerate([(0, 0), (0, 1), (1, 0), (1, 1)]):
        x = LEFT + (c * step + size / 2) * RES
        y = TOP - (r * step + size / 2) * RES
        cams.append((x, y, f"submodel_{n:04d}"))
    return cams


def _cpu_seconds() -> float:
    """CPU time of this process so far (user + system, all threads), seconds."""
    use = resource.getrusage(resource.RUSAGE_SELF)
    return use.ru_utime + use.ru_stime


BASELINES = {
    "plain": "rasterio.merge -> tiled DEFLATE GTiff, level 6 (GDAL's default), no overviews",
    "level1": "rasterio.merge -> tiled DEFLATE GTiff, level 1 (ours'), no overviews",
    "cog": "rasterio.merge -> COG with average overviews compressed as ours (ours' product)",
}
"""The baselines by name, with what each writes."""


def _run_baseline(
    inputs: dict[str, Path], out: Path, variant: str, workers: int, queue: Any
) -> None:
    import rasterio
    from rasterio.merge import merge

    from prefect_odm.merge.cog import build_overviews, temporary_sibling, write_cog
    from prefect_odm.merge.dem import DEM_COG_OPTIONS

    t, cpu = time.perf_counter(), _cpu_seconds()
    paths = [str(inputs[k]) for k in sorted(inputs)]
    tiled = {"tiled": True, "blockxsize": 512, "blockysize": 512, "BIGTIFF": "IF_SAFER"}
    if variant == "cog":
        tmp = temporary_sibling(out, "baseline")
        try:
            merge(
                paths,
                dst_path=str(tmp),
                dst_kwds={**tiled, "blockxsize": 256, "blockysize": 256, "compress": "none"},
            )
            with rasterio.open(tmp, "r+") as ds:
                build_overviews(ds)
            write_cog(tmp, out, workers=workers, **DEM_COG_OPTIONS)
        finally:
            tmp.unlink(missing_ok=True)
    else:
        level = {"zlevel": 1} if variant == "level1" else {}
        merge(
            paths,
            dst_path=str(out),
            dst_kwds={**tiled, "compress": "DEFLATE", "predictor": 3, **level},
        )
    queue.put((time.perf_counter() - t, peak_mib(), _cpu_seconds() - cpu))


def _run_ours(inputs: dict[str, Path], out: Path, workers: int, cams: list, queue: Any) -> None:
    from prefect_odm.merge import merge_dems
    from prefect_odm.ownership import Ownership

    t, cpu = time.perf_counter(), _cpu_seconds()
    report = merge_dems(inputs, out, ownership=Ownership.from_cameras(cams), workers=workers)
    offsets = ", ".join(f"{v:+.2f}" for _, v in sorted(report.vertical_offsets_m.items()))
    queue.put(
        (
            time.perf_counter() - t,
            peak_mib(),
            _cpu_seconds() - cpu,
            report.width,
            report.height,
            offsets,
        )
    )


def _line(name: str, runs: list[tuple[float, float, float]]) -> str:
    wall, mib, cpu = (float(np.median(v)) for v in zip(*runs, strict=True))
    return f"  {name:22s}: {wall:7.1f} s  CPU {cpu:6.1f} s  peak {mib:7.0f} MiB"


def run(size: int, overlap: float, workers: int, folder: Path, repeat: int) -> dict[str, float]:
    """Write the inputs, run the baselines and ours ``repeat`` times alternately, print and
    return the medians (speed: the median of the per-round ratios, which a shared machine's
    changing load disturbs least)."""
    folder.mkdir(parents=True, exist_ok=True)
    t = time.perf_counter()
    inputs = make_inputs(folder, size, overlap)
    print(f"[{size}] wrote 4 two-band DSMs of {size}x{size} in {time.perf_counter() - t:.1f} s")
    base: dict[str, list[tuple[float, float, float]]] = {k: [] for k in BASELINES}
    ours: list[tuple[float, float, float]] = []
    loads: list[float] = []
    for n in range(repeat):
        for variant in BASELINES:
            loads.append(os.getloadavg()[0])
            out = folder / f"baseline_{variant}.tif"
            base[variant].append(run_in_child(_run_baseline, inputs, out, variant, workers))
        loads.append(os.getloadavg()[0])
        *got, width, height, offsets = run_in_child(
            _run_ours, inputs, folder / "ours.tif", workers, cameras(size, overlap)
        )
        ours.append((got[0], got[1], got[2]))
        print(
            f"  round {n + 1}: "
            + ", ".join(f"{k} {v[-1][0]:.1f} s ({v[-1][2]:.1f} s CPU)" for k, v in base.items())
            + f", merge_dems {got[0]:.1f} s ({got[2]:.1f} s CPU); load {min(loads[-4:]):.1f}-{max(loads[-4:]):.1f}"
        )
    print(
        f"[{size}] mosaic {width}x{height} ({width * height / 1e6:.0f} Mpx, 2 bands), medians of "
        f"{repeat} alternated rounds, 1-min load average {min(loads):.1f}-{max(loads):.1f} on "
        f"{os.cpu_count()} CPUs"
    )
    for k, what in BASELINES.items():
        print(_line(f"rasterio.merge {k}", base[k]) + f"  ({what})")
    print(
        _line("merge_dems", ours)
        + f"  (workers={workers}; offsets {offsets} m; DEFLATE level 1 COG with overviews)"
    )
    sizes = {k: (folder / f"baseline_{k}.tif").stat().st_size / 2**20 for k in BASELINES}
    print(
        "  file sizes: "
        + ", ".join(f"{k} {v:.1f} MiB" for k, v in sizes.items())
        + f", merge_dems {(folder / 'ours.tif').stat().st_size / 2**20:.1f} MiB"
    )
    ours_s, ours_mib, ours_cpu = (float(np.median(v)) for v in zip(*ours, strict=True))
    for k in BASELINES:
        speed = float(np.median([b[0] / o[0] for b, o in zip(base[k], ours, strict=True)]))
        b_cpu = float(np.median([b[2] for b in base[k]]))
        b_mib = float(np.median([b[1] for b in base[k]]))
        print(
            f"  ours vs {k:6s}: speed {speed:.2f}x (wall, median of the rounds' ratios), "
            f"CPU speed {b_cpu / ours_cpu:.2f}x, memory ratio {ours_mib / b_mib:.2f}"
        )
    return {"ours_s": ours_s, "ours_mib": ours_mib, "base_s": float(np.median([b[0] for b in base["plain"]])),
            "base_mib": float(np.median([b[1] for b in base["plain"]]))}  # fmt: skip


def main() -> None:
    """Parse the arguments and run the benchmark (twice with ``--growth``)."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--size", type=int, default=4000, help="side of each input, pixels")
    parser.add_argument("--overlap", type=float, default=0.2, help="overlap fraction")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--growth", action="store_true", help="also run inputs twice as large")
    parser.add_argument("--repeat", type=int, default=3, help="alternated runs of each merge")
    parser.add_argument("--keep", type=Path, default=None, help="keep the files in this folder")
    args = parser.parse_args()
    with bench_folder(args.keep, "bench_merge_dem_") as root:
        first = run(args.size, args.overlap, args.workers, root / f"s{args.size}", args.repeat)
        if args.growth:
            if not args.keep:
                shutil.rmtree(root / f"s{args.size}", ignore_errors=True)
            second = run(
                2 * args.size, args.overlap, args.workers, root / f"s{2 * args.size}", args.repeat
            )
            growth = second["ours_mib"] / first["ours_mib"] - 1
            print(
                f"mosaic 4x larger: our peak memory {first['ours_mib']:.0f} -> "
                f"{second['ours_mib']:.0f} MiB (growth {growth:+.1%}); baseline plain "
                f"{first['base_mib']:.0f} -> {second['base_mib']:.0f} MiB"
            )


if __name__ == "__main__":
    main()
