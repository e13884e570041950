"""Figures of the built-in engine's dense products against ODM's own cloud of brighton.

Shared by ``tests/engine/test_dense.py`` (thresholds) and ``benchmarks/bench_engine.py``
(printed figures, PNGs). The reference is ``brighton_beach_1600/reference/model.laz``
(OpenDroneMap from the full-resolution images, EPSG:32615).

* DSM |dz|: our DSM minus the mean reference height per DSM cell, over the cells both have
  (absolute: no plane removed; the plane fitted to dz is reported apart as the tilt).
* Measured share: cells of the orthophoto footprint (alpha > 0) that hold a dense point (not a
  gap-filled height); also of the reference's footprint (cells holding reference points).
* ODM's crop area: what ODM's ``crop`` (default 3 m) keeps of a cloud, after
  ``opendm/cropper.py`` ``create_bounds_geojson``: every 90th point (ODM's decimation for an
  OpenMVS cloud under 1,000 images), the occupied 1 m cells (PDAL's 1 m hexbin there), their
  convex hull shrunk by crop + 3 m and grown by 3 m. Reported: the share of the area ODM's crop
  keeps of ODM's cloud that ODM's cloud measures (the reference's own figure) and that ours
  measures, and the share of the area the crop would keep of ours that ours measures.
* Density: dense points per m² of the orthophoto footprint, and the share with a colour.
* Steep surface where nothing is measured: the share of the orthophoto footprint's DSM-nodata
  cells where the surface the orthophoto is projected on (``odm_dem/engine_surface.tif``, the
  interpolation through the gaps) is steeper than ``STEEP_DEG``: steep faces there are not
  measured, and the orthophoto smears the images along them.
* Object heights: DSM minus DTM (each from its own ground filter, so georeferencing offsets
  cancel) in the cells where ODM's DSM stands more than 1 m above its ground: the median of
  ours over the median of ODM's; also for the largest such object alone (the pavilion).
* DTM |dz|: our DTM, less the DSM's signed median offset, against the same ground filter run on
  ODM's cloud, over the cells both have: the median.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import laspy
import numpy as np
import rasterio
from rasterio.enums import Resampling

from prefect_odm.engine import ground
from prefect_odm.engine.pipeline_options import SPECS
from prefect_odm.registry import DSM_MEASURED_BAND, DSM_MEASURED_DESCRIPTION

DATA = Path(__file__).resolve().parents[2] / ".." / "shared" / "data"
REFERENCE = DATA / "brighton_beach_1600" / "reference" / "model.laz"
OBJECT_MIN_HEIGHT_M = 1.0
STEEP_DEG = 60.0
ODM_CROP_M = 3.0  # ODM's default ``crop``
ODM_CROP_DECIMATION = 90  # ODM's odm_georeferencing, an OpenMVS cloud of under 1,000 images
ODM_BUFFER_SMOOTH_M = 3.0  # BUFFER_SMOOTH_DISTANCE in opendm/cropper.py


@dataclass(frozen=True)
class DenseFigures:
    """The figures of one run (see the module docstring); heights in metres."""

    dsm_median_abs_m: float
    dsm_p90_abs_m: float
    dsm_median_signed_m: float
    tilt_deg: float
    plane_removed_median_abs_m: float
    measured_share_of_orthophoto: float
    measured_share_of_reference: float
    reference_measured_share_of_its_crop: float
    measured_share_of_reference_crop: float
    measured_share_of_our_crop: float
    points_per_m2: float
    coloured_share: float
    steep_share_of_unmeasured: float
    object_height_ratio: float
    object_cells: int
    largest_object_ratio: float
    largest_object_cells: int
    dtm_median_abs_m: float

    def lines(self) -> list[str]:
        """The figures as printable lines."""
        return [
            f"DSM |dz| vs ODM: median {self.dsm_median_abs_m:.2f} m, p90 {self.dsm_p90_abs_m:.2f}"
            f" m (signed median {self.dsm_median_signed_m:+.2f} m, tilt {self.tilt_deg:.2f} deg;"
            f" plane removed: median {self.plane_removed_median_abs_m:.2f} m)",
            f"measured heights: {100 * self.measured_share_of_orthophoto:.0f}% of the orthophoto"
            f" footprint, {100 * self.measured_share_of_reference:.0f}% of ODM's cloud footprint;"
            f" of the area ODM's crop keeps of its cloud: ODM's cloud"
            f" {100 * self.reference_measured_share_of_its_crop:.0f}%, ours"
            f" {100 * self.measured_share_of_reference_crop:.0f}%; of the area it would keep of"
            f" ours: {100 * self.measured_share_of_our_crop:.0f}%",
            f"dense cloud: {self.points_per_m2:.0f} points/m2 over the orthophoto footprint,"
            f" {100 * self.coloured_share:.0f}% coloured",
            f"orthophoto surface where the DSM has no height: {100 * self.steep_share_of_unmeasured:.1f}%"
            f" steeper than {STEEP_DEG:g} deg",
            f"object heights (DSM - DTM where ODM's > {OBJECT_MIN_HEIGHT_M:g} m, "
            f"{self.object_cells} cells): {100 * self.object_height_ratio:.0f}% of ODM's; the"
            f" largest object ({self.largest_object_cells} cells):"
            f" {100 * self.largest_object_ratio:.0f}%",
            f"DTM |dz| vs ODM's ground (DSM offset removed): median {self.dtm_median_abs_m:.2f} m",
        ]


def points_of(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """``(xyz (n, 3) float64, rgb (n, 3) float64)`` of a LAS/LAZ file."""
    las = laspy.read(path)
    xyz = np.column_stack([las.x, las.y, las.z])
    rgb = np.column_stack([las.red, las.green, las.blue]).astype(np.float64)
    return xyz, rgb


def rasterise(
    xyz: np.ndarray, transform: rasterio.Affine, shape: tuple[int, int]
) -> tuple[np.ndarray, np.ndarray]:
    """``(mean z per cell (NaN where empty), points per cell)``."""
    col = np.floor((xyz[:, 0] - transform.c) / transform.a).astype(np.int64)
    row = np.floor((xyz[:, 1] - transform.f) / transform.e).astype(np.int64)
    ok = (col >= 0) & (col < shape[1]) & (row >= 0) & (row < shape[0])
    index = row[ok] * shape[1] + col[ok]
    counts = np.bincount(index, minlength=shape[0] * shape[1])
    sums = np.bincount(index, weights=xyz[ok, 2], minlength=shape[0] * shape[1])
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)
    return mean.reshape(shape), counts.reshape(shape)


def odm_crop_area(
    xyz: np.ndarray,
    transform: rasterio.Affine,
    shape: tuple[int, int],
    crop_m: float = ODM_CROP_M,
    decimation_step: int = ODM_CROP_DECIMATION,
) -> np.ndarray:
    """The cells of the grid ``(transform, shape)`` inside the area ODM's ``crop`` keeps of the
    cloud ``xyz`` (module docstring), ``(rows, cols)`` bool."""
    from rasterio.features import rasterize
    from shapely.geometry import MultiPoint

    cells = np.unique(np.floor(xyz[::decimation_step, :2]), axis=0)
    corners = np.concatenate([cells + offset for offset in ((0, 0), (1, 0), (0, 1), (1, 1))])
    hull = MultiPoint(corners).convex_hull
    smoothed = hull.buffer(-(crop_m + ODM_BUFFER_SMOOTH_M)).buffer(ODM_BUFFER_SMOOTH_M)
    area = smoothed if smoothed.area > 0 else hull  # ODM keeps the hull when the crop eats it
    return rasterize([area], out_shape=shape, transform=transform).astype(bool)


def _steep_share(task: Path, cells: np.ndarray) -> float:
    """Share of ``cells`` (on the DSM grid) where the orthophoto's surface is steeper than
    :data:`STEEP_DEG`."""
    with rasterio.open(task / "odm_dem" / "engine_surface.tif") as src:
        surface = src.read(1, out_shape=cells.shape, resampling=Resampling.bilinear)
        res_m = src.res[0] * src.width / cells.shape[1]
    gy, gx = np.gradient(surface.astype(np.float64), res_m)
    steep = np.degrees(np.arctan(np.hypot(gx, gy))) > STEEP_DEG
    return float(steep[cells].mean()) if cells.any() else 0.0


DEM_GAPFILL_STEPS = int(SPECS["dem-gapfill-steps"]["value"])
"""The engine's default ``dem-gapfill-steps`` (the runs measured here use the default)."""


