"""Orthophotos and DSMs read onto the seamlines' coarse grid (adapter: rasterio).

:func:`coarse_layers` resamples each submodel's orthophoto (average of the pixels in a cell) and
DSM (bilinear) onto one coarse grid in the merge's CRS; a cell has colour only where every
orthophoto pixel under it has data. :func:`seamlines_of` then computes the
:class:`.seamlines.OwnerLabels` that the orthophoto, DEM and point-cloud merges share.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import rasterio
from numpy.typing import NDArray
from rasterio.crs import CRS
from rasterio.enums import Resampling
from rasterio.transform import Affine
from rasterio.warp import reproject, transform_bounds

from prefect_odm.align.similarity import RasterCorrection
from prefect_odm.errors import MergeError
from prefect_odm.grid import Bounds, Grid, check_mosaic_size
from prefect_odm.merge.balance import GainOffset
from prefect_odm.merge.colour import colour_corrections
from prefect_odm.merge.seam_methods import LABEL_SEAM_METHODS, seam_method
from prefect_odm.merge.seamlines import CoarseLayers, OwnerLabels, SeamlineCost, least_cost_labels
from prefect_odm.merge.seams import SeamMethod
from prefect_odm.merge.sources import GridPlan, plan_grid
from prefect_odm.ownership import Ownership

DEFAULT_CELL_M = 0.5
"""Cell size of the owner-label grid, metres."""
FINE_FACTOR = 4
"""Colour pixels per cell side for the seamline cost's texture difference."""


def _bounds_in(path: Path, crs: CRS, fix: RasterCorrection | None = None) -> tuple[Bounds, CRS]:
    with rasterio.open(path) as ds:
        if ds.crs is None:
            raise MergeError(f"{path} has no CRS")
        if fix is None:
            return transform_bounds(ds.crs, crs, *ds.bounds), ds.crs
        t = ds.transform
        moved = Affine(*fix.corrected_geotransform((t.a, t.b, t.c, t.d, t.e, t.f)))
        corners = [moved @ (c, r) for c in (0, ds.width) for r in (0, ds.height)]
        xs, ys = [x for x, _ in corners], [y for _, y in corners]
        return (min(xs), min(ys), max(xs), max(ys)), ds.crs


def coarse_grid(
    paths: Mapping[str, Path],
    crs: CRS,
    cell_m: float,
    fixes: Mapping[str, RasterCorrection] | None = None,
) -> Grid:
    """The grid of ``cell_m`` cells covering every input (where ``fixes``, by the same keys,
    put them), corners on multiples of ``cell_m``.

    Raises:
        MergeError: the grid is far larger than the inputs
            (:func:`prefect_odm.grid.check_mosaic_size`), before any layer is allocated on it.
    """
    named = {k: _bounds_in(p, crs, (fixes or {}).get(k))[0] for k, p in paths.items()}
    boxes = list(named.values())
    left = math.floor(min(b[0] for b in boxes) / cell_m) * cell_m
    bottom = math.floor(min(b[1] for b in boxes) / cell_m) * cell_m
    right = math.ceil(max(b[2] for b in boxes) / cell_m) * cell_m
    top = math.ceil(max(b[3] for b in boxes) / cell_m) * cell_m
    grid = Grid(left, top, cell_m, round((right - left) / cell_m), round((top - bottom) / cell_m))
    check_mosaic_size(grid, named, "seamline")
    return grid


def _read(
    path: Path,
    grid: Grid,
    crs: CRS,
    bands: list[int],
    resampling: Resampling,
    fix: RasterCorrection | None = None,
) -> tuple[NDArray[np.float32], NDArray[np.bool_]]:
    """Bands of ``path`` on ``grid`` (float32) and where every source pixel has data.

    With ``fix`` (the alignment's correction, in ``crs``), the raster is read where the merge
    puts it: the grid is taken back through the inverse of the horizontal correction, so the one
    warp is the only resampling (as in :func:`.sources.plan_grid`).

    Raises:
        MergeError: the raster cannot be read, or is corrected but not in ``crs``.
    """
    out = np.zeros((len(bands), grid.height, grid.width), dtype=np.float32)
    cover = np.zeros((grid.height, grid.width), dtype=np.uint8)
    dst = grid.affine
    try:
        with rasterio.open(path) as ds:
            if fix is not None:
                if ds.crs != crs:
                    raise MergeError(
                        f"{path} is in {ds.crs}, not {crs}: its alignment correction cannot be "
                        "applied to the seamlines"
                    )
                (a, b, c), (d, e, f) = fix.inverse_affine()
                dst = Affine(a, b, c, d, e, f) @ grid.affine
            reproject(
                rasterio.band(ds, bands), out, dst_transform=dst, dst_crs=crs,
                resampling=resampling, num_threads=2,
            )  # fmt: skip
            mask = ds.dataset_mask()
            reproject(
                mask, cover, src_transform=ds.transform, src_crs=ds.crs, src_nodata=None,
                dst_transform=dst, dst_crs=crs, dst_nodata=0, resampling=Resampling.min,
            )  # fmt: skip
    except rasterio.errors.RasterioIOError as exc:
        raise MergeError(f"{path} cannot be read for seamlines: {exc}") from exc
    return out, cover > 0


