"""Keras 3 model -> TFLite (LiteRT) flatbuffer, builtin ops only, checked at run time.

The conversion path is one that was measured to be correct with Keras 3.15 /
TF 2.21 (see the project's stack notes):

1. the model's inference call is traced as a ``tf.function`` with a fixed (or
   explicitly dynamic) batch;
2. ``tf.lite.TFLiteConverter.from_concrete_functions([fn])`` (no trackable object:
   the converter then freezes the variables itself) with builtin op sets only
   (``TFLITE_BUILTINS``, ``TFLITE_BUILTINS_INT8`` or the int16x8 set), so an op
   without a builtin kernel is an error (`UnsupportedOpError`) instead of a
   silent Flex (SELECT_TF_OPS) dependency; float16, dynamic-range int8, full
   int8 and int16x8 quantization are converter settings (`QUANTIZATIONS`);
3. a JSON metadata entry (preprocessing, class names, quantization) is added to
   the flatbuffer's ``metadata`` list;
4. the flatbuffer is run once in ``ai_edge_litert`` before it is moved onto the
   target path (the converter does not catch run-time failures such as
   ``BROADCAST_TO ... failed to prepare``).

Not used on purpose: ``from_concrete_functions([fn], keras_model)`` (leaves the
variables unfrozen and gives NaN), ``model.export(format="litert")`` (enables
Flex ops by default), and ``model.export(format="tf_saved_model")`` +
``from_saved_model`` (correct too, but 3-5x slower: the export traces and saves the
model, and the converter loads and traces it again).
"""

from __future__ import annotations

import collections
import dataclasses
import json
import logging
import os
import re
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import keras
import numpy as np
from ai_edge_litert import schema_py_generated as tfl_schema
from ai_edge_litert.interpreter import Interpreter

from keras_mvit2.export.detection_postprocess import (
    append_detection_postprocess,
    check_object_names,
)
from keras_mvit2.export.flatbuffer import (
    BUILTIN_NAMES,
    TENSOR_TYPE_NAMES,
    decode_name,
    op_names,
    parse_flatbuffer,
    serialize_flatbuffer,
    tensor_indices,
)
from keras_mvit2.export.pointwise_fusion import PointwiseFusion, fuse_pointwise_convolutions
from keras_mvit2.export.tflite_standard_metadata import (
    add_standard_metadata,
    standard_metadata_of,
)
from keras_mvit2.models.input_size import has_dynamic_size, with_input_size
from keras_mvit2.utils.files import atomic_output

__all__ = [
    "IO_DTYPES",
    "METADATA_NAME",
    "QUANTIZATIONS",
    "TFLiteReport",
    "TensorDetails",
    "UnsupportedOpError",
    "inspect_tflite",
    "read_tflite_metadata",
    "run_tflite",
    "tflite_metadata",
    "to_tflite",
]

#: Ops that mean the model still holds un-frozen variables (broken conversion).
_VARIABLE_OPS = ("VAR_HANDLE", "READ_VARIABLE", "ASSIGN_VARIABLE")

_OPS_COMPATIBILITY_URL = "https://ai.google.dev/edge/litert/models/ops_compatibility"

_FLOAT_TENSOR_TYPES = frozenset(
    getattr(tfl_schema.TensorType, name)
    for name in ("FLOAT32", "FLOAT16", "FLOAT64", "BFLOAT16")
    if hasattr(tfl_schema.TensorType, name)
)


class UnsupportedOpError(RuntimeError):
    """The model needs TensorFlow ops that have no TFLite builtin kernel.

    keras_mvit2 converts with ``TFLITE_BUILTINS`` only; such ops would need the
    Flex delegate (SELECT_TF_OPS) or a custom kernel, which mobile runtimes
    usually do not ship.

    Attributes:
        ops: the TensorFlow op names (e.g. ``["Cumprod"]``), sorted.
        layers: the Keras layers that contain them, as ``"outer/inner"`` paths of
            layer names (empty where the converter gave no usable location).
    """

    def __init__(self, message: str, ops: list[str], layers: list[str]):
        super().__init__(message)
        self.ops = ops
        self.layers = layers


@dataclasses.dataclass(frozen=True)
class TensorDetails:
    """One input or output of a TFLite model.

    Attributes:
        name: tensor name in the flatbuffer.
        shape: shape the interpreter allocates by default (a dynamic batch shows as 1).
        shape_signature: shape with ``-1`` for dynamic dimensions.
        dtype: numpy dtype name, e.g. ``"float32"`` or ``"int8"``.
        quantization: ``(scale, zero_point)``; ``(0.0, 0)`` for float tensors.
    """

    name: str
    shape: tuple[int, ...]
    shape_signature: tuple[int, ...]
    dtype: str
    quantization: tuple[float, int]

    @classmethod
    def from_interpreter(cls, details: dict[str, Any]) -> TensorDetails:
        signature = details.get("shape_signature", details["shape"])
        scale, zero_point = details["quantization"]
        return cls(
            name=details["name"],
            shape=tuple(int(d) for d in details["shape"]),
            shape_signature=tuple(int(d) for d in signature),
            dtype=np.dtype(details["dtype"]).name,
            quantization=(float(scale), int(zero_point)),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "shape": list(self.shape),
            "shape_signature": list(self.shape_signature),
            "dtype": self.dtype,
            "quantization": {"scale": self.quantization[0], "zero_point": self.quantization[1]},
        }


