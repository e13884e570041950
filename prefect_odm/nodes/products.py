"""Checks that downloaded or merged products open and carry what they must (adapter: rasterio, laspy).

Which check a product gets is its :attr:`~prefect_odm.registry.Product.verify` rule in the
product registry; :data:`VERIFIERS` maps each rule to its function.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

from prefect_odm.errors import OutputValidationError
from prefect_odm.registry import PRODUCTS, VerifyRule, product, required_products

#: Bands an ``rgba_raster`` product (the orthophoto: RGB plus alpha) must have at least.
RGBA_MIN_BANDS = 4


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


def verify_rgba_raster(path: Path) -> dict[str, object]:
    """:func:`verify_raster` with at least :data:`RGBA_MIN_BANDS` bands (colour and alpha)."""
    return verify_raster(path, min_bands=RGBA_MIN_BANDS)


VERIFIERS: dict[VerifyRule, Callable[[Path], dict[str, object]]] = {
    "rgba_raster": verify_rgba_raster,
    "raster": verify_raster,
    "point_cloud": verify_point_cloud,
}
"""The check of each :data:`~prefect_odm.registry.VerifyRule`."""


def verify_product(name: str, path: Path) -> dict[str, object]:
    """Check the file of product ``name`` with its registry verify rule.

    Returns:
        What the rule's function returns (:func:`verify_raster` or :func:`verify_point_cloud`).

    Raises:
        KeyError: no product has that name.
        OutputValidationError: the file fails the check.
    """
    return VERIFIERS[product(name).verify](path)


def find_odm_products(
    project_dir: Path, *, require: Iterable[str] | None = None
) -> dict[str, Path]:
    """Products found in an OpenDroneMap project folder, each verified.

    Args:
        project_dir: a folder in ODM's layout (or an extracted all.zip): each product at its
            registry :attr:`~prefect_odm.registry.Product.odm_path`.
        require: products that must be present (default: those the registry marks
            ``required``).

    Returns:
        Product name -> path, for every product present, in registry order.

    Raises:
        OutputValidationError: a required product is missing or a product does not open.
    """
    found: dict[str, Path] = {}
    for name, entry in PRODUCTS.items():
        path = project_dir / entry.odm_path
        if path.exists():
            verify_product(name, path)
            found[name] = path
    wanted = required_products() if require is None else tuple(require)
    missing = [p for p in wanted if p not in found]
    if missing:
        paths = ", ".join(product(m).odm_path for m in missing)
        raise OutputValidationError(f"{project_dir}: missing {', '.join(missing)} ({paths})")
    return found
