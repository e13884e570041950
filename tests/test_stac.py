"""The STAC catalogue of a run (issue 36): a real direct-pipeline run on brighton (two
submodels), its ``stac/collection.json`` read back with pystac, every asset href opened
locally and, after the run folder was copied to moto's S3 server, through ``s3://``; the
catalogue's fields must equal the products' own (EPSG, shape, transform, point count)."""

from __future__ import annotations

import json
from pathlib import Path

import laspy
import numpy as np
import pystac
import pytest
import rasterio

from prefect_odm import storage
from prefect_odm.cli.main import main
from prefect_odm.models import ProcessingOptions, Survey
from prefect_odm.publish.stac import FsspecStacIO


@pytest.fixture(scope="module")
def direct_run(prefect_api, brighton_images, tmp_path_factory):
    """brighton reconstructed once with the direct pipeline, --split 10 --split-overlap-m 20."""
    from prefect_odm.flows import reconstruct

    out = tmp_path_factory.mktemp("stac-run")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PREFECT_ODM_HOME", str(tmp_path_factory.mktemp("odm-home")))
        manifest = reconstruct(
            images=str(brighton_images),
            output=str(out),
            split=10,
            split_overlap_m=20,
            options=ProcessingOptions(pipeline="direct"),
        )
    return manifest, out / manifest.survey_fingerprint[:16]


def _check_catalogue(
    collection: pystac.Collection, manifest, open_binary, pipeline: str | None = "direct"
) -> list[str]:
    """Every asset of every Item opened through ``open_binary``; the fields equal the file's.
    Returns the product hrefs checked."""
    items = {item.id: item for item in collection.get_items()}
    done = [r for r in manifest.submodels if r.status != "failed"]
    assert set(items) == {"merged", *(r.submodel_id for r in done)}
    assert set(items["merged"].assets) == set(manifest.products)
    checked = []
    for item in items.values():
        assert item.properties["prefect_odm:survey_fingerprint"] == manifest.survey_fingerprint
        assert item.properties["prefect_odm:merge_fingerprint"] == manifest.merge_fingerprint
        assert item.properties["prefect_odm:options"].get("pipeline") == pipeline
        for name, asset in item.assets.items():
            href = asset.get_absolute_href()
            assert href is not None
            with open_binary(href) as fh:
                if name == "point_cloud":
                    with laspy.open(fh) as reader:
                        header = reader.header
                    assert asset.extra_fields["pc:count"] == header.point_count > 0
                    copc = href.endswith(".copc.laz")
                    assert copc == (item.id == "merged")  # the merge writes COPC by default
                    assert asset.media_type == (
                        "application/vnd.laszip+copc" if copc else "application/vnd.laszip"
                    )
                    assert _epsg(asset) == header.parse_crs().to_epsg() == manifest.crs_epsg
                    area = (header.maxs[0] - header.mins[0]) * (header.maxs[1] - header.mins[1])
                    assert asset.extra_fields["pc:density"] == pytest.approx(
                        header.point_count / area
                    )
                else:
                    with rasterio.open(fh) as ds:
                        assert _epsg(asset) == ds.crs.to_epsg() == manifest.crs_epsg
                        assert asset.extra_fields["proj:shape"] == [ds.height, ds.width]
                        assert asset.extra_fields["proj:transform"] == pytest.approx(
                            list(ds.transform)[:6]
                        )
                        bands = asset.extra_fields["raster:bands"]
                        assert len(bands) == ds.count
                        assert bands[0]["spatial_resolution"] == pytest.approx(ds.res[0])
                        values = ds.read(1, masked=True).astype(np.float64)
                        stats = bands[0]["statistics"]
                        assert stats["minimum"] == pytest.approx(float(values.min()))
                        assert stats["maximum"] == pytest.approx(float(values.max()))
                        assert stats["mean"] == pytest.approx(float(values.mean()), rel=1e-6)
                        assert stats["valid_percent"] == pytest.approx(
                            100 * values.count() / values.size
                        )
            checked.append(href)
    return checked


