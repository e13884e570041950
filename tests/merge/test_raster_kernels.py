"""The compiled interpolations of :mod:`prefect_odm.merge.raster_kernels` against the numpy
passes they replaced (kept here as the reference): the same float32 values, bit for bit."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import rasterio
from numpy.typing import NDArray

from prefect_odm.grid import Block, Grid
from prefect_odm.merge import DEM_NODATA, dem, merge_dems
from prefect_odm.merge.blend import height_weights, weighted_heights
from prefect_odm.merge.edge_distances import EdgeDistance
from prefect_odm.merge.raster_kernels import bilinear_sample, blend_heights, seam_columns
from prefect_odm.merge.seams import OwnershipSeams, SeamField, blend_weights
from prefect_odm.ownership import Ownership

from .conftest import LEFT, TOP
from .test_merge_dem import RES, _surface, _write_measured


def _numpy_seam(field: SeamField, block: Block, ids: list[str]) -> NDArray[np.float32]:
    """:meth:`SeamField.seam_distance` as numpy computed it before the kernel."""
    s, res, g = field.lattice_step_px, field.grid.resolution_m, field.grid
    i0, j0 = block.row_off // s, block.col_off // s
    i1 = (block.row_off + block.height - 1) // s + 1
    j1 = (block.col_off + block.width - 1) // s + 1
    ly = g.top - (np.arange(i0, i1 + 1, dtype=np.float64) * s + 0.5) * res
    lx = g.left + (np.arange(j0, j1 + 1, dtype=np.float64) * s + 0.5) * res
    gx, gy = np.meshgrid(lx, ly)
    pts = np.column_stack([gx.ravel(), gy.ravel()])
    rows = np.arange(block.row_off, block.row_off + block.height)
    cols = np.arange(block.col_off, block.col_off + block.width)
    ri, rf = rows // s - i0, ((rows % s) / s).astype(np.float64)[:, None]
    ci, cf = cols // s - j0, ((cols % s) / s).astype(np.float64)[None, :]

    def interp(values: NDArray[np.float64]) -> NDArray[np.float64]:
        lat = values.reshape(gx.shape)
        tmp = (1.0 - rf) * lat[ri, :] + rf * lat[ri + 1, :]
        out: NDArray[np.float64] = (1.0 - cf) * tmp[:, ci] + cf * tmp[:, ci + 1]
        return out

    base = interp(np.asarray(field._all.query(pts, k=1)[0], dtype=np.float64))
    return np.stack(
        [
            (0.5 * (interp(np.asarray(field._trees[sid].query(pts, k=1)[0])) - base)).astype(
                np.float32
            )
            for sid in ids
        ]
    )


def _numpy_sample(edge: EdgeDistance, row_off: int, col_off: int, window: tuple[int, ...]) -> Any:
    """:meth:`EdgeDistance.sample` as numpy computed it before the kernel."""
    rows = np.arange(window[0], window[0] + window[2]) - row_off + 0.5
    cols = np.arange(window[1], window[1] + window[3]) - col_off + 0.5
    rr = rows / edge.factor_rows - 0.5 + 1.0
    cc = cols / edge.factor_cols - 0.5 + 1.0
    r0, c0 = np.floor(rr).astype(np.intp), np.floor(cc).astype(np.intp)
    wr1, wc1 = (rr - r0)[:, None], (cc - c0)[None, :]
    wr0, wc0 = 1.0 - wr1, 1.0 - wc1
    sub = edge.distance_m[r0[0] : r0[-1] + 2, c0[0] : c0[-1] + 2].astype(np.float64)
    top, bottom = sub[r0 - r0[0]], sub[r0 - r0[0] + 1]
    c0 -= c0[0]
    out = top[:, c0] * wr0 * wc0
    out += top[:, c0 + 1] * wr0 * wc1
    out += bottom[:, c0] * wr1 * wc0
    out += bottom[:, c0 + 1] * wr1 * wc1
    return out.astype(np.float32)


def _bits(a: NDArray[np.float32]) -> NDArray[np.uint32]:
    return np.ascontiguousarray(a).view(np.uint32)


def test_seam_distances_are_the_numpy_passes_bit_for_bit() -> None:
    rng = np.random.default_rng(7)
    grid = Grid(500_000.0, 5_000_000.0, 0.05, 3000, 2000)
    cams = [
        (500_000.0 + x, 5_000_000.0 - y, f"s{n % 4}")
        for n, (x, y) in enumerate(rng.uniform(0, 150, size=(40, 2)))
    ]
    field = SeamField(Ownership.from_cameras(cams), grid, lattice_step_px=8, compiled=True)
    ids = ["s0", "s1", "s2", "s3"]
    for block in [Block(0, 0, 128, 512), Block(1037, 1541, 77, 459), Block(1992, 2999, 8, 1)]:
        got = field.seam_distance(block, ids)
        want = _numpy_seam(field, block, ids)
        assert got.dtype == np.float32 and got.shape == want.shape
        assert np.array_equal(_bits(got), _bits(want))
        by_numpy = replace(field, compiled=False).seam_distance(block, ids)
        assert np.array_equal(_bits(by_numpy), _bits(want))
        assert (got != 0).any()  # not a trivially equal field


def test_edge_distance_samples_are_the_numpy_passes_bit_for_bit() -> None:
    rng = np.random.default_rng(3)
    distance = (rng.random((260, 190)) * 40).astype(np.float32)
    edge = EdgeDistance(3000 / 258, 2100 / 188, distance, compiled=True)
    src: Any = SimpleNamespace(row_off=100, col_off=-40)
    for window in [(100, -40, 3000, 2100), (1100, 333, 128, 512), (3099, 2059, 1, 1)]:
        got = edge.sample(src, window)
        want = _numpy_sample(edge, 100, -40, window)
        assert got.shape == (window[2], window[3])
        assert np.array_equal(_bits(got), _bits(want))
        by_numpy = replace(edge, compiled=False).sample(src, window)
        assert np.array_equal(_bits(by_numpy), _bits(want))


def test_the_kernels_take_their_inputs_as_documented() -> None:
    values = np.arange(12, dtype=np.float32).reshape(3, 4)
    cell = np.array([0, 1], dtype=np.intp)
    half = np.array([0.5, 0.25])
    got = bilinear_sample(values, cell, cell, half, half)
    assert got.tolist() == [[2.5, 3.25], [5.5, 6.25]]
    out = np.empty((2, 2), dtype=np.float32)
    seam_columns(values[:2].astype(np.float64), np.zeros((2, 4)), cell, half, out)
    assert out.tolist() == [[0.25, 0.625], [2.25, 2.625]]


def _numpy_blend(
    z: NDArray[np.float32],
    valid: NDArray[np.bool_],
    edt: NDArray[np.float32],
    e: NDArray[np.float32],
    flags: NDArray[np.float32],
    feather_m: float,
) -> tuple[NDArray[np.float32], NDArray[np.float32], NDArray[np.bool_]]:
    """The DEM merge's numpy passes: blend_weights, height_weights, weighted_heights."""
    any_valid = valid.any(axis=0)
    weights = height_weights(valid, edt, blend_weights(e, valid, feather_m))
    flag = weighted_heights(weights, flags.copy(), valid) >= 0.5
    return weighted_heights(weights, z.copy(), valid), flag.astype(np.float32), any_valid


