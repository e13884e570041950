"""Time to refuse misplaced products before a merge, and what the check costs a good merge.

NodeODM's test mode returns its canned brighton products (EPSG:32615) for every submodel; with
``--submodels N`` they are checked against N planned footprints in Freetown (EPSG:32628), as
the merge of such a run does before reading anything (the refusal), and against footprints
around the products themselves (the cost on a merge that goes on). Header reads only.

    python benchmarks/bench_product_locations.py --submodels 100
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from shapely.geometry import box

from prefect_odm.errors import MisplacedProductError
from prefect_odm.merge.locations import check_product_locations

CANNED = Path(__file__).resolve().parents[2] / "shared/peers/nodeodm/tests/processing_results"


def _timed(products: dict, footprints: dict, epsg: int) -> tuple[float, float, str]:
    wall, cpu = time.perf_counter(), time.process_time()
    try:
        check_product_locations(products, footprints, epsg, lambda sid: "rerun it")
        outcome = "accepted"
    except MisplacedProductError as exc:
        outcome = str(exc)
    return time.perf_counter() - wall, time.process_time() - cpu, outcome


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--submodels", type=int, default=100)
    args = parser.parse_args()
    names = {
        "orthophoto": "odm_orthophoto/odm_orthophoto.tif",
        "dsm": "odm_dem/dsm.tif",
        "dtm": "odm_dem/dtm.tif",
        "point_cloud": "odm_georeferencing/odm_georeferenced_model.laz",
    }
    products = {
        f"submodel-{i:03d}": {k: str(CANNED / v) for k, v in names.items()}
        for i in range(args.submodels)
    }
    freetown = {sid: box(695_000.0, 937_000.0, 695_100.0, 937_100.0) for sid in products}
    brighton = {sid: box(576_680.0, 5_188_130.0, 576_760.0, 5_188_210.0) for sid in products}
    print(f"load average {os.getloadavg()[0]:.1f}, {args.submodels} submodels x 4 products")
    wall, cpu, line = _timed(products, freetown, 32628)
    print(f"refused (canned products, Freetown plan): {wall:.2f} s wall, {cpu:.2f} CPU-s")
    print(f"  {line}")
    wall2, cpu2, line2 = _timed(products, brighton, 32615)
    print(f"accepted (products where planned): {wall2:.2f} s wall, {cpu2:.2f} CPU-s ({line2})")
    print(f"  ratio refused / accepted CPU: {cpu / cpu2:.2f}")


if __name__ == "__main__":
    main()
