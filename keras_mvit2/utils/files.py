"""Atomic file output: a reader never sees a half-written file (any file, or JSON)."""

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from typing import Any

import numpy as np


@contextlib.contextmanager
def atomic_output(path: str | os.PathLike) -> Iterator[str]:
    """Yields a temporary path beside `path`; moves it onto `path` only on success.

    Whatever writes to the yielded path (a file or a directory) replaces `path`
    in one `os.replace`; on an exception the temporary is removed and an
    existing `path` is left untouched. The temporary keeps the suffix of `path`
    (writers such as Keras check extensions like `.weights.h5`).
    """
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    base = os.path.basename(path)
    stem, dot, suffix = base.partition(".")
    tmp_dir = tempfile.mkdtemp(prefix=f".{stem}.", dir=directory)
    tmp_path = os.path.join(tmp_dir, f"{stem}{dot}{suffix}")
    try:
        yield tmp_path
        if os.path.isdir(path) and not os.path.isdir(tmp_path):
            raise IsADirectoryError(f"Refusing to replace the directory {path!r} with a file.")
        if os.path.isdir(tmp_path) and os.path.isdir(path):
            shutil.rmtree(path)
        os.replace(tmp_path, path)
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)


def sha256_file(path: str | os.PathLike) -> str:
    """The SHA-256 hex digest of a file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def disk_size(path: str | os.PathLike) -> int:
    """Bytes on disk of a file, or of every file under a folder (a `.mlpackage`, say)."""
    if os.path.isfile(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(root, name))
               for root, _, names in os.walk(path) for name in names)


def write_text(path: str | os.PathLike, text: str) -> None:
    """Writes `text` to `path` (UTF-8), atomically (`atomic_output`)."""
    with atomic_output(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        f.write(text)


def write_json(path: str | os.PathLike, payload: Any, *, indent: int = 2) -> None:
    """Writes `payload` to `path` as JSON, atomically (`atomic_output`).

    numpy scalars and arrays become numbers and lists, paths strings; anything else
    that JSON cannot hold raises `TypeError` before `path` is touched.
    """
    with atomic_output(path) as tmp, open(tmp, "w") as f:
        json.dump(payload, f, indent=indent, default=_to_json)


def _to_json(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    raise TypeError(f"Not JSON serializable: {type(value).__name__}")
