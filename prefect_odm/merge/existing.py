"""Find the products of OpenDroneMap outputs made elsewhere (adapter: fsspec via storage).

Recognised layouts, local or at any fsspec URL (``s3://bucket/prefix``):

- an OpenDroneMap project folder, or the extracted contents of a NodeODM/WebODM ``all.zip``:
  ``odm_orthophoto/odm_orthophoto.tif``, ``odm_dem/dsm.tif``, ``odm_dem/dtm.tif``,
  ``odm_georeferencing/odm_georeferenced_model.laz`` (the paths of
  :data:`prefect_odm.layout.ODM_PRODUCT_PATHS`);
- a folder holding several of those (one level down, e.g. one folder per task, possibly each
  with its ``all.zip``, or ODM's own ``submodels/submodel_0000`` folders);
- an ``all.zip`` file (or a folder holding ``*.zip`` files); the product members are extracted
  into a local working folder given by the caller.

Each found output gets an id: the folder's name (for ``all.zip``, the name of the folder holding
it), made unique with a numeric suffix when two are equal. :func:`plan_existing_merge` then
matches them to a prefect-odm plan when one is given (:func:`match_plan`) and names the merge.
"""

from __future__ import annotations

import logging
import posixpath
import zipfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prefect_odm import storage
from prefect_odm.errors import InputError
from prefect_odm.fingerprints import fingerprint
from prefect_odm.layout import ODM_PRODUCT_PATHS, PRODUCT_FILES, join, submodel_of_folder
from prefect_odm.models import MergeOptions, SplitPlan
from prefect_odm.ownership import Ownership
from prefect_odm.product_identity import base_names, foreign_images, listed, shot_names
from prefect_odm.registry import REPORT_FILES, REPORT_FOLDER
from prefect_odm.storage import check_inputs_exist, filesystem, is_local

if TYPE_CHECKING:
    from fsspec import AbstractFileSystem

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ExistingOutput:
    """The products of one OpenDroneMap output found at ``location``.

    Attributes:
        submodel_id: id given to this output in the merge.
        location: the folder or zip URL it was found at.
        products: product name (``orthophoto``, ``dsm``, ``dtm``, ``point_cloud``) -> local path
            or URL of the file.
    """

    submodel_id: str
    location: str
    products: dict[str, str]


def _products_in_folder(url: str) -> dict[str, str]:
    """Products in ODM's layout, or (a prefect-odm submodel folder) flat under ODM's file names."""
    fs, root = filesystem(url)
    found = {}
    for layout in (ODM_PRODUCT_PATHS, PRODUCT_FILES):
        for product, rel in layout.items():
            path = posixpath.join(root.rstrip("/"), rel)
            if product not in found and fs.exists(path):
                found[product] = join(url, rel)
    return found


def _name_of(url: str) -> str:
    name = posixpath.basename(url.rstrip("/"))
    if name.lower().endswith(".zip"):
        stem = name[:-4]
        parent = posixpath.basename(posixpath.dirname(url.rstrip("/")))
        name = parent if stem.lower() == "all" and parent else stem
    return name or "output"


def extract_products(zip_url: str, dest: Path | None) -> dict[str, str]:
    """Extract the product members of an ``all.zip`` (local or URL) into ``dest``.

    Args:
        zip_url: the archive (local path or fsspec URL).
        dest: where the members go; None: nothing is extracted, only the archive's listing
            (its central directory) is read and checked (the command line's early check).

    Returns:
        product name -> local path of the extracted file (``dest`` None: the member's name).

    Raises:
        InputError: the file is not a zip archive, or one of its members would leave ``dest``
            (an absolute name or ``..``: the archive is refused, as ``reconstruct`` refuses a
            node's).
    """
    fs, path = filesystem(zip_url)
    if dest is not None:
        dest.mkdir(parents=True, exist_ok=True)
    found: dict[str, str] = {}
    try:
        with fs.open(path, "rb") as fh, zipfile.ZipFile(fh) as zf:
            names = set(zf.namelist())
            escaping = sorted(n for n in names if n.startswith("/") or ".." in n.split("/"))
            if escaping:
                raise InputError(
                    f"{zip_url}: archive member {escaping[0]!r} would leave the output folder"
                )
            for product, rel in ODM_PRODUCT_PATHS.items():
                member = next((n for n in sorted(names) if n == rel or n.endswith("/" + rel)), None)
                if member is None:
                    continue
                if dest is None:
                    found[product] = member
                    continue
                target = dest / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                with zf.open(member) as src, open(target, "wb") as out:
                    while chunk := src.read(1 << 20):
                        out.write(chunk)
                found[product] = str(target)
    except zipfile.BadZipFile as exc:
        raise InputError(f"{zip_url} is not a zip archive: {exc}") from exc
    return found


