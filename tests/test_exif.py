"""EXIF/XMP parsing from header bytes, checked against the data manifests."""

from __future__ import annotations

import csv
from datetime import datetime
from pathlib import Path

import pytest

from prefect_odm.errors import ImageHeaderError
from prefect_odm.survey.exif import (
    HEADER_READ_BYTES,
    jpeg_header_end,
    parse_dji_xmp,
    read_header,
    read_metadata,
    sniff_format,
)


def _reader(path: Path):
    data = path.read_bytes()
    calls: list[tuple[int, int]] = []

    def read(offset: int, length: int) -> bytes:
        calls.append((offset, length))
        return data[offset : offset + length]

    return read, len(data), calls


def _manifest(data_dir: Path, survey: str) -> list[dict[str, str]]:
    with (data_dir / survey / "manifest.csv").open(newline="") as fh:
        return list(csv.DictReader(fh))


def _opt(text: str) -> float | None:
    return float(text) if text.strip() else None


@pytest.mark.parametrize("survey", ["brighton_beach_1600", "seneca_1200", "tiny_exif"])
def test_metadata_matches_manifest(data_dir: Path, survey: str) -> None:
    rows = _manifest(data_dir, survey)
    assert rows
    for row in rows:
        read, size, _ = _reader(data_dir / survey / "images" / row["file"])
        meta, bytes_read = read_metadata(read, size)
        assert meta.format == "JPEG"
        assert (meta.width, meta.height) == (int(row["w"]), int(row["h"]))
        assert meta.make == row["make"]
        assert meta.model == row["model"]
        assert meta.latitude == pytest.approx(float(row["lat"]), abs=1e-9)
        assert meta.longitude == pytest.approx(float(row["lon"]), abs=1e-9)
        assert meta.altitude_m == pytest.approx(float(row["alt"]), abs=1e-6)
        assert meta.relative_altitude_m == pytest.approx(_opt(row["rel_alt"]))
        assert meta.gimbal_pitch_deg == pytest.approx(_opt(row["gimbal_pitch"]))
        assert meta.focal_length_mm == pytest.approx(float(row["focal"]))
        assert meta.focal_length_35mm == pytest.approx(_opt(row["focal35"]))
        assert meta.capture_time == datetime.strptime(row["dt"], "%Y:%m:%d %H:%M:%S")
        # Only the header and a short tail are read, never the whole file (files > 128 KiB).
        if size > 4 * HEADER_READ_BYTES:
            assert bytes_read <= HEADER_READ_BYTES + 1024 < size


def test_dji_xmp_attitude(brighton_images: Path) -> None:
    read, size, _ = _reader(brighton_images / "DJI_0018.JPG")
    meta, _ = read_metadata(read, size)
    assert meta.gimbal_yaw_deg == pytest.approx(45.0)
    assert meta.flight_yaw_deg == pytest.approx(46.0)
    assert meta.relative_altitude_m == pytest.approx(39.8)


def test_xmp_element_form() -> None:
    xmp = (
        b"<x:xmpmeta><rdf:Description><drone-dji:RelativeAltitude>+12.5</drone-dji:RelativeAltitude>"
        b"<drone-dji:GimbalPitchDegree>-90.0</drone-dji:GimbalPitchDegree></rdf:Description></x:xmpmeta>"
    )
    assert parse_dji_xmp(xmp) == {"RelativeAltitude": 12.5, "GimbalPitchDegree": -90.0}


def test_header_extends_when_app_segments_are_long(brighton_images: Path) -> None:
    read, size, calls = _reader(brighton_images / "DJI_0018.JPG")
    header = read_header(read, size, first_read_bytes=4096)
    assert len(calls) > 1  # the first 4 KiB did not reach the start of scan
    assert jpeg_header_end(header) == len(header)


def test_sniff_format() -> None:
    assert sniff_format(b"\xff\xd8\xff\xe0") == "JPEG"
    assert sniff_format(b"II*\x00....") == "TIFF"
    assert sniff_format(b"\x89PNG\r\n\x1a\n") == "PNG"
    assert sniff_format(b"hello") == "OTHER"
    assert sniff_format(b"") is None


