"""The products prefect-odm knows, each declared once (pure core).

Every module that names a product file, verifies one, merges one or reports on one reads it from
:data:`PRODUCTS` (or :data:`REPORT_FILES` for the camera and report files a node returns): the
built-in engine writes its outputs at :attr:`Product.odm_path`, the NodeODM adapter verifies what
it downloads with :attr:`Product.verify`, :mod:`prefect_odm.layout` stores each under
:attr:`Product.file_name`, the merge picks its method from :attr:`Product.merge`, and the report
and manifest list them in this order.

The file names and folders are OpenDroneMap's (``odm_orthophoto/odm_orthophoto.tif`` and so on),
so an ODM project folder, an extracted ``all.zip`` and a prefect-odm submodel folder are all read
the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

ProductName = Literal["orthophoto", "dsm", "dtm", "point_cloud"]
"""The merged products, by name."""

ProductKind = Literal["raster", "point_cloud"]
VerifyRule = Literal["rgba_raster", "raster", "point_cloud"]
MergeMethod = Literal["orthophoto", "dem", "point_cloud"]
CrsRule = Literal["projected"]


@dataclass(frozen=True)
class Product:
    """One product: where it lives, how it is checked and how it is merged.

    Attributes:
        name: the product's name in plans, results and the manifest.
        file_name: the file name in a submodel folder and in ``merged/`` (ODM's file name).
        odm_path: the path inside an OpenDroneMap project folder or ``all.zip``.
        kind: ``raster`` (GeoTIFF, written as a COG when merged) or ``point_cloud`` (LAZ).
        crs_rule: ``projected``: the product must carry a projected CRS (ODM writes UTM); merged
            products take the plan's EPSG.
        verify: how a downloaded file is checked before it counts: ``rgba_raster`` (opens with a
            CRS and at least 4 bands), ``raster`` (opens with a CRS), ``point_cloud`` (LAS/LAZ
            header with points and a CRS).
        merge: the merge method (``orthophoto``: seams, balancing and feathering; ``dem``:
            vertical offsets removed and edge-distance blending; ``point_cloud``: crop to each
            submodel's own area, streamed).
        option: the NodeODM boolean option that asks for the product, or ``None`` when it is
            always made.
        required: whether a finished submodel must return it (when asked for).
    """

    name: ProductName
    file_name: str
    odm_path: str
    kind: ProductKind
    crs_rule: CrsRule
    verify: VerifyRule
    merge: MergeMethod
    option: str | None
    required: bool


PRODUCTS: dict[ProductName, Product] = {
    p.name: p
    for p in (
        Product(
            name="orthophoto",
            file_name="odm_orthophoto.tif",
            odm_path="odm_orthophoto/odm_orthophoto.tif",
            kind="raster",
            crs_rule="projected",
            verify="rgba_raster",
            merge="orthophoto",
            option=None,
            required=True,
        ),
        Product(
            name="dsm",
            file_name="dsm.tif",
            odm_path="odm_dem/dsm.tif",
            kind="raster",
            crs_rule="projected",
            verify="raster",
            merge="dem",
            option="dsm",
            required=True,
        ),
        Product(
            name="dtm",
            file_name="dtm.tif",
            odm_path="odm_dem/dtm.tif",
            kind="raster",
            crs_rule="projected",
            verify="raster",
            merge="dem",
            option="dtm",
            required=False,
        ),
        Product(
            name="point_cloud",
            file_name="odm_georeferenced_model.laz",
            odm_path="odm_georeferencing/odm_georeferenced_model.laz",
            kind="point_cloud",
            crs_rule="projected",
            verify="point_cloud",
            merge="point_cloud",
            option=None,
            required=True,
        ),
    )
}
"""Every product, in the order plans, reports and manifests list them."""

REPORT_FOLDER = "odm_report"
"""The folder of a node's report files (cameras, engine report) inside its outputs."""

REPORT_FILES: dict[str, str] = {
    "shots": "shots.geojson",
    "cameras": "cameras.json",
}
"""Report files a node may return, by name -> file name inside :data:`REPORT_FOLDER` (ODM's
``odm_report/shots.geojson``: each reconstructed camera's position and rotation; ``cameras.json``:
the camera models). Stored under ``report/`` in the submodel's folder."""


def product(name: str) -> Product:
    """The product called ``name``.

    Raises:
        KeyError: no product has that name (the message lists the known ones).
    """
    try:
        return PRODUCTS[name]  # type: ignore[index]
    except KeyError:
        raise KeyError(f"unknown product {name!r} (known: {', '.join(PRODUCTS)})") from None


def products_of_kind(kind: ProductKind) -> tuple[ProductName, ...]:
    """Names of the products of one kind, in registry order."""
    return tuple(name for name, p in PRODUCTS.items() if p.kind == kind)
