"""Camera tables read from ``shots.geojson`` and the correspondences submodels share (pure core).

What a node returns in ``odm_report/shots.geojson`` (a GeoJSON FeatureCollection, one Point
feature per reconstructed image). Each feature's properties carry:

* ``filename``: the image name;
* ``translation``: the camera centre ``[x, y, z]`` in the submodel's projected CRS (UTM metres).
  OpenDroneMap's ``opendm/shots.py`` (``get_geojson_shots_from_opensfm``) writes the OpenSfM
  shot origin plus the UTM offset there, not OpenSfM's ``t`` vector; the built-in engine writes
  the centre too;
* ``rotation``: the world-to-camera rotation, either a rotation vector of 3 numbers (OpenSfM's
  axis-angle, what ODM writes, converted with ``cv2.Rodrigues`` there) or 9 numbers, a row-major
  3x3 matrix (what the built-in engine writes, ``prefect_odm.engine.products.write_shots_geojson``);
* optionally ``epsg`` (the built-in engine) and ``capture_time`` (ODM, seconds).

The feature geometry is WGS 84 (longitude, latitude, altitude). Where ``translation`` is given it
is used (exact, projected); ODM before 2.0 (``opendm/shots.py`` at ad891bf, May 2020) wrote no
``translation``, and NodeODM's test mode returns those canned files to this day: there the
camera centre is the geometry projected into the submodel's CRS (:func:`prefect_odm.geo.project_lonlat`),
the altitude kept.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray
from scipy.spatial.transform import Rotation

from prefect_odm.geo import project_lonlat

FloatArray = NDArray[np.float64]


@dataclass(frozen=True)
class CameraTable:
    """The cameras one submodel reconstructed, in its projected CRS.

    Attributes:
        submodel_id: the submodel, e.g. ``submodel-003``.
        names: image names, length ``n``, unique.
        centres: camera centres, shape ``(n, 3)``, metres in the plan CRS.
        rotations: world-to-camera rotations, shape ``(n, 3, 3)``, or ``None`` when not given.
        epsg: the CRS the node says it used, when it says.
    """

    submodel_id: str
    names: tuple[str, ...]
    centres: FloatArray
    rotations: FloatArray | None = None
    epsg: int | None = None

    def __post_init__(self) -> None:
        """Check the arrays' shapes against ``names``.

        Raises:
            ValueError: ``centres`` or ``rotations`` not of ``len(names)`` rows, or a name repeated.
        """
        n = len(self.names)
        if self.centres.shape != (n, 3):
            raise ValueError(
                f"{self.submodel_id}: centres must be ({n}, 3), got {self.centres.shape}"
            )
        if self.rotations is not None and self.rotations.shape != (n, 3, 3):
            raise ValueError(f"{self.submodel_id}: rotations must be ({n}, 3, 3)")
        if len(set(self.names)) != n:
            raise ValueError(f"{self.submodel_id}: an image appears twice in the camera table")

    def index(self) -> dict[str, int]:
        """Row of each image name."""
        return {name: i for i, name in enumerate(self.names)}


def _rotation(values: Sequence[float], where: str) -> FloatArray:
    arr = np.asarray(values, dtype=np.float64)
    if arr.size == 3:
        matrix: FloatArray = Rotation.from_rotvec(arr).as_matrix()
        return matrix
    if arr.size == 9:
        return arr.reshape(3, 3)
    raise ValueError(
        f"{where}: rotation must have 3 (axis-angle) or 9 (3x3) numbers, got {arr.size}"
    )


def _centre_from_geometry(
    feature: Mapping[str, Any], crs_epsg: int | None, where: str
) -> list[float]:
    """The camera centre of a feature without ``translation``: its WGS 84 Point projected."""
    geometry = feature.get("geometry") or {}
    coords = geometry.get("coordinates")
    if geometry.get("type") != "Point" or not isinstance(coords, list) or len(coords) != 3:
        raise ValueError(f"{where}: needs 'translation' or a Point geometry [lon, lat, alt]")
    if crs_epsg is None:
        raise ValueError(f"{where}: no 'translation', and no CRS to project its geometry into")
    lon, lat, alt = (float(v) for v in coords)
    x, y = project_lonlat(lon, lat, crs_epsg)
    return [float(x), float(y), alt]


def read_shots_geojson(
    submodel_id: str,
    document: str | bytes | Mapping[str, Any],
    crs_epsg: int | None = None,
) -> CameraTable:
    """A :class:`CameraTable` from the text (or parsed JSON) of a ``shots.geojson``.

    Args:
        submodel_id: the submodel these cameras belong to.
        document: the FeatureCollection, as JSON text or already parsed.
        crs_epsg: the submodel's projected CRS, into which the geometry of features without
            ``translation`` (ODM before 2.0, NodeODM's test mode) is projected.

    Returns:
        the table, with rotations when every feature has one.

    Raises:
        ValueError: not a FeatureCollection, a feature without ``filename``, or without
            ``translation`` and a Point geometry (or ``crs_epsg``) to take the centre from,
            a rotation of another size, or an image listed twice (ODM skips repeats; so do we only
            when the positions agree).
    """
    data = json.loads(document) if isinstance(document, str | bytes) else document
    if data.get("type") != "FeatureCollection":
        raise ValueError(f"{submodel_id}: shots.geojson is not a FeatureCollection")
    names: list[str] = []
    centres: list[list[float]] = []
    rotations: list[FloatArray] = []
    epsg: int | None = None
    for number, feature in enumerate(data.get("features", [])):
        props = feature.get("properties") or {}
        where = f"{submodel_id} shots.geojson feature {number}"
        if "filename" not in props:
            raise ValueError(f"{where}: needs 'filename'")
        if "translation" in props:
            centre = [float(v) for v in props["translation"]]
        else:
            centre = _centre_from_geometry(feature, crs_epsg, where)
        if len(centre) != 3:
            raise ValueError(f"{where}: translation must be [x, y, z]")
        if props["filename"] in names:
            continue
        names.append(str(props["filename"]))
        centres.append(centre)
        if props.get("rotation") is not None:
            rotations.append(_rotation(props["rotation"], where))
        if props.get("epsg") is not None:
            epsg = int(props["epsg"])
    rot = np.stack(rotations) if rotations and len(rotations) == len(names) else None
    return CameraTable(
        submodel_id, tuple(names), np.asarray(centres, dtype=np.float64).reshape(-1, 3), rot, epsg
    )


@dataclass(frozen=True)
class Correspondence:
    """The cameras two submodels both reconstructed (the images their overlap shares).

    Attributes:
        first, second: submodel ids, ``first < second``.
        names: the shared image names, length ``k``, sorted.
        first_centres, second_centres: each submodel's centre of those images, ``(k, 3)`` metres.
        first_rotations, second_rotations: world-to-camera rotations ``(k, 3, 3)``, or ``None``
            when either submodel gave none.
    """

    first: str
    second: str
    names: tuple[str, ...]
    first_centres: FloatArray
    second_centres: FloatArray
    first_rotations: FloatArray | None
    second_rotations: FloatArray | None

    @property
    def key(self) -> str:
        """``first|second``, the overlap's name in reports."""
        return f"{self.first}|{self.second}"

    def rms_m(self) -> float:
        """Root-mean-square distance (metres) between the two submodels' centres, before alignment."""
        d = np.linalg.norm(self.first_centres - self.second_centres, axis=1)
        return float(np.sqrt(np.mean(d**2))) if len(d) else 0.0


def shared_cameras(tables: Sequence[CameraTable], *, min_shared: int = 1) -> list[Correspondence]:
    """Every pair of submodels that reconstructed at least ``min_shared`` of the same images.

    Args:
        tables: one camera table per submodel (ids unique).
        min_shared: the fewest shared images that make a pair.

    Returns:
        correspondences sorted by ``(first, second)``.

    Raises:
        ValueError: two tables with the same submodel id.
    """
    by_id = {t.submodel_id: t for t in tables}
    if len(by_id) != len(tables):
        raise ValueError("two camera tables have the same submodel id")
    owners: dict[str, list[str]] = {}
    for table in tables:
        for name in table.names:
            owners.setdefault(name, []).append(table.submodel_id)
    pairs: dict[tuple[str, str], list[str]] = {}
    for name, ids in owners.items():
        ids.sort()
        for i, a in enumerate(ids):
            for b in ids[i + 1 :]:
                pairs.setdefault((a, b), []).append(name)
    out = []
    for (a, b), names in sorted(pairs.items()):
        if len(names) < min_shared:
            continue
        names.sort()
        ta, tb = by_id[a], by_id[b]
        ia, ib = ta.index(), tb.index()
        rows_a = np.array([ia[n] for n in names])
        rows_b = np.array([ib[n] for n in names])
        with_rot = ta.rotations is not None and tb.rotations is not None
        out.append(
            Correspondence(
                a,
                b,
                tuple(names),
                ta.centres[rows_a],
                tb.centres[rows_b],
                ta.rotations[rows_a] if with_rot and ta.rotations is not None else None,
                tb.rotations[rows_b] if with_rot and tb.rotations is not None else None,
            )
        )
    return out
