"""Move one submodel's real products and cameras by a known similarity (tests and benchmark).

The products of a real run are copied and rewritten as if that submodel's reconstruction had
been off by ``P``: the orthophoto and DSM get ``P``'s horizontal part as a corrected geotransform
(at the submodel's ground height; the DSM's values get its height plane), the point cloud and the
cameras (``shots.geojson`` centres and world-to-camera rotations) get ``P`` itself.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import laspy
import numpy as np
import rasterio
from rasterio.transform import Affine

from prefect_odm.align import Similarity


def known_error(centre: np.ndarray) -> Similarity:
    """The issue's known transform: 3 m shift, 1.5 m height, 1 degree tilt, 0.2 % scale."""
    shift = 3.0 / np.sqrt(2.0)
    return Similarity.from_parameters(
        np.radians([1.0, 0.0, 0.0]), np.log(1.002), np.array([shift, shift, 1.5]), centre
    )


def _move_raster(path: Path, error: Similarity, ground_m: float, heights: bool) -> None:
    fix = error.raster_correction(ground_m)
    with rasterio.open(path, "r+") as ds:
        t = ds.transform
        if heights:
            z = ds.read(1)
            valid = ds.read_masks(1) > 0
            rows, cols = np.nonzero(valid)
            x = t.c + (cols + 0.5) * t.a
            y = t.f + (rows + 0.5) * t.e
            z[valid] = fix.corrected_heights(x, y, z[valid]).astype(z.dtype)
            ds.write(z, 1)
        ds.transform = Affine(*fix.corrected_geotransform((t.a, t.b, t.c, t.d, t.e, t.f)))


def _move_cloud(path: Path, error: Similarity) -> None:
    las = laspy.read(path)
    moved = error.apply(np.stack([las.x, las.y, las.z], axis=1))
    las.x, las.y, las.z = moved[:, 0], moved[:, 1], moved[:, 2]
    las.write(path)


def _move_shots(path: Path, error: Similarity) -> None:
    data = json.loads(path.read_text())
    for feature in data["features"]:
        props = feature["properties"]
        props["translation"] = error.apply(np.array([props["translation"]]))[0].tolist()
        rot = np.asarray(props["rotation"], dtype=np.float64).reshape(3, 3)
        props["rotation"] = error.apply_world_to_camera(rot[None])[0].ravel().tolist()
    path.write_text(json.dumps(data))


def moved_copy(folder: Path, dest: Path, error: Similarity, ground_m: float) -> Path:
    """A copy of a submodel folder (products + ``report/shots.geojson``) moved by ``error``."""
    shutil.copytree(folder, dest)
    _move_raster(dest / "odm_orthophoto.tif", error, ground_m, heights=False)
    _move_raster(dest / "dsm.tif", error, ground_m, heights=True)
    _move_cloud(dest / "odm_georeferenced_model.laz", error)
    _move_shots(dest / "report" / "shots.geojson", error)
    return dest


def submodel_folders(survey_dir: Path) -> dict[str, Path]:
    """Submodel id -> its folder under ``submodels/`` of a run's survey folder."""
    return {d.name.rsplit("-", 1)[0]: d for d in sorted((survey_dir / "submodels").iterdir())}


def products_of(folders: dict[str, Path]) -> tuple[dict[str, dict[str, str]], dict[str, str]]:
    """(submodel id -> product name -> path, submodel id -> shots.geojson path)."""
    products = {
        sid: {
            "orthophoto": str(d / "odm_orthophoto.tif"),
            "dsm": str(d / "dsm.tif"),
            "point_cloud": str(d / "odm_georeferenced_model.laz"),
        }
        for sid, d in folders.items()
    }
    return products, {sid: str(d / "report" / "shots.geojson") for sid, d in folders.items()}


def _camera_centres(shots: str) -> tuple[list[str], np.ndarray, np.ndarray]:
    from prefect_odm.align import read_shots_geojson

    table = read_shots_geojson("x", Path(shots).read_text())
    assert table.rotations is not None
    return list(table.names), table.centres, table.rotations


def recovery(before, after, moved_id: str, error: Similarity, shots: str) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    """How far the alignment of the moved run is from the original run's, on the moved
    submodel's cameras: (largest position difference, metres; largest rotation, degrees).

    ``before`` and ``after`` are the two runs' :class:`AlignmentReport`; ``shots`` the moved
    submodel's original ``shots.geojson``. Perfect recovery: ``C'(P(X)) == C(X)`` for every
    camera ``X`` (``C``, ``C'`` the two runs' corrections, ``P`` the known error), and the same
    orientation.
    """
    from scipy.spatial.transform import Rotation

    _, x0, r0 = _camera_centres(shots)
    pos = np.linalg.norm(
        after.apply_points(moved_id, error.apply(x0)) - before.apply_points(moved_id, x0), axis=1
    )

    def rot(report) -> np.ndarray:  # type: ignore[no-untyped-def]
        m = np.eye(3)
        for step in report._steps(moved_id):
            m = step.similarity().rotation_matrix @ m
        return m

    turn = rot(after) @ error.rotation_matrix @ rot(before).T
    angle = float(np.degrees(Rotation.from_matrix(turn).magnitude()))
    return float(pos.max()), angle
