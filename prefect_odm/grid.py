"""The common pixel grid of a merge (pure core: no I/O).

Every merged raster lives on one north-up grid whose edges are whole multiples of the
resolution in the target CRS ("snapped to the resolution"): two merges at the same resolution
share pixel edges, and an input already on a snapped grid is read without resampling.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from prefect_odm.errors import MergeError, format_distance

if TYPE_CHECKING:
    from affine import Affine

Bounds = tuple[float, float, float, float]
"""``(left, bottom, right, top)`` in CRS units, as rasterio spells bounds."""

_SNAP_TOLERANCE = 1e-6
"""Fraction of a pixel below which an offset counts as a whole number of pixels."""


@dataclass(frozen=True)
class Grid:
    """A north-up pixel grid.

    Attributes:
        left: x of the left edge, CRS units (metres in a UTM CRS).
        top: y of the top edge, CRS units.
        resolution_m: pixel size (square pixels), CRS units.
        width, height: size in pixels.
    """

    left: float
    top: float
    resolution_m: float
    width: int
    height: int

    @property
    def transform(self) -> tuple[float, float, float, float, float, float]:
        """Affine coefficients ``(a, b, c, d, e, f)`` as rasterio's ``Affine`` takes them."""
        return (self.resolution_m, 0.0, self.left, 0.0, -self.resolution_m, self.top)

    @property
    def bounds(self) -> Bounds:
        """``(left, bottom, right, top)`` in CRS units."""
        return (
            self.left,
            self.top - self.height * self.resolution_m,
            self.left + self.width * self.resolution_m,
            self.top,
        )

    @property
    def pixel_area_m2(self) -> float:
        """Area of one pixel, square CRS units."""
        return self.resolution_m * self.resolution_m

    @classmethod
    def covering(cls, bounds: Bounds, resolution_m: float, snap_m: float) -> Grid:
        """The grid of ``resolution_m`` pixels covering ``bounds``, corner snapped to ``snap_m``.

        The edges of ``bounds`` are rounded outward to whole multiples of ``snap_m`` (anchored
        at the CRS origin); width and height are the whole pixels that cover the snapped box
        (the right and bottom edges may overhang it by less than a pixel when ``snap_m`` is not
        a multiple of ``resolution_m``). The built-in engine's DEM grid.

        Args:
            bounds: ``(left, bottom, right, top)`` in CRS units.
            resolution_m: pixel size, CRS units (> 0).
            snap_m: the corner snap, CRS units (> 0).
        """
        left = math.floor(bounds[0] / snap_m) * snap_m
        top = math.ceil(bounds[3] / snap_m) * snap_m
        right = math.ceil(bounds[2] / snap_m) * snap_m
        bottom = math.floor(bounds[1] / snap_m) * snap_m
        width = max(1, int(math.ceil((right - left) / resolution_m - 1e-9)))
        height = max(1, int(math.ceil((top - bottom) / resolution_m - 1e-9)))
        return cls(left=left, top=top, resolution_m=resolution_m, width=width, height=height)

    def refined(self, factor: int, resolution_m: float) -> Grid:
        """The grid over exactly the same area with ``factor`` x ``factor`` pixels of
        ``resolution_m`` in each of this grid's pixels (same top-left corner).

        Args:
            factor: whole number of fine pixels per pixel side (>= 1).
            resolution_m: the fine pixel size, CRS units; ``factor * resolution_m`` must be this
                grid's pixel size (to :data:`_SNAP_TOLERANCE` of a pixel).

        Raises:
            ValueError: ``factor`` < 1, or ``factor * resolution_m`` is not this grid's pixel.
        """
        if factor < 1:
            raise ValueError(f"refinement factor must be at least 1, got {factor}")
        if abs(factor * resolution_m - self.resolution_m) > _SNAP_TOLERANCE * self.resolution_m:
            raise ValueError(
                f"{factor} x {resolution_m} is not the grid's pixel size {self.resolution_m}"
            )
        return Grid(
            left=self.left,
            top=self.top,
            resolution_m=resolution_m,
            width=self.width * factor,
            height=self.height * factor,
        )

    def is_aligned_with(self, other: Grid) -> bool:
        """True when every pixel edge of this grid lies on a pixel edge of ``other`` (to
        :data:`_SNAP_TOLERANCE` of ``other``'s pixel): its pixel is a whole multiple of
        ``other``'s and its corner falls on ``other``'s pixel edges."""
        ratio = self.resolution_m / other.resolution_m
        whole = abs(ratio - round(ratio)) <= _SNAP_TOLERANCE * max(1.0, ratio) and round(ratio) >= 1
        return whole and other.offset_of(self.left, self.top) is not None

    @property
    def affine(self) -> Affine:
        """:attr:`transform` as an :class:`affine.Affine` (what rasterio's profiles take)."""
        from affine import Affine

        return Affine(*self.transform)

    def xs(self) -> NDArray[np.floating[Any]]:
        """Pixel-centre x coordinates (eastings), CRS units, shape ``(width,)``."""
        return self.left + (np.arange(self.width) + 0.5) * self.resolution_m

    def ys(self) -> NDArray[np.floating[Any]]:
        """Pixel-centre y coordinates (northings), CRS units, shape ``(height,)``."""
        return self.top - (np.arange(self.height) + 0.5) * self.resolution_m

    def offset_of(self, left: float, top: float) -> tuple[int, int] | None:
        """Whole-pixel ``(row, col)`` of a point on this grid; None if it falls between pixels."""
        col = (left - self.left) / self.resolution_m
        row = (self.top - top) / self.resolution_m
        rc, cc = round(row), round(col)
        if abs(row - rc) > _SNAP_TOLERANCE or abs(col - cc) > _SNAP_TOLERANCE:
            return None
        return rc, cc

    def sub_grid(self, bounds: Bounds) -> tuple[int, int, Grid]:
        """The part of this grid covering ``bounds`` (rounded outward to whole pixels).

        Returns:
            ``(row_off, col_off, grid)`` where the offsets are in pixels of this grid (they may
            lie outside ``[0, height)``/``[0, width)`` when ``bounds`` extends beyond it).
        """
        res = self.resolution_m
        col0 = math.floor((bounds[0] - self.left) / res + _SNAP_TOLERANCE)
        col1 = math.ceil((bounds[2] - self.left) / res - _SNAP_TOLERANCE)
        row0 = math.floor((self.top - bounds[3]) / res + _SNAP_TOLERANCE)
        row1 = math.ceil((self.top - bounds[1]) / res - _SNAP_TOLERANCE)
        grid = Grid(
            left=self.left + col0 * res,
            top=self.top - row0 * res,
            resolution_m=res,
            width=max(col1 - col0, 1),
            height=max(row1 - row0, 1),
        )
        return row0, col0, grid

    def decimated(self, max_side_px: int) -> tuple[int, Grid]:
        """A coarser grid over the same area whose longer side is at most ``max_side_px``.

        Returns:
            ``(factor, grid)``: the integer decimation factor and the coarse grid (its pixel is
            ``factor`` times larger; its extent may overhang by less than one coarse pixel).
        """
        factor = max(1, math.ceil(max(self.width, self.height) / max_side_px))
        return factor, self.coarsened(factor)

    def coarsened(self, factor: int) -> Grid:
        """The grid over the same area with pixels ``factor`` times larger (same top-left corner;
        its extent may overhang by less than one coarse pixel)."""
        return Grid(
            left=self.left,
            top=self.top,
            resolution_m=self.resolution_m * factor,
            width=max(1, math.ceil(self.width / factor)),
            height=max(1, math.ceil(self.height / factor)),
        )


