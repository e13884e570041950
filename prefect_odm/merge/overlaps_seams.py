"""The seams of corrected products, measured as the merge will show them (adapter: rasterio,
OpenCV), for the alignment's stage checks (:mod:`prefect_odm.align.stages`).

Per overlap of neighbouring submodels, for any set of corrections:

* the orthophotos: the feature matches of :mod:`.overlaps_matches`, found once on the
  orthophotos as they are, moved by each correction's affine, exactly as the merge's corrected
  geotransform moves every pixel: the median displacement and the median of its length;
* the DSMs: placed on one grid with the corrections (corrected geotransform, height plane and
  bowl added as read: :func:`.sources.plan_grid`) and sampled as the DEM merge samples its
  overlaps (:func:`.overlap_sampling.overlap_samples`, :func:`.overlap_sampling.dsm_seam`):
  for the corrections the merge applies, the DEM merge's own ``overlap_seams`` figures.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np

from prefect_odm.align.similarity import RasterCorrection
from prefect_odm.align.stage_records import DsmSeam, OrthoSeam, OverlapSeam
from prefect_odm.merge.overlap_sampling import dsm_seam, overlap_samples
from prefect_odm.merge.overlaps import OrthoShift
from prefect_odm.merge.overlaps_matches import (
    OverlapMatches,
    displacements,
    moved,
    orthophoto_matches,
)
from prefect_odm.merge.sources import plan_grid


def dsm_seams(
    dsms: Mapping[str, Path],
    corrections: Mapping[str, RasterCorrection] | None = None,
    *,
    crs_epsg: int | None = None,
) -> dict[str, DsmSeam]:
    """``"first|second"`` -> the two DSMs against each other as the DEM merge places them.

    Args:
        dsms: submodel id -> local DSM GeoTIFF.
        corrections: the alignment's raster corrections (None: the DSMs as they are).
        crs_epsg: the grid's CRS (None: the first input's), as the merge is given it.
    """
    from prefect_odm.merge.dem import has_measured_band

    if len(dsms) < 2:
        return {}
    measured = all(has_measured_band(Path(p)) for p in dsms.values())
    plan = plan_grid(
        dsms, resolution_m=None, crs_epsg=crs_epsg, value_bands=2 if measured else 1,
        corrections=corrections, correct_heights=True,
    )  # fmt: skip
    out: dict[str, DsmSeam] = {}
    for a, b, va, vb in overlap_samples(plan):
        seam = dsm_seam(va, vb, measured)
        if seam is not None:
            out[f"{a.submodel_id}|{b.submodel_id}"] = seam
    return out


def ortho_seam(
    matches: OverlapMatches, corrections: Mapping[str, RasterCorrection] | None = None
) -> OrthoSeam:
    """One overlap's orthophoto displacement after ``corrections`` (:func:`displacements`)."""
    d = displacements(matches, corrections)
    dx, dy = np.median(d, axis=0)
    return OrthoSeam(
        matches=len(d),
        shift_m=(float(dx), float(dy)),
        median_m=float(np.median(np.hypot(d[:, 0], d[:, 1]))),
    )


def matched_shifts(
    matches: list[OverlapMatches], corrections: Mapping[str, RasterCorrection] | None = None
) -> dict[tuple[str, str], OrthoShift]:
    """``(first, second)`` -> the median displacement of each overlap's matches after
    ``corrections``, as an :class:`.overlaps.OrthoShift` (``tiles``: the matches; ``xy``,
    ``dxy``: each match where the corrected first orthophoto has it, and its displacement)."""
    out = {}
    for m in matches:
        d = displacements(m, corrections)
        xy = moved(m, corrections)
        dx, dy = np.median(d, axis=0)
        out[(m.first, m.second)] = OrthoShift(m.first, m.second, float(dx), float(dy),
                                              len(m.xy_first), xy, d)  # fmt: skip
    return out


class SeamMeter:
    """Measures the seams of one set of products under any corrections.

    The orthophoto matches are found once, when the meter is made; each :meth:`measure` then
    moves them and samples the DSMs again.

    Args:
        dsms: submodel id -> local DSM (may be empty).
        orthophotos: submodel id -> local orthophoto (may be empty).
        crs_epsg: the plan CRS.

    Raises:
        MergeError: an input that cannot be read.
    """

    def __init__(
        self, dsms: Mapping[str, Path], orthophotos: Mapping[str, Path], crs_epsg: int | None
    ) -> None:
        """Find the orthophoto matches once (read here, so a bad input fails at once)."""
        self._dsms = dict(dsms)
        self._crs_epsg = crs_epsg
        self.matches = orthophoto_matches(orthophotos, crs_epsg=crs_epsg)

    def measure(
        self, corrections: Mapping[str, RasterCorrection] | None = None
    ) -> list[OverlapSeam]:
        """Every overlap's seam after ``corrections`` (None: the products as they are), sorted
        by overlap; a figure the overlap does not give (no DSM samples, too few matches) is
        None."""
        dsm = dsm_seams(self._dsms, corrections, crs_epsg=self._crs_epsg)
        ortho = {f"{m.first}|{m.second}": ortho_seam(m, corrections) for m in self.matches}
        out = []
        for key in sorted(set(dsm) | set(ortho)):
            first, second = key.split("|")
            out.append(OverlapSeam(overlap=key, first=first, second=second,
                                   orthophoto=ortho.get(key), dsm=dsm.get(key)))  # fmt: skip
        return out