@dataclasses.dataclass
class TFLiteReport:
    """What a `.tflite` file contains and how XNNPACK partitions it.

    Attributes:
        path: the file.
        size_bytes: file size.
        op_histogram: op name -> number of ops, over all subgraphs, sorted by op
            name. Builtins by name (``"CONV_2D"``), custom ops by their custom code
            (Flex ops are ``"Flex<TfOp>"``).
        max_tensor_rank: largest rank of any tensor in the file.
        flex_ops: the Flex (SELECT_TF_OPS) ops, sorted; ``[]`` for a builtin-only model.
        custom_ops: the other custom ops (not Flex), sorted.
        inputs: the model inputs.
        outputs: the model outputs.
        dynamic_batch: True when the batch dimension of the first input is ``-1``.
        num_xnnpack_partitions: DELEGATE nodes after the interpreter applied its
            default delegates (XNNPACK on CPU). ``None`` if the file cannot be
            loaded by ``ai_edge_litert`` (e.g. it needs Flex ops).
        num_ops_outside_xnnpack: ops that still run on the plain TFLite kernels.
        ops_outside_xnnpack: histogram of those ops, sorted by op name.
        float_ops: histogram of the ops that compute in floating point (an input or
            output tensor of type float32/float16/float64/bfloat16), except a QUANTIZE
            of a float model input and a DEQUANTIZE to a float model output. For a
            float model that is nearly every op; for a full-integer model it lists the
            ops left in float (``{}`` when fully quantized).
        metadata: the ``"keras_mvit2"`` JSON metadata entry (see `to_tflite`), or
            ``None`` for a file without it.
    """

    path: str
    size_bytes: int
    op_histogram: dict[str, int]
    max_tensor_rank: int
    flex_ops: list[str]
    custom_ops: list[str]
    inputs: list[TensorDetails]
    outputs: list[TensorDetails]
    dynamic_batch: bool
    num_xnnpack_partitions: int | None
    num_ops_outside_xnnpack: int | None
    ops_outside_xnnpack: dict[str, int] | None
    float_ops: dict[str, int] = dataclasses.field(default_factory=dict)
    metadata: dict[str, Any] | None = None

    @property
    def num_ops(self) -> int:
        """Total number of ops in the file."""
        return sum(self.op_histogram.values())

    @property
    def num_ops_in_xnnpack(self) -> int | None:
        """Ops that XNNPACK took (``num_ops - num_ops_outside_xnnpack``)."""
        if self.num_ops_outside_xnnpack is None:
            return None
        return self.num_ops - self.num_ops_outside_xnnpack

    @property
    def quantization(self) -> str | None:
        """The quantization recorded in the metadata (``None`` without metadata)."""
        return (self.metadata or {}).get("quantization")

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serializable dict of the report."""
        out = dataclasses.asdict(self)
        out["inputs"] = [t.to_dict() for t in self.inputs]
        out["outputs"] = [t.to_dict() for t in self.outputs]
        out["num_ops"] = self.num_ops
        out["num_ops_in_xnnpack"] = self.num_ops_in_xnnpack
        return out


# --------------------------------------------------------------------------------------
# Conversion

#: Conversion modes of `to_tflite`.
QUANTIZATIONS = ("float32", "float16", "dynamic_int8", "int8", "int16x8")
#: Allowed `io_dtype` per quantization (the first is the default).
IO_DTYPES = {
    "float32": ("float32",),
    "float16": ("float32",),
    "dynamic_int8": ("float32",),
    "int8": ("float32", "int8", "uint8"),
    "int16x8": ("float32", "int16"),
}
#: Quantizations calibrated on a representative dataset.
CALIBRATED = ("int8", "int16x8")

#: Name of the JSON entry that `to_tflite` writes into the flatbuffer's `metadata`.
METADATA_NAME = "keras_mvit2"
METADATA_FORMAT = "keras_mvit2.tflite_metadata"
METADATA_VERSION = 1


def to_tflite(
    model: keras.Model,
    path: str | os.PathLike,
    *,
    quantization: str = "float32",
    representative_data: Any = None,
    num_calibration_samples: int = 200,
    io_dtype: str = "float32",
    batch_size: int | str | None = 1,
    class_names: Sequence[str] | None = None,
    metadata: Mapping[str, Any] | None = None,
    sidecar: bool = False,
    allow_float_ops: bool = False,
    calibration_seed: int = 0,
    fuse_pointwise: bool = True,
    image_size: int | tuple[int, int] | None = None,
) -> TFLiteReport:
    """Converts a Keras 3 model to a TFLite file with builtin ops only, optionally quantized.

    The model is traced with a fixed (or dynamic) batch, converted with
    ``TFLiteConverter.from_concrete_functions([fn])`` with builtin op sets only (no
    Flex), tagged with JSON metadata, run once in ``ai_edge_litert`` and only then
    moved onto `path` (atomically: on any error an existing file at `path` is left as
    it was and nothing new is written).

    Quantization modes:

    * ``"float32"``: no quantization.
    * ``"float16"``: float16 weights (half the size), dequantized to float32 at load
      time on CPU; GPU delegates can run them in float16.
    * ``"dynamic_int8"``: int8 weights, float activations (dynamic-range
      quantization); no data needed. Note: XNNPACK does not take the hybrid convs.
    * ``"int8"``: full integer (``TFLITE_BUILTINS_INT8``): int8 weights and
      activations, calibrated on `representative_data`. With ``io_dtype="float32"``
      the model quantizes its input and dequantizes its output itself; with
      ``"int8"``/``"uint8"`` the app feeds quantized pixels (the scale and zero point
      are in the metadata and the tensor details).
    * ``"int16x8"``: int16 activations and int8 weights (more accurate than int8:
      MobileViTV2-0.5 top-1 agreement with Keras 0.99 vs 0.975, but run by the
      reference kernels, not XNNPACK; SPACE_TO_DEPTH, DEPTH_TO_SPACE and DIV have no
      int16 kernel and stay float), calibrated like int8.

    Graph optimization: with ``fuse_pointwise=True`` (the default) each pair of
    back-to-back 1x1 convolutions with nothing non-linear between them is fused into
    one (`keras_mvit2.export.pointwise_fusion`): the same function with fewer
    multiply-accumulates (MobileViTV2-0.5: three pairs, 56 M MACs, about 7 % of the
    float32 latency). For int8/int16x8 the float graph is fused before calibration.

    Metadata: a JSON document (see `tflite_metadata`) is stored in the flatbuffer's
    ``metadata`` list under the name ``"keras_mvit2"``: preprocessing (RGB, scale
    1/255, input size, NHWC), class names, quantization and the I/O quantization
    parameters. An RGB image model also gets the standard TFLite Model Metadata
    (``TFLITE_METADATA``: image input, normalization mean 0 / std 255, output ranges and
    the class names as a packed ``labels.txt``) that MediaPipe Tasks, the TFLite Task
    Library and Android Studio's ML binding read, so those clients load the file as it
    is (see `keras_mvit2.export.tflite_standard_metadata`). Read both back with
    `read_tflite_metadata`. With ``sidecar=True`` what `read_tflite_metadata` returns
    (both) is also written (atomically, after the model) to ``<path>.json``, for apps
    that would rather not parse the flatbuffer.

    Args:
        model: a built Keras model with one input ``(batch, height, width,
            channels)`` (any rank works as long as all non-batch dimensions are
            static). A model built with ``input_shape=(None, None, 3)`` is exported
            at `image_size` (see `keras_mvit2.with_input_size`): the same graph as
            a model built for that size, with the same weights.
        path: the `.tflite` file to write.
        quantization: one of `QUANTIZATIONS`.
        representative_data: calibration images for ``"int8"``/``"int16x8"`` (see
            `keras_mvit2.export.calibration_images`): a `tf.data.Dataset` of images
            or ``(images, labels)`` (e.g. the training or evaluation pipeline), a
            numpy array ``(N, H, W, 3)`` (float in [0, 1] or uint8), a folder of
            class sub-folders of images, or ``"fashion_mnist"``. Use real images
            of the deployment distribution: random inputs calibrate badly.
        num_calibration_samples: images used for calibration (default 200).
        io_dtype: input/output type, see `IO_DTYPES`: ``"float32"`` for every
            mode; ``"int8"``/``"uint8"`` for int8; ``"int16"`` for int16x8.
        batch_size: the fixed batch of the exported graph (default 1, the mobile
            case, with the fewest ops). ``None`` (or ``"dynamic"``) exports a dynamic
            batch; the file is then run with batches 2 and 1 and an error is raised
            if it does not run (some graphs, e.g. tf_keras GroupNormalization, fail
            with a dynamic batch).
        class_names: one name per output class (a classifier's or a segmenter's last axis;
            written into both metadata, the standard one as a packed `labels.txt`).
        metadata: extra JSON-serializable entries for the metadata's ``"user"`` field.
        sidecar: also write the metadata to ``<path>.json``.
        allow_float_ops: for ``"int8"``, accept a model in which some ops were left
            in float (default: such a model is an error listing those ops).
        calibration_seed: seed of the calibration subset.
        fuse_pointwise: fuse back-to-back 1x1 convolutions (see above). ``False``
            keeps the converter's graph op for op.
        image_size: the input size to export at, an int or ``(height, width)``: for a
            dynamic-size model, defaults to its checkpoint's size (384 for the
            ``_384`` weights) or 256; for a fixed-size model it must be that size.

    Returns:
        The `TFLiteReport` of the written file (with `float_ops` and `metadata`).

    Raises:
        UnsupportedOpError: an op has no TFLite builtin (or no quantized kernel in
            the requested op set); the message names the TensorFlow op(s), the Keras
            layer(s) that contain them and the fix.
        RuntimeError: the converted model fails to run in ``ai_edge_litert``, gives
            non-finite outputs, still holds variables, or (int8) has float ops left.
        ValueError: invalid `model` input shape, `batch_size`, `quantization`,
            `io_dtype`, `class_names`, or missing/invalid `representative_data`.
    """
    path = os.fspath(path)
    if batch_size == "dynamic":
        batch_size = None
    _check_quantization_options(quantization, io_dtype, representative_data)
    if getattr(model, "inputs", None) and (image_size is not None or has_dynamic_size(model)):
        model = with_input_size(model, image_size)
    input_shape = _export_input_shape(model, batch_size)
    class_names = _check_class_names(class_names, model)
    if isinstance(num_calibration_samples, bool) or not isinstance(
        num_calibration_samples, int
    ) or num_calibration_samples < 1:
        raise ValueError(
            "num_calibration_samples must be a positive int. "
            f"Received: num_calibration_samples={num_calibration_samples!r}"
        )
    if metadata is not None:
        try:
            json.dumps(dict(metadata))
        except (TypeError, ValueError) as err:
            raise ValueError(f"metadata must be JSON-serializable: {err}") from err

    calibration = None
    calibration_info = None
    if quantization in CALIBRATED:
        from keras_mvit2.export.calibration import calibration_images, describe_source

        if len(input_shape) != 4:
            raise ValueError(
                f"quantization={quantization!r} calibrates on images and needs an image "
                f"input (batch, height, width, channels). Received: input shape {input_shape}"
            )
        calibration = calibration_images(
            representative_data,
            image_size=tuple(input_shape[1:3]),
            channels=input_shape[3],
            num_samples=num_calibration_samples,
            seed=calibration_seed,
        )
        calibration_info = {
            "source": describe_source(representative_data),
            "num_samples": len(calibration),
        }

    flatbuffer, fusions = _convert_model(
        model, input_shape, quantization, io_dtype, calibration, fuse_pointwise
    )
    postprocess = getattr(model, "detection_postprocess", None)  # with_detection_postprocess
    if postprocess is not None:
        flatbuffer = append_detection_postprocess(flatbuffer, model.anchors_yxhw, postprocess)
    summary = summarize_flatbuffer(bytes(flatbuffer))
    info = tflite_metadata(
        model,
        inputs=summary.inputs,
        outputs=summary.outputs,
        quantization=quantization,
        batch_size=batch_size,
        class_names=class_names,
        calibration=calibration_info,
        user=dict(metadata) if metadata is not None else None,
        fused_pointwise=fusions if fuse_pointwise else None,
    )
    flatbuffer = embed_all_metadata(flatbuffer, info, summary.outputs)

    with atomic_output(path) as tmp_path:
        with open(tmp_path, "wb") as f:
            f.write(flatbuffer)
        _check_runs(tmp_path, dynamic_batch=batch_size is None)
        if calibration is not None:
            _sanity_check(model, tmp_path, calibration, quantization)
        if quantization == "int8" and not allow_float_ops:
            left = _read_flatbuffer(tmp_path).float_ops
            if left:
                raise RuntimeError(
                    "The full-integer (int8) model still computes these ops in float: "
                    f"{_format_histogram(left)} (besides the input QUANTIZE / output "
                    "DEQUANTIZE). They run as float islands between DEQUANTIZE/QUANTIZE "
                    "pairs, which integer-only accelerators cannot run. Fix: rewrite the "
                    "layer with int8-quantizable ops (e.g. x * x instead of SQUARE, no NEG), "
                    "or pass allow_float_ops=True to accept a mixed model."
                )
    report = inspect_tflite(path)
    if sidecar:  # what read_tflite_metadata returns: our JSON and the standard metadata
        with atomic_output(path + ".json") as tmp_json, open(tmp_json, "w") as f:
            json.dump(report.metadata, f, indent=2)
    return report


def _sanity_check(
    model: keras.Model, path: str, calibration: np.ndarray, quantization: str
) -> None:
    """Warns when a calibrated model grossly disagrees with Keras on calibration images.

    A safety net for converter/kernel bugs (e.g. LiteRT 2.3's int16 SUM kernel, which
    our layers avoid by summing as N * mean); the
    real measure of what quantization lost is `keras_mvit2.export.validate` on held-out
    images.
    """
    x = calibration[:8]
    try:
        got = run_tflite(path, x)
    except ValueError:  # e.g. a fixed batch that 8 is not a multiple of
        return
    ref = np.asarray(model(x, training=False), dtype=np.float32)
    if ref.shape != got.shape or ref.ndim != 2:
        return
    scale = float(np.abs(ref).max())
    spread = float(np.ptp(ref, axis=0).max())
    if scale == 0.0 or spread < 1e-3 * scale:
        return  # near-constant outputs (untrained model): nothing to compare
    rel = float(np.abs(got - ref).max()) / scale
    agreement = float(np.mean(got.argmax(-1) == ref.argmax(-1)))
    if rel > 0.5 or agreement < 0.5:
        hint = (
            " A known cause: LiteRT 2.3's int16 SUM kernel gives wrong results (a custom "
            "layer that sums with reduce_sum); sum as N * mean, or use quantization='int8'."
            if quantization == "int16x8" else ""
        )
        warnings.warn(
            f"The {quantization} model disagrees with Keras on {len(x)} calibration images: "
            f"max |diff| is {rel:.0%} of the largest output, top-1 agreement {agreement:.0%}."
            f"{hint} Check it with keras_mvit2.export.validate before shipping it.",
            stacklevel=3,
        )


def _check_quantization_options(quantization: Any, io_dtype: Any, representative_data: Any):
    if quantization not in QUANTIZATIONS:
        raise ValueError(
            f"quantization must be one of {QUANTIZATIONS}. Received: quantization={quantization!r}"
        )
    allowed = IO_DTYPES[quantization]
    if io_dtype not in allowed:
        hint = (
            " Quantized inputs/outputs need a fully quantized model: use quantization='int8' "
            "(int8/uint8 I/O) or 'int16x8' (int16 I/O)."
            if quantization not in CALIBRATED else ""
        )
        raise ValueError(
            f"io_dtype for quantization={quantization!r} must be one of {allowed}. "
            f"Received: io_dtype={io_dtype!r}.{hint}"
        )
    if quantization in CALIBRATED and representative_data is None:
        raise ValueError(
            f"quantization={quantization!r} needs representative_data to calibrate the "
            "activation ranges: a tf.data.Dataset of images (e.g. your training or evaluation "
            "pipeline), a numpy array (N, H, W, 3) in [0, 1], a folder of images, or "
            "'fashion_mnist'. A few hundred real images of the deployment distribution are "
            "enough. Without data, use quantization='dynamic_int8' (int8 weights only)."
        )
    if quantization not in CALIBRATED and representative_data is not None:
        raise ValueError(
            f"representative_data is only used by the calibrated quantizations {CALIBRATED}; "
            f"quantization={quantization!r} does not calibrate. Drop representative_data or "
            "use quantization='int8'."
        )


def _check_class_names(class_names: Any, model: keras.Model) -> list[str] | None:
    if class_names is None:
        return None
    if isinstance(class_names, (str, bytes)) or not isinstance(class_names, Sequence):
        raise ValueError(
            "class_names must be a list of strings, one per output class. "
            f"Received: {type(class_names).__name__}"
        )
    names = [str(c) for c in class_names]
    postprocess = getattr(model, "detection_postprocess", None)  # with_detection_postprocess
    if postprocess is not None:
        return check_object_names(names, postprocess.num_classes)
    output_shape = tuple(model.outputs[0].shape) if getattr(model, "outputs", None) else ()
    if len(model.outputs or []) != 1 or len(output_shape) not in (2, 4):
        raise ValueError(
            "class_names needs a classifier with one output of shape (batch, classes) or a "
            "segmenter with one output (batch, height, width, classes). "
            f"Received: output shapes {[tuple(o.shape) for o in model.outputs or []]}"
        )
    if output_shape[-1] != len(names):
        raise ValueError(
            f"class_names has {len(names)} entries but the model outputs {output_shape[-1]} "
            "classes. Pass one name per class, in output order."
        )
    return names


def _export_input_shape(model: keras.Model, batch_size: int | None) -> tuple[int | None, ...]:
    if batch_size is not None and (
        isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1
    ):
        raise ValueError(
            "batch_size must be a positive int, None or 'dynamic'. "
            f"Received: batch_size={batch_size!r}"
        )
    inputs = getattr(model, "inputs", None)
    if not inputs:
        raise ValueError(
            "to_tflite needs a model with a defined input (Functional, or Sequential starting "
            f"with keras.Input). Received: model={model.name!r} without inputs"
        )
    if len(inputs) != 1:
        raise ValueError(
            f"to_tflite supports models with one input. Received: {len(inputs)} inputs"
        )
    shape = tuple(inputs[0].shape)
    if any(d is None for d in shape[1:]):
        raise ValueError(
            "to_tflite needs a static input shape apart from the batch (build the model with a "
            f"fixed input_shape, e.g. (256, 256, 3)). Received: input shape={shape}"
        )
    return (batch_size, *shape[1:])


def _concrete_function(model: keras.Model, input_shape: tuple[int | None, ...]):
    """The model's inference call traced for `input_shape` (training=False)."""
    import tensorflow as tf

    dtype = model.inputs[0].dtype
    spec = tf.TensorSpec(input_shape, dtype, name="input")
    serve = tf.function(lambda x: model(x, training=False), input_signature=[spec])
    return serve.get_concrete_function()


