"""Balanced partition of camera positions: target sizes and recursive bisection (pure core).

Steps 1-3 of :mod:`prefect_odm.plan.planning`: the canonical order that makes a plan independent of
input order, the submodel sizes within +-20 % of ``split`` (:func:`target_sizes`), and the
partition by recursive principal-axis bisection (:func:`partition_positions`; Berger & Bokhari
1987, "A partitioning strategy for nonuniform problems on multiprocessors", IEEE Trans.
Computers C-36(5), with the principal axis instead of a coordinate axis). Positions are in a
projected CRS, metres.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from prefect_odm.errors import PlanningError

#: Relative size tolerance the planner aims for (+-20 % of ``split``).
SIZE_TOLERANCE = 0.2

#: Exponent applied to the load ratio each rebalancing round (:func:`rebalanced_sizes`): below 1
#: so a core does not overshoot when its neighbours move too.
REBALANCE_DAMPING = 0.7


def default_min_submodel_images(split: int) -> int:
    """The default minimum submodel size: ``max(5, split // 4)``."""
    return max(5, int(split) // 4)


def target_sizes(n: int, split: int, min_submodel_images: int | None = None) -> list[int]:
    """Core image counts of the submodels, in planning order.

    Args:
        n: number of cameras (>= 1).
        split: the asked average submodel size in images (>= 1).
        min_submodel_images: smallest allowed submodel (default
            :func:`default_min_submodel_images`).

    Returns:
        Sizes summing to ``n``. A single submodel when ``n <= split * 1.2``. Otherwise sizes as
        equal as
        possible with every size within +-20 % of ``split`` when such a count exists; else
        ``split``-sized submodels and one remainder (last), or -- when the remainder is below
        ``min_submodel_images`` -- the remainder spread over the others (unless that would push
        them all out of tolerance, possible only for a ``split`` of a few images).

    Raises:
        PlanningError: for ``n < 1`` or ``split < 1``.
    """
    if n < 1:
        raise PlanningError("nothing to plan: no camera positions")
    if split < 1:
        raise PlanningError(f"split must be >= 1 image, got {split}")
    lo, hi = (1 - SIZE_TOLERANCE) * split, (1 + SIZE_TOLERANCE) * split
    if n <= hi:
        return [n]
    min_size = (
        default_min_submodel_images(split) if min_submodel_images is None else min_submodel_images
    )
    best: tuple[float, int] | None = None
    for k in {max(1, n // split), max(1, -(-n // split)), max(1, round(n / split))}:
        small, extra = divmod(n, k)
        big = small + (1 if extra else 0)
        if lo <= small and big <= hi:
            score = (abs(n / k - split), -k)
            if best is None or score < (abs(n / best[1] - split), -best[1]):
                best = (score[0], k)
    if best is not None:
        k = best[1]
        small, extra = divmod(n, k)
        return [small + 1] * extra + [small] * (k - extra)
    q, r = divmod(n, split)
    if r == 0:
        return [split] * q
    if r >= min_size:
        return [split] * q + [r]
    add, extra = divmod(r, q)
    spread = [split + add + 1] * extra + [split + add] * (q - extra)
    if q == 1 or spread[0] <= hi:
        return spread
    # Very small ``split`` (a few images): spreading would push every submodel out of
    # tolerance, so the remainder stays the one exception.
    return [split] * q + [r]


def canonical_order(
    x_m: NDArray[np.float64], y_m: NDArray[np.float64], tie_rank: NDArray[np.int64] | None = None
) -> NDArray[np.intp]:
    """Indices sorting positions by ``(x, y, tie_rank)`` -- the order every step works in."""
    keys: tuple[NDArray[Any], ...] = (y_m, x_m)
    if tie_rank is not None:
        keys = (tie_rank, y_m, x_m)
    return np.lexsort(keys)


def _principal_axis(xy: NDArray[np.float64]) -> NDArray[np.float64]:
    centred = xy - xy.mean(axis=0)
    cov = centred.T @ centred
    # Closed form for the 2x2 symmetric case: exact, sign-stable and cheap.
    a, b, d = float(cov[0, 0]), float(cov[0, 1]), float(cov[1, 1])
    if abs(b) < 1e-12 * max(a, d, 1e-300):
        return np.array([1.0, 0.0]) if a >= d else np.array([0.0, 1.0])
    lam = 0.5 * (a + d) + math.sqrt(0.25 * (a - d) ** 2 + b * b)
    v = np.array([b, lam - a])
    v /= np.hypot(v[0], v[1])
    if v[0] < 0 or (v[0] == 0 and v[1] < 0):
        v = -v
    return v


def partition_positions(xy: NDArray[np.float64], sizes: Sequence[int]) -> NDArray[np.int32]:
    """Balanced partition of positions by recursive principal-axis bisection.

    Args:
        xy: ``(n, 2)`` positions in metres, already in canonical order.
        sizes: target size of each part (sum ``n``); part ``i`` gets exactly ``sizes[i]`` points.

    Returns:
        ``(n,)`` int32 part label of each position, labels numbered along the cuts (spatial order).
    """
    n = len(xy)
    if sum(sizes) != n:
        raise PlanningError(f"target sizes sum to {sum(sizes)}, not to the {n} positions")
    labels = np.empty(n, dtype=np.int32)
    stack: list[tuple[NDArray[np.intp], int, int]] = [(np.arange(n), 0, len(sizes))]
    size_arr = list(sizes)
    while stack:
        idx, first, stop = stack.pop()
        if stop - first == 1:
            labels[idx] = first
            continue
        mid = (first + stop) // 2
        count = sum(size_arr[first:mid])
        pts = xy[idx]
        axis = _principal_axis(pts)
        proj = pts @ axis
        order = np.argsort(proj, kind="stable")
        left = np.sort(idx[order[:count]])
        right = np.sort(idx[order[count:]])
        stack.append((right, mid, stop))
        stack.append((left, first, mid))
    return labels


def rebalanced_sizes(
    weights: Sequence[float], loads: Sequence[int], n: int, min_size: int
) -> tuple[list[int], list[float]]:
    """Core sizes that move processing load from the busiest submodels to the lightest.

    One round of the planner's load balancing (:func:`prefect_odm.plan.planning.plan_from_positions`):
    each core's weight is multiplied by ``(mean load / its load) ** REBALANCE_DAMPING``, every
    weight is raised to at least ``min_size``, and the weights are scaled and rounded (largest
    remainder) to whole sizes summing to ``n``. An inner submodel takes overlap images from
    every side and an edge one from a few, so with equal cores inner submodels process up to 1.8
    times the images of edge ones (issue 14); shrinking inner cores and growing edge cores evens
    what each node processes.

    Args:
        weights: the current core sizes, possibly fractional (one per submodel, > 0).
        loads: images each submodel processes with those cores (core + overlap, >= 1).
        n: total cameras (the sizes' sum).
        min_size: smallest core allowed (at most ``n / len(weights)``).

    Returns:
        ``(sizes, weights)``: whole sizes summing to ``n``, each >= ``min_size``, in the order
        of ``weights``, and the fractional weights they were rounded from (the next round's
        input).
    """
    load = np.asarray(loads, dtype=np.float64)
    w = np.asarray(weights, dtype=np.float64) * (load.mean() / load) ** REBALANCE_DAMPING
    w *= n / w.sum()  # before the minimum is applied, so the weights compare with it as sizes
    for _ in range(len(w)):  # raise the smallest to min_size; the others share what is left
        small = w < min_size
        if not small.any():
            break
        w[small] = min_size
        rest = n - min_size * int(small.sum())
        w[~small] *= rest / w[~small].sum()
    w *= n / w.sum()
    sizes = np.floor(w).astype(np.int64)
    order = np.argsort(-(w - sizes), kind="stable")
    sizes[order[: n - int(sizes.sum())]] += 1
    while sizes.min() < min_size and sizes.max() > min_size:  # rounding left one short
        sizes[int(np.argmin(sizes))] += 1
        sizes[int(np.argmax(sizes))] -= 1
    return [int(v) for v in sizes], [float(v) for v in w]