def _epsg(asset: pystac.Asset) -> int:
    code = asset.extra_fields.get("proj:code") or f"EPSG:{asset.extra_fields['proj:epsg']}"
    return int(str(code).split(":")[1])


def test_each_run_writes_a_self_contained_catalogue_equal_to_its_products(direct_run):
    manifest, run_dir = direct_run
    collection = pystac.Collection.from_file(str(run_dir / "stac" / "collection.json"))
    checked = _check_catalogue(collection, manifest, lambda href: open(href, "rb"))
    print(
        f"\n{len(checked)} assets checked: "
        + ", ".join(Path(h).relative_to(run_dir).as_posix() for h in checked)
    )
    assert all(Path(h).is_relative_to(run_dir) for h in checked)
    # every href in the JSON is relative: the folder can be moved or synced as it is
    for path in (run_dir / "stac").rglob("*.json"):
        doc = json.loads(path.read_text())
        hrefs = [link["href"] for link in doc["links"]] + [
            a["href"] for a in doc.get("assets", {}).values()
        ]
        assert hrefs and not [h for h in hrefs if h.startswith("/") or "://" in h], path
    # the catalogue's footprint holds the cameras (the products extend a little beyond them)
    west, south, east, north = collection.extent.spatial.bboxes[0]
    survey = Survey.model_validate_json((run_dir / "plan" / "survey.json").read_text())
    lons = [i.longitude for i in survey.images if i.longitude is not None]
    lats = [i.latitude for i in survey.images if i.latitude is not None]
    assert west < min(lons) <= max(lons) < east and south < min(lats) <= max(lats) < north
    assert (east - west) < 0.01 and (north - south) < 0.01  # ~100 m, not a wrong CRS's degrees
    # the catalogue's time is when the photos were taken (EXIF), not when they were processed
    taken = sorted(i.capture_time for i in survey.images if i.capture_time is not None)
    assert taken and taken[0].year == 2016  # brighton was flown in June 2016
    merged = collection.get_item("merged", recursive=True)
    assert merged is not None and merged.datetime is None
    start, end = merged.common_metadata.start_datetime, merged.common_metadata.end_datetime
    assert start is not None and end is not None
    assert (start.replace(tzinfo=None), end.replace(tzinfo=None)) == (taken[0], taken[-1])
    (interval,) = collection.extent.temporal.intervals
    assert interval[0] is not None and interval[0].replace(tzinfo=None) == taken[0]


def test_stac_command_writes_the_catalogue_of_a_run_copied_to_s3(direct_run, s3_endpoint):
    import s3fs

    manifest, run_dir = direct_run
    fs = s3fs.S3FileSystem()
    fs.mkdir("stac-bucket")
    for path in run_dir.rglob("*"):
        if path.is_file() and "stac" not in path.relative_to(run_dir).parts:
            fs.put_file(
                str(path), f"stac-bucket/runs/{run_dir.name}/{path.relative_to(run_dir).as_posix()}"
            )
    assert main(["stac", "s3://stac-bucket/runs"]) == 0  # the output root: its one run is found
    href = f"s3://stac-bucket/runs/{run_dir.name}/stac/collection.json"
    collection = pystac.Collection.from_file(href, stac_io=FsspecStacIO())
    checked = _check_catalogue(
        collection, manifest, lambda h: storage.filesystem(h)[0].open(h, "rb")
    )
    assert checked and all(h.startswith(f"s3://stac-bucket/runs/{run_dir.name}/") for h in checked)


