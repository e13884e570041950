"""Exposure and vignetting compensation of the orthophoto's images, solved from their overlaps.

Model (in the log domain, after Goldman, 2010, *Vignette and exposure calibration and
compensation*, IEEE PAMI 32(12)): a ground point ``p`` seen by image ``i`` at normalised radius
``r`` (distance from the principal point over the half diagonal) has the grey value (mean of the
bands)

    log I = log A_p + log g_i + b1 r^2 + b2 r^4 + b3 r^6

with ``A_p`` the point's unknown radiance, ``g_i`` the image's gain (exposure) and ``b`` the
vignetting polynomial, shared by every image of one camera (same size and intrinsics). The
observations are the candidate views of the view grid (:mod:`.ortho_views`) on flat, low-texture
ground seen by at least two images, sampled from a blurred, downsampled copy of each image
(robust to small misregistration). The radiances are eliminated (Schur complement), the small
system in gains and vignetting is solved with iteratively reweighted Huber weights
(``HUBER_LOG`` in log units) against parallax, moving objects and glare, the gauge fixed by a
mean log gain of zero. One gain for the three bands: white balance is left as the camera set it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from prefect_odm.engine.camera import CameraPose, Scene
from prefect_odm.engine.ortho_views import ViewCandidates

VIGNETTING_TERMS = 3
"""Even powers of the radius in the vignetting polynomial (r^2, r^4, r^6)."""

SAMPLE_DOWNSCALE = 4
"""Images are sampled at 1/this size (area average, then a Gaussian of one pixel)."""

HUBER_LOG = 0.05
"""Huber threshold of the robust solve, log units (about 5 %)."""

IRLS_ITERATIONS = 6
MIN_OBSERVATIONS = 100
FLAT_RANGE_M = 0.5
"""Cells whose DSM ranges more over 3 x 3 view cells are left out of the solve, metres."""

TEXTURE_QUANTILE = 0.5
"""Only the smoothest half of the flat cells (by local grey variation) enter the solve."""
MAX_POINTS = 60_000
"""At most this many ground points (view cells) enter the solve (an even subsample)."""

VALID_DN = (8.0, 250.0)
"""Samples darker or brighter (any band) are left out: noise and saturation."""

FACTOR_LIMITS = (0.4, 2.5)
"""Compensation factors are clipped to this range."""

REMAP_CHUNK = 30_000

ImageSource = Callable[[CameraPose], NDArray[np.uint8]]
"""Camera -> its image, ``(rows, cols, 3)`` uint8."""


@dataclass(frozen=True)
class Radiometry:
    """The solved compensation.

    Attributes:
        gains: per image and band, multiplicative, float64, shape ``(cameras, 3)`` (mean log 0).
        vignetting: per image (copied from its camera group) and band, the coefficients ``b1..b3``
            of the log vignetting polynomial, float64, shape ``(cameras, 3, VIGNETTING_TERMS)``.
        observations: samples used in the solve.
        rms_log_before, rms_log_after: robust RMS (1.4826 MAD) of the log residual ``log I -
            mean over the point's views`` before and after compensation.
    """

    gains: NDArray[np.float64]
    vignetting: NDArray[np.float64]
    observations: int
    rms_log_before: float
    rms_log_after: float

    @classmethod
    def identity(cls, cameras: int) -> Radiometry:
        """No compensation (every factor 1)."""
        return cls(np.ones((cameras, 3)), np.zeros((cameras, 3, VIGNETTING_TERMS)), 0, 0.0, 0.0)

    def factor(
        self, index: int, camera: CameraPose, u: NDArray[np.floating], v: NDArray[np.floating]
    ) -> NDArray[np.float32]:
        """Multiplicative correction of image ``index`` at pixels ``(u, v)``: shape ``u.shape +
        (3,)``, float32 (``1 / (gain * vignetting)``, clipped to ``FACTOR_LIMITS``)."""
        r2 = normalised_radius2(camera, u, v)
        coeffs = self.vignetting[index]
        log_gain = np.log(self.gains[index])
        bands: list[NDArray[np.float32]] = []
        for band in range(3):
            if band and np.array_equal(coeffs[band], coeffs[0]) and log_gain[band] == log_gain[0]:
                bands.append(bands[0])  # bands alike: computed once
                continue
            log_v = np.zeros_like(r2)
            for c in coeffs[band][::-1]:  # Horner in r^2: r2 * (b1 + r2 * (b2 + r2 * b3))
                log_v = (log_v + np.float32(c)) * r2
            value = np.exp(-(log_v + np.float32(log_gain[band])))
            bands.append(np.clip(value, *FACTOR_LIMITS).astype(np.float32))
        return np.stack(bands, axis=-1)


def normalised_radius2(
    camera: CameraPose, u: NDArray[np.floating], v: NDArray[np.floating]
) -> NDArray[np.float32]:
    """Squared distance from the principal point over the squared half diagonal."""
    half_diag2 = (camera.width**2 + camera.height**2) / 4.0
    du = np.asarray(u, dtype=np.float32) - np.float32(camera.cx)
    dv = np.asarray(v, dtype=np.float32) - np.float32(camera.cy)
    return ((du * du + dv * dv) / np.float32(half_diag2)).astype(np.float32)


def camera_groups(scene: Scene) -> NDArray[np.int64]:
    """Group index per camera: images of one physical camera (size and intrinsics) share one."""
    keys = [(c.width, c.height, round(c.focal_px), round(c.cx), round(c.cy)) for c in scene.cameras]
    lookup = {key: i for i, key in enumerate(sorted(set(keys)))}
    return np.array([lookup[k] for k in keys], dtype=np.int64)


def sample_candidate_colours(
    scene: Scene, views: ViewCandidates, source: ImageSource
) -> NDArray[np.float32]:
    """Colour of every candidate view from a blurred, downsampled image: ``(K, rows, cols,
    3)`` float32 DN, NaN where there is no candidate."""
    import cv2

    colours = np.full((*views.camera.shape, 3), np.nan, dtype=np.float32)
    for index, camera in enumerate(scene.cameras):
        where = views.camera == index
        if not where.any():
            continue
        image = source(camera)
        s = SAMPLE_DOWNSCALE
        small = cv2.resize(
            image, (image.shape[1] // s, image.shape[0] // s), interpolation=cv2.INTER_AREA
        )
        small = cv2.GaussianBlur(small.astype(np.float32), (0, 0), 1.0)
        mu = (views.u[where] / s - 0.5).astype(np.float32)
        mv = (views.v[where] / s - 0.5).astype(np.float32)
        sampled = np.empty((len(mu), 3), dtype=np.float32)
        for start in range(0, len(mu), REMAP_CHUNK):  # cv2.remap maps are < 32767 long
            part = slice(start, start + REMAP_CHUNK)
            sampled[part] = cv2.remap(
                small,
                mu[part, None],
                mv[part, None],
                cv2.INTER_LINEAR,
                borderMode=cv2.BORDER_REPLICATE,
            ).reshape(-1, 3)
        colours[where] = sampled
    return colours


def smooth_cells(views: ViewCandidates, colours: NDArray[np.float32]) -> NDArray[np.bool_]:
    """View cells on flat, low-texture ground: where a small misregistration between the views
    (parallax of trees, errors of the DSM) changes the sampled colour least.

    Flat: the DSM ranges less than ``FLAT_RANGE_M`` over 3 x 3 view cells. Low texture: the best
    view's grey level varies (standard deviation over 3 x 3 cells) less than the
    ``TEXTURE_QUANTILE`` of that variation over the flat cells.
    """
    from scipy.ndimage import maximum_filter, minimum_filter, uniform_filter

    z = views.z.astype(np.float64)
    flat = (maximum_filter(z, 3) - minimum_filter(z, 3)) < FLAT_RANGE_M
    grey = np.nan_to_num(colours[0].mean(axis=-1), nan=0.0).astype(np.float64)
    mean = uniform_filter(grey, 3)
    std = np.sqrt(np.maximum(uniform_filter(grey * grey, 3) - mean * mean, 0.0))
    usable = flat & (views.camera[0] >= 0)
    if not usable.any():
        return np.asarray(usable, dtype=bool)
    limit = float(np.quantile(std[usable], TEXTURE_QUANTILE))
    return np.asarray(usable & (std <= limit), dtype=bool)


def _observations(
    views: ViewCandidates, colours: NDArray[np.float32], scene: Scene
) -> tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.float32], NDArray[np.float64]]:
    """``(point, image, r^2, log grey)`` of the usable multi-view samples of smooth cells."""
    k = views.camera.shape[0]
    cams = views.camera.reshape(k, -1)
    count = (cams >= 0).sum(axis=0)
    cells = np.flatnonzero((count >= 2) & smooth_cells(views, colours).ravel())
    if len(cells) > MAX_POINTS:
        cells = cells[np.linspace(0, len(cells) - 1, MAX_POINTS).astype(np.int64)]
    k_idx, c_idx = np.nonzero(cams[:, cells] >= 0)
    flat = cells[c_idx]
    image = cams[k_idx, flat].astype(np.int64)
    value = colours.reshape(k, -1, 3)[k_idx, flat]
    u = views.u.reshape(k, -1)[k_idx, flat]
    v = views.v.reshape(k, -1)[k_idx, flat]
    r2 = np.empty(len(image), dtype=np.float32)
    for index, camera in enumerate(scene.cameras):
        sel = image == index
        r2[sel] = normalised_radius2(camera, u[sel], v[sel])
    ok = np.all((value > VALID_DN[0]) & (value < VALID_DN[1]), axis=1)
    point = np.unique(flat[ok], return_inverse=True)[1].astype(np.int64)
    grey = np.log(value[ok].astype(np.float64).mean(axis=1))
    # a point seen only once after the cuts says nothing
    seen = np.bincount(point)[point] >= 2
    point = np.unique(point[seen], return_inverse=True)[1].astype(np.int64)
    return point, image[ok][seen], r2[ok][seen], grey[seen]


def _design(
    image: NDArray[np.int64], group: NDArray[np.int64], r2: NDArray[np.float32], cameras: int
) -> Any:
    """Sparse ``(n, cameras + groups * VIGNETTING_TERMS)``: log gain and vignetting columns."""
    from scipy.sparse import csr_matrix

    n, t = len(image), VIGNETTING_TERMS
    col_b = cameras + group[image][:, None] * t + np.arange(t)[None, :]
    powers = np.stack([r2.astype(np.float64) ** (j + 1) for j in range(t)], axis=1)
    rows = np.repeat(np.arange(n), 1 + t)
    cols = np.column_stack([image, col_b]).ravel()
    data = np.column_stack([np.ones(n), powers]).ravel()
    unknowns = cameras + (int(group.max()) + 1) * t
    return csr_matrix((data, (rows, cols)), shape=(n, unknowns))


def _solve(
    point: NDArray[np.int64], design: Any, y: NDArray[np.float64], cameras: int
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Robust least squares with the point radiances eliminated (Schur complement).

    Minimises ``sum w (y - A_p - M x)^2`` over ``A`` and ``x``: with ``B`` the weighted
    point-membership matrix and ``S = B M``, the reduced normal equations are
    ``(M^T W M - S^T D^-1 S) x = M^T W y - S^T D^-1 B y`` (``D``: the points' weights), plus the
    gauge row ``sum(log gains) = 0``. Returns ``(x, residuals)``.
    """
    from scipy.sparse import csr_matrix, diags

    n, m = design.shape
    points = int(point.max()) + 1
    weight = np.ones(n)
    x = np.zeros(m)
    residual = np.zeros(n)
    for _ in range(IRLS_ITERATIONS):
        b = csr_matrix((weight, (point, np.arange(n))), shape=(points, n))
        d_inv = diags(1.0 / np.asarray(b.sum(axis=1)).ravel())
        s = b @ design
        normal = (design.T @ diags(weight) @ design - s.T @ d_inv @ s).toarray()
        rhs = design.T @ (weight * y) - s.T @ (d_inv @ (b @ y))
        gauge = np.zeros(m)
        gauge[:cameras] = 1.0
        normal += float(n) * np.outer(gauge, gauge)
        x = np.linalg.solve(normal + 1e-9 * np.eye(m), rhs)
        radiance = (b @ (y - design @ x)) * d_inv.diagonal()
        residual = y - design @ x - radiance[point]
        magnitude = np.abs(residual)
        weight = np.where(magnitude <= HUBER_LOG, 1.0, HUBER_LOG / np.maximum(magnitude, 1e-12))
    return x, residual


