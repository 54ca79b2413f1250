"""The PyTorch road to `.tflite`: Keras' own litert-torch export, with our metadata.

`to_tflite_via_torch` converts a model that Keras runs on PyTorch (``KERAS_BACKEND=torch``)
with Keras 3's ``model.export(format="litert")``, which traces it with ``torch.export`` and
lowers it with Google's litert-torch (0.10; no TensorFlow in the process), then gives the file
what every `.tflite` of ours carries, written by the same functions as the TensorFlow road
(`serialize_with_metadata`): the ``serving_default`` signature (input ``image``, output ``logits``
or ``probabilities``), our JSON metadata and the standard TFLite Model Metadata with the class
names packed as ``labels.txt`` (MediaPipe Tasks, `mvit2 web`). Quantized formats are made
from that float32 file by ai-edge-quantizer (`quantize_with_edge_quantizer`, the recipes of
`TORCH_ROAD_RECIPES`), since litert-torch's own quantizer is configured for Keras through
TensorFlow's ``tf.lite.Optimize`` constants.

Forms: the model is traced in `forms`, by default
`keras_mvit2.layers.export_forms.FLOAT_RUNTIME` (the token sum as a product and a mean). The
TensorFlow road's matrix-product form also converts here (its 0/1 diagonal mask is a numpy
constant: ``keras.ops.eye`` traced as an op that litert-torch lowered to ``STABLEHLO_IOTA``,
which LiteRT's interpreter does not have), but with ai-edge-quantizer's int8 it measured no
better and slower (``benchmarks/torch_road_int8.py``, a fine-tuned MobileViTV2-0.5 at 256x256:
agreement with Keras 65.9 % against 66.6 %, 2.81 against 2.59 ms at 1 thread).

litert-torch is called with ``enable_x64=True`` (see `_write_float32`).

Differences from the TensorFlow road, measured by ``benchmarks/export_roads.py``: no fused
1x1 convolution pairs (`fuse_pointwise`), a fixed batch of 1, float32 input and output only
(no uint8 / int8 I/O), and quantization by ai-edge-quantizer rather than the TFLite
converter (no per-tensor 99.99 % ranges, no `float_layers`).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping, Sequence
from importlib.metadata import version
from typing import Any

import keras
import numpy as np

from keras_mvit2.export.class_names import check_class_names
from keras_mvit2.export.roads import check_road, import_litert_torch
from keras_mvit2.export.tflite.flatbuffer import parse_flatbuffer
from keras_mvit2.export.tflite.inspect import TFLiteReport, inspect_tflite
from keras_mvit2.export.tflite.metadata import serialize_with_metadata, tflite_metadata
from keras_mvit2.export.tflite.quantization import (
    CALIBRATED,
    TFLiteQuantization,
    resolve_quantization,
)
from keras_mvit2.export.tflite.run import _check_runs
from keras_mvit2.export.tflite.tensors import io_tensors
from keras_mvit2.layers import export_forms
from keras_mvit2.layers.export_forms import ExportForms
from keras_mvit2.models.input_size import has_dynamic_size, with_input_size
from keras_mvit2.utils.files import atomic_output

__all__ = ["TORCH_ROAD_OPTIONS", "TORCH_ROAD_RECIPES", "to_tflite_via_torch"]

#: `quantization` -> the ai-edge-quantizer recipe (`EDGE_RECIPES`) applied to the float32 file.
TORCH_ROAD_RECIPES = {
    "float16": "weight_only_wf16_afp32",
    "dynamic_int8": "dynamic_wi8_afp32",
    "int8": "static_wi8_ai8",
    "int16x8": "static_wi8_ai16",
}
#: The options of `to_tflite` that the torch road takes (the others are refused by name).
TORCH_ROAD_OPTIONS = ("num_calibration_samples", "calibration_seed", "sidecar", "forms")


def to_tflite_via_torch(
    model: keras.Model,
    path: str | os.PathLike,
    *,
    quantization: str = "float32",
    class_names: Sequence[str] | None = None,
    calibration_data: np.ndarray | None = None,
    metadata: Mapping[str, Any] | None = None,
    image_size: int | tuple[int, int] | None = None,
    num_calibration_samples: int = 200,
    calibration_seed: int = 0,
    sidecar: bool = False,
    forms: ExportForms = export_forms.FLOAT_RUNTIME,
) -> TFLiteReport:
    """Converts a Keras model running on PyTorch to a `.tflite` through litert-torch.

    The file has batch 1, input ``(1, H, W, 3)`` float32 RGB in [0, 1] and output
    ``(1, classes)``, the same ``serving_default`` signature and metadata as `to_tflite`'s,
    plus ``converter`` in our JSON (``{"road": "torch", "tool": "litert-torch", "version"}``).
    It is run once in LiteRT before it is moved onto `path` (atomically).

    Args:
        model: a built Keras model with one image input ``(batch, H, W, 3)``, on the
            PyTorch backend. A ``(None, None, 3)`` model is exported at `image_size`.
        path: the `.tflite` file to write.
        quantization: one of `QUANTIZATIONS`; all but ``"float32"`` go through
            ai-edge-quantizer (`TORCH_ROAD_RECIPES`).
        class_names: one name per output class, written into both metadata.
        calibration_data: for ``"int8"`` / ``"int16x8"``: float32 images ``(N, H, W, 3)``
            in [0, 1] (or uint8 pixels), of the deployment distribution.
        metadata: extra JSON-serializable entries for the metadata's ``"user"`` field.
        image_size: the input size for a ``(None, None, 3)`` model (see `to_tflite`).
        num_calibration_samples: at most this many calibration images are used.
        calibration_seed: seed of the calibration subset.
        sidecar: also write what `read_tflite_metadata` returns to ``<path>.json``.
        forms: the forms of the shared math the model is traced in
            (`keras_mvit2.layers.export_forms.ExportForms`), recorded in the metadata.

    Returns:
        The `TFLiteReport` of the written file.

    Raises:
        ImportError: litert-torch is not installed (the message says how to install it).
        ValueError: not the PyTorch backend, an unknown quantization, calibration data
            missing or of the wrong shape, class names that do not fit the model.
        RuntimeError: litert-torch could not convert the model, or the file does not run.
    """
    check_road("torch", "tflite")
    quant = resolve_quantization(quantization)
    path = os.fspath(path)
    names = check_class_names(class_names, model)
    if has_dynamic_size(model):
        model = with_input_size(model, image_size)
    elif image_size is not None:
        model = with_input_size(model, image_size)  # the same size, or a clear error
    shape = tuple(model.inputs[0].shape)
    if len(shape) != 4 or None in shape[1:]:
        raise ValueError(f"to_tflite_via_torch exports image models (batch, H, W, C). "
                         f"Received: input shape {shape}")
    images = _calibration(calibration_data, quant, shape, num_calibration_samples,
                          calibration_seed)
    litert_torch = import_litert_torch()
    converter = {"road": "torch", "tool": "litert-torch", "version": version("litert-torch")}
    with tempfile.TemporaryDirectory() as folder:
        float_path = os.path.join(folder, "float32.tflite")
        _write_float32(model, float_path, names, metadata, converter, litert_torch, forms)
        if not quant.optimized:  # float32: the file as litert-torch wrote it
            with atomic_output(path) as tmp:
                os.replace(float_path, tmp)
        else:
            from keras_mvit2.export.tflite.edge_quantizer import quantize_with_edge_quantizer

            quantize_with_edge_quantizer(
                float_path, path, recipe=TORCH_ROAD_RECIPES[quant.name],
                calibration_images=images, quantization_name=quant.name)
    report = inspect_tflite(path)
    if sidecar:
        import json

        with atomic_output(path + ".json") as tmp_json, open(tmp_json, "w") as f:
            json.dump(report.metadata, f, indent=2)
    return report


def _write_float32(model: keras.Model, path: str, class_names: list[str] | None,
                   user: Mapping[str, Any] | None, converter: dict[str, str],
                   litert_torch: Any, forms: ExportForms) -> None:
    """The float32 file: Keras' litert-torch export, then signature and metadata; run once."""
    raw = path[:-len(".tflite")] + ".litert-torch.tflite"
    # Keras' export (keras/src/export/litert.py): eval mode, batch 1, torch.export, then
    # litert_torch.convert; its errors are a RuntimeError naming litert-torch's.
    # enable_x64: litert-torch's default casts int64 to int32 while lowering, and the cast
    # can miss index operands ("'func.call' op operand type mismatch", i64 vs i32); kept,
    # they fold into int32 constants (the files have float32 and int32 tensors only). This
    # fixes MobileViTV2-0.5 at 32x32 with 3 classes, not with 10 (litert-torch 0.10); 64x64
    # and 256x256 convert either way.
    with export_forms.tracing(forms):
        model.export(raw, format="litert", verbose=False, enable_x64=True)
    with open(raw, "rb") as f:
        converted = parse_flatbuffer(f.read())  # edited in place, serialized once
    inputs, outputs = io_tensors(converted)
    info = tflite_metadata(model, inputs=inputs, outputs=outputs,
                           quantization="float32", batch_size=1, class_names=class_names,
                           user=dict(user) if user is not None else None,
                           converter=converter, forms=forms)
    flatbuffer = serialize_with_metadata(converted, info, outputs)
    with open(path, "wb") as f:
        f.write(flatbuffer)
    os.remove(raw)
    _check_runs(path, dynamic_batch=False)