def coarse_layers(
    crs: CRS,
    cell_m: float,
    orthophotos: Mapping[str, Path] | None = None,
    dsms: Mapping[str, Path] | None = None,
    alignment: Mapping[str, RasterCorrection] | None = None,
) -> CoarseLayers:
    """Each submodel's colour and heights on one coarse grid covering all inputs.

    Colours are read at ``cell_m / FINE_FACTOR`` (average resampling) and kept there as uint8
    for the texture difference of the seamline cost, and averaged to the cells.

    Args:
        crs: the merge's CRS.
        cell_m: cell size, metres.
        orthophotos: submodel id -> RGB(A) orthophoto, or None.
        dsms: submodel id -> DSM GeoTIFF, or None.
        alignment: submodel id -> the alignment's correction (in ``crs``): each product is
            read where the merge puts it, DSM heights corrected too (None: as they are).

    Raises:
        MergeError: no input, or an input that cannot be read or has no CRS; a corrected input
            not in ``crs``.
    """
    ortho, dsm = dict(orthophotos or {}), dict(dsms or {})
    fixes = dict(alignment or {})
    if not ortho and not dsm:
        raise MergeError("seamlines need orthophotos or DSMs")
    grid = coarse_grid(
        {
            **{f"{k} orthophoto": v for k, v in ortho.items()},
            **{f"{k} DSM": v for k, v in dsm.items()},
        },
        crs,
        cell_m,
        {
            **{f"{k} orthophoto": v for k, v in fixes.items()},
            **{f"{k} DSM": v for k, v in fixes.items()},
        },
    )
    f = FINE_FACTOR
    fine_grid = Grid(grid.left, grid.top, cell_m / f, grid.width * f, grid.height * f)
    rgb: dict[str, NDArray[np.float32]] = {}
    fine: dict[str, NDArray[np.uint8]] = {}
    for sid, path in sorted(ortho.items()):
        values, ok = _read(path, fine_grid, crs, [1, 2, 3], Resampling.average, fixes.get(sid))
        fine[sid] = np.clip(np.rint(values), 0, 255).astype(np.uint8)
        cells = values.reshape(3, grid.height, f, grid.width, f).mean(axis=(2, 4))
        full = ok.reshape(grid.height, f, grid.width, f).all(axis=(1, 3))
        cells[:, ~full] = np.nan
        rgb[sid] = cells.astype(np.float32)
    heights: dict[str, NDArray[np.float32]] = {}
    for sid, path in sorted(dsm.items()):
        fix = fixes.get(sid)
        values, ok = _read(path, grid, crs, [1], Resampling.bilinear, fix)
        if fix is not None:
            window = (0, 0, grid.height, grid.width)
            values = fix.heights_on_grid((grid.left, grid.top, cell_m), window, values, ok)
        heights[sid] = np.where(ok, values[0], np.float32(np.nan)).astype(np.float32)
    return CoarseLayers(grid=grid, rgb=rgb, dsm=heights, fine=fine, fine_factor=f)