@dataclass(frozen=True)
class Block:
    """A rectangular window of a :class:`Grid`, in pixels."""

    row_off: int
    col_off: int
    height: int
    width: int


def snap_grid(bounds: Iterable[Bounds], resolution_m: float) -> Grid:
    """The smallest snapped grid holding every bounding box.

    Edges are rounded outward to whole multiples of ``resolution_m`` (anchored at the CRS
    origin), so the same resolution always gives the same pixel edges.

    Args:
        bounds: ``(left, bottom, right, top)`` boxes in one CRS.
        resolution_m: pixel size in CRS units (> 0).

    Raises:
        ValueError: no bounds, or a non-positive resolution.
    """
    boxes = list(bounds)
    if not boxes:
        raise ValueError("snap_grid needs at least one bounding box")
    if not resolution_m > 0:
        raise ValueError(f"resolution must be positive, got {resolution_m}")
    res = float(resolution_m)
    left = math.floor(min(b[0] for b in boxes) / res + _SNAP_TOLERANCE) * res
    bottom = math.floor(min(b[1] for b in boxes) / res + _SNAP_TOLERANCE) * res
    right = math.ceil(max(b[2] for b in boxes) / res - _SNAP_TOLERANCE) * res
    top = math.ceil(max(b[3] for b in boxes) / res - _SNAP_TOLERANCE) * res
    width = max(1, round((right - left) / res))
    height = max(1, round((top - bottom) / res))
    return Grid(left=left, top=top, resolution_m=res, width=width, height=height)


def iter_blocks(grid: Grid, block_size: int) -> Iterator[Block]:
    """Blocks of at most ``block_size`` x ``block_size`` pixels in row-major order."""
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    for row in range(0, grid.height, block_size):
        for col in range(0, grid.width, block_size):
            yield Block(
                row_off=row,
                col_off=col,
                height=min(block_size, grid.height - row),
                width=min(block_size, grid.width - col),
            )


