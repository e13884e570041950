"""A synthetic drone survey over a sloping, textured ground, written at run time.

The ground is the plane ``z = BASE_Z_M + slope * (x - x0)`` in EPSG:32633 (WGS 84 / UTM 33N,
near 45.1 N 15.0 E), rising :attr:`SlopeSurvey.rise_m` (150 m) from the west edge of the
covered ground to its east edge, painted with a seeded multi-scale noise texture (octaves of
0.1 to 26 m, tinted by a low-frequency colour field) so that SIFT finds features everywhere.
A grid of nadir images (north up) is taken at a constant height above that ground, rendered with
an ideal pinhole camera: each pixel's ray is intersected with the plane analytically and the
texture sampled bilinearly. Each JPEG carries what a real drone writes: EXIF GPS latitude,
longitude and altitude (metres above the ellipsoid here), capture time (2 s per shot, 10 s per
turn), focal length with the focal-plane resolution; XMP ``drone-dji:`` RelativeAltitude (the
barometric height above the take-off point, at the survey's south-west corner), gimbal pitch
and yaw; and ``Camera:AboveGroundAltitude`` (the height above the ground below).

Nothing is committed: the images are written where the caller asks (``tmp_path`` in tests).
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np
from numpy.typing import NDArray
from PIL import Image
from pyproj import Transformer

EPSG = 32633
BASE_Z_M = 300.0
X0_M, Y0_M = 500_000.0, 4_995_000.0
TEXTURE_RES_M = 0.1
FOCAL_MM = 4.0
START = datetime(2026, 6, 1, 10, 0, 0)


@dataclass(frozen=True)
class SlopeSurvey:
    """The survey's geometry (metres) and camera.

    Attributes:
        lines, per_line: flight lines (along north, spaced in x) and images per line.
        line_spacing_m, shot_spacing_m: distances between lines and between shots.
        height_m: camera height above the ground below.
        rise_m: the ground's rise over the covered width (west to east).
        width_px, height_px, focal_px: the pinhole camera (no distortion, centred).
        gps_sigma_m: standard deviation of the noise added to the written GPS (x, y and z).
        jitter_m: standard deviation of the true positions about the exact grid (a flown grid is
            never exact; an exact one is degenerate for the planner's Voronoi core areas).
        seed: the texture's and the noise's seed.
        above_ground_tag: write ``Camera:AboveGroundAltitude`` (without it only DJI's
            RelativeAltitude is there, as on most DJI surveys).
    """

    lines: int = 12
    per_line: int = 12
    line_spacing_m: float = 30.0
    shot_spacing_m: float = 15.0
    height_m: float = 70.0
    rise_m: float = 150.0
    width_px: int = 640
    height_px: int = 480
    focal_px: float = 550.0
    gps_sigma_m: float = 0.0
    jitter_m: float = 0.7
    above_ground_tag: bool = True
    seed: int = 11
    margin_m: float = field(default=20.0)

    @property
    def footprint_m(self) -> tuple[float, float]:
        """Ground footprint (across x, along y) of one image on level ground."""
        k = self.height_m / self.focal_px
        return self.width_px * k, self.height_px * k

    @property
    def covered_x_m(self) -> tuple[float, float]:
        """West and east edges of the ground the images cover (level-ground footprints)."""
        half = self.footprint_m[0] / 2.0
        return X0_M - half, X0_M + (self.lines - 1) * self.line_spacing_m + half

    @property
    def slope(self) -> float:
        """dz/dx of the ground."""
        west, east = self.covered_x_m
        return self.rise_m / (east - west)

    def ground_z(self, x_m: NDArray[np.float64]) -> NDArray[np.float64]:
        """The true ground height at easting ``x_m`` (any shape), metres."""
        return BASE_Z_M + self.slope * (x_m - self.covered_x_m[0])

    def cameras(self) -> list[tuple[str, float, float, float, float]]:
        """``(name, x, y, z, seconds since the start)`` per image in capture order (serpentine)."""
        out = []
        t = 0.0
        jitter = np.random.default_rng(self.seed + 2).normal(
            0.0, self.jitter_m, (self.lines, self.per_line, 2)
        )
        for line in range(self.lines):
            shots = range(self.per_line) if line % 2 == 0 else reversed(range(self.per_line))
            for shot in shots:
                x = X0_M + line * self.line_spacing_m + float(jitter[line, shot, 0])
                y = Y0_M + shot * self.shot_spacing_m + float(jitter[line, shot, 1])
                z = float(self.ground_z(np.array(x))) + self.height_m
                out.append((f"SLOPE_{len(out):04d}.JPG", x, y, z, t))
                t += 2.0
            t += 10.0
        return out


@dataclass(frozen=True)
class _Texture:
    """The ground's paint: noise octaves (each its own table, coarser ones larger cells) and a
    colour tint, sampled bilinearly at ground positions; ``left``, ``top`` the tables' corner."""

    octaves: tuple[tuple[float, NDArray[np.float32]], ...]  # (cell size m, table)
    tint: NDArray[np.float32]  # (3, rows, cols), cells of TINT_CELL_M
    left: float
    top: float

    def rgb(self, x: NDArray[np.float64], y: NDArray[np.float64]) -> NDArray[np.float64]:
        """Colours ``(..., 3)`` in 0..255 at ground positions ``x``, ``y`` (metres)."""
        from scipy.ndimage import map_coordinates

        grey = np.zeros_like(x)
        for cell_m, table in self.octaves:
            at = [(self.top - y) / cell_m, (x - self.left) / cell_m]
            grey += map_coordinates(table, at, order=1, mode="nearest")
        at = [(self.top - y) / TINT_CELL_M, (x - self.left) / TINT_CELL_M]
        tint = [map_coordinates(band, at, order=1, mode="nearest") for band in self.tint]
        return np.clip(np.stack([128.0 + 40.0 * grey * t for t in tint], axis=-1), 0, 255)


TINT_CELL_M = 40.0


def _texture(survey: SlopeSurvey) -> _Texture:
    """The seeded texture over the survey's ground and a margin around it."""
    from scipy.ndimage import gaussian_filter

    fh = survey.footprint_m[1]
    left = survey.covered_x_m[0] - survey.margin_m
    right = survey.covered_x_m[1] + survey.margin_m
    bottom = Y0_M - fh / 2.0 - survey.margin_m
    top = Y0_M + (survey.per_line - 1) * survey.shot_spacing_m + fh / 2.0 + survey.margin_m
    rng = np.random.default_rng(survey.seed)
    octaves = []
    weights = [0.6 + 0.25 * k for k in range(5)]
    norm = float(np.sqrt(np.sum(np.square(weights))))
    for k, weight in enumerate(weights):  # cells of 0.1, 0.4, 1.6, 6.4, 25.6 m
        cell_m = TEXTURE_RES_M * 4**k
        shape = (int((top - bottom) / cell_m) + 2, int((right - left) / cell_m) + 2)
        table = gaussian_filter(rng.standard_normal(shape).astype(np.float32), 0.7)
        octaves.append((cell_m, (weight / norm * table / table.std()).astype(np.float32)))
    tint_shape = (3, int((top - bottom) / TINT_CELL_M) + 2, int((right - left) / TINT_CELL_M) + 2)
    tint = rng.uniform(0.75, 1.25, tint_shape).astype(np.float32)
    return _Texture(tuple(octaves), tint, left, top)


def _render(survey: SlopeSurvey, texture: _Texture, cam: NDArray[np.float64]) -> NDArray[np.uint8]:
    """The image of a nadir, north-up pinhole camera at ``cam`` (x, y, z), ``(rows, cols, 3)``."""
    v, u = np.mgrid[0 : survey.height_px, 0 : survey.width_px].astype(np.float64)
    # camera x = east, camera y (image down) = south, optical axis = down
    dx = (u + 0.5 - survey.width_px / 2.0) / survey.focal_px
    dy = -(v + 0.5 - survey.height_px / 2.0) / survey.focal_px
    dz = -np.ones_like(dx)
    plane_at_cam = float(survey.ground_z(np.array(cam[0])))
    t = (plane_at_cam - cam[2]) / (dz - survey.slope * dx)
    return texture.rgb(cam[0] + t * dx, cam[1] + t * dy).astype(np.uint8)


def _xmp(relative_m: float, above_ground_m: float | None) -> bytes:
    agl = "" if above_ground_m is None else f'Camera:AboveGroundAltitude="{above_ground_m:.3f}"'
    packet = (
        '<?xpacket begin="" id="W5M0MpCehiHzreSzNTczkc9d"?>'
        '<x:xmpmeta xmlns:x="adobe:ns:meta/"><rdf:RDF '
        'xmlns:rdf="http://www.w3.org/1999/02/22-rdf-syntax-ns#">'
        '<rdf:Description rdf:about="" xmlns:drone-dji="http://www.dji.com/drone-dji/1.0/" '
        'xmlns:Camera="http://pix4d.com/camera/1.0/" '
        f'drone-dji:RelativeAltitude="{relative_m:+.3f}" drone-dji:GimbalPitchDegree="-90.0" '
        f'drone-dji:GimbalYawDegree="0.0" drone-dji:FlightYawDegree="0.0" {agl}/>'
        '</rdf:RDF></x:xmpmeta><?xpacket end="w"?>'
    ).encode()
    body = b"http://ns.adobe.com/xap/1.0/\x00" + packet
    return b"\xff\xe1" + (len(body) + 2).to_bytes(2, "big") + body


def _after_app_segments(jpeg: bytes) -> int:
    """Offset just after the APPn segments that follow the JPEG's SOI marker."""
    at = 2
    while jpeg[at] == 0xFF and 0xE0 <= jpeg[at + 1] <= 0xEF:
        at += 2 + int.from_bytes(jpeg[at + 2 : at + 4], "big")
    return at


def _rational(value: float, den: int = 10_000) -> tuple[int, int]:
    return round(value * den), den


def _dms(degrees: float) -> tuple[tuple[int, int], ...]:
    d = abs(degrees)
    minutes = (d - int(d)) * 60.0
    return ((int(d), 1), (int(minutes), 1), _rational((minutes - int(minutes)) * 60.0))


def _exif(survey: SlopeSurvey, lat: float, lon: float, alt: float, when: datetime) -> bytes:
    import piexif

    stamp = when.strftime("%Y:%m:%d %H:%M:%S").encode()
    px_per_cm = survey.focal_px / FOCAL_MM * 10.0
    return bytes(
        piexif.dump(
            {
                "0th": {piexif.ImageIFD.Make: b"prefect-odm", piexif.ImageIFD.Model: b"pinhole"},
                "Exif": {
                    piexif.ExifIFD.DateTimeOriginal: stamp,
                    piexif.ExifIFD.FocalLength: _rational(FOCAL_MM, 1000),
                    piexif.ExifIFD.FocalPlaneXResolution: _rational(px_per_cm, 1000),
                    piexif.ExifIFD.FocalPlaneYResolution: _rational(px_per_cm, 1000),
                    piexif.ExifIFD.FocalPlaneResolutionUnit: 3,
                },
                "GPS": {
                    piexif.GPSIFD.GPSLatitudeRef: b"N" if lat >= 0 else b"S",
                    piexif.GPSIFD.GPSLatitude: _dms(lat),
                    piexif.GPSIFD.GPSLongitudeRef: b"E" if lon >= 0 else b"W",
                    piexif.GPSIFD.GPSLongitude: _dms(lon),
                    piexif.GPSIFD.GPSAltitudeRef: 0,
                    piexif.GPSIFD.GPSAltitude: _rational(alt, 1000),
                },
            }
        )
    )


def write_slope_survey(folder: Path, survey: SlopeSurvey | None = None) -> SlopeSurvey:
    """Render the survey's images into ``folder`` (created); returns the survey written.

    Deterministic: the same survey gives the same bytes.
    """
    import piexif

    survey = survey or SlopeSurvey()
    folder.mkdir(parents=True, exist_ok=True)
    texture = _texture(survey)
    to_lonlat = Transformer.from_crs(EPSG, 4326, always_xy=True)
    noise = np.random.default_rng(survey.seed + 1)
    take_off_z = float(survey.ground_z(np.array(survey.covered_x_m[0])))
    for name, x, y, z, seconds in survey.cameras():
        pixels = _render(survey, texture, np.array([x, y, z]))
        ex, ey, ez = noise.normal(0.0, survey.gps_sigma_m, 3) if survey.gps_sigma_m else (0, 0, 0)
        lon, lat = to_lonlat.transform(x + ex, y + ey)
        buffer = io.BytesIO()
        Image.fromarray(pixels).save(buffer, format="JPEG", quality=92)
        jpeg = buffer.getvalue()
        exif = _exif(survey, lat, lon, z + ez, START + timedelta(seconds=seconds))
        out = io.BytesIO()
        piexif.insert(exif, jpeg, out)
        data = out.getvalue()
        at = _after_app_segments(data)
        data = (
            data[:at]
            + _xmp(z + ez - take_off_z, survey.height_m if survey.above_ground_tag else None)
            + data[at:]
        )
        (folder / name).write_bytes(data)
    return survey


@dataclass(frozen=True)
class SlopeFigures:
    """How a merged DSM of the slope survey compares with the true ground.

    Attributes:
        range_m, truth_range_m: max - min of the DSM and of the truth over the DSM's valid cells.
        range_error_pct: ``|range_m - truth_range_m| / truth_range_m * 100``.
        median_abs_dz_m, p99_abs_dz_m: of ``DSM - truth`` over the valid cells.
        seam_step_max_m, seam_step_p99_m: ``|dz(a) - dz(b)|`` between 4-neighbouring cells owned
            by different submodels (nearest core camera of the plan).
        inner_step_p99_m: the same between neighbours of one submodel (the DSM's own roughness).
        seam_offset_max_m: the largest level difference between two neighbouring submodels
            across their seam: per pair of submodels, the median of ``dz(b) - dz(a)`` over the
            neighbour cells across their seam (at least 20), largest ``|median|``. This is the
            step of the surface; the per-cell figures above also hold the DSM's roughness.
        seam_pairs: how many neighbour pairs cross a seam.
    """

    range_m: float
    truth_range_m: float
    range_error_pct: float
    median_abs_dz_m: float
    p99_abs_dz_m: float
    seam_step_max_m: float
    seam_step_p99_m: float
    inner_step_p99_m: float
    seam_pairs: int
    seam_offset_max_m: float = 0.0


def slope_figures(dsm_path: Path, plan_json: Path, survey: SlopeSurvey) -> SlopeFigures:
    """The :class:`SlopeFigures` of a merged DSM (GeoTIFF, EPSG:32633) against the truth."""
    import json

    import rasterio
    from scipy.spatial import cKDTree

    with rasterio.open(dsm_path) as ds:
        dsm = ds.read(1, masked=True)
        rows, cols = np.mgrid[0 : ds.height, 0 : ds.width]
        xs, ys = rasterio.transform.xy(ds.transform, rows.ravel(), cols.ravel())
    x = np.asarray(xs).reshape(dsm.shape)
    y = np.asarray(ys).reshape(dsm.shape)
    valid = ~np.ma.getmaskarray(dsm)
    z = np.asarray(dsm.filled(np.nan), dtype=np.float64)
    truth = survey.ground_z(x)
    dz = np.where(valid, z - truth, np.nan)
    cameras = json.loads(plan_json.read_text())["cameras"]
    ids = sorted({c["submodel_id"] for c in cameras})
    label_of = np.array([ids.index(c["submodel_id"]) for c in cameras])
    _, nearest = cKDTree([(c["x_m"], c["y_m"]) for c in cameras]).query(
        np.column_stack([x.ravel(), y.ravel()])
    )
    owner = label_of[np.asarray(nearest)].reshape(dsm.shape)
    seam, inner, signed, pair_keys = [], [], [], []
    for a, b, oa, ob in (
        (dz[:, :-1], dz[:, 1:], owner[:, :-1], owner[:, 1:]),
        (dz[:-1], dz[1:], owner[:-1], owner[1:]),
    ):
        both = np.isfinite(a) & np.isfinite(b)
        step = np.abs(a - b)
        across = both & (oa != ob)
        seam.append(step[across])
        inner.append(step[both & (oa == ob)])
        # the higher-numbered submodel's side minus the other's, per pair of submodels
        signed.append(np.where(oa < ob, b - a, a - b)[across])
        pair_keys.append(np.minimum(oa, ob)[across] * len(ids) + np.maximum(oa, ob)[across])
    seam_steps, inner_steps = np.concatenate(seam), np.concatenate(inner)
    keys, diffs = np.concatenate(pair_keys), np.concatenate(signed)
    offsets = [
        abs(float(np.median(diffs[keys == k]))) for k in np.unique(keys) if (keys == k).sum() >= 20
    ]
    span, truth_span = float(np.ptp(z[valid])), float(np.ptp(truth[valid]))
    return SlopeFigures(
        range_m=span,
        truth_range_m=truth_span,
        range_error_pct=abs(span - truth_span) / truth_span * 100.0,
        median_abs_dz_m=float(np.nanmedian(np.abs(dz))),
        p99_abs_dz_m=float(np.nanpercentile(np.abs(dz), 99)),
        seam_step_max_m=float(seam_steps.max()) if len(seam_steps) else 0.0,
        seam_step_p99_m=float(np.percentile(seam_steps, 99)) if len(seam_steps) else 0.0,
        inner_step_p99_m=float(np.percentile(inner_steps, 99)),
        seam_pairs=len(seam_steps),
        seam_offset_max_m=max(offsets, default=0.0),
    )