def _spread(point: NDArray[np.int64], log_value: NDArray[np.float64]) -> float:
    """Robust RMS of the deviation of each sample from its point's mean (log units)."""
    sums = np.bincount(point, weights=log_value)
    counts = np.bincount(point)
    deviation = log_value - sums[point] / counts[point]
    return float(1.4826 * np.median(np.abs(deviation)))


def solve_radiometry(
    scene: Scene, views: ViewCandidates, colours: NDArray[np.float32]
) -> Radiometry:
    """Gains and vignetting from the candidate views' colours (see the module docstring).

    Args:
        scene: the posed cameras.
        views: candidate views on the view grid.
        colours: their colours, ``(K, rows, cols, 3)`` (:func:`sample_candidate_colours`).

    Returns:
        The compensation; identity when fewer than ``MIN_OBSERVATIONS`` samples exist.
    """
    cameras = len(scene.cameras)
    point, image, r2, log_grey = _observations(views, colours, scene)
    if len(point) < MIN_OBSERVATIONS:
        return Radiometry.identity(cameras)
    group = camera_groups(scene)
    design = _design(image, group, r2, cameras)
    x, _ = _solve(point, design, log_grey, cameras)
    log_gain = x[:cameras] - x[:cameras].mean()
    coeffs = x[cameras:].reshape(-1, VIGNETTING_TERMS)
    corrected = log_grey - design @ x
    gains = np.repeat(np.exp(log_gain)[:, None], 3, axis=1)
    vignetting = np.repeat(coeffs[group][:, None, :], 3, axis=1)
    return Radiometry(
        gains, vignetting, int(len(point)), _spread(point, log_grey), _spread(point, corrected)
    )
