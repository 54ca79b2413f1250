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
   int8 and int16x8 quantization are converter settings (`QUANTIZATIONS`, each
   resolved once, at the entry, into the `TFLiteQuantization` the steps read);
3. the converted flatbuffer is parsed once and edited in place (1x1 fusion, the
   detection post-processing op), then the ``serving_default`` signature, a JSON
   metadata entry (preprocessing, class names, quantization, the export forms) and
   the standard metadata are added and it is serialized once;
4. the flatbuffer is run once in ``ai_edge_litert`` before it is moved onto the
   target path (the converter does not catch run-time failures such as
   ``BROADCAST_TO ... failed to prepare``).

Not used on purpose: ``from_concrete_functions([fn], keras_model)`` (leaves the
variables unfrozen and gives NaN), ``model.export(format="litert")`` (enables
Flex ops by default), and ``model.export(format="tf_saved_model")`` +
``from_saved_model`` (correct too, but 3-5x slower: the export traces and saves the
model, and the converter loads and traces it again).

Notes (measured with Keras 3.15, TF 2.21 and LiteRT 2.3):

* ``"int16x8"`` is more accurate than ``"int8"`` (MobileViTV2-0.5 top-1 agreement with
  Keras 0.99 vs 0.975) but runs on the reference kernels, not XNNPACK; SPACE_TO_DEPTH,
  DEPTH_TO_SPACE and DIV have no int16 kernel and stay float.
* ``"dynamic_int8"``: XNNPACK does not take the hybrid convolutions.
* The 1x1 convolution fusion (``fuse_pointwise``) fuses three pairs in MobileViTV2-0.5:
  56 M multiply-accumulates less, about 7 % of the float32 latency.
