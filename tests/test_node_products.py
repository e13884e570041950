"""What real nodes return, read as they write it: OpenDroneMap's ``shots.geojson`` without
``translation`` (ODM before 2.0, and every product of NodeODM 2.2.4's test mode)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest

from prefect_odm.align import read_shots_geojson
from prefect_odm.geo import project_lonlat

NODEODM_SHOTS = (
    Path(__file__).resolve().parents[1]
    / "../shared/peers/nodeodm/tests/processing_results/odm_report/shots.geojson"
)


def test_nodeodm_shots_without_translation_are_placed_from_their_geometry(data_dir: Path) -> None:
    """NodeODM's canned shots (brighton's cameras, reconstructed by ODM) land within a few metres
    of brighton's own EXIF GPS once their WGS 84 geometry is projected into EPSG:32615."""
    document = json.loads(NODEODM_SHOTS.read_text())
    assert all("translation" not in f["properties"] for f in document["features"])
    table = read_shots_geojson("submodel-000", document, crs_epsg=32615)
    assert len(table.names) == len(document["features"]) and table.rotations is not None
    with open(data_dir / "brighton_beach_1600" / "manifest.csv") as fh:
        gps = {row["file"]: row for row in csv.DictReader(fh)}
    names = [n for n in table.names if n in gps]
    assert len(names) >= 10, table.names
    lon = np.array([float(gps[n]["lon"]) for n in names])
    lat = np.array([float(gps[n]["lat"]) for n in names])
    x, y = project_lonlat(lon, lat, 32615)
    rows = [table.index()[n] for n in names]
    offsets = np.hypot(table.centres[rows, 0] - x, table.centres[rows, 1] - y)
    heights = table.centres[rows, 2] - np.array([float(gps[n]["alt"]) for n in names])
    print(
        f"camera vs EXIF GPS: median {np.median(offsets):.2f} m, max {offsets.max():.2f} m; "
        f"dz median {np.median(heights):+.2f} m"
    )
    assert np.median(offsets) < 5.0 and np.abs(heights).max() < 5.0


def test_a_feature_without_translation_needs_a_point_and_a_crs() -> None:
    point = {"type": "Point", "coordinates": [-91.994, 46.8426, 198.4]}
    feature = {"type": "Feature", "geometry": point, "properties": {"filename": "a.jpg"}}
    collection = {"type": "FeatureCollection", "features": [feature]}
    with pytest.raises(ValueError, match="no CRS to project its geometry into"):
        read_shots_geojson("s", collection)
    no_point = {**feature, "geometry": None}
    with pytest.raises(ValueError, match="needs 'translation' or a Point geometry"):
        read_shots_geojson("s", {"type": "FeatureCollection", "features": [no_point]}, 32615)
    table = read_shots_geojson("s", collection, 32615)
    x, y = project_lonlat(-91.994, 46.8426, 32615)
    assert np.allclose(table.centres, [[float(x), float(y), 198.4]])
    # a given translation wins over the geometry (exact, already projected)
    with_t = {**feature, "properties": {"filename": "a.jpg", "translation": [1.0, 2.0, 3.0]}}
    table = read_shots_geojson("s", {"type": "FeatureCollection", "features": [with_t]}, 32615)
    assert np.allclose(table.centres, [[1.0, 2.0, 3.0]])