def intersect(
    a: tuple[int, int, int, int], b: tuple[int, int, int, int]
) -> tuple[int, int, int, int] | None:
    """Intersection of two ``(row_off, col_off, height, width)`` windows, None when empty."""
    r0 = max(a[0], b[0])
    c0 = max(a[1], b[1])
    r1 = min(a[0] + a[2], b[0] + b[2])
    c1 = min(a[1] + a[3], b[1] + b[3])
    if r1 <= r0 or c1 <= c0:
        return None
    return r0, c0, r1 - r0, c1 - c0


def dem_cells_per_orthophoto_cell(
    orthophoto_res_m: float, asked_res_m: float | None, default_res_m: float
) -> int:
    """How many orthophoto cells make one DEM cell side: the DEM lies on the orthophoto's grid.

    The asked DEM resolution (ODM's ``dem-resolution``), or ``default_res_m`` when none is asked,
    is rounded to the nearest whole number of orthophoto cells, at least one: a DEM is never
    finer than the orthophoto (ODM caps ``dem-resolution`` at the GSD, and the orthophoto cell
    is never finer than the GSD).

    Args:
        orthophoto_res_m: the orthophoto's pixel size, metres (> 0).
        asked_res_m: the asked DEM pixel size, metres; None or <= 0: not asked.
        default_res_m: the DEM pixel size to use when none is asked, metres (> 0).

    Returns:
        The whole factor ``k >= 1``; the DEM cell is ``k * orthophoto_res_m``.

    Raises:
        ValueError: a non-positive orthophoto or default resolution.
    """
    if not orthophoto_res_m > 0 or not default_res_m > 0:
        raise ValueError(
            f"resolutions must be positive, got {orthophoto_res_m} and {default_res_m}"
        )
    wanted = asked_res_m if asked_res_m is not None and asked_res_m > 0 else default_res_m
    return max(1, math.floor(wanted / orthophoto_res_m + 0.5))


MOSAIC_FACTOR_MIN = 16
"""The least factor a mosaic's pixel count may exceed its inputs' summed pixel counts by (see
:func:`check_mosaic_size`)."""

MOSAIC_FLOOR_PX = 1 << 22
"""Mosaics up to this many pixels (2048 x 2048) are never refused, however small the inputs."""


def mosaic_limit_px(input_px: int, n_inputs: int) -> int:
    """The most pixels a mosaic of ``n_inputs`` inputs holding ``input_px`` pixels together may
    have: ``max(MOSAIC_FACTOR_MIN, 2 * n_inputs)`` times ``input_px``, at least
    :data:`MOSAIC_FLOOR_PX`.

    Inputs that overlap or touch give a mosaic smaller than their sum; gaps between them and an
    L-shaped or diagonal layout make it larger, a diagonal chain of ``n`` equal squares (touching
    at their corners) ``n`` times larger at most. Far more than that means an input lies
    somewhere else than the others (another place, another UTM zone, a wrong CRS)."""
    return max(MOSAIC_FLOOR_PX, max(MOSAIC_FACTOR_MIN, 2 * n_inputs) * input_px)


def check_mosaic_size(grid: Grid, boxes: Mapping[str, Bounds], what: str = "mosaic") -> None:
    """Refuse a grid far larger than its inputs before anything is allocated on it.

    Args:
        grid: the grid about to be used.
        boxes: input name -> its ``(left, bottom, right, top)`` in the grid's CRS.
        what: what the grid is for (first word of the message).

    Raises:
        MergeError: the grid has more pixels than :func:`mosaic_limit_px` allows; one line with
            its size, resolution and bounds, and the inputs lying farthest from the others'
            median centre (what makes it that large).
    """
    res = grid.resolution_m
    input_px = sum(
        max(1, math.ceil((b[2] - b[0]) / res)) * max(1, math.ceil((b[3] - b[1]) / res))
        for b in boxes.values()
    )
    limit = mosaic_limit_px(input_px, len(boxes))
    total = grid.width * grid.height
    if total <= limit:
        return
    centres = {k: ((b[0] + b[2]) / 2, (b[1] + b[3]) / 2) for k, b in boxes.items()}
    mx = float(np.median([c[0] for c in centres.values()]))
    my = float(np.median([c[1] for c in centres.values()]))
    far = sorted(((math.hypot(x - mx, y - my), k) for k, (x, y) in centres.items()), reverse=True)[
        :2
    ]
    left, bottom, right, top = grid.bounds
    raise MergeError(
        f"{what} grid of {grid.width:,} x {grid.height:,} px at {res:.3g} m "
        f"(bounds {left:.0f}, {bottom:.0f}, {right:.0f}, {top:.0f}) is {total / input_px:,.0f} "
        f"times its {len(boxes)} inputs' {input_px:,} px (at most {limit / input_px:,.0f} times): "
        + ", ".join(f"{k} lies {format_distance(d)} from the inputs' median centre" for d, k in far)
        + "; refused before anything is allocated"
    )
