"""The one module that knows where every output lives.

``{output}/{survey_fingerprint[:16]}/``
    ``plan/plan.json``, ``plan/plan.geojson``, ``plan/plan.png``, ``plan/survey.json``
    ``submodels/{submodel_id}-{fingerprint[:12]}/`` (``result.json`` and the product files)
    ``merged/odm_orthophoto.tif``, ``merged/dsm.tif``, ``merged/dtm.tif``,
    ``merged/odm_georeferenced_model.copc.laz`` (or ``.laz``, ``MergeOptions.point_cloud_format``)
    ``report/report.md``, ``report/*.png``
    ``manifest.json`` (written last)

Roots are local paths or fsspec URLs; joining is plain ``/`` so it works for both.
"""

from __future__ import annotations

import os
import posixpath
import re
from dataclasses import dataclass
from typing import Any, overload

from prefect_odm.registry import PRODUCTS, REPORT_FILES, PointCloudFormat

PRODUCT_FILES: dict[str, str] = {name: p.file_name for name, p in PRODUCTS.items()}
"""Product name -> file name, as OpenDroneMap names them (from :mod:`prefect_odm.registry`)."""

ODM_PRODUCT_PATHS: dict[str, str] = {name: p.odm_path for name, p in PRODUCTS.items()}
"""Product name -> path inside an OpenDroneMap project folder or all.zip (from the registry)."""


PLAN_FILES: dict[str, str] = {
    "plan": "plan.json",
    "survey": "survey.json",
    "geojson": "plan.geojson",
    "png": "plan.png",
}
"""The files of a plan folder (``plan/`` of a run, or ``prefect-odm plan --output DIR``)."""

RESULT_FILE = "result.json"
"""A submodel folder's record; its presence means the submodel is done."""

LAST_RUN_FILE = ".prefect-odm-last-run.json"
"""The command line's record of its last run in an output root (the no-change repeat)."""


_SUBMODEL_FOLDER = re.compile(r"^(submodel-\d+)-[0-9a-f]{12}$")


def submodel_of_folder(name: str) -> str | None:
    """The submodel id of a folder named as :meth:`OutputLayout.submodel_dir` names it
    (``submodel-003-<fingerprint[:12]>`` -> ``submodel-003``); None for any other name."""
    match = _SUBMODEL_FOLDER.match(name)
    return match.group(1) if match else None


def plan_file(folder: str, name: str) -> str:
    """The plan folder file ``name`` (a key of :data:`PLAN_FILES`) under ``folder``."""
    return join(folder, PLAN_FILES[name])


def join(root: str, *parts: str) -> str:
    """Join URL or path parts with '/' without doubling separators."""
    out = root.rstrip("/")
    for part in parts:
        out = f"{out}/{part.strip('/')}"
    return out


class _Under:
    """A path attribute of :class:`OutputLayout`: ``join(<another path attribute>, *parts)``."""

    def __init__(self, parent: str, *parts: str) -> None:
        self.parent = parent
        self.parts = parts

    @overload
    def __get__(self, layout: None, owner: type[Any]) -> _Under: ...
    @overload
    def __get__(self, layout: OutputLayout, owner: type[Any]) -> str: ...
    def __get__(self, layout: OutputLayout | None, owner: type[Any]) -> _Under | str:
        if layout is None:
            return self
        return join(getattr(layout, self.parent), *self.parts)


