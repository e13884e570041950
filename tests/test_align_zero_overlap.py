"""brighton ``--split 8 --split-overlap-m 0``: two submodels that share no image, tied only by
their products. The height refinement once lowered both (-0.23 and -0.42 m) and left the merged
DSM 0.52 m below ODM's own cloud, lower than either submodel alone; the merge must keep the
absolute height of its inputs (issue: a new user's trial)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import laspy
import numpy as np
import pytest
import rasterio

pytestmark = pytest.mark.integration


def _signed_median_m(dsm_path: Path, reference: np.ndarray) -> float:
    """Median of the DSM's measured heights minus the mean height of ODM's cloud per cell, m."""
    from prefect_odm.registry import DSM_MEASURED_BAND, DSM_MEASURED_DESCRIPTION

    with rasterio.open(dsm_path) as ds:
        z = ds.read(1).astype(np.float64)
        z[z == ds.nodata] = np.nan
        if ds.count >= 2 and ds.descriptions[1] == DSM_MEASURED_DESCRIPTION:
            z[ds.read(DSM_MEASURED_BAND) != 1] = np.nan
        rows, cols = rasterio.transform.rowcol(ds.transform, reference[:, 0], reference[:, 1])
    rows, cols = np.asarray(rows), np.asarray(cols)
    inside = (rows >= 0) & (rows < z.shape[0]) & (cols >= 0) & (cols < z.shape[1])
    flat = rows[inside] * z.shape[1] + cols[inside]
    sums = np.bincount(flat, weights=reference[inside, 2], minlength=z.size)
    counts = np.bincount(flat, minlength=z.size)
    with np.errstate(invalid="ignore", divide="ignore"):
        odm = np.where(counts > 0, sums / np.maximum(counts, 1), np.nan).reshape(z.shape)
    diff = z - odm
    return float(np.nanmedian(diff))


@pytest.fixture(scope="module")
def zero_overlap_run(prefect_api, brighton_images, tmp_path_factory):
    os.environ["PREFECT_ODM_HOME"] = str(tmp_path_factory.mktemp("odm-home"))
    from prefect_odm.flows import reconstruct

    out = tmp_path_factory.mktemp("brighton-zero-overlap")
    manifest = reconstruct(images=str(brighton_images), output=str(out), split=8,
                           split_overlap_m=0)  # fmt: skip
    return manifest


def test_zero_overlap_merge_keeps_the_inputs_absolute_height(zero_overlap_run, data_dir):
    manifest = zero_overlap_run
    las = laspy.read(data_dir / "brighton_beach_1600" / "reference" / "model.laz")
    reference = np.column_stack([las.x, las.y, las.z])
    survey = Path(manifest.products["dsm"]).parents[1]
    alone = [_signed_median_m(p, reference) for p in sorted(survey.glob("submodels/*/dsm.tif"))]
    merged = _signed_median_m(Path(manifest.products["dsm"]), reference)
    assert len(alone) == 2
    # measured: the submodels -0.27 and -0.08 m, the merge -0.18 m (before the fix -0.52 m)
    assert min(alone) - 0.05 <= merged <= max(alone) + 0.05, (alone, merged)
    refinement = json.loads((survey / "manifest.json").read_text())["alignment"]["refinement"]
    z = [t["translation_m"][2] for t in refinement["transforms"]]
    w = [t["n_samples"] for t in refinement["transforms"]]
    assert abs(np.average(z, weights=w)) <= 0.05, z  # before: -0.23 and -0.42 m