"""

from __future__ import annotations

import json
import logging
import os
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import keras
import numpy as np

from keras_mvit2.export.class_names import check_class_names
from keras_mvit2.export.tflite.detection_postprocess import add_detection_postprocess
from keras_mvit2.export.tflite.diagnose import (
    _converter_error,
    _int16x8_hazard_error,
    _not_quantizable_error,
)
from keras_mvit2.export.tflite.flatbuffer import (
    decode_name,
    op_names,
    parse_flatbuffer,
    tensor_indices,
)
from keras_mvit2.export.tflite.inspect import (
    TFLiteReport,
    _format_histogram,
    _read_flatbuffer,
    inspect_tflite,
)
from keras_mvit2.export.tflite.metadata import serialize_with_metadata, tflite_metadata
from keras_mvit2.export.tflite.pointwise_fusion import (
    PointwiseFusion,
    fuse_pointwise_convolutions,
    fuse_pointwise_pairs,
)
from keras_mvit2.export.tflite.quantization import (
    CALIBRATED,
    IO_DTYPES,
    QUANTIZATIONS,
    TFLiteQuantization,
    resolve_quantization,
)
from keras_mvit2.export.tflite.run import _check_runs, _sanity_check
from keras_mvit2.export.tflite.tensors import io_tensors
from keras_mvit2.layers import export_forms
from keras_mvit2.models.input_size import has_dynamic_size, with_input_size
from keras_mvit2.utils.files import atomic_output

__all__ = ["CALIBRATED", "IO_DTYPES", "QUANTIZATIONS", "to_tflite"]

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
    float_layers: Sequence[str] | None = None,
    activation_ranges: str | None = None,
    forms: export_forms.ExportForms | None = None,
    calibrated_edit: Callable[[bytes, np.ndarray], bytes] | None = None,
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
      quantization); no data needed.
    * ``"int8"``: full integer (``TFLITE_BUILTINS_INT8``): int8 weights and
      activations, calibrated on `representative_data`. With ``io_dtype="float32"``
      the model quantizes its input and dequantizes its output itself; with
      ``"int8"``/``"uint8"`` the app feeds quantized pixels (the scale and zero point
      are in the metadata and the tensor details).
    * ``"int16x8"``: int16 activations and int8 weights, calibrated like int8: more
      accurate than int8, but run by the reference kernels (not XNNPACK); ops without
      an int16 kernel stay float.

    Graph optimization: with ``fuse_pointwise=True`` (the default) each pair of
    back-to-back 1x1 convolutions with nothing non-linear between them is fused into
    one (`keras_mvit2.export.tflite.pointwise_fusion`): the same function with fewer
    multiply-accumulates. For int8/int16x8 the float graph is fused before calibration.

    Metadata: a JSON document (see `tflite_metadata`) is stored in the flatbuffer's
    ``metadata`` list under the name ``"keras_mvit2"``: preprocessing (RGB, scale
    1/255, input size, NHWC), class names, quantization and the I/O quantization
    parameters. An RGB image model also gets the standard TFLite Model Metadata
    (``TFLITE_METADATA``: image input, normalization mean 0 / std 255, output ranges and
    the class names as a packed ``labels.txt``) that MediaPipe Tasks, the TFLite Task
    Library and Android Studio's ML binding read, so those clients load the file as it
    is (see `keras_mvit2.export.tflite.standard_metadata`). Read both back with
    `read_tflite_metadata`. With ``sidecar=True`` what `read_tflite_metadata` returns
    (both) is also written (atomically, after the model) to ``<path>.json``, for apps
    that would rather not parse the flatbuffer.

    Measurements behind these choices are in the notes of
    `keras_mvit2.export.tflite.convert` (the module docstring).

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
            in float (default: such a model is an error listing those ops), and compute
            the attention weights' SOFTMAX in float inside XNNPACK, between a DEQUANTIZE
            and a QUANTIZE of its int8 tensors: LiteRT's int8 SOFTMAX runs on one thread
            outside XNNPACK (`keras_mvit2.export.tflite.int8_kernels.float_softmax_islands`).
        calibration_seed: seed of the calibration subset.
        fuse_pointwise: fuse back-to-back 1x1 convolutions (see above). ``False``
            keeps the converter's graph op for op.
        image_size: the input size to export at, an int or ``(height, width)``: for a
            dynamic-size model, defaults to its checkpoint's size (384 for the
            ``_384`` weights) or 256; for a fixed-size model it must be that size.
        float_layers: for ``"int8"``, Keras layers whose ops stay float (between a
            DEQUANTIZE and a QUANTIZE) while the rest is int8, e.g. the most sensitive
            ones by `keras_mvit2.export.tflite.layer_errors`: top-level layer names
            (``"stem_conv"``, ``"stage3_block1"``: every op inside) or nested paths
            (``"stage3_block1/transformer_0/attn"``). Their float ops need no
            `allow_float_ops`; any other float op is still an error. Recorded in the
            metadata as ``calibration["float_layers"]``
            (`keras_mvit2.export.tflite.float_layers`).
        activation_ranges: for ``"int8"`` and ``"int16x8"``, how each activation's range is
            chosen from the calibration images
            (`keras_mvit2.export.tflite.activation_ranges`): a two-sided percentile,
            ``"p99.99"`` (the int8 default: the 0.005 % most extreme values of each side are
            clipped), ``"mse"`` (the range of least squared quantization error) or
            ``"minmax"`` (the converter's global min / max; the int16x8 default). Recorded
            in the metadata as ``calibration["activation_ranges"]``.
        forms: the forms of the shared math the model is traced in
            (`keras_mvit2.layers.export_forms.ExportForms`); None: the quantization's own
            (`TFLiteQuantization.forms`: `export_forms.INT8` for ``"int8"``, else
            `export_forms.KERAS`). Recorded in the metadata as ``forms``.
        calibrated_edit: for ``"int8"``, a function of the calibrated float graph (a
            flatbuffer, its activation ranges chosen) and the calibration images that
            returns the graph to quantize: `keras_mvit2.quantize.qat` captures the graph
            here and hands back the same graph with trained weights.

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
    model, input_shape, class_names, quant = _checked_arguments(
        model,
        quantization=quantization,
        io_dtype=io_dtype,
        representative_data=representative_data,
        image_size=image_size,
        batch_size=batch_size,
        class_names=class_names,
        num_calibration_samples=num_calibration_samples,
        metadata=metadata,
        float_layers=float_layers,
    )
    activation_ranges = _activation_ranges(activation_ranges, quant)
    if calibrated_edit is not None and not quant.calibrated:
        raise ValueError(
            f"calibrated_edit applies to the calibrated quantizations {CALIBRATED}; "
            f"quantization={quant.name!r} has no calibrated graph.")
    float_layers = tuple(float_layers or ())
    calibration, calibration_info = _calibration_data(
        representative_data, quant, input_shape, num_calibration_samples,
        calibration_seed,
    )
    if activation_ranges is not None:
        calibration_info = {**(calibration_info or {}), "activation_ranges": activation_ranges}
    if float_layers:
        calibration_info = {**(calibration_info or {}), "float_layers": list(float_layers)}
    # The forms traced (and recorded in the metadata): the caller's, else the quantization's
    # (full int8: export_forms.INT8, the GroupNorm's E[x^2] as a matrix product).
    forms = quant.forms if forms is None else forms
    with export_forms.tracing(forms):
        converted, fusions = _convert_model(
            model, input_shape, quant, io_dtype, calibration, fuse_pointwise,
            float_layers=float_layers, activation_ranges=activation_ranges,
            calibrated_edit=calibrated_edit, allow_float_ops=allow_float_ops,
        )
    flatbuffer = _with_postprocess_and_metadata(
        converted,
        model,
        quantization=quant,
        batch_size=batch_size,
        class_names=class_names,
        calibration_info=calibration_info,
        user=dict(metadata) if metadata is not None else None,
        fusions=fusions if fuse_pointwise else None,
        forms=forms,
    )
    _write_checked(
        path,
        flatbuffer,
        model,
        quantization=quant,
        calibration=calibration,
        dynamic_batch=batch_size is None,
        allow_float_ops=allow_float_ops,
        float_layers=float_layers,
    )
    report = inspect_tflite(path)
    if sidecar:  # what read_tflite_metadata returns: our JSON and the standard metadata
        with atomic_output(path + ".json") as tmp_json, open(tmp_json, "w") as f:
            json.dump(report.metadata, f, indent=2)
    return report


# --------------------------------------------------------------------------------------
# Step 1: the arguments


def _checked_arguments(
    model: keras.Model,
    *,
    quantization: Any,
    io_dtype: Any,
    representative_data: Any,
    image_size: Any,
    batch_size: Any,
    class_names: Any,
    num_calibration_samples: Any,
    metadata: Mapping[str, Any] | None,
    float_layers: Sequence[str] | None = None,
) -> tuple[keras.Model, tuple[int | None, ...], list[str] | None, TFLiteQuantization]:
    """Checks `to_tflite`'s arguments (ValueError on the first bad one) and returns the
    model to convert (at `image_size` for a dynamic-size model), its export input shape,
    the checked class names and the resolved `quantization`."""
    quant = _check_quantization_options(quantization, io_dtype, representative_data)
    if getattr(model, "inputs", None) and (image_size is not None or has_dynamic_size(model)):
        model = with_input_size(model, image_size)
    input_shape = _export_input_shape(model, batch_size)
    class_names = check_class_names(class_names, model)
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
    if float_layers:
        if not quant.float_layers:
            raise ValueError(
                "float_layers keeps layers in float inside a full-integer model: it needs "
                f"quantization='int8'. Received: quantization={quantization!r}"
            )
        from keras_mvit2.export.tflite.layer_names import check_layer_names

        check_layer_names(float_layers, model, what="float_layers")
    return model, input_shape, class_names, quant


def _check_quantization_options(quantization: Any, io_dtype: Any,
                                representative_data: Any) -> TFLiteQuantization:
    """`quantization` resolved (`resolve_quantization`), checked against `io_dtype` and
    `representative_data`."""
    quant = resolve_quantization(quantization)
    allowed = quant.io_dtypes
    if io_dtype not in allowed:
        hint = (
            " Quantized inputs/outputs need a fully quantized model: use quantization='int8' "
            "(int8/uint8 I/O) or 'int16x8' (int16 I/O)."
            if not quant.quantized_io else ""
        )
        raise ValueError(
            f"io_dtype for quantization={quantization!r} must be one of {allowed}. "
            f"Received: io_dtype={io_dtype!r}.{hint}"
        )
    if quant.calibrated and representative_data is None:
        raise ValueError(
            f"quantization={quantization!r} needs representative_data to calibrate the "
            "activation ranges: a tf.data.Dataset of images (e.g. your training or evaluation "
            "pipeline), a numpy array (N, H, W, 3) in [0, 1], a folder of images, or "
            "'fashion_mnist'. A few hundred real images of the deployment distribution are "
            "enough. Without data, use quantization='dynamic_int8' (int8 weights only)."
        )
    if not quant.calibrated and representative_data is not None:
        raise ValueError(
            f"representative_data is only used by the calibrated quantizations {CALIBRATED}; "
            f"quantization={quantization!r} does not calibrate. Drop representative_data or "
            "use quantization='int8'."
        )
    return quant


def _activation_ranges(method: Any, quant: TFLiteQuantization) -> str | None:
    """The checked range method of a calibrated quantization (its default for None);
    None for the quantizations that do not calibrate."""
    from keras_mvit2.export.tflite.activation_ranges import check_range_method

    if not quant.calibrated:
        if method is not None:
            raise ValueError(
                f"activation_ranges applies to the calibrated quantizations {CALIBRATED}; "
                f"quantization={quant.name!r} has no activation ranges. Drop it or use "
                "quantization='int8'."
            )
        return None
    if method is None:
        return quant.activation_ranges
    return check_range_method(method)


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


# --------------------------------------------------------------------------------------
# Step 2: the calibration images (int8 / int16x8)


def _calibration_data(
    representative_data: Any,
    quant: TFLiteQuantization,
    input_shape: tuple[int | None, ...],
    num_samples: int,
    seed: int,
) -> tuple[np.ndarray | None, dict[str, Any] | None]:
    """The calibration images and their description for the metadata (``None, None`` for
    the quantizations that do not calibrate)."""
    if not quant.calibrated:
        return None, None
    from keras_mvit2.export.calibration import calibration_images, describe_source

    if len(input_shape) != 4:
        raise ValueError(
            f"quantization={quant.name!r} calibrates on images and needs an image "
            f"input (batch, height, width, channels). Received: input shape {input_shape}"
        )
    calibration = calibration_images(
        representative_data,
        image_size=tuple(input_shape[1:3]),
        channels=input_shape[3],
        num_samples=num_samples,
        seed=seed,
    )
    calibration_info = {
        "source": describe_source(representative_data),
        "num_samples": len(calibration),
    }
    if seed != 0:  # recorded when not the default, so the calibration can be repeated
        calibration_info["seed"] = seed
    return calibration, calibration_info


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


# --------------------------------------------------------------------------------------
# Step 3: the conversion (with the 1x1 convolution fusion and the int16x8 hazard check)


def _convert_model(
    model: keras.Model,
    input_shape: tuple[int | None, ...],
    quant: TFLiteQuantization,
    io_dtype: str,
    calibration: np.ndarray | None,
    fuse_pointwise: bool = True,
    *,
    float_layers: Sequence[str] = (),
    activation_ranges: str | None = None,
    calibrated_edit: Callable[[bytes, np.ndarray], bytes] | None = None,
    allow_float_ops: bool = False,
) -> tuple[Any, list[PointwiseFusion]]:
    """The converted flatbuffer, parsed (`ModelT`: the edits after the conversion change it
    in place and `_with_postprocess_and_metadata` serializes it once), and the 1x1
    convolution pairs fused in it (`float_layers`: see
    `keras_mvit2.export.tflite.float_layers`; `activation_ranges`:
    `keras_mvit2.export.tflite.activation_ranges`)."""
    from tensorflow.lite.python.convert_phase import ConverterError

    concrete_function = _concrete_function(model, input_shape)
    if quant.int16_activations:
        _check_int16x8_hazards(concrete_function, model)
    converter = _make_converter(
        concrete_function, quant, io_dtype, calibration, batch=input_shape[0] or 1
    )
    fusions: list[PointwiseFusion] = []
    if fuse_pointwise and quant.calibrated:
        _fuse_before_calibration(converter, fusions)
    if float_layers or activation_ranges not in (None, "minmax") or calibrated_edit:
        _quantize_after_calibration(converter, model, float_layers, activation_ranges,
                                    calibrated_edit)
    try:
        with warnings.catch_warnings():
            # "Statistics for quantized inputs were expected, but not specified" (harmless).
            warnings.filterwarnings("ignore", message="Statistics for quantized inputs")
            converted = parse_flatbuffer(converter.convert())
        if quant.fast_int8_kernels:
            from keras_mvit2.export.tflite.int8_kernels import for_fast_kernels

            for_fast_kernels(converted, float_softmax=allow_float_ops)
        if fuse_pointwise and not quant.calibrated:
            # float32 and float16 weights are fused here; quantized weights are skipped.
            fusions = fuse_pointwise_pairs(converted)
        return converted, fusions
    except ConverterError as err:
        error = _converter_error(err, concrete_function, model, quant.name)
        if error is None:
            raise
        raise error from err
    except RuntimeError as err:
        error = _not_quantizable_error(err, model, quant.name)
        if error is None:
            raise
        raise error from err


def _quantize_after_calibration(converter, model: keras.Model, float_layers: Sequence[str],
                                activation_ranges: str | None,
                                calibrated_edit: Callable[[bytes, np.ndarray], bytes] | None
                                ) -> None:
    """Hooks the range selection, the caller's edit and the float layers between calibration
    and quantization."""
    from keras_mvit2.export.tflite.calibrated_quantize import (
        quantize_after_calibration,
        representative_images,
    )

    denylist = None

    def edit(calibrated: bytes) -> bytes:
        images = representative_images(converter)
        if activation_ranges not in (None, "minmax"):
            from keras_mvit2.export.tflite.activation_ranges import select_ranges

            calibrated = select_ranges(calibrated, images, activation_ranges)
        return calibrated if calibrated_edit is None else calibrated_edit(calibrated, images)

    if float_layers:
        from keras_mvit2.export.tflite.float_layers import selected_nodes
        from keras_mvit2.export.tflite.layer_names import LayerNames

        names = LayerNames(model)

        def denylist(calibrated: bytes) -> list[str]:
            return selected_nodes(calibrated, names, float_layers)
    quantize_after_calibration(converter, edit=edit, denylisted_nodes=denylist)


def _concrete_function(model: keras.Model, input_shape: tuple[int | None, ...]):
    """The model's inference call traced for `input_shape` (training=False)."""
    import tensorflow as tf

    dtype = model.inputs[0].dtype
    spec = tf.TensorSpec(input_shape, dtype, name="input")
    serve = tf.function(lambda x: model(x, training=False), input_signature=[spec])
    return serve.get_concrete_function()