def _read(path: Path, measured_only: bool = False) -> tuple[np.ndarray, rasterio.Affine]:
    """Band 1 with nodata as NaN; ``measured_only``: also NaN where the DSM's measured band
    (``registry.DSM_MEASURED_BAND``, when it has one) says the height was gap-filled."""
    with rasterio.open(path) as src:
        data = src.read(1).astype(np.float64)
        data = np.where(data == src.nodata, np.nan, data)
        if measured_only and src.count >= 2 and src.descriptions[1] == DSM_MEASURED_DESCRIPTION:
            data = np.where(src.read(DSM_MEASURED_BAND) == 1, data, np.nan)
        return data, src.transform


def _tilt(diff: np.ndarray, valid: np.ndarray, res_m: float) -> tuple[float, float]:
    """(tilt of the plane fitted to ``diff`` in degrees, median |residual| after removing it)."""
    rows, cols = np.nonzero(valid)
    d = diff[valid]
    a = np.column_stack([cols * res_m, rows * res_m, np.ones_like(d)])
    coef = np.linalg.lstsq(a, d, rcond=None)[0]
    return float(np.degrees(np.arctan(np.hypot(*coef[:2])))), float(np.median(np.abs(d - a @ coef)))


def _reference_dtm(reference: np.ndarray, res_m: float) -> np.ndarray:
    """ODM's ground: the same ground filter as ours, run on ODM's cloud per cell."""
    ref = reference.astype(np.float32)
    return ground.dtm_from_ground(ref, ground.smrf_ground(ref, res_m))


