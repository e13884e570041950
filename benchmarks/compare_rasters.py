"""Compare two rasters pixel by pixel (the before and after of a merge change).

Prints, per pair, whether grid, CRS, band count and every pixel (nodata and masks included) are
the same, and whether the files are byte-identical; exits 1 when any pixel differs.

Usage: python benchmarks/compare_rasters.py A.tif B.tif [A2.tif B2.tif ...]
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import numpy as np
import rasterio


def same_pixels(a: Path, b: Path) -> bool:
    """True when ``a`` and ``b`` have the same grid, CRS, bands, nodata, masks and pixels;
    prints one line saying so, with the largest difference when they differ."""
    with rasterio.open(a) as da, rasterio.open(b) as db:
        meta = (da.crs, da.transform, da.shape, da.count, da.dtypes, da.nodata)
        if meta != (db.crs, db.transform, db.shape, db.count, db.dtypes, db.nodata):
            print(f"{a} / {b}: grid, CRS, bands or nodata differ")
            return False
        va, vb = da.read(), db.read()
        masks = np.array_equal(da.read_masks(), db.read_masks())
        equal = np.array_equal(va, vb, equal_nan=True) and masks
    digest = [hashlib.sha256(p.read_bytes()).hexdigest() for p in (a, b)]
    worst = 0.0 if equal else float(np.nanmax(np.abs(va.astype(np.float64) - vb)))
    print(
        f"{a.name} / {b.name}: {va.shape[1]} x {va.shape[2]} x {va.shape[0]}, "
        f"pixels {'identical' if equal else f'DIFFER (max |diff| {worst:g})'}, "
        f"files {'byte-identical' if digest[0] == digest[1] else 'differ in bytes'}"
    )
    return equal


def main() -> int:
    paths = [Path(p) for p in sys.argv[1:]]
    if not paths or len(paths) % 2:
        raise SystemExit("usage: compare_rasters.py A.tif B.tif [A2.tif B2.tif ...]")
    results = [same_pixels(a, b) for a, b in zip(paths[::2], paths[1::2], strict=True)]
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