def archived_product_urls(location: str, products: dict[str, str]) -> dict[str, str]:
    """An output's products as a manifest lists them once the merge has ended.

    A product extracted from an ``all.zip`` into the merge's working folder (deleted when the
    merge ends) is given as the fsspec URL of its archive member, ``zip://MEMBER::ARCHIVE``
    (the archive being ``location`` itself or ``location/all.zip``); the others as they are.

    Args:
        location: where the output was found (:attr:`ExistingOutput.location`).
        products: product name -> the path or URL the merge read.

    Returns:
        Product name -> a URL that still opens the product.

    Raises:
        InputError: the archive is no longer a zip archive.
    """
    root = location.rstrip("/")
    if all(url.startswith(root) for url in products.values()):
        return dict(products)
    archive = location if root.lower().endswith(".zip") else join(location, "all.zip")
    members = extract_products(archive, None)
    return {
        product: f"zip://{members[product]}::{archive}" if product in members else url
        for product, url in products.items()
    }


_Found = tuple[str, str, dict[str, str]]
"""One location's ``(name, url, product -> local path)``; an empty product map holds none."""


def _find_in_children(
    fs: AbstractFileSystem, path: str, url: str, workdir: Path | None, found: list[_Found]
) -> None:
    """Add the outputs one level below the folder ``url`` (``path`` on ``fs``) to ``found``:
    zip files, ODM project folders (or their ``all.zip``), and a ``submodels/`` folder's
    children. Zip members go to ``workdir/zip-{n}-{name}``, ``n`` counting what is found
    (``workdir`` None: zip files are listed, not extracted)."""
    for child in sorted(p for p in fs.ls(path, detail=False)):
        name = posixpath.basename(str(child).rstrip("/"))
        child_url = join(url, name) if not is_local(url) else str(Path(url) / name)
        if name.lower().endswith(".zip"):
            prods = extract_products(child_url, _zip_dest(workdir, found, name[:-4]))
            if prods:
                found.append((_name_of(child_url), child_url, prods))
        elif fs.isdir(child):
            prods = _products_in_folder(child_url)
            zipped = posixpath.join(str(child).rstrip("/"), "all.zip")
            if not prods and fs.exists(zipped):
                zip_url = join(child_url, "all.zip")
                prods = extract_products(zip_url, _zip_dest(workdir, found, name))
            if not prods and name == "submodels":
                for sub in sorted(fs.ls(child, detail=False)):
                    sub_name = posixpath.basename(str(sub).rstrip("/"))
                    sub_url = join(child_url, sub_name)
                    sub_prods = _products_in_folder(sub_url)
                    if sub_prods:
                        found.append((sub_name, sub_url, sub_prods))
            elif prods:
                found.append((name, child_url, prods))


def _zip_dest(workdir: Path | None, found: Sequence[_Found], name: str) -> Path | None:
    """Where the next archive's members go (``workdir/zip-{n}-{name}``); None without one."""
    return None if workdir is None else workdir / f"zip-{len(found)}-{name}"


def _with_unique_ids(found: Sequence[_Found]) -> list[ExistingOutput]:
    """The locations that hold products, sorted by id; a repeated name gets ``-2``, ``-3``..."""
    out: list[ExistingOutput] = []
    used: set[str] = set()
    for name, url, prods in found:
        if not prods:
            log.info("%s holds no OpenDroneMap product", url)
            continue
        sid = name
        n = 2
        while sid in used:
            sid = f"{name}-{n}"
            n += 1
        used.add(sid)
        out.append(ExistingOutput(sid, url, dict(sorted(prods.items()))))
    return sorted(out, key=lambda o: o.submodel_id)