def _object_heights(
    ours: np.ndarray, reference: np.ndarray, ref_dtm: np.ndarray, dtm: np.ndarray
) -> tuple[float, int, float, int]:
    """``(ratio, cells, ratio of the largest object, its cells)`` (module docstring)."""
    from scipy import ndimage

    odm_height = reference - ref_dtm
    tall = np.isfinite(reference) & (odm_height > OBJECT_MIN_HEIGHT_M)
    objects = tall & np.isfinite(ours) & np.isfinite(dtm)
    if not objects.any():
        return 0.0, 0, 0.0, 0
    ratio = float(np.median(ours[objects] - dtm[objects]) / np.median(odm_height[objects]))
    labels, count = ndimage.label(tall)
    sizes = np.bincount(labels[objects], minlength=count + 1)
    sizes[0] = 0
    largest = objects & (labels == int(np.argmax(sizes)))
    largest_ratio = float(np.median(ours[largest] - dtm[largest]) / np.median(odm_height[largest]))
    return ratio, int(objects.sum()), largest_ratio, int(largest.sum())


def dense_figures(task: Path) -> DenseFigures:
    """The figures of a finished brighton task with ``dsm`` and ``dtm`` (module docstring)."""
    # the accuracy figures are of the measured heights; the gap-filled ones are counted apart
    dsm, transform = _read(task / "odm_dem" / "dsm.tif", measured_only=True)
    dtm, _ = _read(task / "odm_dem" / "dtm.tif")
    res_m = transform.a
    ref_xyz, _ = points_of(REFERENCE)
    reference, ref_counts = rasterise(ref_xyz, transform, dsm.shape)
    both = np.isfinite(dsm) & (ref_counts > 0)
    diff = np.where(both, dsm - reference, np.nan)
    tilt_deg, plane_removed = _tilt(diff, both, res_m)
    xyz, rgb = points_of(task / "odm_georeferencing" / "odm_georeferenced_model.laz")
    _, our_counts = rasterise(xyz, transform, dsm.shape)
    with rasterio.open(task / "odm_orthophoto" / "odm_orthophoto.tif") as src:
        alpha = src.read(
            4, out_shape=dsm.shape, resampling=Resampling.nearest
        )  # same bounds: the orthophoto grid is the DEM grid's box
    footprint = alpha > 0
    measured = our_counts > 0
    inside = footprint[np.clip(np.floor((transform.f - xyz[:, 1]) / res_m).astype(int), 0, dsm.shape[0] - 1),
                       np.clip(np.floor((xyz[:, 0] - transform.c) / res_m).astype(int), 0, dsm.shape[1] - 1)]  # fmt: skip
    ref_crop = odm_crop_area(ref_xyz, transform, dsm.shape)
    our_crop = odm_crop_area(xyz, transform, dsm.shape)
    ref_dtm = _reference_dtm(reference, res_m)
    # the cells without a height before the last gap-filling step (the nearest height): the
    # large gaps, where the orthophoto lies on the interpolated surface
    small_gaps = ground.fill_small_gaps(dsm.astype(np.float32), transform.a, DEM_GAPFILL_STEPS)
    ratio, cells, largest_ratio, largest_cells = _object_heights(dsm, reference, ref_dtm, dtm)
    on_ground = np.isfinite(dtm) & np.isfinite(ref_dtm)
    dtm_dz = dtm[on_ground] - float(np.median(diff[both])) - ref_dtm[on_ground]
    return DenseFigures(
        dsm_median_abs_m=float(np.median(np.abs(diff[both]))),
        dsm_p90_abs_m=float(np.percentile(np.abs(diff[both]), 90)),
        dsm_median_signed_m=float(np.median(diff[both])),
        tilt_deg=tilt_deg,
        plane_removed_median_abs_m=plane_removed,
        measured_share_of_orthophoto=float((measured & footprint).sum() / max(1, footprint.sum())),
        measured_share_of_reference=float(
            (measured & (ref_counts > 0)).sum() / (ref_counts > 0).sum()
        ),
        reference_measured_share_of_its_crop=float((ref_counts > 0)[ref_crop].mean()),
        measured_share_of_reference_crop=float(measured[ref_crop].mean()),
        measured_share_of_our_crop=float(measured[our_crop].mean()),
        points_per_m2=float(inside.sum() / max(1e-9, footprint.sum() * res_m * res_m)),
        coloured_share=float((rgb.sum(axis=1) > 0).mean()) if len(rgb) else 0.0,
        steep_share_of_unmeasured=_steep_share(task, footprint & ~np.isfinite(small_gaps)),
        object_height_ratio=ratio,
        object_cells=cells,
        largest_object_ratio=largest_ratio,
        largest_object_cells=largest_cells,
        dtm_median_abs_m=float(np.median(np.abs(dtm_dz))),
    )