@dataclass(frozen=True)
class OutputLayout:
    """Paths of one survey's outputs under ``root`` (the tree of the module docstring).

    Each folder or file attribute is declared as the path attribute it lies under plus its name.
    """

    root: str
    survey_fingerprint: str

    def __post_init__(self) -> None:
        """A relative local root is made absolute (against the working folder now), so every
        path a run records (``manifest.json``, ``result.json``, events) holds from any working
        folder and for any reader; a URL is kept as it is."""
        if "://" not in self.root and not posixpath.isabs(self.root):
            object.__setattr__(self, "root", os.path.abspath(self.root))

    def rebased(self, url: str) -> str:
        """A product path an older record names, as this layout places it.

        Records written before roots were made absolute (an ``--output`` given relative) hold
        paths relative to the working folder of the command that wrote them
        (``out/<fingerprint[:16]>/merged/dsm.tif``): such a path is taken from its run folder's
        name on, under :attr:`survey_dir`. Absolute paths, URLs and relative paths outside a
        run folder (a ``merge`` input) are returned unchanged.
        """
        name = self.survey_fingerprint[:16]
        parts = url.split("/")
        if "://" in url or posixpath.isabs(url) or name not in parts:
            return url
        after = parts[len(parts) - parts[::-1].index(name) :]
        return join(self.survey_dir, *after)

    @property
    def survey_dir(self) -> str:
        """``{root}/{survey_fingerprint[:16]}``: everything of this survey."""
        return join(self.root, self.survey_fingerprint[:16])

    plan_dir = _Under("survey_dir", "plan")
    plan_json = _Under("plan_dir", PLAN_FILES["plan"])
    survey_json = _Under("plan_dir", PLAN_FILES["survey"])
    plan_geojson = _Under("plan_dir", PLAN_FILES["geojson"])
    plan_png = _Under("plan_dir", PLAN_FILES["png"])
    submodels_dir = _Under("survey_dir", "submodels")
    merged_dir = _Under("survey_dir", "merged")
    calibration_dir = _Under("survey_dir", "calibration")
    report_dir = _Under("survey_dir", "report")
    report_md = _Under("report_dir", "report.md")
    #: The merge reports.
    merge_report = _Under("report_dir", "merge.json")
    #: Written last: what the run produced and from what.
    manifest = _Under("survey_dir", "manifest.json")

    def submodel_dir(self, submodel_id: str, fingerprint: str) -> str:
        """One submodel's folder: ``submodels/{submodel_id}-{fingerprint[:12]}``."""
        return join(self.submodels_dir, f"{submodel_id}-{fingerprint[:12]}")

    def submodel_results_glob(self, submodel_id: str) -> str:
        """A glob matching the ``result.json`` of every fingerprint of one submodel."""
        return join(self.submodels_dir, f"{submodel_id}-*", RESULT_FILE)

    def submodel_result(self, submodel_id: str, fingerprint: str) -> str:
        """The submodel's record (:data:`RESULT_FILE`); its presence means the submodel is done."""
        return join(self.submodel_dir(submodel_id, fingerprint), RESULT_FILE)

    def submodel_upload_mark(self, submodel_id: str, fingerprint: str, task_uuid: str) -> str:
        """``uploads/<task_uuid>`` of the submodel: written before the upload under that UUID
        starts, so a later run knows a UUID no node has as a task may hold a killed upload's
        files (the node keeps them) and takes the next attempt's UUID instead."""
        return join(self.submodel_dir(submodel_id, fingerprint), "uploads", task_uuid)

    def calibration_file(self, fingerprint: str, file_name: str) -> str:
        """A file of the survey's camera calibration (``cameras.json``, its ``geo.txt``)."""
        return join(self.calibration_dir, fingerprint[:12], file_name)

    def submodel_input(self, submodel_id: str, fingerprint: str, file_name: str) -> str:
        """A file sent to the node with the images (``geo.txt``), stored under ``inputs/``."""
        return join(self.submodel_dir(submodel_id, fingerprint), "inputs", file_name)

    def submodel_report_file(self, submodel_id: str, fingerprint: str, file_name: str) -> str:
        """A report file a node returned (``odm_report/<file_name>``), stored under ``report/``."""
        return join(self.submodel_dir(submodel_id, fingerprint), "report", file_name)

    def submodel_shots(self, submodel_id: str, fingerprint: str) -> str:
        """The submodel's reconstructed cameras (ODM's ``shots.geojson``)."""
        return self.submodel_report_file(submodel_id, fingerprint, REPORT_FILES["shots"])

    def submodel_product(self, submodel_id: str, fingerprint: str, product: str) -> str:
        """A product file of one submodel (registry file name)."""
        return join(self.submodel_dir(submodel_id, fingerprint), PRODUCT_FILES[product])

    def merged_product(self, product: str, point_cloud_format: PointCloudFormat = "laz") -> str:
        """A merged product file, ``merged/<registry file name>`` (a point cloud written as COPC:
        ``merged/odm_georeferenced_model.copc.laz``, :meth:`.registry.Product.merged_file_name`)."""
        return join(self.merged_dir, PRODUCTS[product].merged_file_name(point_cloud_format))  # type: ignore[index]

    def report_file(self, file_name: str) -> str:
        """Another file of the report (pictures)."""
        return join(self.report_dir, file_name)
