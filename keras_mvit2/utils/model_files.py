"""Model and weights files that are not what their names say, and `.keras` loading.

A file named `model.keras` that is not a Keras archive (a truncated copy, a saved web page, a
checkpoint of another framework renamed) makes Keras answer "File not found", although the
file is there. `file_format_problem` reads the first bytes and says what is wrong instead;
`check_file_format` turns that into one error naming the problem and the fix, and
`load_keras_model` checks before Keras loads. The CLI's model arguments (`export`,
`validate`, `optimize`, `eval`, `bench`, `visualize`), the weights files of `weights=` /
`--weights` and the published downloads (`keras_mvit2.weights.download`) all go through
them.

```python
model = load_keras_model("run/model.keras")        # ValueError if it is no Keras archive
check_file_format("mobilevitv2_050.weights.h5")    # ValueError if it is no HDF5 file
```
"""

from __future__ import annotations

import os
import zipfile
from typing import Any

__all__ = ["check_file_format", "file_format_problem", "load_keras_model"]

#: The first bytes of every HDF5 file (Keras `.weights.h5` and legacy `.h5`).
HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
#: How a name ends -> what the file is, and what writes one (the fix of an error).
_KINDS = (
    (".keras", "a Keras model file",
     "the zip archive model.save('model.keras') writes (mvit2 train and mvit2 finetune leave "
     "model.keras in their run folder), or save the model again"),
    (".h5", "a Keras weights file",
     "the HDF5 file model.save_weights('x.weights.h5') or mvit2 convert-weights writes"),
    (".safetensors", "a safetensors checkpoint",
     "the model.safetensors file of a timm / Hugging Face checkpoint, downloaded again"),
    ((".pt", ".pth", ".bin"), "a PyTorch checkpoint",
     "the file torch.save wrote (an ml-cvnets .pt, a timm .pth / .bin), downloaded again"),
)


def _kind(name: str) -> tuple[str, str] | None:
    lower = name.lower()
    for suffixes, kind, fix in _KINDS:
        if lower.endswith(suffixes):
            return kind, fix
    return None


def _head(path: str, size: int = 1024) -> bytes:
    with open(path, "rb") as f:
        return f.read(size)


def file_format_problem(path: str | os.PathLike, name: str | None = None) -> str | None:
    """Why the file at `path` is not the kind of file its name says, in words.

    Reads only the first bytes (and a zip archive's table of contents), so it is cheap;
    it does not check that the contents fit a model.

    - any file: empty, or an HTML / XML page (a saved web page, a proxy's answer);
    - `.keras`: a zip archive holding `config.json` (what `model.save` writes);
    - `.h5` (`.weights.h5`): an HDF5 file;
    - `.pt`, `.pth`, `.bin`: a zip archive or a pickle (what `torch.save` writes);
    - `.safetensors`: a header safetensors reads, with at least one tensor.

    Args:
        path: the file.
        name: the name that says its kind (default: `path`; a download cached under
            another name passes the published file name).

    Returns:
        A phrase such as `"it is not a zip archive (9 bytes: b'not a zip')"`, or None when
        the file looks like what its name says (or the name says nothing checkable).
    """
    path = os.fspath(path)
    name = name or path
    if os.path.isdir(path):
        return "it is a folder, not a file"
    size = os.path.getsize(path)
    if size == 0:
        return "the file is empty"
    head = _head(path)
    text = head.lstrip().lower()
    if text.startswith((b"<!doctype html", b"<html", b"<?xml", b"<head", b"<body")):
        return ("the file is an HTML/XML page, not a model file (a saved web page, or a "
                "proxy, captive portal or error page that answered instead of the server)")
    lower = name.lower()
    found = f"{size:,} bytes, starting {head[:16]!r}"
    if lower.endswith(".keras"):
        if not zipfile.is_zipfile(path):
            return f"it is not a zip archive ({found})"
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
        if "config.json" not in names:
            return (f"it is a zip archive without config.json (it holds "
                    f"{', '.join(names[:3]) or 'nothing'}{', ...' if len(names) > 3 else ''})")
        return None
    if lower.endswith(".h5"):
        if not head.startswith(HDF5_SIGNATURE):
            return f"it is not an HDF5 file ({found})"
        return None
    if lower.endswith((".pt", ".pth", ".bin")):
        # torch.save writes a zip archive; files of torch < 1.6 are a pickle stream.
        if not (zipfile.is_zipfile(path) or head.startswith(b"\x80")):
            return f"it is neither a zip archive nor a pickle, torch.save's formats ({found})"
        return None
    if lower.endswith(".safetensors"):
        try:
            from safetensors import safe_open

            with safe_open(path, framework="numpy") as f:
                if not list(f.keys()):
                    return "the safetensors file holds no tensors"
        except Exception as e:  # SafetensorError for truncated / malformed headers
            return f"the file is not a valid safetensors file ({type(e).__name__}: {e})"
    return None


def check_file_format(path: str | os.PathLike, what: str | None = None) -> None:
    """Raises `ValueError` when `path` exists but is not the kind of file its name says.

    Args:
        path: the file (a missing one is left to the caller's own `FileNotFoundError`).
        what: how the message names the value (default: the path), e.g. `"--weights 'x'"`.

    Raises:
        ValueError: naming the file, what is wrong with it and what to pass instead.
    """
    path = os.fspath(path)
    if not os.path.exists(path):
        return
    problem = file_format_problem(path)
    if problem is None:
        return
    kind = _kind(path)
    label = what or repr(path)
    if kind is None:
        raise ValueError(f"{label} is not a usable file: {problem}.")
    raise ValueError(f"{label} is not {kind[0]}: {problem}. Pass {kind[1]}.")


def load_keras_model(path: str | os.PathLike, *, compile: bool = False) -> Any:
    """`keras.saving.load_model(path)` after checking that `path` is a Keras archive.

    Raises:
        FileNotFoundError: no file at `path`.
        ValueError: the file is not a `.keras` archive (`check_file_format`'s message), where
            Keras would say "File not found".
    """
    import keras

    # The custom layers are registered: importing this module ran keras_mvit2/__init__.py.
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"Model file not found: {path!r}")
    if not path.endswith(".keras"):
        raise ValueError(f"Expected a .keras model file (what model.save writes). "
                         f"Received: {path!r}")
    check_file_format(path)
    return keras.saving.load_model(path, compile=compile)
