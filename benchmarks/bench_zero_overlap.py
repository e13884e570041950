"""Merged and per-submodel DSMs against ODM's own cloud of brighton, and a picture of the merged
DSM's difference (``python benchmarks/bench_zero_overlap.py SURVEY [SURVEY ...] --png OUT``).

``SURVEY``: a survey folder (``OUTPUT/<fingerprint>``) of ``prefect-odm reconstruct`` on
brighton, e.g. ``--split 8 --split-overlap-m 0`` (two submodels tied only by their products) or
the Quickstart's ``--split 10 --split-overlap-m 20``. Per DSM: the signed median and the p90 of
``|dz|`` of its measured heights minus the mean height of ODM's cloud
(``reference/model.laz``) per cell (``_quickstart.dz_lines``'s figures), and for the merge the
refinement's height change at each submodel's own centre (``manifest.json``). With ``--png`` the
merged DSM's ``dz`` is drawn (matplotlib, blue -1 m .. red +1 m) with the submodels' footprints.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _quickstart import dz_grid  # noqa: E402

REFERENCE = (Path(__file__).resolve().parents[1] / "../shared/data/brighton_beach_1600"
             / "reference" / "model.laz")  # fmt: skip


def line(label: str, dz: Any) -> str:
    d = dz[np.isfinite(dz)]
    return (f"{label}: median dz {np.median(d):+.3f} m, p90 |dz| "
            f"{np.percentile(np.abs(d), 90):.3f} m ({len(d)} cells)")  # fmt: skip


def render(dz: Any, transform: Any, survey: Path, path: Path, title: str) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 6), dpi=110)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    h, w = dz.shape
    extent = (0.0, w * transform.a, -h * transform.a, 0.0)
    image = ax.imshow(dz, cmap="RdBu_r", vmin=-1.0, vmax=1.0, extent=extent)
    for dsm in sorted(survey.glob("submodels/*/dsm.tif")):
        import rasterio

        with rasterio.open(dsm) as src:
            b = src.bounds
        x0, y0 = b.left - transform.c, b.bottom - transform.f
        ax.plot([x0, b.right - transform.c, b.right - transform.c, x0, x0],
                [y0, y0, b.top - transform.f, b.top - transform.f, y0], lw=0.8,
                label=dsm.parent.name[:13])  # fmt: skip
    ax.legend(loc="lower right", fontsize=7)
    ax.set_title(title, fontsize=9)
    ax.set_xlabel("east (m)")
    ax.set_ylabel("north (m)")
    fig.colorbar(image, ax=ax, label="merged DSM - ODM cloud (m)")
    fig.savefig(path)


def main() -> None:
    import laspy

    parser = argparse.ArgumentParser()
    parser.add_argument("surveys", nargs="+", type=Path)
    parser.add_argument("--png", type=Path, default=None)
    args = parser.parse_args()
    las = laspy.read(REFERENCE)
    reference = np.column_stack([las.x, las.y, las.z])
    for k, survey in enumerate(args.surveys):
        print(f"== {survey}")
        for dsm in sorted(survey.glob("submodels/*/dsm.tif")):
            print("  " + line(dsm.parent.name[:12], dz_grid(dsm, reference)[0]))
        dz, transform = dz_grid(survey / "merged" / "dsm.tif", reference)
        print("  " + line("merged", dz))
        refinement = json.loads((survey / "manifest.json").read_text())["alignment"]["refinement"]
        for t in refinement["transforms"] if refinement else []:
            print(f"  refinement {t['submodel_id']}: {t['translation_m'][2]:+.3f} m at its centre")
        if args.png is not None:
            args.png.mkdir(parents=True, exist_ok=True)
            path = args.png / f"dz_merged_{k}.png"
            render(dz, transform, survey, path, f"{survey}\n{line('merged', dz)}")
            print(f"  picture: {path}")


if __name__ == "__main__":
    main()
