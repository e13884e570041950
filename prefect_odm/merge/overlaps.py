"""What neighbouring submodels' rasters say about each other in their overlaps (adapter: rasterio,
OpenCV).

For the alignment between submodels without cameras (:func:`prefect_odm.align.align_heights`)
and for the figures that judge an alignment:

* :func:`dem_overlaps`: DSM height differences ``z_second - z_first`` sampled on a lattice in
  each overlap (positions in the plan CRS), with, when orthophotos are given, the orthophoto
  shift between the two from :func:`ortho_shifts`;
* :func:`ortho_shifts`: the horizontal offset of the second orthophoto against the first in each
  overlap, by phase correlation (``cv2.phaseCorrelate``, C. D. Kuglin and D. C. Hines, "The phase
  correlation image alignment method", 1975) on grey tiles of about ``tile_m`` metres where both
  have data, the median over the tiles whose correlation peak is clear;
* :func:`ground_heights`: each DSM's median height, the height at which a raster's horizontal
  correction is exact.

Inputs are placed on one grid as the merges place them (:func:`.sources.plan_grid`, with the same
``corrections``), so the figures after alignment are measured on what the merge will read.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import cv2
import numpy as np
from numpy.typing import NDArray
from rasterio.enums import Resampling

from prefect_odm.align.height_tilt import DemOverlap, after_shifts, align_heights
from prefect_odm.align.planar import HorizontalOffsets, align_horizontal
from prefect_odm.align.report import AlignmentOptions, AlignmentResult
from prefect_odm.align.similarity import RasterCorrection
from prefect_odm.merge.overlap_sampling import overlap_pairs
from prefect_odm.merge.sources import (
    GridPlan,
    RasterSource,
    SourceReader,
    Window4,
    plan_grid,
)

FloatArray = NDArray[np.float64]

MAX_DEM_SAMPLES = 20_000
"""Largest number of DSM samples taken from one overlap."""
MIN_PEAK_RESPONSE = 0.05
"""A phase-correlation tile counts only when its peak response is above this (0..1)."""
MIN_TILE_VALID = 0.9
"""A tile counts only where both orthophotos have data on this share of its pixels."""
MIN_SHIFT_TILES = 3
"""An overlap's shift is the median over its clear tiles, and is given only from this many: the
median of two is their mean, which one wrong peak moves. On the synthetic slope two submodels
touching at a corner had two tiles, (1.08, -1.21) and (-9.84, 16.46) pixels; their mean, about
1 m, was a shift no rigid correction could meet, 1.3 m rms over the 1 m overlap gate, where the
orthophotos against the rendered truth were 0.27 m apart."""
PREDICT_PIXEL_M = 0.1
"""Pixel size the solve's phase correlation reads at (decimated, nearest), metres."""
MATCHED_SHIFT_M = 2.5
"""An overlap whose orthophotos feature matches put farther apart than this (metres) takes their
offset in the solve: an eighth of :data:`ALIGN_TILE_M`, where a tile's content is a quarter
away from its neighbour's and wrong peaks begin (a peak counts up to a quarter of the tile)."""
ALIGN_TILE_M = 20.0
"""Tile side of the orthophoto shifts the alignment solves from, metres (more tiles than the
50 m the figures use: narrow overlaps then still give several)."""


@dataclass(frozen=True)
class OrthoShift:
    """The second orthophoto's horizontal offset against the first in one overlap.

    Attributes:
        first, second: submodel ids (sorted).
        dx_m, dy_m: the median offset over the tiles, plan CRS metres (east, north).
        magnitude_m: ``hypot(dx_m, dy_m)``.
        tiles: tiles whose correlation counted.
        xy, dxy: the offsets it is the median of, ``(n, 2)`` each, where measured (plan CRS
            metres) and how far (tiles at their centres, or feature matches), or None.
    """

    first: str
    second: str
    dx_m: float
    dy_m: float
    tiles: int
    xy: FloatArray | None = field(default=None, compare=False, repr=False)
    dxy: FloatArray | None = field(default=None, compare=False, repr=False)

    @property
    def magnitude_m(self) -> float:
        """Length of the offset, metres."""
        return float(np.hypot(self.dx_m, self.dy_m))