def _strip_case(seed: int, k: int) -> tuple[NDArray[Any], ...]:
    """Random heights, masks (holes in the owner, pixels of one source, of none), edge and
    seam distances (zeros, ties, far beyond the feather) and measured flags."""
    rng = np.random.default_rng(seed)
    shape = (k, 64, 96)
    z = rng.normal(30, 5, shape).astype(np.float32)
    valid = rng.random(shape) > 0.3
    valid[:, :4] = False  # no source
    valid[1:, 4:8] = False  # one source
    edt = (rng.random(shape) * 12).astype(np.float32)
    edt[:, 10:12] = 0.0
    e = (rng.random(shape) * 4).astype(np.float32)
    e[0, 20:30] = 3.9  # every weight vanishes: the fallback on the smallest e
    e[1:, 20:30] = 3.5
    e[:, 30:32] = 1.0  # ties
    flags = (rng.random(shape) > 0.5).astype(np.float32)
    return z, valid, edt, e, flags


def test_the_blend_is_the_numpy_passes_bit_for_bit() -> None:
    for seed, k, feather in [(1, 2, 5.0), (2, 3, 2.0), (3, 4, 0.0), (4, 5, 7.5), (5, 1, 5.0)]:
        z, valid, edt, e, flags = _strip_case(seed, k)
        want_z, want_flag, any_valid = _numpy_blend(z, valid, edt, e, flags, feather)
        dem = np.full(z.shape[1:], -9999.0, dtype=np.float32)
        measured = np.full(z.shape[1:], -9999.0, dtype=np.float32)
        done = blend_heights(z, valid, edt, e, flags, feather, dem, measured)
        assert done == int(any_valid.sum())
        assert np.array_equal(_bits(dem[any_valid]), _bits(want_z[any_valid]))
        assert np.array_equal(measured[any_valid], want_flag[any_valid])
        assert (dem[~any_valid] == -9999.0).all() and (measured[~any_valid] == -9999.0).all()
        no_flags = np.full(z.shape[1:], -9999.0, dtype=np.float32)
        assert blend_heights(z, valid, edt, e, None, feather, no_flags, None) == done
        assert np.array_equal(_bits(no_flags), _bits(dem))