def find_existing_outputs(locations: Sequence[str], workdir: Path | None) -> list[ExistingOutput]:
    """OpenDroneMap outputs found at the given folders, zip files or their children.

    Args:
        locations: local paths or fsspec URLs (ODM project folders, extracted ``all.zip``
            contents, ``all.zip`` files, or folders holding any of those one level down).
        workdir: local folder where zip members are extracted; None: nothing is extracted
            (each archive's listing is read and checked), as
            :func:`~prefect_odm.merge.existing_checks.check_existing_merge`
            does.

    Returns:
        The outputs found, sorted by id; ids are unique.

    Raises:
        InputError: a location that does not exist, a file that is not a zip archive, an
            archive member that would leave the working folder, or no product found anywhere.
    """
    check_inputs_exist(locations)
    found: list[_Found] = []
    for url in locations:
        fs, path = filesystem(url)
        if not url.lower().endswith(".zip") and not fs.isdir(path):
            raise InputError(
                f"{url}: a file, not an OpenDroneMap project folder, a folder of them or an all.zip"
            )
        if url.lower().endswith(".zip"):
            name = _name_of(url)
            found.append((name, url, extract_products(url, _zip_dest(workdir, found, name))))
            continue
        direct = _products_in_folder(url)
        if direct:
            found.append((_name_of(url), url, direct))
            continue
        _find_in_children(fs, path, url, workdir, found)
    if not any(p for _, _, p in found):
        raise InputError(
            "no OpenDroneMap product ("
            + ", ".join(ODM_PRODUCT_PATHS.values())
            + ") found in "
            + ", ".join(locations)
        )
    return _with_unique_ids(found)


def shots_url(location: str) -> str | None:
    """The ``shots.geojson`` of an ODM output folder (``odm_report/``, or ``report/`` of a
    prefect-odm submodel folder), or None when it has none."""
    for folder in (REPORT_FOLDER, "report"):
        url = join(location, folder, REPORT_FILES["shots"])
        if storage.exists(url):
            return url
    return None


def _shot_names(location: str) -> set[str]:
    """Image names in ``odm_report/shots.geojson`` of an ODM output folder (empty if absent)."""
    for folder in (REPORT_FOLDER, "report"):  # ODM's layout; a prefect-odm submodel folder
        try:
            return shot_names(storage.read_bytes(join(location, folder, REPORT_FILES["shots"])))
        except (FileNotFoundError, OSError, ValueError):
            continue
    return set()


def match_plan(found: Sequence[ExistingOutput], plan: SplitPlan) -> dict[str, str]:
    """Found output id -> plan submodel id: same id (or ``{id}-...``, a prefect-odm submodel
    folder), else the submodel sharing most image names (``shots.geojson``).

    Raises:
        InputError: an output sharing no image with any submodel; an output named after a
            submodel whose cameras include images that submodel does not have (the plan is of
            another run); or two outputs matching the same submodel.
    """
    by_id = {sm.id: sm for sm in plan.submodels}
    out: dict[str, str] = {}
    for output in sorted(found, key=lambda o: o.submodel_id):
        oid = output.submodel_id
        names = _shot_names(output.location)
        named = [sid for sid in by_id if oid == sid or oid.startswith(f"{sid}-")]
        if len(named) == 1:  # e.g. a prefect-odm folder "submodel-003-<fingerprint>"
            extra = foreign_images(names, by_id[named[0]].image_names)
            if extra:
                raise InputError(
                    f"{output.location}: {len(extra)} of its {len(names)} cameras "
                    f"({listed(extra)}) are not in "
                    f"{named[0]} of the plan: the plan is not of the run that made it"
                )
            out[oid] = named[0]
            continue
        best = max(plan.submodels, key=lambda sm: (len(names & base_names(sm.image_names)), sm.id))
        if not names & base_names(best.image_names):
            raise InputError(f"{output.location}: no image of it is in any submodel of the plan")
        out[oid] = best.id
    by_submodel: dict[str, list[str]] = {}
    for oid, sid in sorted(out.items()):
        by_submodel.setdefault(sid, []).append(oid)
    for sid, oids in by_submodel.items():
        if len(oids) > 1:
            raise InputError(
                f"{len(oids)} inputs match {sid} of the plan ({', '.join(oids)}): give one of "
                "them (a run's submodels/ folder keeps one per set of options)"
            )
    return out


@dataclass(frozen=True)
class ExistingMerge:
    """What to merge of outputs made elsewhere, and under which identity.

    Attributes:
        products: submodel id (the plan's, or the output's own) -> product name -> URL.
        ownership: the plan's ownership rule (its cameras in the plan CRS), None without a plan.
        crs_epsg: the plan's CRS, None without a plan.
        plan_fingerprint: the plan's fingerprint, empty without a plan.
        identity: the fingerprint naming the merge's output folder.
        renamed: found output id -> the plan's submodel id (empty without a plan).
        gps: image name -> the plan's camera position ``(x, y, z)`` (plan CRS metres), for the
            alignment's gauge; empty without a plan.
        footprints: submodel id -> the plan's footprint of it (GeoJSON in the plan CRS), where
            each output's products must lie (:mod:`.locations`); empty without a plan.
        locations: submodel id -> the location its output was found at.
    """

    products: dict[str, dict[str, str]]
    ownership: Ownership | None
    crs_epsg: int | None
    plan_fingerprint: str
    identity: str
    renamed: dict[str, str] = field(default_factory=dict)
    gps: dict[str, tuple[float, float, float]] = field(default_factory=dict)
    footprints: dict[str, dict[str, Any]] = field(default_factory=dict)
    locations: dict[str, str] = field(default_factory=dict)

    def submodel_of(self, output_id: str) -> str:
        """The id a found output is merged under (the plan's, else its own)."""
        return self.renamed.get(output_id, output_id)


