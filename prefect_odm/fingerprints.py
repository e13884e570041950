"""Content fingerprints: stable hashes of canonical JSON.

A fingerprint never depends on file names, input order or dictionary order; see DESIGN.md,
"Identities and caching".
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Any


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
    image_identities: Iterable[str], options: Mapping[str, Any], engine_identity: str
) -> str:
    """Fingerprint of a submodel: its images, the processing options and the engine identity."""
    return fingerprint(
        {
            "kind": "submodel",
            "images": sorted(image_identities),
            "options": dict(options),
            "engine": engine_identity,
        }
    )
