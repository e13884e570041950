"""The view labelling of the orthophoto: which candidate view colours each view cell.

A Markov random field on the view grid, 4-connected, as in seam finding for photomontage
(Kwatra et al., 2003, *Graphcut textures*, SIGGRAPH; Agarwala et al., 2004, *Interactive digital
photomontage*, SIGGRAPH): a label is a candidate slot of :class:`~.ortho_views.ViewCandidates`,

* data term: ``DATA_WEIGHT * view cost`` (nadir angle and distance, :mod:`.ortho_views`);
* smoothness term between neighbours ``p, q`` with different cameras ``a, b``:
  ``POTTS_DN + (|C_a(p) - C_b(p)| + |C_a(q) - C_b(q)|) / 2``, with ``C`` the compensated colour
  (mean over bands, DN) of a view at a cell and ``MISSING_DN`` where a camera does not see it; a
  view change is cheap where both views agree, i.e. along low-contrast paths.

The energy is minimised by iterated conditional modes (Besag, 1986, *J. R. Stat. Soc. B* 48(3))
from the best-data labelling, updating the two colours of a checkerboard in turn (deterministic;
every sweep lowers the energy) until no label changes or ``MAX_SWEEPS``.
"""

from __future__ import annotations

from typing import TypeVar

import numpy as np
from numpy.typing import NDArray

from prefect_odm.engine.ortho_views import ViewCandidates

DATA_WEIGHT = 40.0
"""DN per unit of view cost (a tangent of the nadir angle of 0.1 weighs 4 DN)."""

POTTS_DN = 2.0
"""Fixed cost of a view change between two neighbouring view cells, DN."""

MISSING_DN = 255.0
"""Colour difference assumed where one of the two cameras does not see the cell, DN."""

MAX_SWEEPS = 60

G = TypeVar("G", bound=np.generic)

_SHIFTS = ((1, 0), (-1, 0), (0, 1), (0, -1))
"""Neighbour offsets (rows, cols)."""


def _shift(a: NDArray[G], dr: int, dc: int, fill: float) -> NDArray[G]:
    """``out[..., r, c] = a[..., r + dr, c + dc]``, ``fill`` outside."""
    out = np.full_like(a, fill)
    rows, cols = a.shape[-2:]
    dst_r = slice(max(0, -dr), rows - max(0, dr))
    src_r = slice(max(0, dr), rows - max(0, -dr))
    dst_c = slice(max(0, -dc), cols - max(0, dc))
    src_c = slice(max(0, dc), cols - max(0, -dc))
    out[..., dst_r, dst_c] = a[..., src_r, src_c]
    return out


def _colour_of(
    cams: NDArray[np.int32], grey: NDArray[np.float32], camera: NDArray[np.int32]
) -> NDArray[np.float32]:
    """Colour at each cell of the camera ``camera[..., r, c]`` (NaN where it is no candidate).

    ``cams``/``grey``: ``(K, rows, cols)``; ``camera``: ``(..., rows, cols)``.
    """
    out = np.full(camera.shape, np.nan, dtype=np.float32)
    for k in range(cams.shape[0]):
        hit = (cams[k] == camera) & (camera >= 0)
        out = np.where(hit & np.isnan(out), grey[k], out)
    return out


def label_views(
    views: ViewCandidates, grey: NDArray[np.float32], *, max_sweeps: int = MAX_SWEEPS
) -> tuple[NDArray[np.int32], int]:
    """The camera per view cell minimising the energy of the module docstring.

    Args:
        views: candidate views.
        grey: compensated colour of each candidate (mean of the bands, DN), float32, shape
            ``views.camera.shape``; NaN where unknown.
        max_sweeps: iteration limit.

    Returns:
        ``(camera index per view cell (rows, cols), int32, -1 where none; sweeps run)``.
    """
    cams = views.camera
    data = np.where(cams >= 0, DATA_WEIGHT * views.cost, np.inf).astype(np.float32)
    # colour of slot k's camera at each neighbour, fixed for all sweeps: (4, K, rows, cols)
    at_neighbour = np.stack(
        [
            _colour_of(
                _shift(cams, dr, dc, -1), _shift(grey, dr, dc, np.nan), cams.astype(np.int32)
            )
            for dr, dc in _SHIFTS
        ]
    )
    slot = np.zeros(cams.shape[1:], dtype=np.int64)
    rows, cols = np.indices(slot.shape)
    parity = (rows + cols) % 2
    sweeps = 0
    while sweeps < max_sweeps:
        sweeps += 1
        changed = 0
        for colour in (0, 1):
            label_cam = np.take_along_axis(cams, slot[None], axis=0)[0]
            label_grey = np.take_along_axis(grey, slot[None], axis=0)[0]
            total = data.copy()
            for d, (dr, dc) in enumerate(_SHIFTS):
                nb_cam = _shift(label_cam, dr, dc, -1)
                nb_grey = _shift(label_grey, dr, dc, np.nan)
                b_here = _colour_of(cams, grey, nb_cam)
                diff = 0.5 * (np.abs(grey - b_here) + np.abs(at_neighbour[d] - nb_grey))
                diff = np.where(np.isnan(diff), MISSING_DN, diff)
                pair = np.where(cams == nb_cam, 0.0, POTTS_DN + diff)
                total += np.where(nb_cam >= 0, pair, 0.0).astype(np.float32)
            best = np.argmin(total, axis=0)
            update = (parity == colour) & np.isfinite(total.min(axis=0)) & (best != slot)
            changed += int(update.sum())
            slot = np.where(update, best, slot)
        if changed == 0:
            break
    label = np.take_along_axis(cams, slot[None], axis=0)[0]
    return label.astype(np.int32), sweeps
