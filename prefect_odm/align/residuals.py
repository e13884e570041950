"""Residual records of a solved alignment (pure core): per overlap, per submodel, against GPS."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from numpy.typing import NDArray
from scipy.spatial.transform import Rotation

from prefect_odm.align.cameras import CameraTable, Correspondence
from prefect_odm.align.report import (
    CameraGpsResidual,
    OutlierCamera,
    OverlapResidual,
    SubmodelResidual,
    SubmodelTransform,
)
from prefect_odm.align.similarity import Similarity

FloatArray = NDArray[np.float64]


def _rms(values: FloatArray) -> float:
    return float(np.sqrt(np.mean(values**2))) if len(values) else 0.0


def transform_record(submodel_id: str, sim: Similarity, cameras: FloatArray) -> SubmodelTransform:
    """The pydantic record of one submodel's similarity; ``cameras`` ``(n, 3)`` size its correction."""
    return SubmodelTransform(
        submodel_id=submodel_id,
        kind="similarity",
        scale=sim.scale,
        rotation=tuple(float(v) for row in sim.rotation for v in row),
        translation_m=sim.translation,
        centre_m=sim.centre,
        rotation_deg=sim.rotation_deg,
        tilt_deg=sim.tilt_deg,
        scale_change=sim.scale_change,
        max_correction_m=float(sim.displacement_m(cameras).max()),
        n_samples=len(cameras),
    )


def _orientation_rms_deg(c: Correspondence, a: Similarity, b: Similarity) -> float | None:
    if c.first_rotations is None or c.second_rotations is None:
        return None
    ra = a.apply_world_to_camera(c.first_rotations)
    rb = b.apply_world_to_camera(c.second_rotations)
    angles = np.linalg.norm(Rotation.from_matrix(ra @ rb.transpose(0, 2, 1)).as_rotvec(), axis=1)
    return float(np.degrees(_rms(angles)))


def overlap_residuals(
    pairs: Sequence[Correspondence],
    transforms: Mapping[str, Similarity],
    active: NDArray[np.bool_],
    overlap_of_row: NDArray[np.intp],
    rejected: Sequence[OutlierCamera],
) -> list[OverlapResidual]:
    """Before/after agreement of every overlap's shared cameras (after: over the cameras kept).

    Args:
        pairs: the correspondences, in solve order.
        transforms: the solved similarity of each submodel id.
        active: per stacked row (all pairs' cameras in order), whether it was kept.
        overlap_of_row: per stacked row, the index of its pair.
        rejected: the outliers, listed again under their overlap.
    """
    out = []
    for k, c in enumerate(pairs):
        keep = active[overlap_of_row == k]
        a, b = transforms[c.first], transforms[c.second]
        d = np.linalg.norm(a.apply(c.first_centres) - b.apply(c.second_centres), axis=1)[keep]
        before = np.linalg.norm(c.first_centres - c.second_centres, axis=1)
        out.append(
            OverlapResidual(
                overlap=c.key,
                first=c.first,
                second=c.second,
                n_shared=len(c.names),
                n_used=int(keep.sum()),
                rms_before_m=_rms(before),
                rms_after_m=_rms(d),
                max_after_m=float(d.max()) if len(d) else 0.0,
                orientation_rms_after_deg=_orientation_rms_deg(c, a, b),
                outliers=[o for o in rejected if o.overlap == c.key],
            )
        )
    return out


def submodel_residuals(
    submodel_ids: Sequence[str], overlaps: Sequence[OverlapResidual]
) -> list[SubmodelResidual]:
    """Each submodel's residuals pooled over its overlaps (rms weighted by cameras used)."""
    out = []
    for sid in submodel_ids:
        mine = [o for o in overlaps if sid in (o.first, o.second)]
        n = sum(o.n_used for o in mine)
        ss = sum(o.rms_after_m**2 * o.n_used for o in mine)
        out.append(
            SubmodelResidual(
                submodel_id=sid,
                n_overlaps=len(mine),
                rms_after_m=float(np.sqrt(ss / n)) if n else 0.0,
                max_after_m=max((o.max_after_m for o in mine), default=0.0),
            )
        )
    return out


def camera_gps_residuals(
    tables: Sequence[CameraTable],
    transforms: Mapping[str, Similarity],
    gps: Mapping[str, tuple[float, float, float]],
) -> list[CameraGpsResidual]:
    """Each submodel's cameras against their GPS positions (plan CRS), before and after.

    Submodels with no camera in ``gps`` are left out.
    """
    out = []
    for t in tables:
        rows = [i for i, n in enumerate(t.names) if n in gps]
        if not rows:
            continue
        g = np.asarray([gps[t.names[i]] for i in rows], dtype=np.float64)
        x = t.centres[rows]
        after = transforms[t.submodel_id].apply(x) - g
        out.append(
            CameraGpsResidual(
                submodel_id=t.submodel_id,
                n_cameras=len(rows),
                rms_before_m=_rms(np.linalg.norm(x - g, axis=1)),
                rms_after_m=_rms(np.linalg.norm(after, axis=1)),
                horizontal_rms_after_m=_rms(np.linalg.norm(after[:, :2], axis=1)),
                vertical_rms_after_m=_rms(after[:, 2]),
                mean_offset_after_m=(
                    float(after[:, 0].mean()),
                    float(after[:, 1].mean()),
                    float(after[:, 2].mean()),
                ),
            )
        )
    return out
