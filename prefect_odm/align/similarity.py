"""3-D similarity transforms between submodels (pure core: numpy and scipy only).

A :class:`Similarity` maps a point ``X`` (plan CRS, metres, ``(x, y, z)`` with ``z`` the height
of the plan's vertical datum) to ``X' = centre + translation + scale * R @ (X - centre)``. Keeping
the rotation about a centre near the submodel (its camera centroid) keeps the parameters readable
(``translation`` is the shift at the submodel, not at the CRS origin 5,000 km away) and the least
squares well conditioned.

:func:`umeyama` fits one similarity to point pairs in closed form (S. Umeyama, "Least-squares
estimation of transformation parameters between two point patterns", IEEE TPAMI 13(4):376-380,
1991). :meth:`Similarity.raster_correction` turns a transform into what a raster merge needs to
resample once: an affine for ``x, y`` and a plane for ``z``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

FloatArray = NDArray[np.float64]

# (a, b, c, d, e, f) as rasterio's Affine: x = a*col + b*row + c, y = d*col + e*row + f.
GeoTransform = tuple[float, float, float, float, float, float]


def _vec3(values: ArrayLike) -> tuple[float, float, float]:
    arr = np.asarray(values, dtype=np.float64).reshape(3)
    return (float(arr[0]), float(arr[1]), float(arr[2]))


def _mat3(values: ArrayLike) -> tuple[tuple[float, float, float], ...]:
    arr = np.asarray(values, dtype=np.float64).reshape(3, 3)
    return tuple(_vec3(row) for row in arr)


def as_points(points: ArrayLike) -> FloatArray:
    """``points`` as a float64 array of shape ``(n, 3)``; raises ``ValueError`` on another shape."""
    arr = np.asarray(points, dtype=np.float64)
    if arr.ndim != 2 or arr.shape[1] != 3:
        raise ValueError(f"points must have shape (n, 3), got {arr.shape}")
    return arr


@dataclass(frozen=True)
class Similarity:
    """``X' = centre + translation + scale * rotation @ (X - centre)`` in the plan CRS.

    Attributes:
        scale: unitless, 1 for none.
        rotation: proper rotation matrix, row-major ``(3, 3)``.
        translation: metres, the shift of ``centre``.
        centre: metres, plan CRS; the point the rotation and scale act about.
    """

    scale: float = 1.0
    rotation: tuple[tuple[float, float, float], ...] = (
        (1.0, 0.0, 0.0),
        (0.0, 1.0, 0.0),
        (0.0, 0.0, 1.0),
    )
    translation: tuple[float, float, float] = (0.0, 0.0, 0.0)
    centre: tuple[float, float, float] = (0.0, 0.0, 0.0)

    @classmethod
    def from_parameters(
        cls, rotvec_rad: ArrayLike, log_scale: float, translation: ArrayLike, centre: ArrayLike
    ) -> Similarity:
        """From a rotation vector (axis times angle, radians), ``log(scale)`` and a shift (m)."""
        from scipy.spatial.transform import Rotation  # SciPy on first use (align/__init__)

        matrix = Rotation.from_rotvec(np.asarray(rotvec_rad, dtype=np.float64)).as_matrix()
        return cls(math.exp(log_scale), _mat3(matrix), _vec3(translation), _vec3(centre))

    @classmethod
    def from_matrix(cls, scale: float, rotation: ArrayLike, translation: ArrayLike) -> Similarity:
        """From the origin form ``X' = scale * rotation @ X + translation``."""
        return cls(scale, _mat3(rotation), _vec3(translation), (0.0, 0.0, 0.0))

    @property
    def rotation_matrix(self) -> FloatArray:
        """The rotation, shape ``(3, 3)``."""
        return np.asarray(self.rotation, dtype=np.float64)

    @property
    def rotation_deg(self) -> float:
        """The rotation angle in degrees (0 to 180): ``atan2(sin, cos)`` of the angle from the
        matrix's skew part and trace, exact near 0 and near 180 degrees."""
        r = self.rotation_matrix
        skew = np.array([r[2, 1] - r[1, 2], r[0, 2] - r[2, 0], r[1, 0] - r[0, 1]])
        return float(
            np.degrees(math.atan2(0.5 * float(np.linalg.norm(skew)), 0.5 * (np.trace(r) - 1.0)))
        )

    @property
    def tilt_deg(self) -> float:
        """The angle (degrees) between the transformed vertical and the vertical."""
        return float(np.degrees(np.arccos(np.clip(self.rotation_matrix[2, 2], -1.0, 1.0))))

    @property
    def scale_change(self) -> float:
        """``scale - 1`` (unitless; 0.002 is 0.2 %)."""
        return self.scale - 1.0

    def origin_form(self) -> tuple[float, FloatArray, FloatArray]:
        """``(scale, R (3, 3), t (3,))`` with ``X' = scale * R @ X + t``."""
        r = self.rotation_matrix
        c = np.asarray(self.centre)
        t = c + np.asarray(self.translation) - self.scale * r @ c
        return self.scale, r, t

    def apply(self, points: ArrayLike) -> FloatArray:
        """Transform points, shape ``(n, 3)`` in, ``(n, 3)`` out (plan CRS metres)."""
        xyz = as_points(points)
        c = np.asarray(self.centre)
        moved: FloatArray = (
            c + np.asarray(self.translation) + self.scale * (xyz - c) @ self.rotation_matrix.T
        )
        return moved

    def apply_world_to_camera(self, rotations: ArrayLike) -> FloatArray:
        """Camera orientations after the transform: ``R_cam @ R.T`` for world-to-camera ``(n, 3, 3)``."""
        rot = np.asarray(rotations, dtype=np.float64).reshape(-1, 3, 3)
        out: FloatArray = rot @ self.rotation_matrix.T
        return out

    def then(self, other: Similarity) -> Similarity:
        """The composition ``other(self(X))``, kept about ``self.centre``."""
        s1, r1, t1 = self.origin_form()
        s2, r2, t2 = other.origin_form()
        return Similarity.from_matrix(s1 * s2, r2 @ r1, s2 * r2 @ t1 + t2).recentred(self.centre)

    def inverse(self) -> Similarity:
        """The inverse transform, kept about the image of ``centre``."""
        s, r, t = self.origin_form()
        inv = Similarity.from_matrix(1.0 / s, r.T, -(r.T @ t) / s)
        return inv.recentred(self.apply(np.asarray([self.centre]))[0])

    def recentred(self, centre: ArrayLike) -> Similarity:
        """The same transform written about another centre."""
        s, r, t = self.origin_form()
        c = np.asarray(centre, dtype=np.float64).reshape(3)
        return Similarity(s, _mat3(r), _vec3(s * r @ c + t - c), _vec3(c))

    def displacement_m(self, points: ArrayLike) -> FloatArray:
        """How far each point moves (metres), shape ``(n,)``."""
        xyz = as_points(points)
        moved: FloatArray = np.linalg.norm(self.apply(xyz) - xyz, axis=1)
        return moved

    def raster_correction(self, reference_height_m: float) -> RasterCorrection:
        """What a raster merge needs to resample a submodel's raster once.

        The transform is split into a horizontal affine evaluated at ``reference_height_m`` (the
        submodel's ground height, metres), the horizontal shift per metre of height away from it
        (the tilt's lean; zero for a pure horizontal similarity plus height), and a height
        correction ``z' = z_scale * z + plane(x, y)``. For a 1 degree tilt the lean is 1.7 cm per
        metre of relief: :attr:`RasterCorrection.lean_m_per_m` lets the caller bound the error.

        Args:
            reference_height_m: height (plan CRS vertical, metres) the affine is exact at.

        Returns:
            the :class:`RasterCorrection` in the plan CRS (source ``x, y`` in, corrected out).
        """
        s, r, t = self.origin_form()
        m = s * r
        affine = (
            (float(m[0, 0]), float(m[0, 1]), float(m[0, 2] * reference_height_m + t[0])),
            (float(m[1, 0]), float(m[1, 1]), float(m[1, 2] * reference_height_m + t[1])),
        )
        return RasterCorrection(
            affine=affine,
            lean_m_per_m=(float(m[0, 2]), float(m[1, 2])),
            reference_height_m=reference_height_m,
            z_scale=float(m[2, 2]),
            z_plane=(float(t[2]), float(m[2, 0]), float(m[2, 1])),
        )


