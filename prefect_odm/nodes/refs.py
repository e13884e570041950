"""Node references in flow parameters, and the names runs carry in the UI (pure).

Flow parameters are shown in clear on the Prefect UI's Parameters tab of every run and are
passed on to child runs, so a node URL there must never carry a credential: tokens live in a
``NodeODMPool`` block (``node_pool``) or in ``PREFECT_ODM_NODE_TOKEN`` /
``PREFECT_ODM_NODE_TOKENS`` on the workers (:mod:`prefect_odm.settings`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from urllib.parse import parse_qs, urlparse

from prefect_odm.errors import InputError

CREDENTIAL_QUERY_KEYS = ("token", "access_token", "api_key", "apikey", "password")
"""Query keys that carry a secret in a node URL (NodeODM and ClusterODM use ``token``)."""

GENERIC_FOLDER_NAMES = frozenset({"images", "image", "imgs", "photos", "jpg", "raw", "dcim"})
"""Folder names that say nothing about the survey: the label takes the folder above."""

_LABEL_CHARS = re.compile(r"[^A-Za-z0-9_.-]+")

LABEL_MAX_CHARS = 32
"""Longest survey short name in a run name."""


def public_url(url: str) -> str:
    """``url`` without query or credentials: safe to log or put into an error message (also
    :func:`prefect_odm.nodes.client.public_url`)."""
    parts = urlparse(url)
    try:
        port = parts.port
    except ValueError:
        port = None
    if not parts.scheme or not parts.hostname:  # not a URL: the text, less any query or login
        return url.split("?", 1)[0].rsplit("@", 1)[-1]
    netloc = f"{parts.hostname}:{port}" if port else parts.hostname
    return f"{parts.scheme}://{netloc}{parts.path}".rstrip("/")


def credential_in(url: str) -> str | None:
    """What credential ``url`` carries (``"?token="``, ``"user:password@"``), or ``None``."""
    parts = urlparse(url)
    if parts.username or parts.password:
        return "user:password@"
    for key in parse_qs(parts.query, keep_blank_values=True):
        if key.lower() in CREDENTIAL_QUERY_KEYS:
            return f"?{key}="
    return None


def refuse_credentials(nodes: Sequence[str] | None, parameter: str = "nodes") -> None:
    """Refuse node URLs that carry a credential, before a run stores them as parameters.

    Args:
        nodes: node URLs as given to a flow.
        parameter: the parameter's name, for the message.

    Raises:
        InputError: a URL carries ``?token=`` (or another secret query key) or
            ``user:password@``; the message names the node by its public URL only and points
            to the ``NodeODMPool`` block and the token variables.
    """
    for url in nodes or []:
        what = credential_in(url)
        if what is not None:
            raise InputError(
                f"{parameter}: {public_url(url)} carries a credential ({what}); parameters are "
                "shown in the Prefect UI and passed to every child run: give the token in a "
                "NodeODMPool block (node_pool=...) or in PREFECT_ODM_NODE_TOKENS (JSON URL -> "
                "token) / PREFECT_ODM_NODE_TOKEN on the workers, and the bare URL here"
            )


def survey_label(source: str) -> str:
    """A short name of a survey from its images location: the last folder that says something.

    ``/data/brighton_beach_1600/images`` -> ``brighton_beach_1600``; ``s3://bucket/city-2026``
    -> ``city-2026``. At most :data:`LABEL_MAX_CHARS` characters, only ``[A-Za-z0-9_.-]``.
    """
    path = urlparse(source).path if "://" in source else source
    parts = [p for p in re.split(r"[\\/]+", path) if p and p not in (".", "..")]
    while len(parts) > 1 and parts[-1].lower() in GENERIC_FOLDER_NAMES:
        parts.pop()
    if not parts and "://" in source:
        parts = [urlparse(source).netloc]
    label = _LABEL_CHARS.sub("-", parts[-1] if parts else "survey").strip("-.")
    return (label or "survey")[:LABEL_MAX_CHARS]


def survey_run_name(source: str, survey_fingerprint: str) -> str:
    """The ``reconstruct`` run's name: survey short name and fingerprint prefix
    (``brighton_beach_1600-3f2a9c1d``)."""
    return f"{survey_label(source)}-{survey_fingerprint[:8]}"


def submodel_run_name(source: str, survey_fingerprint: str, submodel_id: str) -> str:
    """A ``process_submodel`` run's name: the survey's run name and the submodel
    (``brighton_beach_1600-3f2a9c1d-submodel-002``)."""
    return f"{survey_run_name(source, survey_fingerprint)}-{submodel_id}"
