"""Checks that downloaded or merged products open and carry what they must (adapter: rasterio, laspy)."""

from __future__ import annotations

from pathlib import Path

from prefect_odm.errors import OutputValidationError
from prefect_odm.layout import ODM_PRODUCT_PATHS


def verify_raster(path: Path, *, min_bands: int = 1) -> dict[str, object]:
    """Open a GeoTIFF and check it has a CRS and data.

    Returns:
        ``{"crs_epsg", "width", "height", "res_m", "bounds"}``.

    Raises:
        OutputValidationError: the file does not open, has no CRS or too few bands.
    """
    import rasterio
    from rasterio.errors import RasterioIOError

    try:
        with rasterio.open(path) as ds:
            if ds.crs is None:
                raise OutputValidationError(f"{path}: raster has no CRS")
            if ds.count < min_bands:
                raise OutputValidationError(f"{path}: {ds.count} band(s), expected {min_bands}")
            return {
                "crs_epsg": ds.crs.to_epsg(),
                "width": ds.width,
                "height": ds.height,
                "res_m": float(ds.res[0]),
                "bounds": tuple(ds.bounds),
            }
    except RasterioIOError as exc:
        raise OutputValidationError(f"{path}: does not open as a raster ({exc})") from exc


def verify_point_cloud(path: Path) -> dict[str, object]:
    """Read a LAS/LAZ header and check it has points and a CRS.

    Raises:
        OutputValidationError: unreadable header, no points, or no CRS.
    """
    import laspy

    try:
        with laspy.open(path) as reader:
            header = reader.header
            crs = header.parse_crs()
            if header.point_count == 0:
                raise OutputValidationError(f"{path}: point cloud has no points")
            if crs is None:
                raise OutputValidationError(f"{path}: point cloud has no CRS")
            return {"points": int(header.point_count), "crs_epsg": crs.to_epsg()}
    except (laspy.errors.LaspyException, OSError, ValueError) as exc:
        raise OutputValidationError(f"{path}: does not open as LAS/LAZ ({exc})") from exc


def find_odm_products(
    project_dir: Path, *, require: tuple[str, ...] = ("orthophoto", "point_cloud")
) -> dict[str, Path]:
    """Products found in an OpenDroneMap project folder, each verified.

    Args:
        project_dir: a folder in ODM's layout (or an extracted all.zip).
        require: products that must be present.

    Returns:
        Product name -> path, for every product present.

    Raises:
        OutputValidationError: a required product is missing or a product does not open.
    """
    found: dict[str, Path] = {}
    for product, rel in ODM_PRODUCT_PATHS.items():
        path = project_dir / rel
        if path.exists():
            if product == "point_cloud":
                verify_point_cloud(path)
            else:
                verify_raster(path, min_bands=4 if product == "orthophoto" else 1)
            found[product] = path
    missing = [p for p in require if p not in found]
    if missing:
        raise OutputValidationError(
            f"{project_dir}: missing {', '.join(missing)} ({', '.join(ODM_PRODUCT_PATHS[m] for m in missing)})"
        )
    return found
