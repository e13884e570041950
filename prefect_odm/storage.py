"""Storage adapter over fsspec: local paths and URLs (``s3://`` and others) alike.

Writes go to a temporary name and are promoted when complete, so a crash never leaves a
half-written file under the final name and nothing is deleted before its replacement exists.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import fsspec
import orjson
from fsspec.core import url_to_fs
from pydantic import JsonValue

from prefect_odm.errors import InputError, StorageError


def is_local(url: str) -> bool:
    """True for plain paths and ``file://`` URLs."""
    return "://" not in url or url.startswith("file://")


def absolute(url: str) -> str:
    """A relative local path made absolute (against the working folder now), so a record
    naming it holds from any working folder; absolute paths and URLs unchanged."""
    return os.path.abspath(url) if "://" not in url and url and not os.path.isabs(url) else url


def local_path(url: str) -> Path:
    """The local path of a plain path or ``file://`` URL."""
    return Path(url[len("file://") :] if url.startswith("file://") else url)


StorageOptions = Mapping[str, JsonValue]
"""fsspec storage options of a URL (``{"endpoint_url": ..., "key": ..., "client_kwargs": {...}}``)."""


def filesystem(
    url: str, storage_options: StorageOptions | None = None
) -> tuple[fsspec.AbstractFileSystem, str]:
    """The fsspec filesystem and the path inside it for ``url``.

    Args:
        url: a local path or an fsspec URL.
        storage_options: the filesystem's options (credentials, endpoint), None for fsspec's
            defaults and the environment's credentials.

    Raises:
        StorageError: fsspec has no filesystem for the URL (or its package is not installed).
    """
    try:
        fs, path = url_to_fs(url, **(storage_options or {}))
    except (ImportError, ValueError) as exc:
        raise StorageError(f"{url}: cannot open this location ({exc})") from exc
    return fs, path


def file_size_bytes(info: Mapping[str, object]) -> int:
    """The ``size`` of an fsspec ``info`` entry, bytes (0 when it does not say)."""
    size = info.get("size")
    return int(size) if isinstance(size, int | float | str) and size else 0


def exists(url: str) -> bool:
    """Whether a file or folder exists at ``url``.

    Raises:
        StorageError: fsspec has no filesystem for the URL.
    """
    fs, path = filesystem(url)
    return bool(fs.exists(path))


def remove_if_present(url: str) -> None:
    """Delete the file at ``url``; nothing when there is none.

    Raises:
        StorageError: it exists and cannot be deleted.
    """
    fs, path = filesystem(url)
    try:
        if fs.exists(path):
            fs.rm_file(path)
    except OSError as exc:
        raise StorageError(f"{url}: cannot delete ({exc})") from exc


def read_bytes(url: str) -> bytes:
    """The bytes at ``url``.

    Raises:
        FileNotFoundError: nothing at ``url``.
        StorageError: it cannot be read.
    """
    fs, path = filesystem(url)
    try:
        with fs.open(path, "rb") as fh:
            return fh.read()  # type: ignore[no-any-return]
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise StorageError(f"{url}: cannot read ({exc})") from exc


def read_json(url: str) -> Any:
    """The JSON document at ``url``; raises as :func:`read_bytes` does, and
    :class:`json.JSONDecodeError` when it is not JSON."""
    return json.loads(read_bytes(url))


def write_bytes_atomic(url: str, data: bytes) -> None:
    """Write ``data`` to ``url`` through a temporary name, then promote it.

    Raises:
        StorageError: the location cannot be written (names ``url`` and the reason).
    """
    try:
        if is_local(url):
            path = local_path(url)
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
            tmp.write_bytes(data)
            os.replace(tmp, path)
            return
        fs, path_in = filesystem(url)
        # Object stores write whole objects: a PUT is already atomic.
        with fs.open(path_in, "wb") as fh:
            fh.write(data)
    except StorageError:
        raise
    except OSError as exc:
        raise StorageError(f"{url}: cannot write ({exc.strerror or exc})") from exc


#: A float orjson writes unlike ``json.dumps`` (checked against 700,000 random doubles): an
#: exponent of one digit (``1e-7``; ``json``: ``1e-07``) or ``0.0000...`` (``json``: ``...e-05``).
#: Each starts with a literal, which ``re`` finds fast (30 ms in 35 MB; a character class
#: first: 1 s); what else matches (``10.00001``, a name ``e-1``) only falls back to ``json``.
_ORJSON_OWN_FLOATS = (re.compile(rb"e-[1-9](?![0-9])"), re.compile(rb"0\.0000"))


