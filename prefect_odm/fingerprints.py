"""Content fingerprints: stable hashes of canonical JSON.

A fingerprint never depends on file names, input order or dictionary order; see DESIGN.md,
"Identities and caching".
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Any

from prefect_odm.models import MergeOptions

MERGE_VERSION = "8"
"""Bumped when the merge changes its output for the same inputs (part of the merge fingerprint)."""


def canonical_json(value: Any) -> str:
    """Serialise ``value`` to JSON with sorted keys and no whitespace."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def fingerprint(value: Any) -> str:
    """SHA-256 hex digest of :func:`canonical_json` of ``value``."""
    return hashlib.sha256(canonical_json(value).encode("ascii")).hexdigest()


def survey_fingerprint(image_identities: Iterable[str]) -> str:
    """Fingerprint of a survey: the sorted content identities of its accepted images."""
    return fingerprint({"kind": "survey", "images": sorted(image_identities)})


def submodel_fingerprint(
    image_identities: Iterable[str],
    options: Mapping[str, Any],
    engine_identity: str,
    altitudes_m: Mapping[str, float] | None = None,
) -> str:
    """Fingerprint of a submodel: its images, the processing options and the engine identity,
    and the camera altitudes sent with the images (image identity -> metres, the plan's
    ``geo.txt``) when there are any (without, the fingerprint is as before they existed)."""
    value: dict[str, Any] = {
        "kind": "submodel",
        "images": sorted(image_identities),
        "options": dict(options),
        "engine": engine_identity,
    }
    if altitudes_m:
        value["altitudes_m"] = dict(sorted(altitudes_m.items()))
    return fingerprint(value)


def merge_fingerprint(
    submodels: Iterable[tuple[str, str]], plan_fingerprint: str, options: MergeOptions
) -> str:
    """Fingerprint of a merge: the merged submodels ``(id, fingerprint)``, the plan, the merge
    options and :data:`MERGE_VERSION`.

    Options at their defaults hash as before they existed (only fields that differ from the
    defaults enter the hash), so outputs of earlier runs are still recognised.
    """
    value: dict[str, Any] = {
        "kind": "merge",
        "version": MERGE_VERSION,
        "submodels": sorted(submodels),
        "plan": plan_fingerprint,
    }
    changed = options.model_dump(exclude_defaults=True)
    if changed:
        value["options"] = changed
    return fingerprint(value)
