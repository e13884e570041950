"""Pure merge mathematics: grids, seam weights, colour and vertical solves."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prefect_odm.grid import Block, Grid, iter_blocks, snap_grid
from prefect_odm.merge.balance import overlap_stats, solve_gain_offset, solve_vertical_offsets
from prefect_odm.merge.seams import SeamField, blend_weights, ownership_from_centres
from prefect_odm.ownership import Ownership


def test_snap_grid_edges_are_multiples_of_the_resolution() -> None:
    grid = snap_grid([(10.03, 20.01, 30.0, 40.07), (25.0, 5.0, 31.02, 22.0)], 0.5)
    assert grid.bounds == (10.0, 5.0, 31.5, 40.5)
    assert (grid.width, grid.height) == (43, 71)
    assert grid.offset_of(10.5, 40.0) == (1, 1)
    assert grid.offset_of(10.25, 40.0) is None


def test_blocks_tile_the_grid_exactly() -> None:
    grid = Grid(0.0, 100.0, 1.0, 250, 130)
    blocks = list(iter_blocks(grid, 64))
    assert sum(b.height * b.width for b in blocks) == 250 * 130
    assert blocks[-1] == Block(128, 192, 2, 58)


def test_seam_distance_is_zero_for_the_owner_and_grows_into_its_cell() -> None:
    own = Ownership.from_cameras([(10.0, 10.0, "a"), (30.0, 10.0, "b")])
    grid = Grid(0.0, 20.0, 0.5, 80, 40)
    field = SeamField(own, grid, lattice_step_px=4)
    e = field.seam_distance(Block(0, 0, 40, 80), ["a", "b"])
    x = 0.25 + 0.5 * np.arange(80)
    row = e[:, 20]
    owner_a = x < 20
    # exact away from the seam; within a quarter lattice cell (4 px * 0.5 m) next to it
    far = np.abs(x - 20) > 2.0
    assert np.all(row[0][owner_a & far] < 1e-6)
    assert np.all(row[1][~owner_a & far] < 1e-6)
    assert np.all(row[0][owner_a] <= 0.5) and np.all(row[1][~owner_a] <= 0.5)
    # kinks (at cameras, seams) are smoothed over one lattice cell, hence the tolerance;
    # e_b = (d_b - d_a) / 2 (about the distance to the bisector x = 20 near the camera line)
    dy = 10.0 - (20.0 - 20.5 * 0.5)
    exact = (np.hypot(30 - x, dy) - np.hypot(10 - x, dy)) / 2
    assert np.allclose(row[1][owner_a & far], exact[owner_a & far], atol=0.25)
    assert np.allclose(row[1][(x > 12) & (x < 18)], 20 - x[(x > 12) & (x < 18)], atol=0.05)


def test_seam_distance_does_not_depend_on_the_block_layout() -> None:
    own = Ownership.from_cameras([(3.0, 17.0, "a"), (31.0, 4.0, "b"), (18.0, 12.0, "c")])
    grid = Grid(0.0, 20.0, 0.3, 130, 70)
    field = SeamField(own, grid, lattice_step_px=8)
    whole = field.seam_distance(Block(0, 0, 70, 130), ["a", "b", "c"])
    part = field.seam_distance(Block(13, 37, 29, 51), ["a", "b", "c"])
    assert np.array_equal(whole[:, 13:42, 37:88], part)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.floats(0, 30), min_size=6, max_size=6),
    st.lists(st.booleans(), min_size=6, max_size=6),
    st.floats(0, 10),
)
def test_weights_sum_to_one_wherever_any_input_has_data(
    e: list[float], valid: list[bool], feather_m: float
) -> None:
    ea = np.asarray(e, dtype=np.float32).reshape(3, 2, 1)
    va = np.asarray(valid).reshape(3, 2, 1)
    w = blend_weights(ea, va, feather_m)
    total = w.sum(axis=0)
    assert np.allclose(total[va.any(axis=0)], 1.0, atol=1e-6)
    assert np.all(total[~va.any(axis=0)] == 0)
    assert np.all(w[~va] == 0)


def test_gain_offset_solve_removes_a_brightness_step() -> None:
    rng = np.random.default_rng(1)
    base = rng.uniform(40, 180, (3, 5000))
    stats = [overlap_stats("a", "b", base, base + 20), overlap_stats("b", "c", base + 20, base)]
    sol = solve_gain_offset(["a", "b", "c"], stats, bands=3)
    for band in range(3):
        va = sol["a"].gain[band] * base[band] + sol["a"].offset[band]
        vb = sol["b"].gain[band] * (base[band] + 20) + sol["b"].offset[band]
        vc = sol["c"].gain[band] * base[band] + sol["c"].offset[band]
        assert np.abs(va - vb).max() < 0.05
        assert np.abs(vc - vb).max() < 0.05
    assert np.mean([sol[s].gain[0] for s in "abc"]) == pytest.approx(1.0, abs=1e-3)


def test_gain_offset_without_overlaps_is_identity() -> None:
    sol = solve_gain_offset(["a", "b"], [], bands=3)
    assert sol["a"].gain == (1.0, 1.0, 1.0) and sol["b"].offset == (0.0, 0.0, 0.0)


def test_vertical_offsets_solved_jointly() -> None:
    # b is 0.8 m above a, c is 0.3 m below b; mean held at zero
    sol = solve_vertical_offsets(["a", "b", "c"], [("a", "b", -0.8, 100), ("b", "c", 0.3, 100)])
    assert sol["b"] - sol["a"] == pytest.approx(0.8, abs=1e-6)
    assert sol["b"] - sol["c"] == pytest.approx(0.3, abs=1e-6)
    assert sum(sol.values()) == pytest.approx(0.0, abs=1e-6)


def test_ownership_from_centres_bisects() -> None:
    own = ownership_from_centres({"b": (10.0, 0.0), "a": (0.0, 0.0)})
    assert list(own.owner_of_points(np.array([4.9, 5.1]), np.array([0.0, 0.0]))) == ["a", "b"]
