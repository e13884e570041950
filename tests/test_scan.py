"""scan_images on real files: every problem image gets its exact reason, local and on S3."""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from prefect_odm.errors import InputError, NoImagesError
from prefect_odm.geo import project_lonlat
from prefect_odm.survey.flight_checks import (
    flight_tail_mask,
    low_altitude_mask,
    position_outlier_mask,
)
from prefect_odm.survey.scan import scan_images, scan_images_with_stats

GPS_IFD = 0x8825


def _resave(src: Path, dst: Path, edit_gps) -> None:
    """Re-encode a real JPEG with an edited GPS IFD (edit_gps(gps_dict) -> None or 'drop')."""
    im = Image.open(src)
    exif = im.getexif()
    if edit_gps == "drop":
        del exif[GPS_IFD]
    else:
        edit_gps(exif.get_ifd(GPS_IFD))
    im.save(dst, exif=exif.tobytes(), quality=85)


def _set_zero(gps: dict) -> None:
    gps[2] = (0.0, 0.0, 0.0)
    gps[4] = (0.0, 0.0, 0.0)


def _move_north_11_km(gps: dict) -> None:
    d, m, s = (float(v) for v in gps[2])
    gps[2] = (d, m + 6.0, s)


@pytest.fixture()
def bad_survey(tmp_path: Path, brighton_images: Path) -> Path:
    """Brighton's 18 real images plus one real file of every problem kind."""
    root = tmp_path / "survey"
    sub = root / "flight-1"
    sub.mkdir(parents=True)
    for src in sorted(brighton_images.glob("*.JPG")):
        shutil.copy(src, sub / src.name)
    first = brighton_images / "DJI_0018.JPG"
    data = first.read_bytes()
    _resave(first, root / "no_gps.jpg", "drop")
    _resave(first, root / "gps_zero.jpg", _set_zero)
    _resave(first, root / "far_away.jpg", _move_north_11_km)
    (root / "truncated.jpg").write_bytes(data[: len(data) // 2])
    (root / "empty.jpg").write_bytes(b"")
    (root / "notes.jpg").write_text("these are my flight notes, not a photo\n")
    (root / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe1\x00\x04ab" + b"\x00" * 500)
    (root / "copy_of_0018.jpg").write_bytes(data)
    # Same bytes with DJI relative altitude 39.80 m -> 02.00 m (same length: an in-place edit).
    low = data.replace(b'RelativeAltitude="+39.80"', b'RelativeAltitude="+02.00"')
    assert low != data
    (root / "takeoff.jpg").write_bytes(low)
    (root / "readme.txt").write_text("not scanned: not an image name\n")
    return root


def test_each_problem_kind_has_its_exact_reason(bad_survey: Path) -> None:
    survey = scan_images(str(bad_survey))
    reasons = {r.name: r.reason for r in survey.rejected}
    assert reasons == {
        "no_gps.jpg": "no_gps",
        "gps_zero.jpg": "gps_zero",
        "far_away.jpg": "position_outlier",
        "truncated.jpg": "truncated",
        "empty.jpg": "empty_file",
        "notes.jpg": "not_an_image",
        "readme.txt": "not_an_image",  # a stray file is listed as skipped, never silently
        "broken.jpg": "unreadable",
        # The original sorts after "copy_of_0018.jpg", so the copy is kept and the original
        # (flight-1/DJI_0018.JPG) is the duplicate.
        "flight-1/DJI_0018.JPG": "duplicate",
        "takeoff.jpg": "low_altitude",
    }
    dup = next(r for r in survey.rejected if r.reason == "duplicate")
    assert "copy_of_0018.jpg" in dup.detail
    names = [im.name for im in survey.images]
    assert names == sorted(names)
    assert len(names) == 18  # 17 originals + the kept copy
    assert all(r.detail for r in survey.rejected)
    assert survey.crs_epsg == 32615
    assert survey.cameras == {"DJI FC300S": 18}


def test_fail_policy_names_file_and_reason(bad_survey: Path) -> None:
    with pytest.raises(InputError) as info:
        scan_images(str(bad_survey), policy="fail")
    message = str(info.value)
    assert "\n" not in message
    assert "broken.jpg" in message and "unreadable" in message


def test_brighton_identities_match_manifest(data_dir: Path, brighton_images: Path) -> None:
    with (data_dir / "brighton_beach_1600" / "manifest.csv").open(newline="") as fh:
        expected = {row["file"]: row["sha256"] for row in csv.DictReader(fh)}
    survey, stats = scan_images_with_stats(str(brighton_images))
    assert {im.name: im.identity for im in survey.images} == {
        k: f"sha256:{v}" for k, v in expected.items()
    }
    assert survey.rejected == []
    assert stats.files == 18
    # Metadata needs the header (~10 KB) read in one 128 KiB request plus a 1 KiB tail.
    assert stats.metadata_bytes_per_image <= 131072 + 1024


def test_seneca_all_accepted(seneca_images: Path) -> None:
    survey = scan_images(str(seneca_images))
    assert len(survey.images) == 167 and survey.rejected == []
    assert survey.crs_epsg == 32617


def test_missing_path(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(InputError, match="does not exist") as info:
        scan_images(str(missing))
    assert str(missing) in str(info.value)


def test_folder_without_images(tmp_path: Path) -> None:
    (tmp_path / "readme.txt").write_text("nothing here")
    with pytest.raises(NoImagesError, match="no image files"):
        scan_images(str(tmp_path))


def test_no_gps_anywhere(tmp_path: Path, brighton_images: Path) -> None:
    for src in sorted(brighton_images.glob("*.JPG"))[:5]:
        _resave(src, tmp_path / src.name, "drop")
    with pytest.raises(InputError, match="none of the 5 images has GPS coordinates") as info:
        scan_images(str(tmp_path))
    assert str(tmp_path) in str(info.value)


def test_only_broken_files(tmp_path: Path) -> None:
    (tmp_path / "a.jpg").write_bytes(b"")
    (tmp_path / "b.jpg").write_text("text")
    with pytest.raises(NoImagesError, match="none of the 2 files is a readable image") as info:
        scan_images(str(tmp_path))
    assert "a.jpg: " in str(info.value) and "b.jpg: " in str(info.value)
    (tmp_path / "a.jpg").unlink()
    with pytest.raises(NoImagesError, match=r"its one file is not a readable image \(b\.jpg: "):
        scan_images(str(tmp_path))


def test_mixed_cameras_are_reported(tmp_path: Path, brighton_images: Path, data_dir: Path) -> None:
    for src in sorted(brighton_images.glob("*.JPG"))[:4]:
        shutil.copy(src, tmp_path / src.name)
    # A real Canon frame near brighton: take a tiny_exif image and move its GPS onto brighton.
    src = data_dir / "tiny_exif" / "images" / "image_1.jpg"
    im = Image.open(src)
    exif = im.getexif()
    gps = exif.get_ifd(GPS_IFD)
    gps.update({1: "N", 2: (46.0, 50.0, 33.5), 3: "W", 4: (91.0, 59.0, 40.0)})
    im.save(tmp_path / "canon.jpg", exif=exif.tobytes())
    survey = scan_images(str(tmp_path))
    assert survey.cameras == {"Canon Canon PowerShot S110": 1, "DJI FC300S": 4}


def test_outlier_rule_is_robust() -> None:
    rng = np.random.default_rng(3)
    x = rng.uniform(0, 400, 200)
    y = rng.uniform(0, 300, 200)
    x[7], y[7] = 5000.0, 5000.0
    mask = position_outlier_mask(x, y)
    assert mask.tolist() == [i == 7 for i in range(200)]


def test_low_altitude_rules() -> None:
    rel = [40.0] * 10 + [3.0, 15.0]
    assert low_altitude_mask([200.0] * 12, rel).tolist() == [False] * 10 + [True, True]
    absolute = [280.0 + (i % 5) for i in range(20)] + [221.0]
    assert low_altitude_mask(absolute, [None] * 21).tolist() == [False] * 20 + [True]


def test_flight_tails_on_synthetic_lawnmower() -> None:
    from datetime import datetime, timedelta

    t0 = datetime(2025, 1, 1, 12, 0, 0)
    xs: list[float] = []
    ys: list[float] = []
    # Tail: 6 shots flying diagonally to the first waypoint.
    for i in range(6):
        xs.append(-300 + 50 * i)
        ys.append(-300 + 50 * i)
    for line in range(6):
        for j in range(20):
            xs.append(j * 20.0 if line % 2 == 0 else 380 - j * 20.0)
            ys.append(line * 60.0)
    times = [t0 + timedelta(seconds=2 * i) for i in range(len(xs))]
    mask = flight_tail_mask(times, np.array(xs), np.array(ys))
    assert mask[:5].all() and not mask[6:].any()


@pytest.mark.integration
def test_scan_from_s3_on_loopback(s3_endpoint: str, brighton_images: Path, data_dir: Path) -> None:
    import boto3

    client = boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1")
    client.create_bucket(Bucket="scan-test")
    for src in sorted(brighton_images.glob("*.JPG")):
        client.upload_file(str(src), "scan-test", f"survey/images/{src.name}")
    client.put_object(Bucket="scan-test", Key="survey/images/empty.jpg", Body=b"")
    survey, stats = scan_images_with_stats(
        "s3://scan-test/survey", storage_options={"endpoint_url": s3_endpoint}, max_workers=4
    )
    local = scan_images(str(brighton_images))
    assert [im.name for im in survey.images] == [f"images/{im.name}" for im in local.images]
    assert all(im.identity.startswith("etag:") for im in survey.images)
    for a, b in zip(survey.images, local.images, strict=True):
        assert (a.latitude, a.longitude, a.relative_altitude_m) == (
            b.latitude,
            b.longitude,
            b.relative_altitude_m,
        )
        assert a.url.startswith("s3://scan-test/survey/images/")
    assert [(r.name, r.reason) for r in survey.rejected] == [("images/empty.jpg", "empty_file")]
    assert survey.crs_epsg == local.crs_epsg
    # Ranged reads only: far less than the 11.5 MB of the images.
    assert stats.identity_bytes == 0
    assert stats.metadata_bytes < 19 * (131072 + 1024)


def test_an_s3_endpoint_that_does_not_answer_is_one_storage_error() -> None:
    import socket

    from prefect_odm.errors import StorageError

    with socket.socket() as sock:  # a loopback port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    options = {"endpoint_url": f"http://127.0.0.1:{port}", "key": "x", "secret": "y"}
    options["config_kwargs"] = {"retries": {"max_attempts": 1}, "connect_timeout": 2}
    with pytest.raises(StorageError) as caught:
        scan_images("s3://bucket/images", storage_options=options)
    message = str(caught.value)
    assert message.startswith("s3://bucket/images: cannot list (")
    assert "EndpointConnectionError" in message and "\n" not in message


def test_projection_of_scan(brighton_images: Path) -> None:
    survey = scan_images(str(brighton_images))
    x, y = project_lonlat(
        [im.longitude for im in survey.images],
        [im.latitude for im in survey.images],
        survey.crs_epsg,
    )
    assert np.ptp(x) < 200 and np.ptp(y) < 200  # ~84 x 84 m survey


def test_a_photo_that_does_not_decode_whole_is_set_aside_once_decoded_ok_ones_are_remembered(
    tmp_path: Path, brighton_images: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Intact header, GPS and end marker, a stray start-of-frame marker inside the entropy-coded
    data: Pillow raises ``OSError: broken data stream`` on ``load()``. The scan names the file;
    a repeat scan decodes again only what it did not see decode whole."""
    import prefect_odm.survey.local_scan as local_scan

    monkeypatch.setenv("PREFECT_ODM_HOME", str(tmp_path / "home"))
    root = tmp_path / "survey"
    root.mkdir()
    for src in sorted(brighton_images.glob("*.JPG")):
        (root / src.name).symlink_to(src)
    damaged = root / "DJI_0020.JPG"
    data = bytearray(damaged.read_bytes())
    damaged.unlink()
    middle = len(data) // 2
    data[middle : middle + 4] = b"\xff\xc0\x00\x02"
    damaged.write_bytes(bytes(data))
    with Image.open(damaged) as image, pytest.raises(OSError, match="broken data stream"):
        image.load()

    decoded: list[str] = []
    real = local_scan.decode_whole
    monkeypatch.setattr(
        local_scan,
        "decode_whole",
        lambda res, path, *data: (decoded.append(Path(path).name), real(res, path, *data)),
    )
    survey = scan_images(str(root))
    assert [(r.name, r.reason) for r in survey.rejected] == [("DJI_0020.JPG", "unreadable")]
    assert "does not decode whole (broken data stream" in survey.rejected[0].detail
    assert len(survey.images) == 17 and len(decoded) == 18
    decoded.clear()
    again = scan_images(str(root))
    assert again.fingerprint == survey.fingerprint and decoded == ["DJI_0020.JPG"]


@pytest.mark.parametrize("processes", [0, 2])
def test_the_pool_of_processes_reads_as_the_threads_do(
    bad_survey: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, processes: int
) -> None:
    """A first scan in processes (as of :data:`POOL_MIN_FILES` unknown files) gives the same
    records, in the same order, with the same reasons and details, as one on threads; a
    photo that does not decode whole is set aside there too."""
    import prefect_odm.survey.local_scan as local_scan

    brighton = bad_survey / "flight-1"
    data = bytearray((brighton / "DJI_0020.JPG").read_bytes())
    middle = len(data) // 2
    data[middle : middle + 4] = b"\xff\xc0\x00\x02"
    (bad_survey / "damaged.jpg").write_bytes(bytes(data))
    threads = scan_images(str(bad_survey), use_identity_cache=False)
    monkeypatch.setattr(local_scan, "POOL_MIN_FILES", 1)
    monkeypatch.setattr(local_scan, "POOL_CHUNK_FILES", 4)  # results of several tasks in order
    monkeypatch.setattr(local_scan, "scan_processes", lambda files, workers: processes)
    if processes:  # every file read in the pool: none left to this process's threads
        monkeypatch.setattr(local_scan, "map_in_threads", lambda scan, items, workers: iter(()))
    monkeypatch.setenv("PREFECT_ODM_HOME", str(tmp_path / "home"))
    pooled = scan_images(str(bad_survey))
    assert pooled.model_dump() == threads.model_dump()
    damaged = next(r for r in pooled.rejected if r.name == "damaged.jpg")
    assert damaged.reason == "unreadable"
    assert "does not decode whole (broken data stream" in damaged.detail
    assert scan_images(str(bad_survey)).model_dump() == threads.model_dump()  # from the cache


def test_a_pool_is_for_many_files_on_many_cores() -> None:
    from prefect_odm.survey.local_scan import POOL_MIN_FILES, scan_processes

    assert scan_processes(POOL_MIN_FILES - 1, 8) == 0
    assert scan_processes(POOL_MIN_FILES, 1) == 0
    assert scan_processes(POOL_MIN_FILES, 8) in (0, *range(2, 9))