def _make_converter(
    concrete_function,
    quantization: str | TFLiteQuantization = "float32",
    io_dtype: str = "float32",
    calibration: np.ndarray | None = None,
    batch: int = 1,
):
    """The converter: builtin op sets only (never SELECT_TF_OPS), plus the quantization."""
    import tensorflow as tf

    quant = resolve_quantization(quantization)
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
    converter.target_spec.supported_ops = {
        "builtins": [ops_set.TFLITE_BUILTINS],
        "builtins_int8": [ops_set.TFLITE_BUILTINS_INT8],
        # Ops without an int16x8 kernel (SPACE_TO_DEPTH, DEPTH_TO_SPACE and DIV in
        # TF 2.21) stay float between DEQUANTIZE/QUANTIZE: still builtins.
        "int16x8": [ops_set.EXPERIMENTAL_TFLITE_BUILTINS_ACTIVATIONS_INT16_WEIGHTS_INT8,
                    ops_set.TFLITE_BUILTINS],
    }[quant.op_set]
    if quant.optimized:
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
    if quant.float16_weights:
        converter.target_spec.supported_types = [tf.float16]
    if quant.calibrated:
        converter.representative_dataset = _representative_dataset(calibration, batch)
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
    summary_model = parse_flatbuffer(converter.convert())  # a one-off file: not cached
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
        raise _int16x8_hazard_error(hazards, model)