def test_a_merged_dsm_is_the_same_blended_by_the_kernel_or_by_the_numpy_passes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three DSMs with holes and filled cells, merged with the compiled kernels (the overlap
    threshold at 0), with numpy's passes (the default threshold: a small merge) and with a seam
    method without ``linear_feather``: the same heights and flags, bit for bit, every overview."""
    surf = _surface()
    cols = {"a": (0, 110), "b": (80, 190), "c": (160, 240)}
    inputs = {}
    for n, (sid, (c0, c1)) in enumerate(cols.items()):
        z = surf[:, c0:c1] + np.float32(0.3 * n)
        z[n * 20 : n * 20 + 15, 5:25] = DEM_NODATA
        flags = np.ones(z.shape, dtype=bool)
        flags[100:120, 10:30] = False
        flags[:, -12:-6] = n % 2 == 0  # the overlaps disagree on what was measured
        inputs[sid] = _write_measured(tmp_path / f"{sid}.tif", z, flags, c0)
    own = Ownership.from_cameras(
        [(LEFT + RES * (c0 + c1) / 2, TOP - 40, s) for s, (c0, c1) in cols.items()]
    )
    passes = tmp_path / "numpy.tif"
    merge_dems(inputs, passes, ownership=own, block_size=64, workers=1)
    monkeypatch.setattr(dem, "COMPILED_MIN_BLEND_PX", 0)
    compiled = tmp_path / "compiled.tif"
    merge_dems(inputs, compiled, ownership=own, block_size=64, workers=1)
    monkeypatch.setattr(OwnershipSeams, "linear_feather", False)
    unfeathered = tmp_path / "unfeathered.tif"
    merge_dems(inputs, unfeathered, ownership=own, block_size=64, workers=1)
    assert unfeathered.read_bytes() == compiled.read_bytes()
    with rasterio.open(compiled) as a, rasterio.open(passes) as b:
        assert a.count == 2 and a.overviews(1) == b.overviews(1)
        za, zb = a.read(), b.read()
        assert np.array_equal(_bits(za), _bits(zb))
        assert ((za[1] == 0) & (za[0] != DEM_NODATA)).any()  # some cells filled, some measured
        for f in a.overviews(1):
            shape = (2, -(-a.height // f), -(-a.width // f))
            assert np.array_equal(a.read(out_shape=shape), b.read(out_shape=shape))


def test_a_small_dem_merge_does_not_load_numba(tmp_path: Path) -> None:
    """Below :data:`.dem.COMPILED_MIN_BLEND_PX` the merge keeps numpy's passes and never
    imports numba (its first use costs a process about 0.75 s and 108 MiB)."""
    surf = _surface()
    a = _write_measured(tmp_path / "a.tif", surf[:, :150].copy(), np.ones((160, 150), bool), 0)
    b = _write_measured(tmp_path / "b.tif", surf[:, 90:].copy(), np.ones((160, 150), bool), 90)
    script = (
        "import sys; from pathlib import Path; from prefect_odm.merge import merge_dems; "
        f"merge_dems({{'a': Path({str(a)!r}), 'b': Path({str(b)!r})}}, "
        f"Path({str(tmp_path / 'dsm.tif')!r}), ownership=None, block_size=64); "
        "print('numba' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"
    assert (tmp_path / "dsm.tif").exists()
