"""Benchmark: seam colour differences of the orthophoto merge, old and new seams, one process.

Merges the same submodel orthophotos of a finished run (``OUT/<run>/submodels/*/``, cameras
from ``OUT/<run>/plan/plan.json``) three times:

- ``unbalanced``: ownership seams (nearest core camera), no colour balance: the baseline, the
  unbalanced, unaligned mosaic;
- ``today``: ownership seams with the gain-and-offset balance (today's default);
- ``least-cost``: least-cost seamlines from the orthophotos and DSMs together (as the reconstruct
  flow computes them once per merge, :func:`prefect_odm.merge.seamline_rasters.merge_seamlines`),
  balance, and colour offsets along the seams;
- ``aligned``: the same after the alignment between submodels (``build_alignment`` from the
  run's cameras and products, as the reconstruct flow solves it), seamlines cut between the
  aligned products and the orthophotos merged where the alignment puts them: what
  ``reconstruct`` with ``seam_method="least-cost"`` makes.

The seam difference is the mean absolute difference (DN, mean over RGB) between the two
submodels' colours, as corrected, over the pixels within the seam band (half the feathering
width, 1 m by default) of the seam that method uses. Printed per method, with the merge time
and its ratio against ``unbalanced``. With ``--png DIR`` it writes ``overview.png`` (colour
difference with both seamlines) and ``crop-N.png`` (the two mosaics across a seam).

Usage::

    python benchmarks/bench_seams.py OUT/<run> [--png DIR]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import rasterio

from prefect_odm.merge import merge_orthophotos
from prefect_odm.merge.seamline_rasters import merge_seamlines
from prefect_odm.merge.seamlines import OwnerLabels
from prefect_odm.models import MergeOptions
from prefect_odm.ownership import Ownership


def _inputs(run: Path) -> tuple[dict[str, Path], dict[str, Path], Ownership, int]:
    plan = json.loads((run / "plan" / "plan.json").read_text())
    folders = sorted((run / "submodels").glob("submodel-*"))
    ortho = {
        f.name[:12]: f / "odm_orthophoto.tif"
        for f in folders
        if (f / "odm_orthophoto.tif").exists()
    }
    dsm = {f.name[:12]: f / "dsm.tif" for f in folders if (f / "dsm.tif").exists()}
    cams = [(c["x_m"], c["y_m"], c["submodel_id"]) for c in plan["cameras"]]
    return ortho, dsm, Ownership.from_cameras(cams, only=list(ortho)), int(plan["crs_epsg"])


def _alignment(run: Path, epsg: int) -> Any:
    """The run's alignment between submodels, solved as the reconstruct flow does."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from align_perturb import products_of, submodel_folders
    from prefect_odm.tasks.align import build_alignment

    plan = json.loads((run / "plan" / "plan.json").read_text())
    gps = {
        c["name"]: (c["x_m"], c["y_m"], c["z_m"])
        for c in plan["cameras"]
        if c.get("z_m") is not None
    }
    products, shots = products_of(submodel_folders(run))
    return build_alignment(products, shots, MergeOptions(accept_alignment=True), gps, epsg)


def _merge(
    name: str, ortho: dict[str, Path], own: Ownership, epsg: int, out: Path, **kw: Any
) -> tuple[dict[str, Any], OwnerLabels | None]:
    started = time.perf_counter()
    labels = None
    alignment = kw.pop("alignment", None)
    if name in ("least-cost", "aligned"):
        fixes = alignment.raster_corrections() if alignment is not None else None
        labels = merge_seamlines(own, orthophotos=ortho, dsms=kw.pop("dsm"), crs_epsg=epsg,
                                 colour_balance=True, alignment=fixes)  # fmt: skip
    opts = MergeOptions(**kw)
    rep = merge_orthophotos(
        ortho, out, ownership=own, options=opts, crs_epsg=epsg, seamlines=labels,
        alignment=alignment,
    )  # fmt: skip
    seconds = time.perf_counter() - started
    return {"before": rep.seam_mean_abs_diff_before, "after": rep.seam_mean_abs_diff_after,
            "seconds": seconds, "pixels": sum(s.pixels for s in rep.seams)}, labels  # fmt: skip