def _make_converter(
    concrete_function,
    quantization: str = "float32",
    io_dtype: str = "float32",
    calibration: np.ndarray | None = None,
    batch: int = 1,
):
    """The converter: builtin op sets only (never SELECT_TF_OPS), plus the quantization."""
    import tensorflow as tf

    # Without a trackable object the converter freezes the variables itself. (Passing
    # the Keras 3 model as trackable_obj leaves them un-frozen and gives NaN.) TF logs a
    # deprecation warning for that through absl; it does not apply here, so it is muted.
    absl_logger = logging.getLogger("absl")
    level = absl_logger.level
    absl_logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            converter = tf.lite.TFLiteConverter.from_concrete_functions([concrete_function])
    finally:
        absl_logger.setLevel(level)
    ops_set = tf.lite.OpsSet
    converter.target_spec.supported_ops = [ops_set.TFLITE_BUILTINS]
    if quantization == "float16":
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        converter.target_spec.supported_types = [tf.float16]
    elif quantization == "dynamic_int8":
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
    elif quantization in CALIBRATED:
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        converter.representative_dataset = _representative_dataset(calibration, batch)
        if quantization == "int8":
            converter.target_spec.supported_ops = [ops_set.TFLITE_BUILTINS_INT8]
        else:
            # Ops without an int16x8 kernel (SPACE_TO_DEPTH, DEPTH_TO_SPACE and DIV in
            # TF 2.21) stay float between DEQUANTIZE/QUANTIZE: still builtins.
            converter.target_spec.supported_ops = [
                ops_set.EXPERIMENTAL_TFLITE_BUILTINS_ACTIVATIONS_INT16_WEIGHTS_INT8,
                ops_set.TFLITE_BUILTINS,
            ]
        io_type = getattr(tf, io_dtype)
        converter.inference_input_type = io_type
        converter.inference_output_type = io_type
    return converter