def render_pngs(task: Path, folder: Path, name: str) -> list[Path]:
    """Hillshades of our DSM and of ODM's cloud on the same grid, and our cloud from above.

    Returns:
        The PNG paths written into ``folder``.
    """
    import cv2

    folder.mkdir(parents=True, exist_ok=True)
    dsm, transform = _read(task / "odm_dem" / "dsm.tif")
    reference, _ = rasterise(points_of(REFERENCE)[0], transform, dsm.shape)
    written = []
    for label, surface in ((name, dsm), ("odm_reference", reference)):
        gy, gx = np.gradient(
            np.where(np.isfinite(surface), surface, np.nanmedian(surface)), transform.a
        )
        shade = np.clip(255 * (0.5 + 0.5 * (-gx - gy) / np.sqrt(2 + gx * gx + gy * gy)), 0, 255)
        shade = np.where(np.isfinite(surface), shade, 0).astype(np.uint8)
        path = folder / f"{label}_dsm_hillshade.png"
        cv2.imwrite(str(path), shade)
        written.append(path)
    xyz, rgb = points_of(task / "odm_georeferencing" / "odm_georeferenced_model.laz")
    cell = 0.1
    cols = np.floor((xyz[:, 0] - transform.c) / cell).astype(int)
    rows = np.floor((transform.f - xyz[:, 1]) / cell).astype(int)
    shape = (int(dsm.shape[0] * transform.a / cell) + 1, int(dsm.shape[1] * transform.a / cell) + 1)
    ok = (rows >= 0) & (rows < shape[0]) & (cols >= 0) & (cols < shape[1])
    image = np.zeros((*shape, 3), dtype=np.uint8)
    image[rows[ok], cols[ok]] = np.clip(rgb[ok][:, ::-1], 0, 255).astype(np.uint8)
    path = folder / f"{name}_cloud_top.png"
    cv2.imwrite(str(path), image)
    written.append(path)
    return written