# --------------------------------------------------------------------------------------
# Step 4: the detection post-processing op and the metadata


def _with_postprocess_and_metadata(
    converted: Any,
    model: keras.Model,
    *,
    quantization: TFLiteQuantization,
    batch_size: int | None,
    class_names: list[str] | None,
    calibration_info: dict[str, Any] | None,
    user: dict[str, Any] | None,
    fusions: Sequence[PointwiseFusion] | None,
    forms: export_forms.ExportForms,
) -> bytes:
    """The file's bytes: `converted` (the parsed flatbuffer, edited in place) ending in
    ``TFLite_Detection_PostProcess`` for a model wrapped by `with_detection_postprocess`,
    with the ``serving_default`` signature (input ``image``, named outputs:
    `keras_mvit2.export.tflite.signature`), our JSON metadata and the standard metadata,
    serialized once (`serialize_with_metadata`)."""
    postprocess = getattr(model, "detection_postprocess", None)  # with_detection_postprocess
    if postprocess is not None:
        add_detection_postprocess(converted, model.anchors_yxhw, postprocess)
    inputs, outputs = io_tensors(converted)
    info = tflite_metadata(
        model,
        inputs=inputs,
        outputs=outputs,
        quantization=quantization.name,
        batch_size=batch_size,
        class_names=class_names,
        calibration=calibration_info,
        user=user,
        fused_pointwise=fusions,
        forms=forms,
    )
    return serialize_with_metadata(converted, info, outputs)