def _cell_xy(plan: GridPlan, window: Window4, shape: tuple[int, int]) -> tuple[FloatArray, ...]:
    """Plan-CRS centres of the cells of ``window`` read at ``shape``: ``(x, y)``, each ``shape``."""
    g = plan.grid
    step_r, step_c = window[2] / shape[0], window[3] / shape[1]
    xs = g.left + (window[1] + (np.arange(shape[1]) + 0.5) * step_c) * g.resolution_m
    ys = g.top - (window[0] + (np.arange(shape[0]) + 0.5) * step_r) * g.resolution_m
    gx, gy = np.meshgrid(xs, ys)
    return gx, gy


def ground_heights(dsms: Mapping[str, Path]) -> dict[str, float]:
    """Submodel id -> median DSM height (metres), read decimated to at most 512 px a side."""
    return ground_heights_and_relief(dsms)[0]


def ground_heights_and_relief(
    dsms: Mapping[str, Path],
) -> tuple[dict[str, float], dict[str, float]]:
    """Submodel id -> median DSM height, and -> the larger distance from it to the 2nd and 98th
    height percentiles (metres), read decimated to at most 512 px a side."""
    plan = plan_grid(dsms, resolution_m=None, crs_epsg=None, value_bands=1)
    reader = SourceReader(plan, Resampling.nearest)
    heights: dict[str, float] = {}
    relief: dict[str, float] = {}
    try:
        for src in plan.sources:
            f = max(1, -(-max(src.height, src.width) // 512))
            shape = (max(1, src.height // f), max(1, src.width // f))
            values, valid = reader.read(src, src.window, out_shape=shape)
            if valid.any():
                mid = float(np.median(values[0][valid]))
                low, high = np.percentile(values[0][valid], [2, 98])
                heights[src.submodel_id] = mid
                relief[src.submodel_id] = float(max(mid - low, high - mid))
    finally:
        reader.close()
    return heights, relief


def dem_overlaps(
    dsms: Mapping[str, Path],
    *,
    corrections: Mapping[str, RasterCorrection] | None = None,
    shifts: Mapping[tuple[str, str], OrthoShift] | None = None,
    crs_epsg: int | None = None,
) -> list[DemOverlap]:
    """DSM differences ``z_second - z_first`` on a lattice in each overlap (sorted ids).

    Args:
        dsms: submodel id -> local DSM GeoTIFF.
        corrections: the alignment's corrections, applied as the DEM merge applies them.
        shifts: orthophoto offsets per ``(first, second)``; each overlap's samples carry its
            offset as ``dxy`` (so :func:`~prefect_odm.align.align_heights` also solves shifts).
        crs_epsg: the grid's CRS (None: the first input's).

    Returns:
        one :class:`DemOverlap` per overlapping pair with common data (at most
        :data:`MAX_DEM_SAMPLES` samples each).
    """
    from prefect_odm.merge.dem import has_measured_band

    # DSMs with the measured band are compared on measured cells only: gap-filled heights
    # (interpolated across a lake or a forest) differ between submodels by construction
    measured = all(has_measured_band(Path(p)) for p in dsms.values())
    plan = plan_grid(
        dsms, resolution_m=None, crs_epsg=crs_epsg, value_bands=2 if measured else 1,
        corrections=corrections, correct_heights=True,
    )  # fmt: skip
    reader = SourceReader(plan, Resampling.nearest)
    out: list[DemOverlap] = []
    try:
        for a, b, win in overlap_pairs(plan):
            f = max(1, int(np.ceil(np.sqrt(win[2] * win[3] / MAX_DEM_SAMPLES))))
            shape = (max(1, win[2] // f), max(1, win[3] // f))
            va, ma = reader.read(a, win, out_shape=shape)
            vb, mb = reader.read(b, win, out_shape=shape)
            both = ma & mb
            if measured:
                both &= (va[1] == 1) & (vb[1] == 1)
            if not both.any():
                continue
            gx, gy = _cell_xy(plan, win, shape)
            shift = (shifts or {}).get((a.submodel_id, b.submodel_id))
            n = int(both.sum())
            dxy = None if shift is None else np.tile([shift.dx_m, shift.dy_m], (n, 1))
            dz = (vb[0][both] - va[0][both]).astype(np.float64)
            out.append(DemOverlap(a.submodel_id, b.submodel_id, gx[both], gy[both], dz, dxy))
    finally:
        reader.close()
    return out


def _tile_shifts(
    reader: SourceReader,
    pair: tuple[RasterSource, RasterSource],
    win: Window4,
    tile_px: int,
    factor: int,
) -> list[tuple[float, float, float, float]]:
    """Phase-correlation offsets of every clear tile of ``win``: ``(cols, rows)`` in grid pixels
    and the tile centre's ``(row, col)`` on the grid.

    Each source is read once over the whole overlap window (decimated ``factor`` times, nearest;
    ``tile_px`` counts decimated pixels), then cut into tiles.
    """
    a, b = pair
    shape = (win[2] // factor, win[3] // factor)
    va, ma = reader.read(a, win, out_shape=shape if factor > 1 else None)
    vb, mb = reader.read(b, win, out_shape=shape if factor > 1 else None)
    ga, gb, both = va[:3].mean(axis=0), vb[:3].mean(axis=0), ma & mb
    hann = cv2.createHanningWindow((tile_px, tile_px), cv2.CV_32F)
    found: list[tuple[float, float, float, float]] = []
    for r in range(0, shape[0] - tile_px + 1, tile_px):
        for c in range(0, shape[1] - tile_px + 1, tile_px):
            sl = (slice(r, r + tile_px), slice(c, c + tile_px))
            if both[sl].mean() < MIN_TILE_VALID:
                continue
            ta, tb = ga[sl] - ga[sl].mean(), gb[sl] - gb[sl].mean()
            (dc, dr), response = cv2.phaseCorrelate(ta, tb, window=hann)
            if response >= MIN_PEAK_RESPONSE and max(abs(dc), abs(dr)) < tile_px / 4:
                centre = (win[0] + (r + tile_px / 2) * factor, win[1] + (c + tile_px / 2) * factor)
                found.append((float(dc) * factor, float(dr) * factor, *centre))
    return found


def ortho_shifts(
    orthophotos: Mapping[str, Path],
    *,
    corrections: Mapping[str, RasterCorrection] | None = None,
    tile_m: float = 50.0,
    crs_epsg: int | None = None,
    predict: bool = False,
) -> dict[tuple[str, str], OrthoShift]:
    """The second orthophoto's offset against the first in each overlap, by phase correlation.

    Args:
        orthophotos: submodel id -> local RGB(A) GeoTIFF.
        corrections: the alignment's corrections, applied as the orthophoto merge applies them.
        tile_m: tile side, metres (smaller when the overlap is narrower; at least 64 pixels).
        crs_epsg: the grid's CRS (None: the first input's).
        predict: measure on the uncorrected orthophotos (no warp: several times faster) and add
            each tile's difference of the two corrections at its centre, ``C_b(x) - C_a(x)``
            (exact to first order in the corrections' linear part; for the solve), on pixels of
            about :data:`PREDICT_PIXEL_M`. False:
            measure on the warped, corrected orthophotos (for the figures).

    Returns:
        ``(first, second)`` -> :class:`OrthoShift`, for the overlaps with at least
        :data:`MIN_SHIFT_TILES` clear tiles.
    """
    fixes = dict(corrections or {})
    plan = plan_grid(
        orthophotos, resolution_m=None, crs_epsg=crs_epsg, value_bands=3,
        corrections=None if predict else fixes,
    )  # fmt: skip
    res = plan.grid.resolution_m
    # Submodels' orthophotos differ in resolution, so all but one are warped onto the grid. The
    # solve's measure warps with nearest: 3.5x cheaper than bilinear, and its sub-pixel jitter
    # averages out over a tile (the phase correlation's peak is the mean shift).
    reader = SourceReader(plan, Resampling.nearest if predict else Resampling.bilinear)
    out: dict[tuple[str, str], OrthoShift] = {}
    try:
        for a, b, win in overlap_pairs(plan):
            factor = max(1, int(PREDICT_PIXEL_M / res)) if predict else 1
            tile_px = int(min(tile_m / res, win[2], win[3])) // factor
            if tile_px < 64:
                continue
            found = _tile_shifts(reader, (a, b), win, tile_px, factor)
            if len(found) >= MIN_SHIFT_TILES:
                key = (a.submodel_id, b.submodel_id)
                t = np.array(found)
                dxy = np.stack([t[:, 0] * res, -t[:, 1] * res], axis=1)
                if predict:
                    x = plan.grid.left + t[:, 3] * res
                    y = plan.grid.top - t[:, 2] * res
                    dxy += _moved(fixes.get(key[1]), x, y) - _moved(fixes.get(key[0]), x, y)
                dx, dy = np.median(dxy, axis=0)
                xy = np.stack([plan.grid.left + t[:, 3] * res, plan.grid.top - t[:, 2] * res], 1)
                if predict:  # where the corrected first orthophoto has each tile's centre
                    xy += _moved(fixes.get(key[0]), xy[:, 0], xy[:, 1])
                out[key] = OrthoShift(*key, float(dx), float(dy), len(found), xy, dxy)
    finally:
        reader.close()
    return out


def _moved(fix: RasterCorrection | None, x: FloatArray, y: FloatArray) -> FloatArray:
    """Horizontal displacement ``(n, 2)`` of points ``x, y`` by ``fix`` (zeros without one)."""
    if fix is None:
        return np.zeros((len(x), 2))
    (a, b, c), (d, e, f) = fix.affine
    return np.stack([a * x + b * y + c - x, d * x + e * y + f - y], axis=1)


def dsm_disagreement_p90_m(overlaps: list[DemOverlap]) -> dict[str, float]:
    """``"first|second"`` -> 90th percentile of ``|z_second - z_first|`` in the overlap, metres."""
    return {f"{o.first}|{o.second}": float(np.percentile(np.abs(o.dz), 90)) for o in overlaps}


def align_from_products(
    dsms: Mapping[str, Path],
    orthophotos: Mapping[str, Path],
    options: AlignmentOptions,
    *,
    corrections: Mapping[str, RasterCorrection] | None = None,
    crs_epsg: int | None = None,
    matched: Mapping[tuple[str, str], OrthoShift] | None = None,
) -> AlignmentResult:
    """Height, tilt and shift per submodel from its products alone (no cameras).

    The orthophoto offsets in the overlaps (:func:`ortho_shifts`) give the shifts and the DSM
    differences (:func:`dem_overlaps`) the height planes, solved jointly by
    :func:`~prefect_odm.align.align_heights`. Without DSMs, only the shifts (as height-free
    samples at the overlap centres). Feature matches (``matched``) give the offset of an
    overlap without three clear tiles; where they put one beyond :data:`MATCHED_SHIFT_M`,
    farther than the tiles see, the products are first shifted by them (:func:`_far_apart`).

    Args:
        dsms: submodel id -> local DSM (may be empty).
        orthophotos: submodel id -> local orthophoto (may be empty).
        options: the solver settings.
        corrections: corrections already solved (from the cameras): the products are measured
            with them applied, so the result refines them.
        crs_epsg: the grid's CRS.
        matched: ``(first, second)`` -> the offset feature matches measure after
            ``corrections`` (:func:`.overlaps_seams.matched_shifts`), or None.

    Raises:
        ValueError: fewer than two submodels with a DSM or an orthophoto.
    """
    ids = sorted(set(dsms) | set(orthophotos))
    if len(ids) < 2:
        raise ValueError("alignment from products needs two submodels with a DSM or orthophoto")
    fix = corrections
    shifts = (
        ortho_shifts(
            orthophotos, corrections=fix, tile_m=ALIGN_TILE_M, crs_epsg=crs_epsg, predict=True
        )
        if len(orthophotos) > 1
        else {}
    )
    if any(s.magnitude_m > MATCHED_SHIFT_M for s in (matched or {}).values()):
        return _far_apart(dsms, orthophotos, options, corrections, crs_epsg, matched or {})
    offsets = _offsets(shifts, matched or {})
    if offsets:
        return _in_plane_then_heights(ids, dsms, orthophotos, options, fix, crs_epsg, offsets)
    # an overlap too narrow for three clear tiles takes the matches' offset
    shifts = {**(matched or {}), **shifts}
    if len(dsms) > 1:
        overlaps = dem_overlaps(dsms, corrections=fix, shifts=shifts, crs_epsg=crs_epsg)
        centres = _centres(dsms, crs_epsg)
    else:
        centres = _centres(orthophotos, crs_epsg)
        overlaps = [_shift_only(s, centres) for s in shifts.values()]
    return align_heights(ids, np.array([centres[sid] for sid in ids]), overlaps, options)


OFFSETS_FROM = "tiles"
"""Which offsets of an overlap the similarity in the plane is solved from: ``tiles`` (the
phase-correlation tiles at their centres, 4-7 per 10 m brighton overlap, and the feature
matches where there are fewer than three tiles) or ``matches`` (the matches first). On brighton
``--split 6 --split-overlap-m 10`` the matches, about a hundred per overlap and many on roofs,
cars and bushes, leave the tiles 0.03-0.11 m apart but ask one submodel for a 2.5 % scale change
(over the 2 % gate) once the camera step is not applied; the tiles leave 0.03-0.11 m with 1.4 %."""


def _offsets(
    tiles: Mapping[tuple[str, str], OrthoShift], matched: Mapping[tuple[str, str], OrthoShift]
) -> list[HorizontalOffsets]:
    """Each overlap's point-wise offsets (:data:`OFFSETS_FROM`), for those that have them."""
    first, then = (matched, tiles) if OFFSETS_FROM == "matches" else (tiles, matched)
    out = []
    for key in sorted(set(tiles) | set(matched)):
        shift = first.get(key) or then.get(key)
        if shift is not None and shift.xy is not None and shift.dxy is not None:
            out.append(HorizontalOffsets(*key, shift.xy, shift.dxy))
    return out


def _in_plane_then_heights(
    ids: list[str],
    dsms: Mapping[str, Path],
    orthophotos: Mapping[str, Path],
    options: AlignmentOptions,
    corrections: Mapping[str, RasterCorrection] | None,
    crs_epsg: int | None,
    offsets: list[HorizontalOffsets],
) -> AlignmentResult:
    """A similarity in the plane per submodel from the point-wise ``offsets``
    (:func:`~prefect_odm.align.planar.align_horizontal`), then the height planes (and bowls)
    from the DSMs so moved, written as one correction (:func:`after_shifts`)."""
    centres = _centres(dsms if len(dsms) > 1 else orthophotos, crs_epsg)
    xy = np.array([centres[sid] for sid in ids])
    first = align_horizontal(ids, xy, offsets, options)
    if len(dsms) < 2:
        return first
    fix = dict(corrections or {})
    moved = {}
    for t in first.transforms:
        step = t.raster_correction(0.0)
        moved[t.submodel_id] = fix[t.submodel_id].then(step) if t.submodel_id in fix else step
    overlaps = dem_overlaps(dsms, corrections=moved, crs_epsg=crs_epsg)
    return after_shifts(first, align_heights(ids, xy, overlaps, options))


def _far_apart(
    dsms: Mapping[str, Path],
    orthophotos: Mapping[str, Path],
    options: AlignmentOptions,
    corrections: Mapping[str, RasterCorrection] | None,
    crs_epsg: int | None,
    matched: Mapping[tuple[str, str], OrthoShift],
) -> AlignmentResult:
    """Products feature matches put farther apart than the tiles see: first the shifts the
    matches give, then :func:`align_from_products` on the products so shifted (DSM samples
    and tiles where the ground is the same), written as one correction."""
    ids = sorted(set(dsms) | set(orthophotos))
    centres = _centres(orthophotos, crs_epsg)
    flat = options.model_copy(update={"refine_bowl": False})
    first = align_heights(ids, np.array([centres[sid] for sid in ids]),
                          [_shift_only(s, centres) for s in matched.values()], flat)  # fmt: skip
    fix = dict(corrections or {})
    moved = {}
    for t in first.transforms:
        step = t.raster_correction(0.0)
        moved[t.submodel_id] = fix[t.submodel_id].then(step) if t.submodel_id in fix else step
    second = align_from_products(dsms, orthophotos, options, corrections=moved, crs_epsg=crs_epsg)
    return after_shifts(first, second)


def _shift_only(shift: OrthoShift, centres: Mapping[str, tuple[float, float]]) -> DemOverlap:
    """One sample at the midpoint of the two centres: no height difference, the offset."""
    (x1, y1), (x2, y2) = centres[shift.first], centres[shift.second]
    one = np.ones(1)
    return DemOverlap(
        shift.first, shift.second, one * (x1 + x2) / 2, one * (y1 + y2) / 2, one * 0.0,
        np.array([[shift.dx_m, shift.dy_m]]),
    )  # fmt: skip


def _centres(rasters: Mapping[str, Path], crs_epsg: int | None) -> dict[str, tuple[float, float]]:
    """Submodel id -> centre of its raster's bounds on the grid, plan CRS metres."""
    plan = plan_grid(rasters, resolution_m=None, crs_epsg=crs_epsg, value_bands=1)
    out: dict[str, tuple[float, float]] = {}
    for src in plan.sources:
        left, bottom, right, top = src.grid.bounds
        out[src.submodel_id] = ((left + right) / 2, (bottom + top) / 2)
    return out
