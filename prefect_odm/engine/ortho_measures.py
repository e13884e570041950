"""Figures of an orthophoto's quality: view-boundary steps, sharpness, vignetting left.

Used by ``benchmarks/bench_orthophoto.py`` and the tests; pure numpy (no file I/O).

* **Step ratio** across a set of edges: the mean absolute grey difference (mean of the bands)
  between the two cells of each edge, over the same for every other pair of 4-neighbouring
  coloured cells. 1.0 means the edges cannot be told from the texture; a hard cut between two
  exposures gives more. The *block-edge* ratio takes the edges of the old renderer's
  16-cell selection blocks; the *view-boundary* ratio takes the edges where the view label
  changes.
* **Sharpness**: mean squared Laplacian of the grey orthophoto over the same of a reference
  (each labelled view rendered from its image resampled to the orthophoto's GSD).
* **Corner/centre ratio** of a mean image: the mean grey of the four corner patches (each
  ``CORNER_FRACTION`` of the sides) over that of the central patch of the same size.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

CORNER_FRACTION = 0.1


def grey(rgba: NDArray[np.uint8]) -> NDArray[np.float32]:
    """Mean of the colour bands of ``(4, rows, cols)`` (or ``(3, ...)``), float32."""
    return np.asarray(rgba[:3].astype(np.float32).mean(axis=0), dtype=np.float32)


def step_ratio(
    rgba: NDArray[np.uint8],
    edges_down: NDArray[np.bool_],
    edges_right: NDArray[np.bool_],
) -> float:
    """Step ratio of the marked edges (see the module docstring).

    Args:
        rgba: the orthophoto, ``(4, rows, cols)`` uint8.
        edges_down: edge between cell ``(r, c)`` and ``(r + 1, c)`` is marked,
            ``(rows - 1, cols)``.
        edges_right: edge between ``(r, c)`` and ``(r, c + 1)``, ``(rows, cols - 1)``.

    Returns:
        The ratio; NaN when there are no marked or no unmarked edges.
    """
    g = grey(rgba)
    valid = rgba[3] > 0
    d_down = np.abs(np.diff(g, axis=0))
    d_right = np.abs(np.diff(g, axis=1))
    ok_down = valid[1:] & valid[:-1]
    ok_right = valid[:, 1:] & valid[:, :-1]
    marked = np.concatenate([d_down[ok_down & edges_down], d_right[ok_right & edges_right]])
    other = np.concatenate([d_down[ok_down & ~edges_down], d_right[ok_right & ~edges_right]])
    if marked.size == 0 or other.size == 0:
        return float("nan")
    return float(marked.mean() / other.mean())


def block_edges(shape: tuple[int, int], block: int) -> tuple[NDArray[np.bool_], NDArray[np.bool_]]:
    """Edges between cells of different ``block`` x ``block`` blocks (for :func:`step_ratio`)."""
    rows, cols = shape
    down = ((np.arange(rows - 1) + 1) % block == 0)[:, None] & np.ones((1, cols), bool)
    right = np.ones((rows, 1), bool) & ((np.arange(cols - 1) + 1) % block == 0)[None, :]
    return down, right


def label_edges(labels: NDArray[np.integer]) -> tuple[NDArray[np.bool_], NDArray[np.bool_]]:
    """Edges between cells of different labels (for :func:`step_ratio`)."""
    return labels[1:] != labels[:-1], labels[:, 1:] != labels[:, :-1]


def laplacian_energy(g: NDArray[np.float32], mask: NDArray[np.bool_]) -> float:
    """Mean squared 4-neighbour Laplacian of ``g`` over the cells of ``mask`` whose 3 x 3
    neighbourhood lies in ``mask``."""
    from scipy.ndimage import binary_erosion

    lap = (-4.0 * g[1:-1, 1:-1] + g[:-2, 1:-1] + g[2:, 1:-1] + g[1:-1, :-2] + g[1:-1, 2:]).astype(
        np.float64
    )
    inner = binary_erosion(mask, np.ones((3, 3), bool))[1:-1, 1:-1]
    return float(np.mean(lap[inner] ** 2)) if inner.any() else float("nan")


def corner_centre_ratio(mean_grey: NDArray[np.floating]) -> float:
    """Corner/centre ratio of a mean image ``(rows, cols)`` (see the module docstring)."""
    rows, cols = mean_grey.shape
    h, w = max(1, int(rows * CORNER_FRACTION)), max(1, int(cols * CORNER_FRACTION))
    corners = [
        mean_grey[:h, :w],
        mean_grey[:h, -w:],
        mean_grey[-h:, :w],
        mean_grey[-h:, -w:],
    ]
    r0, c0 = (rows - h) // 2, (cols - w) // 2
    centre = mean_grey[r0 : r0 + h, c0 : c0 + w]
    return float(np.mean([c.mean() for c in corners]) / centre.mean())