def refuse_missing_submodels(plan: SplitPlan, matched: Iterable[str], plan_url: str) -> None:
    """Refuse a merge with a plan when a submodel it lists is not among the inputs: merged
    without it, its ground would be a silent hole (or another submodel's edge) in the products.

    Args:
        plan: the plan of ``--plan``.
        matched: the plan's submodel ids the inputs were matched to (:func:`match_plan`).
        plan_url: where the plan was read (named in the error).

    Raises:
        InputError: one line naming the missing submodel(s) and the plan.
    """
    missing = sorted({sm.id for sm in plan.submodels} - set(matched))
    if missing:
        raise InputError(
            f"--plan {plan_url}: {len(missing)} of its {len(plan.submodels)} submodels "
            f"({', '.join(missing[:5])}{', ...' if len(missing) > 5 else ''}) not among the "
            "inputs; give all of them, or leave --plan out to merge these as they are"
        )


def _refuse_two_versions(found: Sequence[ExistingOutput]) -> None:
    """Refuse two prefect-odm folders of one submodel (a run's ``submodels/`` folder keeps one
    per set of options): merged together, the older version would own half of the ground.

    Raises:
        InputError: naming the submodel and both folders.
    """
    versions: dict[str, list[str]] = {}
    for output in found:
        sid = submodel_of_folder(output.submodel_id)
        if sid is not None:
            versions.setdefault(sid, []).append(output.location)
    for sid, locations in sorted(versions.items()):
        if len(locations) > 1:
            raise InputError(
                f"{len(locations)} inputs are versions of {sid} ({', '.join(sorted(locations))}): "
                "give one of them (a run's submodels/ folder keeps one per set of options)"
            )


def plan_existing_merge(
    found: Sequence[ExistingOutput], plan_url: str | None, options: MergeOptions | None = None
) -> ExistingMerge:
    """The products, ownership and identity of a merge of outputs made elsewhere.

    Args:
        found: the outputs (:func:`find_existing_outputs`).
        plan_url: a prefect-odm ``plan.json`` the outputs come from (its ownership rule and CRS
            are used, so the result equals that run's own merge), or None.
        options: the merge options; fields that differ from the defaults enter the identity.

    Raises:
        InputError: the outputs do not match the plan (see :func:`match_plan`), or a submodel
            of the plan is not among them; without a plan, two prefect-odm folders of one
            submodel.
    """
    if plan_url is None:
        _refuse_two_versions(found)
    products = {o.submodel_id: dict(o.products) for o in found}
    ownership: Ownership | None = None
    crs_epsg: int | None = None
    plan_fp = ""
    mapping: dict[str, str] = {}
    gps: dict[str, tuple[float, float, float]] = {}
    footprints: dict[str, dict[str, Any]] = {}
    if plan_url is not None:
        split_plan = SplitPlan.model_validate(storage.read_json(plan_url))
        mapping = match_plan(found, split_plan)
        refuse_missing_submodels(split_plan, mapping.values(), plan_url)
        products = {mapping[oid]: prods for oid, prods in products.items()}
        ownership = Ownership.from_cameras(
            ((c.x_m, c.y_m, c.submodel_id) for c in split_plan.cameras), only=sorted(products)
        )
        crs_epsg = split_plan.crs_epsg
        plan_fp = split_plan.fingerprint
        gps = {c.name: (c.x_m, c.y_m, c.z_m) for c in split_plan.cameras if c.z_m is not None}
        footprints = {
            sm.id: sm.footprint for sm in split_plan.submodels if sm.id in products and sm.footprint
        }
    value: dict[str, object] = {
        "kind": "merge-existing",
        "inputs": sorted(o.submodel_id for o in found),
        "locations": sorted(o.location for o in found),
        "plan": plan_fp,
    }
    changed = (options or MergeOptions()).model_dump(exclude_defaults=True)
    if changed:
        value["options"] = changed
    locations = {mapping.get(o.submodel_id, o.submodel_id): o.location for o in found}
    return ExistingMerge(
        products, ownership, crs_epsg, plan_fp, fingerprint(value), mapping, gps, footprints,
        locations,
    )  # fmt: skip
