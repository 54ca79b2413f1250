"""What both sides of the `keras_mvit2.quantize` worker use: the files they exchange
and dotted attribute paths.

Imported by the parent (`_worker_client`, `qat`, `sparsity`) and by the worker
process (`_worker`, and the TFMOT task functions it runs); it needs only numpy, so
the worker can import it after installing its ``keras`` shim.

Array files: ``.npz`` archives of numpy arrays (``x``, ``y``, optional
``batch_sizes``), written uncompressed. Images that are exactly ``k / 255`` (the
usual ``uint8 / 255`` preprocessing) are stored as uint8 and rescaled when read
(lossless, 4x smaller); other float images are stored as float32. Weight files:
``{keras3 variable path: array}`` as ``w0``, ``w1``, ... plus the list of paths.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import numpy as np

__all__ = [
    "load_arrays",
    "pack_images",
    "path_get",
    "path_set",
    "read_weights",
    "save_arrays",
    "unpack_images",
    "write_twin_weights",
]

# --------------------------------------------------------------------------------------
# Image / label arrays


def pack_images(x: np.ndarray) -> tuple[np.ndarray, bool]:
    """`(array, scaled)`: uint8 when the float images are exactly ``k / 255`` (lossless)."""
    x = np.asarray(x)
    if x.dtype == np.uint8:
        return x, False
    x = x.astype(np.float32, copy=False)
    if x.size and np.all((x >= 0) & (x <= 1)):
        q = np.round(x * 255.0)
        if np.array_equal(q.astype(np.float32) / np.float32(255.0), x):
            return q.astype(np.uint8), True
    return x, False


def unpack_images(x: np.ndarray, scaled: bool) -> np.ndarray:
    if scaled:
        return x.astype(np.float32) / np.float32(255.0)
    return x.astype(np.float32, copy=False)


def save_arrays(path: str, x: np.ndarray, y: np.ndarray | None = None,
                batch_sizes: list[int] | None = None) -> dict[str, Any]:
    """Writes images (packed, see `pack_images`) and labels; returns the file's description."""
    packed, scaled = pack_images(x)
    arrays = {"x": packed}
    if y is not None:
        arrays["y"] = np.asarray(y)
    if batch_sizes is not None:
        arrays["batch_sizes"] = np.asarray(batch_sizes, np.int64)
    np.savez(path, **arrays)
    return {"path": path, "scaled": scaled, "num_examples": len(packed)}


def load_arrays(info: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray | None, Any]:
    """(images float32, labels or None, batch sizes or None) from a `save_arrays` file."""
    with np.load(info["path"]) as data:
        x = unpack_images(data["x"], info["scaled"])
        y = data["y"] if "y" in data else None
        sizes = data["batch_sizes"].tolist() if "batch_sizes" in data else None
    return x, y, sizes



# --------------------------------------------------------------------------------------
# Weights


def write_twin_weights(weight_map: Mapping[str, Any], path: str) -> None:
    """``{keras3 path: twin variable}`` -> an npz the parent reads with `read_weights`."""
    paths = list(weight_map)
    arrays = {f"w{i}": np.asarray(weight_map[p].numpy()) for i, p in enumerate(paths)}
    np.savez(path, __paths__=np.asarray(json.dumps(paths)), **arrays)



def read_weights(path: str) -> dict[str, np.ndarray]:
    """``{keras3 path: array}`` written by the worker's `write_twin_weights`."""
    with np.load(path) as data:
        paths = json.loads(str(data["__paths__"]))
        return {p: data[f"w{i}"] for i, p in enumerate(paths)}



# --------------------------------------------------------------------------------------
# Dotted attribute paths


def path_get(obj: Any, path: str) -> Any:
    """The attribute / list item at dotted `path` of `obj` ("qkv_proj.kernel", "blocks.0")."""
    for part in path.split("."):
        obj = obj[int(part)] if part.isdigit() else getattr(obj, part)
    return obj


def path_set(obj: Any, path: str, value: Any) -> None:
    """Sets the attribute at dotted `path` of `obj` (see `path_get`)."""
    head, _, last = path.rpartition(".")
    setattr(path_get(obj, head) if head else obj, last, value)

