"""Keras model on PyTorch -> Apple Core AI model asset (`.aimodel`): `to_coreai`.

Core AI (Apple, 2026) converts from PyTorch only: ``coreai-torch`` lowers a decomposed
``torch.export.ExportedProgram`` to Core AI IR (`TorchConverter`), which ``coreai-core``
saves as an ``.aimodel`` folder (``main.mlirb`` bytecode, its hash, ``metadata.json``). Both
convert on Linux; running an asset needs macOS (`keras_mvit2.export.coreai.inspect`).

The program is the model's inference call captured by `keras_mvit2.export.torch_export`
(the channels-first MobileViTv2 transformer of Core ML's export, element-wise token
pooling), decomposed with coreai-torch's own table (`get_decomp_table`: composite ops kept),
float32, input ``image`` ``(1, H, W, 3)`` float32 RGB in [0, 1] (Core AI takes tensors; no
image type), output the model's (probabilities for a softmax head). No TensorFlow in the
process (a PyTorch convolution crashes beside it on this stack); coreai-torch imports none.
"""

from __future__ import annotations

import importlib.util
import json
import os
from collections.abc import Mapping, Sequence
from importlib.metadata import version
from typing import Any

import keras

from keras_mvit2.export.class_names import check_class_names
from keras_mvit2.export.coreai.inspect import COREAI_INSTALL, CoreAIReport, inspect_coreai
from keras_mvit2.export.coreml.description import fixed_size_model, model_metadata
from keras_mvit2.export.roads import check_road
from keras_mvit2.utils.files import atomic_output

__all__ = ["COREAI_INSTALL", "MINIMUM_OS", "import_coreai_torch", "to_coreai"]

#: The OS versions (iOS / macOS 27, Core AI's first) a saved asset can require.
MINIMUM_OS = ("27",)


def import_coreai_torch() -> Any:
    """The `coreai_torch` module, or an ImportError naming what to install."""
    if importlib.util.find_spec("coreai_torch") is None:
        raise ImportError(f"Core AI export needs coreai-torch, which is not installed: "
                          f"{COREAI_INSTALL}")
    import warnings

    with warnings.catch_warnings():  # "only validated with torch<=2.13.0; found 2.13.0+cpu"
        warnings.filterwarnings("ignore", message="coreai-torch has only been validated")
        import coreai_torch
    return coreai_torch


def to_coreai(
    model: keras.Model,
    path: str | os.PathLike,
    *,
    quantization: str = "float32",
    class_names: Sequence[str] | None = None,
    metadata: Mapping[str, Any] | None = None,
    image_size: int | tuple[int, int] | None = None,
    minimum_os: str = "27",
) -> CoreAIReport:
    """Converts a Keras model running on PyTorch to a Core AI model asset, saved atomically.

    Args:
        model: a built Keras model with one image input ``(batch, H, W, 3)``, on the
            PyTorch backend (``KERAS_BACKEND=torch``). A ``(None, None, 3)`` model is
            exported at `image_size`.
        path: the asset to write, ending in ``.aimodel`` (a folder).
        quantization: ``"float32"``, the only format written yet.
        class_names: one name per output class, written into the metadata
            (``keras_mvit2.class_names``, a JSON list).
        metadata: extra JSON-serializable entries of the asset's creator-defined metadata.
        image_size: the input size for a ``(None, None, 3)`` model.
        minimum_os: one of `MINIMUM_OS`.

    Returns:
        The `CoreAIReport` of the written asset (its program summary and metadata).

    Raises:
        ValueError: not the PyTorch backend, a path without ``.aimodel``, an unknown format
            or OS, class names that do not fit the model.
        ImportError: coreai-torch is not installed.
    """
    check_road("torch", "coreai")
    path = os.fspath(path)
    if not path.endswith(".aimodel"):
        raise ValueError(f"A Core AI model asset is saved as .aimodel. Received: path={path!r}")
    if quantization != "float32":
        raise ValueError(f"Core AI export writes float32 only. Received: "
                         f"quantization={quantization!r}")
    if minimum_os not in MINIMUM_OS:
        raise ValueError(f"minimum_os must be one of {MINIMUM_OS}. Received: {minimum_os!r}")
    model, shape = fixed_size_model(model, image_size, "Core AI")
    names = check_class_names(class_names, model)
    coreai_torch = import_coreai_torch()
    from pathlib import Path

    from coreai.authoring.asset import OSVersion
    from coreai.runtime import AIModelAssetMetadata

    from keras_mvit2._version import __version__
    from keras_mvit2.export.torch_export import torch_program

    program = torch_program(model, shape, add_softmax=False,
                            decompositions=coreai_torch.get_decomp_table())
    converted = coreai_torch.TorchConverter().add_exported_program(program).to_coreai()
    info = AIModelAssetMetadata()
    info.model_description = f"{model.name} exported by keras_mvit2 {__version__}"
    entries: dict[str, Any] = {
        **model_metadata(model, shape),
        "keras_mvit2.precision": quantization,
        "keras_mvit2.input": json.dumps({"name": "image", "shape": [1, *shape],
                                         "dtype": "float32", "range": [0.0, 1.0]}),
        "keras_mvit2.converter": json.dumps({
            "road": "torch", "tool": "coreai-torch", "version": version("coreai-torch"),
            "coreai-core": version("coreai-core"), "torch": version("torch")}),
        **(dict(metadata) if metadata is not None else {}),
    }
    if names is not None:
        entries["keras_mvit2.class_names"] = names
    for key, value in entries.items():
        info.set_custom(key, value)
    with atomic_output(path) as tmp:  # a new folder, ending in .aimodel as save_asset asks
        converted.save_asset(Path(tmp), metadata=info,
                             minimum_os=getattr(OSVersion, f"v{minimum_os}"))
    return inspect_coreai(path)