def test_stac_command_refuses_a_folder_without_a_manifest(tmp_path, capsys):
    (tmp_path / "merged").mkdir()
    assert main(["stac", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(tmp_path) in err[0] and "manifest.json" in err[0]
    assert not (tmp_path / "stac").exists()
    missing = tmp_path / "nowhere"
    assert main(["stac", str(missing)]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"prefect-odm: error: {missing}: does not exist"
    ]


def test_report_opens_with_a_product_summary_read_from_the_products(direct_run):
    import re

    manifest, run_dir = direct_run
    report_dir = run_dir / "report"
    text = (report_dir / "report.md").read_text()
    summary = text[text.index("## Product summary") : text.index("## Products\n")]
    print("\n" + summary)
    # paths relative to the report, and each one opens from there
    links = re.findall(r"\]\(([^)]+)\)", summary)
    assert {Path(link).name for link in links} == {Path(u).name for u in manifest.products.values()}
    assert all(not link.startswith("/") and (report_dir / link).is_file() for link in links)
    listed = text[text.index("## Products\n") :].split("\n\n")[1].splitlines()
    listed_paths = [line.split("`")[1] for line in listed if line.startswith("- ")]
    assert len(listed_paths) == len(manifest.products)
    assert all(not p.startswith("/") and (report_dir / p).is_file() for p in listed_paths)
    with rasterio.open(manifest.products["orthophoto"]) as ds:
        gsd_cm = 100 * ds.res[0]
        area_m2 = int(np.count_nonzero(ds.read(4))) * ds.res[0] * ds.res[1]  # alpha band
    assert f"{gsd_cm:.1f} cm per pixel" in summary
    assert f"{area_m2:,.0f} m²" in summary
    cloud = laspy.read(manifest.products["point_cloud"])
    assert (
        f"{cloud.header.point_count:,} points, {cloud.header.point_count / area_m2:.1f} points"
        in summary
    )
    # the direct pipeline's DSM is the take-off plane (brighton records no height above
    # ground): nothing in it is measured, and the summary says so in words, naming the pipeline
    from prefect_odm.publish.surface import console_lines
    from prefect_odm.registry import DSM_MEASURED_BAND, DSM_MEASURED_DESCRIPTION

    with rasterio.open(manifest.products["dsm"]) as ds:
        assert ds.descriptions[DSM_MEASURED_BAND - 1] == DSM_MEASURED_DESCRIPTION
        valid = ds.read_masks(1) > 0
        heights = ds.read(1)[valid]
        flags = ds.read(DSM_MEASURED_BAND)[valid]
    assert valid.any() and np.ptp(heights) < 1e-3  # a plane
    assert np.count_nonzero(flags == 1) == 0  # the merge carried "nothing measured"
    plane = (
        "DSM: a plane at the take-off height (direct pipeline; the images record no height "
        "above ground): not a measured surface"
    )
    assert f"**{plane}** (0.0 % of its valid cells are measured)" in summary
    assert "% of its valid cells are measured (at least one point" not in summary
    assert "**Pipeline**: direct (cameras from GPS and attitude" in summary
    assert "points per m² of the covered area: synthetic" in summary
    catalogue = pystac.Collection.from_file(str(run_dir / "stac" / "collection.json"))
    merged = next(i for i in catalogue.get_items() if i.id == "merged")
    assert merged.properties["prefect_odm:dsm_surface"] == "take-off-plane"
    assert merged.assets["point_cloud"].extra_fields["prefect_odm:synthetic"] is True
    lines = console_lines(manifest)
    assert lines[0].startswith("pipeline: direct (") and plane in lines
    assert any(line.startswith("point cloud: synthetic") for line in lines)
    planned = manifest.coverage["coverage_of_planned"]
    assert f"covers {100 * planned:.0f} % of the planned footprint" in summary


def test_stac_command_describes_a_merge_of_outputs_made_elsewhere(direct_run, tmp_path):
    from prefect_odm.flows.merge_existing import merge_existing

    _, run_dir = direct_run
    merged = merge_existing(
        inputs=[str(run_dir / "submodels")],
        output=str(tmp_path / "merged"),
        plan=str(run_dir / "plan" / "plan.json"),
    )
    assert main(["stac", str(tmp_path / "merged")]) == 0
    found = list((tmp_path / "merged").glob("*/stac/collection.json"))
    collection = pystac.Collection.from_file(str(found[0]))
    checked = _check_catalogue(collection, merged, lambda href: open(href, "rb"), pipeline=None)
    # the merged products lie in the folder (relative hrefs), the submodels' where they were read
    outside = [h for h in checked if not Path(h).is_relative_to(found[0].parents[1])]
    assert outside and all(Path(h).is_relative_to(run_dir / "submodels") for h in outside)