def _calibration(data: Any, quant: TFLiteQuantization, shape: tuple, limit: int,
                 seed: int) -> np.ndarray | None:
    """The calibration images as float32 `(N, H, W, 3)` in [0, 1], or None when unused."""
    if not quant.calibrated:
        if data is not None:
            raise ValueError(f"calibration_data is only used by quantization {CALIBRATED}. "
                             f"Received: quantization={quant.name!r}")
        return None
    if data is None:
        raise ValueError(f"quantization={quant.name!r} calibrates activation ranges: pass "
                         "calibration_data, images (N, H, W, 3) in [0, 1] or uint8 pixels.")
    if isinstance(data, str | os.PathLike):
        data = _read_images(os.fspath(data), tuple(shape[1:3]), limit, seed)
    from keras_mvit2.export.calibration import calibration_images  # TensorFlow-free for arrays

    return calibration_images(np.asarray(data), image_size=tuple(shape[1:3]),
                              channels=int(shape[3]), num_samples=limit, seed=seed)


def _read_images(spec: str, size: tuple, limit: int, seed: int) -> np.ndarray:
    """Up to `limit` images of a folder of class sub-folders or ``"fashion_mnist"`` (its
    training split; ``"fashion_mnist:test"``), a seeded class-mixed subset, read without
    TensorFlow (numpy + PIL, `keras_mvit2.data.py_sources`) with the evaluation transform
    at `size` (center crop 0.875 for folders, none for Fashion-MNIST, as the TensorFlow
    road's `calibration_images`): float32 ``(n, H, W, 3)`` in [0, 1]."""
    from keras_mvit2.data.py_augment import eval_transform
    from keras_mvit2.data.py_sources import py_fashion_mnist, py_image_folder
    from keras_mvit2.export.calibration import DEFAULT_FOLDER_CROP_RATIO, _parse_fashion_mnist

    split = _parse_fashion_mnist(spec, "train")
    if split is not None:
        source, crop_ratio = py_fashion_mnist(split), 1.0
    elif os.path.isdir(spec):
        source, crop_ratio = py_image_folder(spec), DEFAULT_FOLDER_CROP_RATIO
    else:
        raise FileNotFoundError(f"Calibration images not found: {spec!r}. Pass a folder with "
                                "one sub-folder of images per class, or 'fashion_mnist'.")
    chosen = np.random.default_rng(seed).permutation(source.num_examples)[:limit]
    return np.stack([eval_transform(source.read(int(i)), size, crop_ratio) for i in chosen])