@dataclass(frozen=True)
class RasterCorrection:
    """A similarity written for a raster: horizontal affine plus a height plane.

    A source cell at ``(x, y)`` with height ``z`` (plan CRS, metres) lands at
    ``x' = a*x + b*y + c + lean_x * (z - reference_height_m)`` (likewise ``y'``) with height
    ``z' = z_scale * z + p0 + px * x + py * y + b * ((x - bx)^2 + (y - by)^2)``.

    Attributes:
        affine: ``((a, b, c), (d, e, f))`` mapping source ``(x, y)`` to corrected ``(x', y')``.
        lean_m_per_m: horizontal shift per metre of height above ``reference_height_m``.
        reference_height_m: the height at which ``affine`` is exact.
        z_scale: factor on the source height (the similarity's scale times ``R[2, 2]``).
        z_plane: ``(p0, px, py)``: metres, and metres per metre of ``x`` and ``y``.
        z_bowl: ``(b, bx, by)``: metres per square metre about the centre ``(bx, by)`` (source
            coordinates); zero unless the alignment solved bowls (``AlignmentOptions.refine_bowl``).
    """

    affine: tuple[tuple[float, float, float], tuple[float, float, float]]
    lean_m_per_m: tuple[float, float]
    reference_height_m: float
    z_scale: float
    z_plane: tuple[float, float, float]
    z_bowl: tuple[float, float, float] = (0.0, 0.0, 0.0)

    def corrected_geotransform(self, transform: GeoTransform) -> GeoTransform:
        """A raster's geotransform after the horizontal correction (rasterio ``Affine`` order).

        Args:
            transform: ``(a, b, c, d, e, f)`` with ``x = a*col + b*row + c``, ``y = d*col + e*row + f``.

        Returns:
            the same six numbers for the corrected raster (rotation terms appear when the
            similarity turns about the vertical); resample it onto the mosaic grid once.
        """
        g = np.array(
            [
                [transform[0], transform[1], transform[2]],
                [transform[3], transform[4], transform[5]],
                [0, 0, 1],
            ]
        )
        h = np.array([*self.affine, (0.0, 0.0, 1.0)])
        out = h @ g
        return (
            float(out[0, 0]),
            float(out[0, 1]),
            float(out[0, 2]),
            float(out[1, 0]),
            float(out[1, 1]),
            float(out[1, 2]),
        )

    def then(self, other: RasterCorrection) -> RasterCorrection:
        """This correction followed by ``other`` (whose ``x, y`` are this one's corrected ones).

        Exact when ``other`` has no lean and ``z_scale`` 1 (a height plane plus an affine, as
        :func:`~prefect_odm.align.align_heights` solves); the lean is this one's. A bowl of
        ``other`` is taken back through this affine (centre mapped back, coefficient times the
        affine's area scale): exact for a similarity's horizontal part, which this one is.

        Raises:
            ValueError: both corrections have a bowl.
        """
        if self.z_bowl[0] != 0.0 and other.z_bowl[0] != 0.0:
            raise ValueError("two bowls do not compose into one")
        h1 = np.array([*self.affine, (0.0, 0.0, 1.0)])
        h2 = np.array([*other.affine, (0.0, 0.0, 1.0)])
        q0, qx, qy = other.z_plane
        p0, px, py = self.z_plane
        (a, b, c), (d, e, f) = self.affine
        k = other.z_scale
        out = h2 @ h1
        return RasterCorrection(
            affine=(
                (float(out[0, 0]), float(out[0, 1]), float(out[0, 2])),
                (float(out[1, 0]), float(out[1, 1]), float(out[1, 2])),
            ),
            lean_m_per_m=self.lean_m_per_m,
            reference_height_m=self.reference_height_m,
            z_scale=k * self.z_scale,
            z_plane=(
                k * p0 + q0 + qx * c + qy * f,
                k * px + qx * a + qy * d,
                k * py + qx * b + qy * e,
            ),
            z_bowl=self._bowl_then(other),
        )

    def _bowl_then(self, other: RasterCorrection) -> tuple[float, float, float]:
        if other.z_bowl[0] == 0.0:
            return self.z_bowl
        bow, bx, by = other.z_bowl
        (a, b, c), (d, e, f) = self.inverse_affine()
        area = abs(float(np.linalg.det(np.array([self.affine[0][:2], self.affine[1][:2]]))))
        return (bow * area, a * bx + b * by + c, d * bx + e * by + f)

    def inverse_affine(self) -> tuple[tuple[float, float, float], tuple[float, float, float]]:
        """``((a, b, c), (d, e, f))`` mapping corrected ``(x', y')`` back to source ``(x, y)``.

        A resampler walks the mosaic grid and reads the source raster here.
        """
        h = np.array([*self.affine, (0.0, 0.0, 1.0)])
        inv = np.linalg.inv(h)
        return (
            (float(inv[0, 0]), float(inv[0, 1]), float(inv[0, 2])),
            (float(inv[1, 0]), float(inv[1, 1]), float(inv[1, 2])),
        )

    def heights_on_grid(
        self,
        grid: tuple[float, float, float],
        window: tuple[int, int, int, int],
        values: NDArray[np.float32],
        valid: NDArray[np.bool_],
    ) -> NDArray[np.float32]:
        """A block of heights read onto a north-up grid, with the height correction applied.

        Args:
            grid: ``(left, top, resolution_m)`` of the grid (plan CRS metres).
            window: ``(row_off, col_off, height, width)`` of the block on the grid, pixels.
            values: ``(bands, rows, cols)``, the heights in band 0 (``rows, cols`` may be a
                decimated read of the window).
            valid: ``(rows, cols)``; only valid cells change (nodata stays nodata).

        Returns:
            a copy of ``values`` with band 0 corrected. The plane is in source coordinates: each
            cell's centre is taken back through the inverse of the horizontal correction.
        """
        left, top, res = grid
        rows, cols = valid.shape
        xs = left + (window[1] + (np.arange(cols) + 0.5) * window[3] / cols) * res
        ys = top - (window[0] + (np.arange(rows) + 0.5) * window[2] / rows) * res
        gx, gy = np.meshgrid(xs, ys)
        (a, b, c), (d, e, f) = self.inverse_affine()
        sx, sy = a * gx[valid] + b * gy[valid] + c, d * gx[valid] + e * gy[valid] + f
        out = values.copy()
        out[0][valid] = self.corrected_heights(sx, sy, values[0][valid]).astype(np.float32)
        return out

    def corrected_heights(self, x: ArrayLike, y: ArrayLike, z: ArrayLike) -> FloatArray:
        """Corrected heights (metres) of source cells at source ``x, y`` with heights ``z``."""
        p0, px, py = self.z_plane
        bow, bx, by = self.z_bowl
        xa, ya, za = (np.asarray(v, dtype=np.float64) for v in (x, y, z))
        out: FloatArray = self.z_scale * za + p0 + px * xa + py * ya
        if bow != 0.0:
            out = out + bow * ((xa - bx) ** 2 + (ya - by) ** 2)
        return out