def _fuse_before_calibration(converter, fusions: list[PointwiseFusion]) -> None:
    """Makes `converter` fuse 1x1 convolutions in its float graph before calibrating it.

    TF 2.21's converter calibrates and quantizes the converted float flatbuffer in
    ``TFLiteConverter._quantize(float_model, ...)``; fusing there means the calibration
    sees (and the quantizer quantizes) the fused graph. The fused pairs are appended
    to `fusions`. A TensorFlow without that hook gets an unfused quantized model.
    """
    quantize = getattr(converter, "_quantize", None)
    if quantize is None:
        return

    def fuse_then_quantize(float_model, *args, **kwargs):
        fused, found = fuse_pointwise_convolutions(bytes(float_model))
        fusions.extend(found)
        return quantize(fused, *args, **kwargs)

    converter._quantize = fuse_then_quantize


def _check_int16x8_hazards(concrete_function, model: keras.Model) -> None:
    """Refuses graphs that make TF 2.21's int16x8 quantizer abort the whole process.

    The int16x8 quantizer hits a fatal check (SIGABRT, no Python exception) on a SUB
    whose constant operand is all zeros, e.g. ``beta - mean * scale`` in a GroupNorm1
    whose beta is still at its zero initialization. The float graph is converted first
    and searched for such ops, so the user gets an error instead of a dead interpreter.
    """
    converter = _make_converter(concrete_function)
    summary_model = parse_flatbuffer(converter.convert())
    names = op_names(summary_model)
    hazards: list[str] = []
    for subgraph in summary_model.subgraphs or []:
        tensors = subgraph.tensors or []
        for op in subgraph.operators or []:
            if names[op.opcodeIndex] != "SUB":
                continue
            for i in tensor_indices(op.inputs):
                buffer = summary_model.buffers[tensors[i].buffer] if i >= 0 else None
                data = None if buffer is None else buffer.data
                if data is not None and len(data) and not np.any(np.asarray(data)):
                    out = tensors[tensor_indices(op.outputs)[0]]
                    hazards.append(decode_name(out.name))
                    break
    if hazards:
        known = _layer_names(model)
        layers = sorted({_layer_path(h.split(";")[0], known, model.name) for h in hazards} - {""})
        where = ", ".join(layers) if layers else ", ".join(hazards[:5])
        raise UnsupportedOpError(
            "quantization='int16x8' would crash: TF 2.21's int16x8 quantizer aborts the process "
            "on a SUB with an all-zero constant operand, found in "
            f"{len(hazards)} op(s) ({where}); typically a normalization shift (beta) still at "
            "its zero initialization. Fix: export a trained model, or use quantization='int8'.",
            ["SUB"],
            layers,
        )


def _representative_dataset(images: np.ndarray, batch: int) -> Callable[[], Iterator]:
    """The converter's generator: batches of `batch` images (the model's fixed batch).

    One pixel of the first image is set to 0 and one to 1, so the calibrated input range is
    exactly [0, 1]: an int8/uint8 input then gets scale 1/255 (zero point -128 / 0), i.e. an
    app can feed raw uint8 pixels (minus 128 for int8) without rescaling. Two pixels move
    the other activation ranges by a negligible amount.
    """
    images = np.array(images, dtype=np.float32, copy=True)
    if images.ndim == 4 and len(images):
        images[0, 0, 0, :] = 0.0
        images[0, -1, -1, :] = 1.0
    if len(images) < batch:
        raise ValueError(
            f"Calibration needs at least one full batch of {batch} images for a model with a "
            f"fixed batch of {batch}. Received: {len(images)} images"
        )

    def generate() -> Iterator[list[np.ndarray]]:
        for start in range(0, len(images) - batch + 1, batch):
            yield [np.ascontiguousarray(images[start : start + batch], dtype=np.float32)]

    return generate