def test_tiff_metadata(tmp_path: Path) -> None:
    from PIL import Image

    im = Image.new("RGB", (64, 48), (10, 20, 30))
    exif = Image.Exif()
    exif[0x010F] = "TestMake"
    exif[0x0110] = "TestModel"
    gps = exif.get_ifd(0x8825)
    gps.update({1: "S", 2: (33.0, 51.0, 54.0), 3: "E", 4: (151.0, 12.0, 36.0), 6: 120.5})
    path = tmp_path / "a.tif"
    im.save(path, exif=exif.tobytes())
    read, size, _ = _reader(path)
    meta, _ = read_metadata(read, size)
    assert meta.format == "TIFF"
    assert (meta.width, meta.height) == (64, 48)
    assert meta.make == "TestMake"
    assert meta.latitude == pytest.approx(-(33 + 51 / 60 + 54 / 3600))
    assert meta.longitude == pytest.approx(151 + 12 / 60 + 36 / 3600)
    assert meta.altitude_m == pytest.approx(120.5)


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"", "empty_file"),
        (b"just some text, not a picture\n", "not_an_image"),
        (b"\xff\xd8\xff\xe1\x00\x04ab" + b"\x00" * 64, "unreadable"),
        (b"\xff\xd8\xff\xe1\x40\x00Exif\x00\x00", "truncated"),
    ],
)
def test_header_problems(content: bytes, reason: str) -> None:
    def read(offset: int, length: int) -> bytes:
        return content[offset : offset + length]

    with pytest.raises(ImageHeaderError) as info:
        read_metadata(read, len(content))
    assert info.value.reason == reason


def test_truncated_pixels(brighton_images: Path) -> None:
    data = (brighton_images / "DJI_0018.JPG").read_bytes()[:300_000]

    def read(offset: int, length: int) -> bytes:
        return data[offset : offset + length]

    with pytest.raises(ImageHeaderError) as info:
        read_metadata(read, len(data))
    assert info.value.reason == "truncated"


def _pillow_focal_plane_px_per_mm(path: Path) -> float | None:
    """Independent reading with Pillow: FocalPlaneXResolution / mm per FocalPlaneResolutionUnit."""
    from PIL import Image

    with Image.open(path) as im:
        sub = im.getexif().get_ifd(0x8769)
    resolution, unit = sub.get(0xA20E), sub.get(0xA210, 2)
    if resolution is None:
        return None
    return float(resolution) / {2: 25.4, 3: 10.0, 4: 1.0}[unit]


@pytest.mark.parametrize("survey", ["brighton_beach_1600", "seneca_1200", "tiny_exif"])
def test_focal_plane_resolution_matches_pillow(data_dir: Path, survey: str) -> None:
    for row in _manifest(data_dir, survey):
        path = data_dir / survey / "images" / row["file"]
        read, size, _ = _reader(path)
        meta, _ = read_metadata(read, size)
        expected = _pillow_focal_plane_px_per_mm(path)
        if expected is None:
            # the DJI FC300S writes no focal-plane resolution; the Canons do
            assert row["make"] == "DJI"
            assert meta.focal_plane_x_resolution_px_per_mm is None
            continue
        assert meta.focal_plane_x_resolution_px_per_mm == pytest.approx(expected, rel=1e-12)
        if survey == "seneca_1200":
            # rescaled with the pixels (SOURCE.md): the manifest width over it is the sensor
            # width of a 1/2.3-inch type sensor, 5-6.2 mm
            assert 5.0 < int(row["w"]) / meta.focal_plane_x_resolution_px_per_mm < 6.2


@pytest.mark.parametrize("suffix", [".jpg", ".tif", ".png"])
@pytest.mark.parametrize(
    ("resolution", "unit", "expected_px_per_mm"),
    [
        (2540.0, None, 100.0),  # no unit tag: inch
        (2540.0, 2, 100.0),
        (1000.0, 3, 100.0),  # centimetre
        (100.0, 4, 100.0),  # millimetre
        (1000.0, 1, None),  # no absolute unit
        (0.0, 2, None),
    ],
)
def test_focal_plane_resolution_units(
    tmp_path: Path, suffix: str, resolution: float, unit: int | None, expected_px_per_mm: float
) -> None:
    from PIL import Image

    exif = Image.Exif()
    sub = exif.get_ifd(0x8769)
    sub[0xA20E] = resolution
    if unit is not None:
        sub[0xA210] = unit
    path = tmp_path / f"a{suffix}"
    Image.new("RGB", (32, 24), (10, 20, 30)).save(path, exif=exif.tobytes())
    read, size, _ = _reader(path)
    meta, _ = read_metadata(read, size)
    assert meta.focal_plane_x_resolution_px_per_mm == pytest.approx(expected_px_per_mm)


def test_image_metadata_fields_are_declared_once(brighton_images: Path) -> None:
    from prefect_odm.engine.camera import ImageMeta, read_image_meta
    from prefect_odm.models import CaptureMetadata, ImageMetadata, ImageRecord

    shared = list(CaptureMetadata.model_fields)
    for model in (ImageMetadata, ImageRecord, ImageMeta):
        assert issubclass(model, CaptureMetadata)
        assert [f for f in model.model_fields if f in shared] == shared
    # The engine's record is the header's metadata plus the file name.
    path = sorted(brighton_images.glob("*.JPG"))[0]
    read, size, _ = _reader(path)
    header, _ = read_metadata(read, size, check_complete=False)
    meta = read_image_meta(path)
    assert meta.model_dump(exclude={"name"}) == header.model_dump()
    assert ImageMeta.from_json(meta.to_json()) == meta
