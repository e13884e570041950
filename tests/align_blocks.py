"""Synthetic blocks of submodels for the alignment tests and benchmark (numpy only).

A lawnmower survey (shots every ``spacing_m`` on a square grid, 100 m above a ground sloping
1 in 10) is cut into ``nx`` x ``ny`` submodels, each with its cameras within ``overlap_m`` of its
cell; every submodel "reconstructs" its cameras through its own error similarity ``E_i``
(``X_i = E_i^-1(X_true)`` plus noise), so the right alignment of submodel ``i`` is ``E_i``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray
from scipy.spatial.transform import Rotation

from prefect_odm.align import CameraTable, Similarity

FloatArray = NDArray[np.float64]
ORIGIN = np.array([500_000.0, 4_500_000.0, 0.0])


@dataclass
class Block:
    truth: dict[str, FloatArray]  # image -> true centre (3,)
    truth_rot: dict[str, FloatArray]  # image -> true world-to-camera rotation (3, 3)
    members: dict[str, list[str]]  # submodel id -> its images

    def tables(
        self,
        errors: dict[str, Similarity] | None = None,
        noise_m: float = 0.0,
        seed: int = 0,
    ) -> list[CameraTable]:
        """Each submodel's cameras seen through ``errors[id]^-1`` (identity when absent)."""
        rng = np.random.default_rng(seed)
        out = []
        for sid, names in self.members.items():
            err = (errors or {}).get(sid, Similarity()).inverse()
            x = err.apply(np.stack([self.truth[n] for n in names]))
            x = x + rng.normal(0.0, noise_m, x.shape) if noise_m else x
            rot = err.apply_world_to_camera(np.stack([self.truth_rot[n] for n in names]))
            out.append(CameraTable(sid, tuple(names), x, rot))
        return out

    def centroid(self, sid: str) -> FloatArray:
        return np.stack([self.truth[n] for n in self.members[sid]]).mean(axis=0)


def make_block(
    nx: int, ny: int, *, cell_m: float = 120.0, spacing_m: float = 20.0, overlap_m: float = 25.0
) -> Block:
    """``nx`` x ``ny`` submodels of ``cell_m`` squares (a chain when ``ny == 1``)."""
    xs = np.arange(spacing_m / 2, nx * cell_m, spacing_m)
    ys = np.arange(spacing_m / 2, ny * cell_m, spacing_m)
    gx, gy = np.meshgrid(xs, ys)
    truth: dict[str, FloatArray] = {}
    truth_rot: dict[str, FloatArray] = {}
    yaw = Rotation.from_euler("z", (90.0 * (np.arange(gx.size) % 2))[:, None], degrees=True)
    nadir = Rotation.from_euler("x", 180.0, degrees=True)
    rots = (nadir * yaw).as_matrix()
    for k, (x, y) in enumerate(zip(gx.ravel(), gy.ravel(), strict=True)):
        name = f"IMG_{k:05d}.JPG"
        truth[name] = ORIGIN + np.array([x, y, 100.0 + 0.1 * x])
        truth_rot[name] = rots[k]
    names = list(truth)
    xy = np.stack([gx.ravel(), gy.ravel()], axis=1)
    members: dict[str, list[str]] = {}
    for j in range(ny):
        for i in range(nx):
            lo = np.array([i * cell_m - overlap_m, j * cell_m - overlap_m])
            inside = np.all((xy >= lo) & (xy < lo + cell_m + 2 * overlap_m), axis=1)
            members[f"submodel-{j * nx + i:03d}"] = [names[k] for k in np.flatnonzero(inside)]
    return Block(truth, truth_rot, members)


def perturbation(
    centre: FloatArray,
    shift_m: tuple[float, float, float] = (2.4, 1.8, 1.5),
    tilt_deg: float = 1.0,
    scale: float = 1.002,
) -> Similarity:
    """The acceptance perturbation: 3 m horizontal, 1.5 m height, 1 degree tilt, 0.2 % scale."""
    rotvec = np.radians(tilt_deg) * np.array([0.6, 0.8, 0.0])
    return Similarity.from_parameters(rotvec, float(np.log(scale)), shift_m, centre)