def _convert_model(
    model: keras.Model,
    input_shape: tuple[int | None, ...],
    quantization: str,
    io_dtype: str,
    calibration: np.ndarray | None,
    fuse_pointwise: bool = True,
) -> tuple[bytes, list[PointwiseFusion]]:
    """The converted flatbuffer and the 1x1 convolution pairs fused in it."""
    from tensorflow.lite.python.convert_phase import ConverterError

    concrete_function = _concrete_function(model, input_shape)
    if quantization == "int16x8":
        _check_int16x8_hazards(concrete_function, model)
    converter = _make_converter(
        concrete_function, quantization, io_dtype, calibration, batch=input_shape[0] or 1
    )
    fusions: list[PointwiseFusion] = []
    if fuse_pointwise and quantization in CALIBRATED:
        _fuse_before_calibration(converter, fusions)
    try:
        with warnings.catch_warnings():
            # "Statistics for quantized inputs were expected, but not specified" (harmless).
            warnings.filterwarnings("ignore", message="Statistics for quantized inputs")
            flatbuffer = converter.convert()
        if fuse_pointwise and quantization not in CALIBRATED:
            # float32 and float16 weights are fused here; quantized weights are skipped.
            flatbuffer, fusions = fuse_pointwise_convolutions(flatbuffer)
        return flatbuffer, fusions
    except ConverterError as err:
        unsupported = _unsupported_ops_from_error(err)
        if not unsupported:
            raise
        graph_def = concrete_function.graph.as_graph_def()
        for op, scopes in _op_scopes_in_graph(graph_def, set(unsupported)).items():
            unsupported[op] |= scopes
        raise _unsupported_op_error(unsupported, model, quantization) from err
    except RuntimeError as err:
        # The calibration/quantization step reports ops without a quantized kernel as
        # "Quantization to ... not yet supported for op: 'DIV'." (TFLite op names).
        ops = sorted(set(_RE_NOT_QUANTIZABLE.findall(str(err))))
        if not ops:
            raise
        raise UnsupportedOpError(
            f"Model {model.name!r} cannot be converted with quantization={quantization!r}: "
            f"TFLite has no quantized kernel for {', '.join(ops)} in this op set. Fix: use "
            "another quantization (e.g. 'int8' or 'dynamic_int8'), or rewrite the layer with "
            f"quantizable ops (see {_OPS_COMPATIBILITY_URL}).",
            ops,
            [],
        ) from err


# Error-text patterns of the TF 2.21 MLIR converter.
_RE_SELECT_OPS = re.compile(r"TF Select ops: ([^\n]+)")
_RE_NOT_BUILTIN = re.compile(r"'tf\.(\w+)' op is neither a custom op nor a flex op")
_RE_CUSTOM_SECTION = re.compile(
    r"Ops that need custom implementation[^\n]*:\s*\n((?:\s*tf\.\w+[^\n]*\n?)+)"
)
_RE_NOT_QUANTIZABLE = re.compile(r"not yet supported for op: '(\w+)'")
_RE_LOC = re.compile(r'fused\["(\w+):", "([^"@]+)@')


def _unsupported_ops_from_error(err: Exception) -> dict[str, set[str]]:
    """TF op name -> set of name-scope paths where the converter found it.

    Reads the structured `errors` of a `ConverterError` (operator name and call-site
    location) and falls back on the error text.
    """
    found: dict[str, set[str]] = {}
    for data in getattr(err, "errors", None) or []:
        code = _enum_name(data, "error_code")
        if code not in ("ERROR_NEEDS_FLEX_OPS", "ERROR_NEEDS_CUSTOM_OPS"):
            continue
        op = data.operator.name.removeprefix("tf.")
        if not op:
            continue
        found.setdefault(op, set())
        calls = list(data.location.call)
        if calls:
            scope = calls[0].name.split("@", 1)[0]
            found[op].add(scope)
        elif data.location.name:
            found[op].add(data.location.name.split("@", 1)[0])

    text = str(err)
    for match in _RE_SELECT_OPS.finditer(text):
        for op in match.group(1).split(","):
            if op.strip():
                found.setdefault(op.strip().removeprefix("tf."), set())
    for match in _RE_CUSTOM_SECTION.finditer(text):
        for op in re.findall(r"tf\.(\w+)", match.group(1)):
            found.setdefault(op, set())
    for line in text.splitlines():
        op_match = _RE_NOT_BUILTIN.search(line)
        if not op_match:
            continue
        op = op_match.group(1)
        found.setdefault(op, set())
        for loc_op, scope in _RE_LOC.findall(line):
            if loc_op == op:
                found[op].add(scope)
    return dict(found)


def _op_scopes_in_graph(graph_def, ops: set[str]) -> dict[str, set[str]]:
    """TF op name -> name scopes of the traced graph's nodes that run it.

    The converter's locations miss ops inside a function the layer calls (a
    ``tf.function`` in its ``call``): their scope restarts in the function's body.
    Here such an op is found in the function library, and the scope is the one of
    the graph node that calls the function (``.../my_layer_1/PartitionedCall``).
    """
    library = {f.signature.name: f for f in graph_def.library.function}
    memo: dict[str, set[str]] = {}

    def ops_in_function(name: str) -> set[str]:
        if name not in memo:
            memo[name] = set()  # a function that calls itself adds nothing more
            function = library.get(name)
            memo[name] = _ops_in_nodes(function.node_def if function else [], ops_in_function)
        return memo[name]

    found: dict[str, set[str]] = {}
    for node in graph_def.node:
        for op in _ops_in_nodes([node], ops_in_function) & ops:
            found.setdefault(op, set()).add(node.name)
    return found


def _ops_in_nodes(nodes, ops_in_function: Callable[[str], set[str]]) -> set[str]:
    """The op types the nodes run, including those of the functions they call."""
    found = set()
    for node in nodes:
        found.add(node.op)
        for value in node.attr.values():
            called = [value.func] if value.HasField("func") else list(value.list.func)
            for function in called:
                if function.name:
                    found |= ops_in_function(function.name)
    return found


def _enum_name(message, field: str) -> str:
    value = getattr(message, field, None)
    try:
        return message.DESCRIPTOR.fields_by_name[field].enum_type.values_by_number[value].name
    except (AttributeError, KeyError):
        return str(value)


def _unsupported_op_error(
    unsupported: dict[str, set[str]], model: keras.Model, quantization: str = "float32"
) -> UnsupportedOpError:
    known = _layer_names(model)
    lines = []
    all_layers: list[str] = []
    for op in sorted(unsupported):
        paths = (_layer_path(scope, known, model.name) for scope in unsupported[op])
        layers = sorted({p for p in paths if p})
        all_layers.extend(p for p in layers if p not in all_layers)
        if layers:
            where = ", ".join(f"'{p}' ({known[p.rsplit('/', 1)[-1]]})" for p in layers)
            lines.append(f"  - tf.{op} in layer {where}")
        else:
            lines.append(f"  - tf.{op} (layer unknown)")
    ops = sorted(unsupported)
    op_set = {
        "int8": "TFLITE_BUILTINS_INT8 (int8 kernels)",
        "int16x8": "the int16x8 builtins",
    }.get(quantization, "TFLITE_BUILTINS")
    message = (
        f"Model {model.name!r} needs TensorFlow op(s) with no TFLite builtin kernel: "
        f"{', '.join(ops)}. keras_mvit2 converts with {op_set} only (no Flex / "
        "SELECT_TF_OPS delegate, which mobile runtimes usually lack).\n"
        + "\n".join(lines)
        + "\nFix: rewrite that computation in the layer with ops that have TFLite builtins "
        f"(see {_OPS_COMPATIBILITY_URL}); if the layer is part of keras_mvit2, please report "
        "it as a bug with this message."
    )
    return UnsupportedOpError(message, ops, all_layers)