# --------------------------------------------------------------------------------------
# Step 5: the checked, atomic write


def _write_checked(
    path: str,
    flatbuffer: bytes,
    model: keras.Model,
    *,
    quantization: TFLiteQuantization,
    calibration: np.ndarray | None,
    dynamic_batch: bool,
    allow_float_ops: bool,
    float_layers: Sequence[str] = (),
) -> None:
    """Writes `flatbuffer` to `path` only if it runs in ``ai_edge_litert`` (and, for int8,
    has no float ops left unless allowed); on any error `path` is left as it was."""
    with atomic_output(path) as tmp_path:
        with open(tmp_path, "wb") as f:
            f.write(flatbuffer)
        _check_runs(tmp_path, dynamic_batch=dynamic_batch)
        if calibration is not None:
            _sanity_check(model, tmp_path, calibration, quantization)
        if quantization.integer_only and not allow_float_ops:
            _check_no_float_ops(tmp_path, model, float_layers)


def _check_no_float_ops(
    path: str, model: keras.Model | None = None, float_layers: Sequence[str] = ()
) -> None:
    """RuntimeError when the full-integer model at `path` still computes ops in float
    (other than those of `float_layers`)."""
    if float_layers:
        from keras_mvit2.export.tflite.float_layers import float_ops_outside

        with open(path, "rb") as f:
            left = float_ops_outside(f.read(), model, float_layers)
    else:
        left = _read_flatbuffer(path).float_ops
    if left:
        raise RuntimeError(
            "The full-integer (int8) model still computes these ops in float: "
            f"{_format_histogram(left)} (besides the input QUANTIZE / output "
            f"DEQUANTIZE{' and the ops of float_layers' if float_layers else ''}). They "
            "run as float islands between DEQUANTIZE/QUANTIZE pairs, which integer-only "
            "accelerators cannot run. Fix: rewrite the layer with int8-quantizable ops "
            "(e.g. x * x instead of SQUARE, no NEG), "
            "keep those layers in float with float_layers=[...], or pass "
            "allow_float_ops=True to accept a mixed model."
        )
