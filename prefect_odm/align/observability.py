"""What the DSM samples of an overlap can tell about two submodels' relative tilt, and the
gauge that keeps a block's own heights (pure core: numpy).

An overlap's samples ``(x, y, dz)`` see the difference of the two submodels' height planes
(and bowls) only where they lie. Spread over an area they fix the relative height and both
components of the relative tilt; spread along a thin seam (``--split-overlap-m 0``, DSMs cropped
at their footprints) they fix the relative height and the tilt *along* the seam, but the tilt
*across* it only through the width of the band: a difference ``e`` between the two DSMs' last
metres reads as a tilt ``e / width`` which each submodel carries to its centre. So an overlap
whose samples spread less than ``AlignmentOptions.min_tilt_spread_m`` (a standard deviation,
metres) across is given to the solve as samples on its centre line (:func:`observed_positions`):
it then says nothing about the tilt across, and the tilt prior (:func:`prior_weights`) holds
that at zero. A prior as weighted
pseudo-observations of zero tilt is the textbook way to give an adjustment what its
observations leave free (Förstner and Wrobel, "Photogrammetric Computer Vision", Springer
2016, ch. 4, estimation with prior information); its sigma is the ``max_rotation_deg`` gate, so
a tilt the samples do see is changed by a fraction of its own uncertainty.

The gauge (:func:`own_height_gauge`): a plane added to every submodel of a connected block
changes no overlap, so it is chosen to keep the block's sample-weighted mean tilt zero and its
sample-weighted mean height change *at each submodel's own centre* zero. Holding the mean of
the plane coefficients at the plan CRS origin zero instead (the gauge before) lowers both of two
submodels at their own centres whenever their relative tilt slopes down from the seam to both
(brighton ``--split 8 --split-overlap-m 0``: -0.23 and -0.42 m), though no overlap says where the
block's absolute height is.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

FloatArray = NDArray[np.float64]


def sample_spread(x: FloatArray, y: FloatArray) -> tuple[FloatArray, FloatArray, float, float]:
    """``(mean (2,), unit major axis (2,), std along it, std across it)`` of sample positions,
    plan CRS metres (principal axes of their covariance)."""
    xy = np.stack([x, y], axis=1)
    mean = xy.mean(axis=0)
    if len(xy) < 2:
        return mean, np.array([1.0, 0.0]), 0.0, 0.0
    values, vectors = np.linalg.eigh(np.cov((xy - mean).T))
    values = np.clip(values, 0.0, None)
    return mean, vectors[:, 1], float(np.sqrt(values[1])), float(np.sqrt(values[0]))


def observed_positions(
    x: FloatArray, y: FloatArray, min_spread_m: float
) -> tuple[FloatArray, FloatArray, list[str]]:
    """Sample positions as the solve is to see them, and what they do not observe.

    Across a spread (standard deviation) below ``min_spread_m`` the samples are moved onto the
    line through their mean along their major axis; when the spread along is below it too, onto
    their mean (the overlap then gives a relative height alone).

    Args:
        x, y: sample positions, plan CRS metres, shape ``(n,)``.
        min_spread_m: the least standard deviation, metres, along which a tilt is solved.

    Returns:
        ``(x, y, unsolved)``: the positions (the inputs when nothing is moved) and a phrase for
        each direction not solved (empty when none).
    """
    mean, axis, along, across = sample_spread(x, y)
    if across >= min_spread_m:
        return x, y, []
    if along < min_spread_m:
        note = (f"relative tilt (samples spread {along:.2f} m along, {across:.2f} m across "
                f"< min_tilt_spread_m={min_spread_m:g})")  # fmt: skip
        return np.full_like(x, mean[0]), np.full_like(y, mean[1]), [note]
    s = (x - mean[0]) * axis[0] + (y - mean[1]) * axis[1]
    note = (f"relative tilt across the overlap, towards ({-axis[1]:+.2f}, {axis[0]:+.2f}) "
            f"(samples spread {across:.2f} m across < min_tilt_spread_m={min_spread_m:g})")  # fmt: skip
    return mean[0] + s * axis[0], mean[1] + s * axis[1], [note]


def prior_weights(n: int, terms: int, length_m: float, tilt_sigma: float) -> FloatArray:
    """Per column of the height design (``(h, gx L, gy L[, b L^2])`` per submodel, ``L =
    length_m``) the weight of its zero pseudo-observation on whitened rows: on heights the
    solver's vanishing ridge (:data:`~prefect_odm.align.planar.RIDGE`), on tilts ``1 /
    (tilt_sigma L)`` (``tilt_sigma``: a slope, m per m), on the bowl ``2 / (tilt_sigma L)`` (its
    slope ``2 b L`` at ``L`` from its centre has the tilt's sigma)."""
    from prefect_odm.align.planar import RIDGE

    tilt = 1.0 / (tilt_sigma * length_m)
    one = np.array([RIDGE, tilt, tilt, 2.0 * tilt])[:terms]
    return np.tile(np.maximum(one, RIDGE), n)


def own_height_gauge(
    planes: FloatArray, centres: FloatArray, weights: FloatArray, block: NDArray[np.bool_]
) -> None:
    """Take out (in place) of the planes ``(p0, px, py)`` of the submodels in ``block`` the one
    plane that keeps their ``weights``-weighted mean tilt and mean height change at their own
    ``centres`` ``(N, 2)`` zero (plan CRS metres; a bowl about a submodel's centre is zero
    there)."""
    w = weights[block]
    c = centres[block]
    # both steps subtract one plane in plan coordinates from every submodel: no overlap changes
    planes[block, 1:] -= np.average(planes[block, 1:], axis=0, weights=w)
    at_centre = planes[block, 0] + (planes[block, 1:] * c).sum(axis=1)
    planes[block, 0] -= np.average(at_centre, weights=w)


def block_height_changes(
    heights_m: dict[str, float], weights: dict[str, float], pairs: list[tuple[str, str]]
) -> list[tuple[list[str], float]]:
    """Per connected block of ``pairs`` (overlaps ``(first, second)``): its submodels and the
    ``weights``-weighted mean of ``heights_m`` (each submodel's height change at its own centre,
    metres). Submodels in no pair are blocks of their own."""
    ids = sorted(heights_m)
    parent = {sid: sid for sid in ids}

    def root(sid: str) -> str:
        while parent[sid] != sid:
            sid = parent[sid]
        return sid

    for a, b in pairs:
        if a in parent and b in parent:
            parent[root(a)] = root(b)
    blocks: dict[str, list[str]] = {}
    for sid in ids:
        blocks.setdefault(root(sid), []).append(sid)
    out = []
    for members in blocks.values():
        w = np.array([weights.get(s, 0.0) for s in members])
        w = w if w.sum() > 0 else np.ones(len(members))
        out.append((members, float(np.average([heights_m[s] for s in members], weights=w))))
    return out