def _layer_names(model: keras.Model) -> dict[str, str]:
    """Layer name -> class name, for the model and every nested layer."""
    names: dict[str, str] = {}
    stack = [model]
    seen: set[int] = set()
    while stack:
        layer = stack.pop()
        if id(layer) in seen:
            continue
        seen.add(id(layer))
        names.setdefault(layer.name, type(layer).__name__)
        flatten = getattr(layer, "_flatten_layers", None)
        children = (
            list(flatten(include_self=False, recursive=False))
            if flatten else list(getattr(layer, "layers", []))
        )
        stack.extend(children)
    return names


def _layer_path(scope: str, known: dict[str, str], model_name: str) -> str:
    """``"functional_1/stage2_block1_1/transformer_0_1/Op"`` -> ``"stage2_block1/transformer_0"``.

    Each name scope is matched against the model's layer names; the ``_<n>``
    suffixes that TF adds to make scopes unique are stripped (first one first,
    as the export trace scopes every layer once more).
    """
    parts = scope.split("/")[:-1]   # the last part is the op name
    path = []
    for part in parts:
        name = _match_layer_name(part, known)
        if name is None:
            continue
        if not path and name == model_name:
            continue
        path.append(name)
    return "/".join(path)


def _match_layer_name(part: str, known: dict[str, str]) -> str | None:
    candidates = []
    stripped = re.sub(r"_\d+$", "", part)
    if stripped != part:
        candidates.append(stripped)
    candidates.append(part)
    while True:
        shorter = re.sub(r"_\d+$", "", candidates[-1])
        if shorter == candidates[-1]:
            break
        candidates.append(shorter)
    return next((c for c in candidates if c in known), None)


# --------------------------------------------------------------------------------------
# Run-time check, inspection, execution


def _check_runs(path: str, *, dynamic_batch: bool) -> None:
    """Runs the file once (batches 2 then 1 for a dynamic batch) or raises RuntimeError."""
    histogram = _read_flatbuffer(path).histogram
    variables = sorted(set(histogram) & set(_VARIABLE_OPS))
    if variables:
        raise RuntimeError(
            f"The converted model still holds variables ({', '.join(variables)}): the weights "
            "were not frozen and the model would compute garbage. This is a converter-path "
            "bug in keras_mvit2; please report it."
        )
    interpreter = Interpreter(model_path=path)
    details = interpreter.get_input_details()
    rng = np.random.default_rng(0)
    if not dynamic_batch:
        feeds = [_sample_input(rng, [int(d) for d in t["shape"]], t) for t in details]
        _invoke_checked(interpreter, feeds, resize=False, what="once")
        return
    # Dynamic batch: batch 2, then the first sample alone must give the same result.
    feeds = []
    for t in details:
        shape = [int(d) for d in t["shape_signature"]]
        shape = [2, *(1 if d < 0 else d for d in shape[1:])]
        feeds.append(_sample_input(rng, shape, t))
    out2 = _invoke_checked(interpreter, feeds, resize=True, what="with batch 2")
    out1 = _invoke_checked(interpreter, [f[:1] for f in feeds], resize=True, what="with batch 1")
    for a, b in zip(out1, out2, strict=True):
        ref = b[:1].astype("float64")
        scale = max(1.0, float(np.abs(ref).max()))
        if a.shape != ref.shape or not np.allclose(a, ref, rtol=0.0, atol=1e-3 * scale):
            raise RuntimeError(
                "The dynamic-batch TFLite model gives different results for the same sample in "
                "batches of 1 and 2; convert with a fixed batch (batch_size=1) instead."
            )


def _invoke_checked(
    interpreter: Interpreter, feeds: list[np.ndarray], *, resize: bool, what: str
) -> list[np.ndarray]:
    details = interpreter.get_input_details()
    try:
        if resize:
            for t, feed in zip(details, feeds, strict=True):
                interpreter.resize_tensor_input(t["index"], list(feed.shape), strict=True)
        interpreter.allocate_tensors()
        for t, feed in zip(details, feeds, strict=True):
            interpreter.set_tensor(t["index"], feed)
        interpreter.invoke()
        outputs = [
            interpreter.get_tensor(t["index"]).copy() for t in interpreter.get_output_details()
        ]
    except (RuntimeError, ValueError) as err:
        hint = (
            " The dynamic-batch graph does not run; convert with a fixed batch "
            "(to_tflite(..., batch_size=1)) instead." if resize else ""
        )
        raise RuntimeError(
            f"The converted TFLite model failed to run {what} in ai_edge_litert: {err}{hint}"
        ) from err
    for out in outputs:
        if np.issubdtype(out.dtype, np.floating) and not np.all(np.isfinite(out)):
            raise RuntimeError(
                f"The converted TFLite model gives non-finite outputs (NaN/inf) when run {what} "
                "on inputs in [0, 1); not writing it."
            )
    return outputs


def _sample_input(rng: np.random.Generator, shape: list[int], detail: dict[str, Any]) -> np.ndarray:
    dtype = np.dtype(detail["dtype"])
    x = rng.random(shape, dtype=np.float32)
    if np.issubdtype(dtype, np.floating):
        return x.astype(dtype)
    return _quantize(x, detail)


class _FlatbufferSummary(NamedTuple):
    histogram: dict[str, int]
    max_rank: int
    inputs: list[TensorDetails]
    outputs: list[TensorDetails]
    float_ops: dict[str, int]
    metadata: dict[str, Any] | None


def _read_flatbuffer(path: str) -> _FlatbufferSummary:
    """Op histogram (all subgraphs), max tensor rank, main-graph I/O, float ops and the
    keras_mvit2 metadata, from the file itself."""
    with open(path, "rb") as f:
        return summarize_flatbuffer(f.read())


def summarize_flatbuffer(buf: bytes) -> _FlatbufferSummary:
    model = parse_flatbuffer(buf)
    names = op_names(model)
    counts: collections.Counter[str] = collections.Counter()
    max_rank = 0
    for subgraph in model.subgraphs or []:
        for op in subgraph.operators or []:
            counts[names[op.opcodeIndex]] += 1
        for tensor in subgraph.tensors or []:
            shape = tensor.shapeSignature if tensor.shapeSignature is not None else tensor.shape
            max_rank = max(max_rank, 0 if shape is None else len(shape))
    inputs: list[TensorDetails] = []
    outputs: list[TensorDetails] = []
    if model.subgraphs:
        main = model.subgraphs[0]
        inputs = [_flatbuffer_tensor(main.tensors[i]) for i in tensor_indices(main.inputs)]
        outputs = [_flatbuffer_tensor(main.tensors[i]) for i in tensor_indices(main.outputs)]
    return _FlatbufferSummary(
        dict(sorted(counts.items())),
        max_rank,
        inputs,
        outputs,
        _float_ops(model, names),
        _metadata_entry(model, buf),
    )