_ORJSON_OPTIONS = (
    orjson.OPT_INDENT_2
    | orjson.OPT_SORT_KEYS
    | orjson.OPT_APPEND_NEWLINE
    | orjson.OPT_PASSTHROUGH_DATETIME
    | orjson.OPT_PASSTHROUGH_DATACLASS
)


def _not_plain_json(value: Any) -> Any:
    raise TypeError(f"{type(value).__name__} is not a JSON type")


def json_text(value: Any) -> bytes:
    """``value`` as indented JSON with sorted keys and a final newline (values JSON does not
    know as ``str``): the text of ``json.dumps(value, indent=2, sort_keys=True, default=str)``.

    Written by orjson (C; the standard library's encoder is pure Python once ``indent`` is set:
    1.5 of the 2 CPU-s of a 50,000-image plan's plan.json and survey.json, issue 33), byte for
    byte the same text: where orjson would write otherwise, ``json`` writes it. That is a NaN or
    infinity (orjson writes ``null``, ``json`` ``NaN``, which a float field reads back), an
    integer beyond 64 bits, a key that is not a string, text that is not ASCII (``json`` escapes
    it as ``\\uXXXX``), a value that is not a JSON type (a datetime, an Enum, NumPy's float: by
    ``default=str``) and a float below 1e-4 in size (orjson ``0.00001`` and ``1e-7``, ``json``
    ``1e-05`` and ``1e-07``: :data:`_ORJSON_OWN_FLOATS` finds them, or a string that looks so).
    """
    try:
        # The C encoder (no indent, keys as they come), 0.2 s at 50k: refuses NaN, infinities and every value
        # ``default=str`` would write (a datetime, an Enum, a dataclass: orjson writes them its
        # own way), as orjson then refuses a float subclass (NumPy's: ``json`` writes a number).
        json.dumps(value, allow_nan=False, default=_not_plain_json, check_circular=False)
        text = orjson.dumps(value, default=_not_plain_json, option=_ORJSON_OPTIONS)
    except (ValueError, TypeError, orjson.JSONEncodeError):
        text = b""
    if text and text.isascii() and not any(p.search(text) for p in _ORJSON_OWN_FLOATS):
        return text
    return (json.dumps(value, indent=2, sort_keys=True, default=str) + "\n").encode()


def write_json_atomic(url: str, value: Any) -> None:
    """Write ``value`` as :func:`json_text` writes it, atomically as :func:`write_bytes_atomic`
    does.

    Raises:
        StorageError: the location cannot be written.
    """
    write_bytes_atomic(url, json_text(value))


def check_folder_writable(url: str) -> None:
    """Refuse, before anything is replaced in it, a local folder in which no file can be made
    (``chattr +i``, a read-only mount; permission bits do not say so for root): one is made and
    removed. A missing folder, or a remote one, passes (its first write says so).

    Raises:
        StorageError: no file can be made in the folder (names it and the reason).
    """
    if not is_local(url) or not local_path(url).is_dir():
        return
    try:
        fd, name = tempfile.mkstemp(prefix=".prefect-odm-probe-", dir=local_path(url))
        os.close(fd)
        os.remove(name)
    except OSError as exc:
        raise StorageError(f"{url}: cannot write here ({exc.strerror or exc})") from None


def put_file(local: Path, url: str) -> None:
    """Copy a local file to ``url`` (temporary name, then promoted).

    Raises:
        StorageError: the location cannot be written.
    """
    if is_local(url):
        dest = local_path(url)
        try:
            dest.parent.mkdir(parents=True, exist_ok=True)
            tmp = dest.with_name(f".{dest.name}.{uuid.uuid4().hex[:8]}.tmp")
            shutil.copyfile(local, tmp)
            os.replace(tmp, dest)
        except OSError as exc:
            raise StorageError(f"{url}: cannot write ({exc.strerror or exc})") from exc
        return
    fs, path = filesystem(url)
    try:
        fs.put_file(str(local), path)
    except OSError as exc:
        raise StorageError(f"{url}: cannot write ({exc})") from exc


def get_file(url: str, local: Path) -> Path:
    """Make ``url`` available as a local file; local URLs are returned as they are."""
    if is_local(url):
        return local_path(url)
    fs, path = filesystem(url)
    local.parent.mkdir(parents=True, exist_ok=True)
    try:
        fs.get_file(path, str(local))
    except OSError as exc:
        raise StorageError(f"{url}: cannot read ({exc})") from exc
    return local


def check_inputs_exist(locations: Sequence[str]) -> None:
    """Every input location exists (local paths and fsspec URLs).

    Raises:
        InputError: one does not (the message names it).
    """
    for url in locations:
        fs, path = filesystem(url)
        if not fs.exists(path):
            raise InputError(f"{url}: no such file or folder")
