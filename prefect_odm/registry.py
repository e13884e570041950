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
PointCloudFormat = Literal["copc", "laz"]
"""How the merged point cloud is written: ``copc`` (a COPC file, LAZ 1.4 with an octree, named as
ODM names its ``--pc-copc`` output) or ``laz`` (a plain LAZ in the inputs' point format)."""


@dataclass(frozen=True)
class Product:
    """One product: where it lives, how it is checked and how it is merged.

    Attributes:
        name: the product's name in plans, results and the manifest.
        odm_path: the path inside an OpenDroneMap project folder or ``all.zip``.
        verify: how a downloaded file is checked before it counts: ``rgba_raster`` (opens with a
            CRS and at least 4 bands), ``raster`` (opens with a CRS), ``point_cloud`` (LAS/LAZ
            header with points and a CRS); see :mod:`prefect_odm.nodes.products`.
        merge: the merge method (``orthophoto``: seams, balancing and feathering; ``dem``:
            vertical offsets removed and edge-distance blending; ``point_cloud``: crop to each
            submodel's own area, streamed).
        kind: ``raster`` (GeoTIFF, written as a COG when merged) or ``point_cloud`` (LAZ).
        crs_rule: ``projected``: the product must carry a projected CRS (ODM writes UTM); merged
            products take the plan's EPSG.
        option: the NodeODM boolean option that asks for the product, or ``None`` when it is
            always made.
        required: whether a finished submodel must return it (when asked for).
        copc_odm_path: for the point cloud, ODM's path of the same cloud written as COPC
            (``--pc-copc``): the merged COPC file takes its name.
    """

    name: ProductName
    odm_path: str
    verify: VerifyRule
    merge: MergeMethod
    kind: ProductKind = "raster"
    crs_rule: CrsRule = "projected"
    option: str | None = None
    required: bool = True

    copc_odm_path: str | None = None

    @property
    def file_name(self) -> str:
        """The file name in a submodel folder and in ``merged/``: ODM's, the last part of
        :attr:`odm_path`."""
        return self.odm_path.rsplit("/", 1)[-1]

    def merged_file_name(self, point_cloud_format: PointCloudFormat = "laz") -> str:
        """The file name in ``merged/``: :attr:`file_name`, or for a point cloud written as COPC
        the last part of :attr:`copc_odm_path` (ODM's ``--pc-copc`` name)."""
        if point_cloud_format == "copc" and self.copc_odm_path is not None:
            return self.copc_odm_path.rsplit("/", 1)[-1]
        return self.file_name


_ALL = (
    # Product(name, odm_path, verify rule, merge method, ...): ODM's folders and file names.
    Product("orthophoto", "odm_orthophoto/odm_orthophoto.tif", "rgba_raster", "orthophoto"),
    Product("dsm", "odm_dem/dsm.tif", "raster", "dem", option="dsm"),
    Product("dtm", "odm_dem/dtm.tif", "raster", "dem", option="dtm", required=False),
    Product(
        "point_cloud",
        "odm_georeferencing/odm_georeferenced_model.laz",
        "point_cloud",
        "point_cloud",
        kind="point_cloud",
        copc_odm_path="odm_georeferencing/odm_georeferenced_model.copc.laz",
    ),
)

PRODUCTS: dict[ProductName, Product] = {p.name: p for p in _ALL}
"""Every product, in the order plans, reports and manifests list them."""

DSM_MEASURED_BAND = 2
DSM_MEASURED_DESCRIPTION = "measured (1) or gap-filled (0)"
"""The DSM's optional second band (its GDAL description): 1 where the height was measured, 0
where gap filling gave it, nodata outside; the built-in engine writes it, the merge carries it
when every input has it. Band 1 is the heights, as ODM writes them."""

DSM_SURFACE_TAG = "PREFECT_ODM_DSM_SURFACE"
"""GeoTIFF metadata tag of a DSM the built-in engine's direct pipeline made, naming what its
heights are (one of :data:`DSM_SURFACES`; absent: heights from points the engine or ODM
reconstructed). The report and the console say it in words, so an assumed plane is never
mistaken for a measured surface."""

DSM_SURFACES: dict[str, str] = {
    "take-off-plane": "a plane at the take-off height (direct pipeline; the images record no "
    "height above ground): not a measured surface",
    "assumed-plane": "a plane at an assumed flight height below the lowest image (direct "
    "pipeline; the images record neither height above ground nor take-off height): not a "
    "measured surface",
    "above-ground-heights": "the terrain through the ground heights the images record (GPS "
    "altitude minus XMP Camera:AboveGroundAltitude; direct pipeline): from the images' recorded "
    "height, not measured (no trees or buildings)",
}
"""The values of :data:`DSM_SURFACE_TAG` and what each says in the report and on the console."""

REPORT_FOLDER = "odm_report"
"""The folder of a node's report files (cameras, engine report) inside its outputs."""

REPORT_FILES: dict[str, str] = {
    "shots": "shots.geojson",
    "cameras": "cameras.json",
}
"""Report files a node may return, by name -> file name (ODM's ``odm_report/shots.geojson``:
each reconstructed camera's position and rotation; ``cameras.json``, at the top of the outputs:
the camera models, OpenSfM's parameters). Every file in :data:`REPORT_FOLDER`, and
``cameras.json``, is stored under ``report/`` in the submodel's folder."""


def point_cloud_format_of(url: str) -> PointCloudFormat:
    """``copc`` for a file named as a COPC file (``*.copc.laz``), else ``laz``."""
    return "copc" if url.lower().endswith(".copc.laz") else "laz"


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


def required_products() -> tuple[ProductName, ...]:
    """Names of the products a finished submodel must return, in registry order."""
    return tuple(name for name, p in PRODUCTS.items() if p.required)