def _float_ops(model, names: list[str] | None = None) -> dict[str, int]:
    """Histogram of the ops with a float input or output tensor, over all subgraphs.

    Not counted: a QUANTIZE whose float inputs are all inputs of its subgraph, and a
    DEQUANTIZE whose float outputs are all outputs of its subgraph (the float I/O
    boundary of a full-integer model with float I/O).
    """
    names = op_names(model) if names is None else names
    counts: collections.Counter[str] = collections.Counter()
    for subgraph in model.subgraphs or []:
        tensors = subgraph.tensors or []
        graph_inputs = set(tensor_indices(subgraph.inputs))
        graph_outputs = set(tensor_indices(subgraph.outputs))
        for op in subgraph.operators or []:
            name = names[op.opcodeIndex]
            float_in = {
                i for i in tensor_indices(op.inputs)
                if i >= 0 and int(tensors[i].type) in _FLOAT_TENSOR_TYPES
            }
            float_out = {
                i for i in tensor_indices(op.outputs)
                if i >= 0 and int(tensors[i].type) in _FLOAT_TENSOR_TYPES
            }
            if not float_in and not float_out:
                continue
            if name == "QUANTIZE" and not float_out and float_in <= graph_inputs:
                continue
            if name == "DEQUANTIZE" and not float_in and float_out <= graph_outputs:
                continue
            counts[name] += 1
    return dict(sorted(counts.items()))


def _format_histogram(histogram: Mapping[str, int]) -> str:
    return ", ".join(f"{name} x{count}" for name, count in histogram.items())


# --------------------------------------------------------------------------------------
# Metadata


def tflite_metadata(
    model: keras.Model,
    *,
    inputs: Sequence[TensorDetails],
    outputs: Sequence[TensorDetails],
    quantization: str,
    batch_size: int | None,
    class_names: list[str] | None = None,
    calibration: dict[str, Any] | None = None,
    user: dict[str, Any] | None = None,
    fused_pointwise: Sequence[PointwiseFusion] | None = None,
) -> dict[str, Any]:
    """The JSON document that `to_tflite` stores in the file (and the sidecar).

    Keys: ``format``/``version`` (``"keras_mvit2.tflite_metadata"``, 1), ``model`` (Keras
    model name), ``attention`` (the attention layers inside, e.g. ``["separable"]``:
    `keras_mvit2.attention.names_in`), ``keras_mvit2_version``, ``quantization``,
    ``batch_size`` (``None``: dynamic), ``preprocessing`` (``color_space`` ``"RGB"``,
    ``layout`` ``"NHWC"``, ``input_size`` ``[height, width]``, ``scale`` 1/255 and
    ``offset`` 0: the model input is ``pixel * scale + offset``, i.e. RGB in [0, 1]),
    ``input``/``output`` (name, shape, dtype and quantization ``scale`` / ``zero_point`` of
    the model's I/O tensors: for int8/uint8 I/O an app computes ``q = round(x / scale) +
    zero_point`` from the [0, 1] input ``x``, and ``y = (q - zero_point) * scale`` for the
    output), ``output_kind`` (``"probabilities"`` or ``"logits"``), ``class_names`` (or
    ``None``), ``calibration`` (source and number of images, for int8/int16x8),
    ``graph_optimizations`` (``fused_pointwise_convolutions``: how many pairs of 1x1
    convolutions were fused and the ``macs_saved``; ``None`` when fusion was off) and
    ``user``.
    """
    from keras_mvit2._version import __version__
    from keras_mvit2.attention import names_in

    shape = tuple(model.inputs[0].shape)
    input_size = [int(d) for d in shape[1:3]] if len(shape) == 4 else None
    activation = getattr(getattr(model.layers[-1], "activation", None), "__name__", "")
    output_kind = "probabilities" if activation == "softmax" else "logits"

    def tensor(t: TensorDetails) -> dict[str, Any]:
        scale, zero_point = t.quantization
        return {
            "name": t.name,
            "shape": list(t.shape_signature),
            "dtype": t.dtype,
            "quantized": bool(scale),
            "scale": scale,
            "zero_point": zero_point,
        }

    return {
        "format": METADATA_FORMAT,
        "version": METADATA_VERSION,
        "model": model.name,
        "attention": names_in(model),
        "keras_mvit2_version": __version__,
        "quantization": quantization,
        "batch_size": batch_size,
        "preprocessing": {
            "color_space": "RGB",
            "layout": "NHWC",
            "input_size": input_size,
            "scale": 1.0 / 255.0,
            "offset": 0.0,
            "description": "RGB pixels in [0, 255] times 1/255 (no mean/std): [0, 1]",
        },
        "input": tensor(inputs[0]) if inputs else None,
        "output": tensor(outputs[0]) if outputs else None,
        "output_kind": output_kind,
        "class_names": class_names,
        "calibration": calibration,
        "graph_optimizations": None if fused_pointwise is None else {
            "fused_pointwise_convolutions": len(fused_pointwise),
            "macs_saved": int(sum(f.macs_saved for f in fused_pointwise)),
        },
        "user": user,
    }


def embed_metadata(flatbuffer: bytes, info: Mapping[str, Any]) -> bytes:
    """Adds (or replaces) the ``"keras_mvit2"`` metadata entry: a buffer holding the JSON."""
    model = parse_flatbuffer(flatbuffer)
    data = json.dumps(info, sort_keys=False).encode("utf-8")
    buffer = tfl_schema.BufferT()
    buffer.data = np.frombuffer(data, dtype=np.uint8)
    model.buffers = list(model.buffers or [])
    model.buffers.append(buffer)
    entry = tfl_schema.MetadataT()
    entry.name = METADATA_NAME
    entry.buffer = len(model.buffers) - 1
    kept = [m for m in (model.metadata or []) if decode_name(m.name) != METADATA_NAME]
    model.metadata = [*kept, entry]
    return serialize_flatbuffer(model, len(flatbuffer) + len(data) + 4096)


def embed_all_metadata(flatbuffer: bytes, info: Mapping[str, Any],
                       outputs: Sequence[TensorDetails]) -> bytes:
    """`flatbuffer` with our JSON entry `info` (`tflite_metadata`) and, for an RGB image
    model, the standard TFLite Model Metadata built from it (`outputs`: the file's output
    tensors, e.g. `summarize_flatbuffer(flatbuffer).outputs`)."""
    return add_standard_metadata(  # last: it appends the labels archive
        embed_metadata(flatbuffer, info), info,
        [t.shape_signature for t in outputs], [t.name for t in outputs],
    )


