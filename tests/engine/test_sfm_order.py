"""Structure from motion does not depend on the order COLMAP's extraction threads finish in.

COLMAP numbers the images in the order its extraction threads write them, and every later step
follows the numbers: two runs on the same images gave different cameras and DSMs. The engine
renumbers them by name (``sfm._number_images_by_name``) before matching. The test writes the
images in reverse name order (one extraction each) into a real COLMAP database.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pycolmap
import pytest

from prefect_odm.engine import sfm

from .conftest import BRIGHTON_IMAGES

NAMES = ["DJI_0018.JPG", "DJI_0019.JPG", "DJI_0020.JPG", "DJI_0021.JPG"]


def _reversed_database(path: Path) -> None:
    extraction = pycolmap.FeatureExtractionOptions()
    extraction.num_threads = 1
    extraction.max_image_size = 480
    extraction.sift.max_num_features = 800
    for name in NAMES[::-1]:  # one call each: COLMAP sorts the names of one call
        pycolmap.extract_features(
            path,
            BRIGHTON_IMAGES,
            image_names=[name],
            camera_mode=pycolmap.CameraMode.SINGLE,
            extraction_options=extraction,
            device=pycolmap.Device.cpu,
        )


def _by_name(path: Path) -> dict[str, tuple[int, np.ndarray, int]]:
    """Name -> (image id, keypoints, id of the image in its frame)."""
    db = pycolmap.Database.open(path)
    try:
        frames = {f.frame_id: f for f in db.read_all_frames()}
        out = {}
        for image in db.read_all_images():
            frame_images = list(frames[image.frame_id].image_ids)
            assert len(frame_images) == 1
            out[image.name] = (
                image.image_id,
                np.asarray(db.read_keypoints(image.image_id)),
                int(frame_images[0].id),
            )
        return out
    finally:
        db.close()


def test_images_are_numbered_by_name_and_keep_their_features(tmp_path: Path) -> None:
    database = tmp_path / "database.db"
    _reversed_database(database)
    before = _by_name(database)
    # the extraction numbered them in the order it wrote them (so the test can fail)
    assert [before[n][0] for n in NAMES] == [4, 3, 2, 1]

    sfm._number_images_by_name(database)

    after = _by_name(database)
    assert [after[n][0] for n in NAMES] == [1, 2, 3, 4]
    for name in NAMES:
        assert np.array_equal(after[name][1], before[name][1]), name
        assert after[name][2] == after[name][0], name  # its frame holds the image's new id
    # COLMAP itself reads the renumbered database: neighbours match and verify
    pycolmap.match_exhaustive(database, device=pycolmap.Device.cpu)
    db = pycolmap.Database.open(database)
    try:
        assert db.num_verified_image_pairs() >= 3
    finally:
        db.close()


def test_a_database_of_another_schema_is_refused_in_one_line(tmp_path: Path) -> None:
    import sqlite3

    database = tmp_path / "database.db"
    sqlite3.connect(database).execute("CREATE TABLE images (image_id INTEGER, name TEXT)").close()
    with pytest.raises(sfm.ProcessingFailedError, match="cannot renumber the images"):
        sfm._number_images_by_name(database)
