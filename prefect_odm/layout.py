"""The one module that knows where every output lives.

``{output}/{survey_fingerprint[:16]}/``
    ``plan/plan.json``, ``plan/plan.geojson``, ``plan/plan.png``, ``plan/survey.json``
    ``submodels/{submodel_id}-{fingerprint[:12]}/`` (``result.json`` and the product files)
    ``merged/odm_orthophoto.tif``, ``merged/dsm.tif``, ``merged/dtm.tif``,
    ``merged/odm_georeferenced_model.laz``
    ``report/report.md``, ``report/*.png``
    ``manifest.json`` (written last)

Roots are local paths or fsspec URLs; joining is plain ``/`` so it works for both.
"""

from __future__ import annotations

from dataclasses import dataclass

from prefect_odm.registry import PRODUCTS

PRODUCT_FILES: dict[str, str] = {name: p.file_name for name, p in PRODUCTS.items()}
"""Product name -> file name, as OpenDroneMap names them (from :mod:`prefect_odm.registry`)."""

ODM_PRODUCT_PATHS: dict[str, str] = {name: p.odm_path for name, p in PRODUCTS.items()}
"""Product name -> path inside an OpenDroneMap project folder or all.zip (from the registry)."""


def join(root: str, *parts: str) -> str:
    """Join URL or path parts with '/' without doubling separators."""
    out = root.rstrip("/")
    for part in parts:
        out = f"{out}/{part.strip('/')}"
    return out


@dataclass(frozen=True)
class OutputLayout:
    """Paths of one survey's outputs under ``root``."""

    root: str
    survey_fingerprint: str

    @property
    def survey_dir(self) -> str:
        return join(self.root, self.survey_fingerprint[:16])

    @property
    def plan_dir(self) -> str:
        return join(self.survey_dir, "plan")

    @property
    def plan_json(self) -> str:
        return join(self.plan_dir, "plan.json")

    @property
    def survey_json(self) -> str:
        return join(self.plan_dir, "survey.json")

    @property
    def plan_geojson(self) -> str:
        return join(self.plan_dir, "plan.geojson")

    @property
    def plan_png(self) -> str:
        return join(self.plan_dir, "plan.png")

    def submodel_dir(self, submodel_id: str, fingerprint: str) -> str:
        return join(self.survey_dir, "submodels", f"{submodel_id}-{fingerprint[:12]}")

    def submodel_result(self, submodel_id: str, fingerprint: str) -> str:
        return join(self.submodel_dir(submodel_id, fingerprint), "result.json")

    def submodel_product(self, submodel_id: str, fingerprint: str, product: str) -> str:
        return join(self.submodel_dir(submodel_id, fingerprint), PRODUCT_FILES[product])

    @property
    def merged_dir(self) -> str:
        return join(self.survey_dir, "merged")

    def merged_product(self, product: str) -> str:
        return join(self.merged_dir, PRODUCT_FILES[product])

    @property
    def report_dir(self) -> str:
        return join(self.survey_dir, "report")

    @property
    def manifest(self) -> str:
        return join(self.survey_dir, "manifest.json")
