"""Benchmark: what each submodel's flow spends reading the run's plan and survey.

Builds a synthetic survey of N images (brighton_beach_1600's 18 scanned records, copied onto a
grid of 18-image tiles 300 m apart) and its plan at ``--split`` images per submodel, stores
``plan/plan.json`` and ``survey.json``, then, for every submodel as ``process_submodel`` does,
loads both: first the named baseline (0.1.0 and 0.2.0: read and validate both files per
submodel), then :func:`prefect_odm.plan.cache.load_plan_and_survey` (once per process, a stat
per submodel after that). Prints CPU seconds per submodel and in all, and the ratio.

Usage: python benchmarks/bench_plan_read.py [--images 1800 7200 20000] [--split 100]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from prefect_odm import storage
from prefect_odm.layout import plan_file
from prefect_odm.models import SplitPlan, Survey
from prefect_odm.plan.cache import _cache, load_plan_and_survey
from prefect_odm.plan.planning import plan_split
from prefect_odm.survey.scan import scan_images

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def synthetic_survey(base: Survey, n: int) -> Survey:
    """``n`` records: ``base``'s images repeated on a grid of tiles 300 m (about 0.0027°) apart."""
    images = []
    side = int((n / len(base.images)) ** 0.5) + 1
    for i in range(n):
        tile, record = divmod(i, len(base.images))
        row, col = divmod(tile, side)
        img = base.images[record]
        images.append(
            img.model_copy(
                update={
                    "name": f"t{tile:05d}_{img.name}",
                    "url": f"{img.url}#t{tile}",
                    "identity": f"{img.identity}:{tile}",
                    "latitude": img.latitude + row * 0.0027,
                    "longitude": img.longitude + col * 0.0035,
                }
            )
        )
    return base.model_copy(update={"images": images, "fingerprint": f"synthetic-{n}"})


def cpu() -> float:
    return time.process_time()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, nargs="+", default=[1800, 7200, 20000])
    parser.add_argument("--split", type=int, default=100)
    args = parser.parse_args()
    base = scan_images(str(DATA / "brighton_beach_1600" / "images"))
    print(
        f"{'images':>7} {'submodels':>9} {'baseline s':>11} {'per sm ms':>10} "
        f"{'cached s':>9} {'per sm ms':>10} {'ratio':>7}"
    )
    for n in args.images:
        survey = synthetic_survey(base, n)
        plan = plan_split(survey, split=args.split, split_overlap_m=20)
        with tempfile.TemporaryDirectory() as tmp:
            plan_url = str(Path(tmp) / "plan" / "plan.json")
            storage.write_json_atomic(plan_url, plan.model_dump(mode="json"))
            storage.write_json_atomic(
                plan_file(str(Path(tmp) / "plan"), "survey"), survey.model_dump(mode="json")
            )
            count = len(plan.submodels)
            t0 = cpu()
            for _ in range(count):  # the baseline: what each submodel flow did
                SplitPlan.model_validate(storage.read_json(plan_url))
                Survey.model_validate(
                    storage.read_json(plan_file(plan_url.rsplit("/", 1)[0], "survey"))
                )
            baseline = cpu() - t0
            _cache.clear()
            t0 = cpu()
            for _ in range(count):
                load_plan_and_survey(plan_url)
            cached = cpu() - t0
        print(
            f"{n:>7} {count:>9} {baseline:>11.2f} {1000 * baseline / count:>10.1f} "
            f"{cached:>9.2f} {1000 * cached / count:>10.1f} {baseline / max(cached, 1e-9):>7.1f}x"
        )


if __name__ == "__main__":
    main()