def _render(png: Path, base: Path, new: Path, labels: OwnerLabels, own: Ownership) -> None:
    """Overview of the seams and crops of both mosaics across the new seam."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    png.mkdir(parents=True, exist_ok=True)
    with rasterio.open(base) as b, rasterio.open(new) as n:
        img_b, img_n, tf = b.read(), n.read(), b.transform
    g = labels.grid
    seam = np.zeros(labels.labels.shape, dtype=bool)
    lab = labels.labels
    seam[:, 1:] |= (lab[:, 1:] != lab[:, :-1]) & (lab[:, 1:] >= 0) & (lab[:, :-1] >= 0)
    rows, cols = np.nonzero(seam)
    fig, ax = plt.subplots(figsize=(9, 9))
    ax.imshow(
        np.moveaxis(img_n[:3], 0, -1),
        extent=(tf.c, tf.c + tf.a * img_n.shape[2], tf.f + tf.e * img_n.shape[1], tf.f),
    )
    ext = (g.left, g.left + g.width * g.resolution_m, g.top - g.height * g.resolution_m, g.top)
    ax.contour(
        np.where(lab < 0, np.nan, lab),
        levels=np.arange(len(labels.submodel_ids)) + 0.5,
        colors="r",
        linewidths=0.8,
        extent=ext,
        origin="upper",
    )
    own_lab = own.label_grid(g.transform, g.height, g.width).astype(float)
    own_lab[lab < 0] = np.nan
    ax.contour(
        own_lab,
        levels=np.arange(len(labels.submodel_ids)) + 0.5,
        colors="w",
        linewidths=0.8,
        linestyles="--",
        extent=ext,
        origin="upper",
    )
    ax.set_title("least-cost seamlines (red) and ownership seams (white, dashed)")
    fig.savefig(png / "overview.png", dpi=100)
    plt.close(fig)
    pick = np.linspace(0, rows.size - 1, 4).astype(int)[1:-1] if rows.size else []
    for k, p in enumerate(pick):
        x = g.left + (cols[p] + 0.5) * g.resolution_m
        y = g.top - (rows[p] + 0.5) * g.resolution_m
        r, c = int((tf.f - y) / -tf.e), int((x - tf.c) / tf.a)
        half = int(8.0 / tf.a)
        win = np.s_[:, max(r - half, 0) : r + half, max(c - half, 0) : c + half]
        r0, c0 = max(r - half, 0), max(c - half, 0)
        xs = tf.c + (np.arange(c0, c + half) + 0.5) * tf.a
        ys = tf.f + (np.arange(r0, r + half) + 0.5) * tf.e
        gx, gy = np.meshgrid(xs, ys)
        seams = (own.label_of_points(gx, gy), labels.label_of_points(gx, gy))
        fig, axes = plt.subplots(1, 2, figsize=(12, 6))
        titles = ("unbalanced, ownership seam (white)", "least-cost seamline (red), balanced")
        for a, img, title, lab_px, colour in zip(
            axes, (img_b, img_n), titles, seams, ("w", "r"), strict=True
        ):
            a.imshow(np.moveaxis(img[win][:3], 0, -1))
            a.contour(lab_px.astype(float), levels=[0.5, 1.5, 2.5], colors=colour, linewidths=0.7)
            a.set_title(title)
            a.axis("off")
        fig.tight_layout()
        fig.savefig(png / f"crop-{k}.png", dpi=90)
        plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="a run folder: plan/plan.json and submodels/")
    parser.add_argument("--png", type=Path, default=None, help="folder for the PNGs")
    args = parser.parse_args()
    ortho, dsm, own, epsg = _inputs(args.run)
    print(f"{args.run}: {len(ortho)} orthophotos, {len(dsm)} DSMs")
    with tempfile.TemporaryDirectory(prefix="bench-seams-") as tmp:
        out = {n: Path(tmp) / f"{n}.tif" for n in ("unbalanced", "today", "least-cost", "aligned")}
        base, _ = _merge("unbalanced", ortho, own, epsg, out["unbalanced"], colour_balance=False)
        today, _ = _merge("today", ortho, own, epsg, out["today"])
        new, labels = _merge("least-cost", ortho, own, epsg, out["least-cost"],
                             seam_method="least-cost", dsm=dsm)  # fmt: skip
        aligned, _ = _merge("aligned", ortho, own, epsg, out["aligned"], seam_method="least-cost",
                            dsm=dsm, alignment=_alignment(args.run, epsg))  # fmt: skip
        ref = base["after"]
        print(
            f"{'method':<12} {'seam |diff| DN':>15} {'vs baseline':>12} {'seconds':>8} {'ratio':>6}"
        )
        rows = (("unbalanced", base), ("today", today), ("least-cost", new), ("aligned", aligned))
        for name, row in rows:
            change = 100.0 * (row["after"] - ref) / ref
            print(f"{name:<12} {row['after']:15.2f} {change:+11.1f}% {row['seconds']:8.1f} "
                  f"{row['seconds'] / base['seconds']:6.2f}")  # fmt: skip
        if args.png is not None and labels is not None:
            _render(args.png, out["unbalanced"], out["least-cost"], labels, own)
            print(f"PNGs in {args.png}")


if __name__ == "__main__":
    main()
