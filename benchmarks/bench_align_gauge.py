"""The alignment of a finished run as the merge builds it, its applied seams and each block's
height change at the submodels' own centres
(``python benchmarks/bench_align_gauge.py OUT/<survey>``).

Run it once with this checkout and once with another on ``PYTHONPATH`` (e.g. ``git archive``
of the commit before) to compare two solvers on the same products, in the same process tree:
per overlap the seam of the last applied stage (orthophoto median displacement, DSM median
and p90 of ``|dz|``), per submodel the refinement's height change at its centre and tilt, the
refinement's sample-weighted mean height change, and what the solve says it did not solve.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from align_perturb import products_of, submodel_folders  # noqa: E402

from prefect_odm.models import MergeOptions, SplitPlan  # noqa: E402


def main() -> None:
    from prefect_odm.tasks.align import build_alignment

    import prefect_odm

    survey = Path(sys.argv[1])
    plan = SplitPlan.model_validate_json((survey / "plan" / "plan.json").read_text())
    gps = {c.name: (c.x_m, c.y_m, c.z_m) for c in plan.cameras if c.z_m is not None}
    products, shots = products_of(submodel_folders(survey))
    started = time.process_time()
    report = build_alignment(products, shots, MergeOptions(accept_alignment=True), gps,
                             plan.crs_epsg)  # fmt: skip
    cpu = time.process_time() - started
    assert report is not None
    print(f"code: {Path(prefect_odm.__file__).parent}; alignment {cpu:.1f} CPU s")
    final = report.final_stage()
    print(f"applied: {[s.stage for s in report.stages if s.applied]}; gates failed: "
          f"{len(report.failures)}")  # fmt: skip
    for seam in final.seams if final is not None else []:
        o, d = seam.orthophoto, seam.dsm
        ortho = f"orthophoto {o.median_m:.3f} m" if o is not None else "orthophoto -"
        dsm = f"DSM {d.median_m:+.3f} / p90 {d.p90_m:.3f} m" if d is not None else "DSM -"
        print(f"  {seam.overlap}: {ortho}, {dsm}")
    refinement = report.refinement
    if refinement is None:
        return
    z = np.array([t.translation_m[2] for t in refinement.transforms])
    w = np.array([t.n_samples for t in refinement.transforms], dtype=float)
    for t in refinement.transforms:
        print(f"  refinement {t.submodel_id}: {t.translation_m[2]:+.3f} m at its centre, tilt "
              f"{t.tilt_deg:.3f} deg")  # fmt: skip
    print(f"  refinement mean height change at the centres: {np.average(z, weights=w):+.3f} m")
    for line in getattr(refinement, "unsolved", []):
        print(f"  not solved: {line}")


if __name__ == "__main__":
    main()
