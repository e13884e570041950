"""What NodeODM-API servers answer about a task they do not know, or a token they refuse (pure).

Every NodeODM-API server answers errors as HTTP 200 with ``{"error": "..."}``, and the text is
the only sign that a task is unknown. The messages below are read from the servers' sources:

* NodeODM 2.2.x (``libs/TaskManager.js`` ``find``, ``index.js`` ``getTaskFromUuid``):
  ``"<uuid> not found"`` for info, output, download, cancel, remove and restart;
  ``libs/taskNew.js`` ``getUUID``: ``"Invalid uuid (not found)"`` for upload and commit.
* ClusterODM (``libs/proxy.js``, HEAD 69181e2): ``"Invalid route for taskId <uuid>:<action>, no
  task table entry."`` for info, output and download; ``"Invalid route for taskId <uuid>, no nodes
  in routing table."`` for cancel, remove and restart; ``"Invalid taskId: the task no longer
  exists."`` for an upload. (``"..., no valid route possible."`` is NOT one: the task is known,
  the action is not available for it.)
* The built-in engine answers as NodeODM does.
"""

from __future__ import annotations

import re

_UUID = r"[0-9A-Za-z]+(?:-[0-9A-Za-z]+){4}"

UNKNOWN_TASK_PATTERNS: tuple[re.Pattern[str], ...] = (
    # NodeODM and the built-in engine
    re.compile(rf"^\s*(?P<uuid>{_UUID}) not found\s*$"),
    re.compile(r"^\s*Invalid uuid \(not found\)\s*$"),
    # ClusterODM
    re.compile(
        rf"^\s*Invalid route for taskId (?P<uuid>{_UUID})(?::[^,]*)?, no task table entry\.?\s*$"
    ),
    re.compile(
        rf"^\s*Invalid route for taskId (?P<uuid>{_UUID}), no nodes in routing table\.?\s*$"
    ),
    re.compile(r"^\s*Invalid taskId: the task no longer exists\.?\s*$"),
)
"""The error texts that mean "this server does not know the task"."""


def is_unknown_task_error(message: str, uuid: str | None = None) -> bool:
    """True when ``message`` is a server's "unknown task" answer.

    Args:
        message: the ``error`` text of the answer.
        uuid: the task asked for; when given, a message naming a DIFFERENT UUID is not a match.

    Returns:
        Whether the message is one of :data:`UNKNOWN_TASK_PATTERNS`.

    >>> is_unknown_task_error("Invalid route for taskId 1-2-3-4-5:info, no task table entry.")
    True
    >>> is_unknown_task_error("Invalid route for taskId 1-2-3-4-5:download, no valid route possible.")
    False
    """
    for pattern in UNKNOWN_TASK_PATTERNS:
        match = pattern.match(message)
        if match is None:
            continue
        named = match.groupdict().get("uuid")
        return uuid is None or named is None or named.lower() == uuid.lower()
    return False


BAD_TOKEN_PATTERNS: tuple[re.Pattern[str], ...] = (
    # NodeODM libs/auth/TokenAuthBase.js: "Invalid authentication token: token does not match."
    re.compile(r"^\s*Invalid authentication token\b"),
    # ClusterODM answers a bad token with a bare HTTP 401 (libs/proxy.js); pyodm's Node.get/post
    # turn any 401 into this text
    re.compile(r"^\s*Unauthorized\. Do you need to set a token\?"),
)
"""The error texts that mean "the node refused the token (wrong or missing)"."""


def is_bad_token_error(message: str) -> bool:
    """True when ``message`` says the node refused the token (NodeODM, or ClusterODM's 401).

    >>> is_bad_token_error("Invalid authentication token: token does not match.")
    True
    """
    return any(pattern.match(message) for pattern in BAD_TOKEN_PATTERNS)