def _metadata_entry(model, buf: bytes) -> dict[str, Any] | None:
    """The keras_mvit2 JSON entry of `model` (parsed from `buf`), with the standard
    metadata under ``"tflite_metadata"``."""
    for entry in model.metadata or []:
        if decode_name(entry.name) != METADATA_NAME:
            continue
        buffer = model.buffers[entry.buffer]
        if buffer.data is None:
            return None
        try:
            info = json.loads(bytes(np.asarray(buffer.data, dtype=np.uint8)).decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            return None
        info["tflite_metadata"] = standard_metadata_of(model, buf)
        return info
    return None


def read_tflite_metadata(path: str | os.PathLike) -> dict[str, Any] | None:
    """The ``"keras_mvit2"`` metadata that `to_tflite` wrote into a `.tflite` file, with
    the standard TFLite Model Metadata under ``"tflite_metadata"``.

    ``"tflite_metadata"`` is the ``TFLITE_METADATA`` entry that MediaPipe Tasks and the
    TFLite Task Library read, as plain data with the packed files' contents (see
    `keras_mvit2.export.tflite_standard_metadata.read_standard_metadata`), or ``None``.
    Returns ``None`` for a file without the keras_mvit2 entry (e.g. converted by other
    tools).
    """
    return _read_flatbuffer(os.fspath(path)).metadata


def _flatbuffer_tensor(tensor) -> TensorDetails:
    shape = tuple(int(d) for d in (tensor.shape if tensor.shape is not None else ()))
    signature = tensor.shapeSignature
    signature = shape if signature is None else tuple(int(d) for d in signature)
    q = tensor.quantization
    scales = [] if q is None or q.scale is None else list(q.scale)
    zeros = [] if q is None or q.zeroPoint is None else list(q.zeroPoint)
    scale = float(scales[0]) if scales else 0.0
    zero = int(zeros[0]) if zeros else 0
    return TensorDetails(
        name=decode_name(tensor.name),
        shape=shape,
        shape_signature=signature,
        dtype=TENSOR_TYPE_NAMES.get(int(tensor.type), f"type_{tensor.type}"),
        quantization=(scale, zero),
    )


def _xnnpack_coverage(interpreter: Interpreter) -> tuple[int, dict[str, int]]:
    """(DELEGATE nodes, histogram of ops executed outside them).

    ``_get_ops_details()`` lists the original nodes followed by the DELEGATE nodes
    that replaced some of them in the execution plan. A node runs outside the
    delegates if a graph output depends on it through nodes that are not
    replaced; walking back from the outputs with "the last node that produces a
    tensor is its producer" finds them (the DELEGATE nodes come last).
    """
    ops = interpreter._get_ops_details()
    producer: dict[int, dict[str, Any]] = {}
    for op in ops:
        for t in op["outputs"]:
            producer[int(t)] = op
    num_delegates = sum(op["op_name"] == "DELEGATE" for op in ops)
    outside: collections.Counter[str] = collections.Counter()
    visited: set[int] = set()
    stack = [int(d["index"]) for d in interpreter.get_output_details()]
    while stack:
        op = producer.get(stack.pop())
        if op is None or op["index"] in visited:
            continue
        visited.add(op["index"])
        if op["op_name"] != "DELEGATE":
            outside[op["op_name"]] += 1
        stack.extend(int(t) for t in op["inputs"] if t >= 0)
    return num_delegates, dict(sorted(outside.items()))


def inspect_tflite(path: str | os.PathLike) -> TFLiteReport:
    """Reads a `.tflite` file: op histogram, ranks, Flex/custom ops, I/O, XNNPACK partitions.

    The op histogram and ranks come from the flatbuffer itself; the I/O details
    and the XNNPACK partitioning from an ``ai_edge_litert`` interpreter created with
    its default delegates (those fields are ``None``/empty if the file does not load,
    e.g. because it needs Flex ops).
    """
    path = os.fspath(path)
    summary = _read_flatbuffer(path)
    histogram = summary.histogram
    flex = sorted(op for op in histogram if op.startswith("Flex"))
    custom = sorted(
        op for op in histogram if op not in BUILTIN_NAMES.values() and not op.startswith("Flex")
    )
    inputs, outputs = summary.inputs, summary.outputs
    partitions = outside_count = outside = None
    try:
        interpreter = Interpreter(model_path=path, num_threads=1)
        interpreter.allocate_tensors()
    except (RuntimeError, ValueError):
        interpreter = None
    if interpreter is not None:
        inputs = [TensorDetails.from_interpreter(d) for d in interpreter.get_input_details()]
        outputs = [TensorDetails.from_interpreter(d) for d in interpreter.get_output_details()]
        partitions, outside = _xnnpack_coverage(interpreter)
        outside_count = sum(outside.values())
    return TFLiteReport(
        path=path,
        size_bytes=os.path.getsize(path),
        op_histogram=histogram,
        max_tensor_rank=summary.max_rank,
        flex_ops=flex,
        custom_ops=custom,
        inputs=inputs,
        outputs=outputs,
        dynamic_batch=bool(inputs) and inputs[0].shape_signature[:1] == (-1,),
        num_xnnpack_partitions=partitions,
        num_ops_outside_xnnpack=outside_count,
        ops_outside_xnnpack=outside,
        float_ops=summary.float_ops,
        metadata=summary.metadata,
    )


def run_tflite(path: str | os.PathLike, inputs: np.ndarray, *, num_threads: int = 1) -> np.ndarray:
    """Runs a batch through a single-input, single-output TFLite model.

    A dynamic-batch model gets its input resized to the whole batch; a
    fixed-batch model (batch 1 by default) is run chunk by chunk. Quantized
    (int8/uint8) inputs and outputs are (de)quantized with the tensor's scale and
    zero point.

    Args:
        path: the `.tflite` file.
        inputs: array of shape ``(batch, *input_shape[1:])``.
        num_threads: interpreter threads.

    Returns:
        The outputs, float32, shape ``(batch, *output_shape[1:])``.
    """
    interpreter = Interpreter(model_path=os.fspath(path), num_threads=num_threads)
    input_details = interpreter.get_input_details()
    output_details = interpreter.get_output_details()
    if len(input_details) != 1 or len(output_details) != 1:
        raise ValueError(
            "run_tflite supports models with one input and one output. Received: "
            f"{len(input_details)} inputs, {len(output_details)} outputs"
        )
    in_detail = input_details[0]
    signature = [int(d) for d in in_detail["shape_signature"]]
    x = np.asarray(inputs)
    if x.ndim != len(signature) or any(
        s >= 0 and s != d for s, d in zip(signature[1:], x.shape[1:], strict=True)
    ):
        raise ValueError(
            f"inputs must have shape (batch, {', '.join(map(str, signature[1:]))}). "
            f"Received: shape={x.shape}"
        )
    if signature[0] < 0 or any(s < 0 for s in signature[1:]):
        interpreter.resize_tensor_input(in_detail["index"], list(x.shape), strict=True)
        chunk = x.shape[0]
    else:
        chunk = signature[0]
        if x.shape[0] % chunk:
            raise ValueError(
                f"The model has a fixed batch of {chunk}; the number of inputs must be a "
                f"multiple of it. Received: batch={x.shape[0]}"
            )
    interpreter.allocate_tensors()
    in_detail = interpreter.get_input_details()[0]
    out_detail = interpreter.get_output_details()[0]
    results = []
    for start in range(0, x.shape[0], chunk):
        feed = x[start : start + chunk]
        dtype = np.dtype(in_detail["dtype"])
        if np.issubdtype(dtype, np.floating):
            feed = feed.astype(dtype)
        else:
            feed = _quantize(feed.astype("float32"), in_detail)
        interpreter.set_tensor(in_detail["index"], np.ascontiguousarray(feed))
        interpreter.invoke()
        results.append(_dequantize(interpreter.get_tensor(out_detail["index"]), out_detail))
    return np.concatenate(results, axis=0)


def _quantize(x: np.ndarray, detail: dict[str, Any]) -> np.ndarray:
    dtype = np.dtype(detail["dtype"])
    scale, zero_point = detail["quantization"]
    if not scale:
        return x.astype(dtype)
    info = np.iinfo(dtype)
    q = np.round(x / scale + zero_point)
    return np.clip(q, info.min, info.max).astype(dtype)


def _dequantize(y: np.ndarray, detail: dict[str, Any]) -> np.ndarray:
    scale, zero_point = detail["quantization"]
    if np.issubdtype(y.dtype, np.integer) and scale:
        return ((y.astype("float32") - zero_point) * scale).astype("float32")
    return y.astype("float32")