def seamlines_of(
    ownership: Ownership,
    crs: CRS,
    *,
    orthophotos: Mapping[str, Path] | None = None,
    dsms: Mapping[str, Path] | None = None,
    cell_m: float = DEFAULT_CELL_M,
    weights: SeamlineCost | None = None,
    corrections: Mapping[str, GainOffset] | None = None,
    alignment: Mapping[str, RasterCorrection] | None = None,
) -> OwnerLabels:
    """The least-cost owner-label grid of a merge (:func:`.seamlines.least_cost_labels`).

    Args:
        ownership: the ownership rule, in ``crs``.
        crs: the merge's CRS.
        orthophotos, dsms: submodel id -> local GeoTIFF (either may be None, not both).
        cell_m: cell size of the label grid, metres.
        weights: cost weights; None for the defaults.
        corrections: each submodel's gain and offset (:mod:`.balance`), applied to its colours
            before the cut; with them the labels also carry colour offsets along the seams
            (:func:`.balance.seam_colour_offsets`). None: neither.
        alignment: submodel id -> the alignment's correction: the cut is made between the
            products where the merge puts them (:func:`coarse_layers`).

    Raises:
        MergeError: as :func:`coarse_layers`.
    """
    keep = set(ownership.submodel_ids)
    ortho = {k: v for k, v in (orthophotos or {}).items() if k in keep}
    dsm = {k: v for k, v in (dsms or {}).items() if k in keep}
    layers = coarse_layers(crs, cell_m, ortho, dsm, alignment)
    for sid, corr in (corrections or {}).items():
        if sid in layers.rgb:
            rgb = layers.rgb[sid]
            gain = np.asarray(corr.gain, dtype=np.float32)[:, None, None]
            offset = np.asarray(corr.offset, dtype=np.float32)[:, None, None]
            rgb *= gain
            rgb += offset
            fine = layers.fine[sid]
            fine[...] = np.clip(np.rint(fine * gain + offset), 0, 255).astype(np.uint8)
    return least_cost_labels(ownership, layers, weights, seam_colour=corrections is not None)


def seams_for(
    name: str,
    ownership: Ownership,
    plan: GridPlan,
    lattice_step_px: int,
    *,
    seamlines: OwnerLabels | None = None,
    orthophotos: Mapping[str, Path] | None = None,
    dsms: Mapping[str, Path] | None = None,
    corrections: Mapping[str, GainOffset] | None = None,
    alignment: Mapping[str, RasterCorrection] | None = None,
    compiled: bool = False,
) -> SeamMethod:
    """The seam method ``name`` of one raster merge (:func:`.seams.seam_method`).

    A label seam method (``least-cost``) follows ``seamlines`` when given (the merge's shared
    owner labels), else labels computed here from this merge's own inputs (with
    ``corrections`` and ``alignment``, see :func:`seamlines_of`); ``compiled``: see
    :class:`.seams.SeamField`.

    Raises:
        InputError: an unknown seam method.
        MergeError: as :func:`coarse_layers`.
    """
    if name in LABEL_SEAM_METHODS and seamlines is None:
        seamlines = seamlines_of(
            ownership, plan.crs, orthophotos=orthophotos, dsms=dsms, corrections=corrections,
            alignment=alignment,
        )  # fmt: skip
    return seam_method(
        name, ownership, plan.grid, lattice_step_px=lattice_step_px, seamlines=seamlines,
        compiled=compiled,
    )  # fmt: skip


def merge_seamlines(
    ownership: Ownership,
    *,
    orthophotos: Mapping[str, Path] | None,
    dsms: Mapping[str, Path] | None,
    crs_epsg: int | None,
    colour_balance: bool,
    alignment: Mapping[str, RasterCorrection] | None = None,
) -> OwnerLabels:
    """The owner labels one merge shares between its orthophoto, DEMs and point cloud.

    Computed from the orthophotos and DSMs together, in the CRS the raster merges use
    (``crs_epsg``, else the first input's by sorted id), each product where the alignment puts it
    (``alignment``: submodel id -> correction, as the merges apply it), the colours corrected by
    the same gains and offsets as the orthophoto merge (:func:`.colour.colour_corrections`) when
    ``colour_balance``.

    Raises:
        MergeError: no input, or one that cannot be read (see :func:`.sources.plan_grid`).
    """
    ortho, dsm = dict(orthophotos or {}), dict(dsms or {})
    first = ortho or dsm
    plan = plan_grid(
        first, resolution_m=None, crs_epsg=crs_epsg, value_bands=3 if ortho else 1,
        corrections={k: v for k, v in (alignment or {}).items() if k in first} or None,
    )  # fmt: skip
    corrections = colour_corrections(plan, colour_balance) if ortho and colour_balance else None
    return seamlines_of(
        ownership, plan.crs, orthophotos=ortho, dsms=dsm, corrections=corrections,
        alignment=alignment,
    )  # fmt: skip
