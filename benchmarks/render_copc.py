"""Render a COPC file as a top view coloured by its RGB, down to one octree level (PNG).

Reads only the nodes of levels 0..LEVEL with laspy's ``CopcReader`` (what a viewer shows at that
depth), rasterises them on a grid of ``--pixel-m`` metres keeping the highest point of each cell,
and writes the image; the line printed says how many points and nodes were read.

    python benchmarks/render_copc.py merged.copc.laz out.png [--level 2] [--pixel-m 0.25]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import laspy
import numpy as np
from PIL import Image


def render(path: Path, out: Path, level: int, pixel_m: float) -> str:
    """Write the top view of ``path`` at levels 0..``level`` to ``out``; returns a summary."""
    with laspy.CopcReader.open(str(path)) as reader:
        points = reader.query(level=range(0, level + 1))
        nodes = sum(1 for key in reader.root_page.entries if key.level <= level)
        total = reader.header.point_count
    x, y, z = np.asarray(points.x), np.asarray(points.y), np.asarray(points.z)
    cols = ((x - x.min()) / pixel_m).astype(np.int64)
    rows = ((y.max() - y) / pixel_m).astype(np.int64)
    shape = (int(rows.max()) + 1, int(cols.max()) + 1)
    order = np.argsort(z)  # the highest point of a cell is written last and stays
    rgb = np.stack([np.asarray(points.red), np.asarray(points.green), np.asarray(points.blue)], 1)
    scale = 257.0 if rgb.max() > 255 else 1.0
    image = np.full((*shape, 3), 255, dtype=np.uint8)
    image[rows[order], cols[order]] = (rgb[order] / scale).astype(np.uint8)
    Image.fromarray(image).save(out)
    return (
        f"{path.name}: levels 0-{level}: {len(points):,} of {total:,} points in {nodes} nodes, "
        f"{shape[1]} x {shape[0]} px at {pixel_m} m -> {out}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("copc", type=Path)
    parser.add_argument("png", type=Path)
    parser.add_argument("--level", type=int, default=2)
    parser.add_argument("--pixel-m", type=float, default=0.25)
    args = parser.parse_args()
    print(render(args.copc, args.png, args.level, args.pixel_m))


if __name__ == "__main__":
    main()