def umeyama(source: ArrayLike, target: ArrayLike, *, with_scale: bool = True) -> Similarity:
    """The least-squares similarity taking ``source`` points onto ``target`` points.

    Closed form of S. Umeyama, IEEE TPAMI 13(4):376-380, 1991 (eqs. 40-42): SVD of the
    cross-covariance, with the reflection fix so the rotation is proper.

    Args:
        source: points, shape ``(n, 3)``, metres, n >= 3 not collinear.
        target: the matching points, shape ``(n, 3)``, same CRS.
        with_scale: fit the scale too (otherwise a rigid transform).

    Returns:
        the similarity, written about the source centroid.

    Raises:
        ValueError: fewer than 3 pairs, shapes that differ, or degenerate (collinear) points.
    """
    src, dst = as_points(source), as_points(target)
    if src.shape != dst.shape or len(src) < 3:
        raise ValueError(f"umeyama needs >= 3 matching pairs, got {src.shape} and {dst.shape}")
    mu_s, mu_d = src.mean(axis=0), dst.mean(axis=0)
    a, b = src - mu_s, dst - mu_d
    var_s = float((a**2).sum() / len(src))
    if var_s <= 0.0:
        raise ValueError("umeyama: all source points coincide")
    cov = b.T @ a / len(src)
    u, d, vt = np.linalg.svd(cov)
    sign = np.ones(3)
    if np.linalg.det(u) * np.linalg.det(vt) < 0:
        sign[2] = -1.0
    if d[1] <= 1e-12 * max(d[0], 1e-300):
        raise ValueError(
            "umeyama: the points are collinear, the rotation about their line is unknown"
        )
    r = u @ np.diag(sign) @ vt
    scale = float((d * sign).sum() / var_s) if with_scale else 1.0
    return Similarity(scale, _mat3(r), _vec3(mu_d - mu_s), _vec3(mu_s))
