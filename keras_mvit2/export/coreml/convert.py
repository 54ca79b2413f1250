"""Keras model -> Core ML ML Program (`.mlpackage`) for iPhone: `to_coreml`.

The model's inference call is traced as a ``tf.function`` (MobileViTv2 blocks in Core ML's
channels-first layout, `keras_mvit2.export.coreml.layout`), converted by ``coremltools``
with the 1x1 convolution fusion pass (`keras_mvit2.export.coreml.pointwise_fusion`), its
weights optionally compressed (`keras_mvit2.export.coreml.compress`), tagged with
keras_mvit2 metadata and saved atomically. Conversion runs on any OS; predictions need
macOS (see `keras_mvit2.export.coreml.inspect`).
"""

import json
import os
from collections.abc import Sequence

import keras
import numpy as np
import tensorflow as tf

from keras_mvit2.export.class_names import check_class_names
from keras_mvit2.export.coreml.activation_quantization import (
    ACTIVATION_QUANTIZATIONS,
    MIN_IOS,
    quantize_activations,
)
from keras_mvit2.export.coreml.compress import DEPLOYMENT_IOS, check_compression, compress_weights
from keras_mvit2.export.coreml.inspect import CoreMLReport, _coremltools, inspect_coreml
from keras_mvit2.export.coreml.layout import coreml_layout
from keras_mvit2.layers.separable_self_attention import elementwise_token_pooling
from keras_mvit2.models.input_size import has_dynamic_size, with_input_size
from keras_mvit2.utils.deprecation import renamed_argument
from keras_mvit2.utils.files import atomic_output

__all__ = ["COMPUTE_UNITS_GUIDANCE", "DEPLOYMENT_TARGETS", "PRECISIONS", "to_coreml"]

PRECISIONS = ("float16", "float32")
DEPLOYMENT_TARGETS = ("iOS16", "iOS17", "iOS18", "macOS13", "macOS14", "macOS15")
#: Written into every package's metadata (``keras_mvit2.compute_units``); the same advice
#: as harness/README.md (section 3), whose Swift harness measures each MLComputeUnits value.
COMPUTE_UNITS_GUIDANCE = (
    "Try MLComputeUnits .cpuAndNeuralEngine first (an fp16 program with no layout "
    "transposes is the Neural Engine's case), then .all (Core ML's default), .cpuAndGPU, "
    "and .cpuOnly as the baseline; keep the fastest on the target phone. harness/ios "
    "measures each: swift run -c release mvit2-coreml-bench MODEL.mlpackage "
    "--compute-units cpu_only cpu_and_gpu cpu_and_ne all (Mac), or the "
    "MViT2DeviceBenchmarks XCTest with TEST_RUNNER_MVIT2_COMPUTE_UNITS (iPhone); "
    "see harness/README.md, section 3."
)


def _is_probability_output(model: keras.Model) -> bool:
    activation = getattr(model.layers[-1], "activation", None)
    return getattr(activation, "__name__", "") == "softmax"


def to_coreml(
    model: keras.Model,
    path: str | os.PathLike,
    *,
    quantization: str | None = None,
    image_input: bool = True,
    class_names: Sequence[str] | None = None,
    minimum_deployment_target: str = "iOS16",
    weight_compression: str | None = None,
    palettize_bits: int = 4,
    prune_sparsity: float = 0.5,
    metadata: dict[str, str] | None = None,
    image_size: int | tuple[int, int] | None = None,
    fuse_pointwise: bool = True,
    precision: str | None = None,
    class_labels: Sequence[str] | None = None,
    palettize_granularity: str = "per_tensor",
    palettize_group_size: int = 16,
    activation_quantization: str | None = None,
    calibration_images: np.ndarray | None = None,
) -> CoreMLReport:
    """Converts `model` to a Core ML ML Program and saves it atomically.

    Args:
        model: a Keras model with a fixed input shape `(H, W, 3)`.
        path: destination, ending in `.mlpackage`.
        quantization: the numeric format, one of `PRECISIONS`: `"float16"` (default,
            what the Neural Engine runs) or `"float32"` (the compute precision).
        image_input: declare the input as an RGB image with scale 1/255 (the
            model's `preprocess_input`), so an app passes a `CVPixelBuffer`;
            `False` keeps a float tensor input `(1, H, W, 3)` in [0, 1].
        class_names: for classifiers, the name of each output class: the
            model becomes a Core ML classifier (outputs `classLabel` and
            `classLabel_probs`). A logits model gets a softmax appended.
        minimum_deployment_target: one of `DEPLOYMENT_TARGETS`.
        weight_compression: `None`, `"int8"` (linear symmetric weights, one scale per
            output channel), `"palettize"` (k-means look-up table of `palettize_bits`
            bits, per `palettize_granularity`) or `"prune"` (magnitude pruning to
            `prune_sparsity`), applied with `coremltools.optimize.coreml`
            (`keras_mvit2.export.coreml.compress`; ready-made sets of these options:
            `keras_mvit2.export.coreml.recipes.COMPRESSION_RECIPES`).
        palettize_granularity: `"per_tensor"` (one table per weight) or
            `"per_grouped_channel"` (one per `palettize_group_size` output channels;
            needs `minimum_deployment_target="iOS18"`).
        activation_quantization: `None` or `"int8"`: int8 activations (W8A8 with
            `weight_compression="int8"`; iOS17+), calibrated on `calibration_images`
            `(N, H, W, 3)` in [0, 1] by running the program's MIL with TensorFlow
            (`keras_mvit2.export.coreml.activation_quantization`; works on Linux).
        metadata: extra user-defined metadata strings (besides ``keras_mvit2.version``,
            ``keras_mvit2.model``, ``keras_mvit2.preprocessing``, ``keras_mvit2.precision``,
            ``keras_mvit2.weight_compression``, ``keras_mvit2.compression`` (JSON: the
            compression options), ``keras_mvit2.pointwise_fusions`` and
            ``keras_mvit2.compute_units``, which are always written).
        precision: deprecated name of `quantization` (removed in 0.4.0).
        class_labels: deprecated name of `class_names` (removed in 0.4.0).
        image_size: the size to export a model built with `input_shape=(None, None, 3)`
            at (int or `(height, width)`; default: its checkpoint's size or 256), see
            `keras_mvit2.with_input_size`.
        fuse_pointwise: fuse back-to-back 1x1 convolutions into one where that saves
            multiply-accumulates (exact; `keras_mvit2.export.coreml.pointwise_fusion`), as the
            TFLite export does. The fused pairs are listed in the
            ``keras_mvit2.pointwise_fusions`` metadata (JSON).

    Returns:
        A `CoreMLReport` of the saved program.
    """
    precision, precision_argument = renamed_argument(
        "to_coreml", "precision", precision, "quantization", quantization, default="float16")
    class_labels, labels_argument = renamed_argument(
        "to_coreml", "class_labels", class_labels, "class_names", class_names)
    ct = _coremltools()
    path = os.fspath(path)
    model, shape, class_labels = _checked_arguments(
        model, path, precision=precision, weight_compression=weight_compression,
        minimum_deployment_target=minimum_deployment_target, image_size=image_size,
        image_input=image_input, class_labels=class_labels,
        arguments=(precision_argument, labels_argument),
    )
    check_compression(weight_compression, bits=palettize_bits, sparsity=prune_sparsity,
                      granularity=palettize_granularity, group_size=palettize_group_size,
                      minimum_deployment_target=minimum_deployment_target)
    _check_activation_quantization(activation_quantization, calibration_images,
                                   minimum_deployment_target, shape)
    add_softmax = class_labels is not None and not _is_probability_output(model)
    mlmodel, fusions = _convert(
        ct, model, shape, add_softmax=add_softmax, image_input=image_input,
        class_labels=class_labels, precision=precision,
        minimum_deployment_target=minimum_deployment_target, fuse_pointwise=fuse_pointwise,
    )
    if not class_labels:
        mlmodel = _with_output_name(ct, mlmodel, model)
    if activation_quantization is not None:
        mlmodel = quantize_activations(mlmodel, calibration_images)
    mlmodel = compress_weights(mlmodel, weight_compression, palettize_bits, prune_sparsity,
                               granularity=palettize_granularity, group_size=palettize_group_size)
    compression = _compression_info(weight_compression, palettize_bits, palettize_granularity,
                                    palettize_group_size, activation_quantization)
    metadata = {"keras_mvit2.compression": json.dumps(compression), **(metadata or {})}
    _add_metadata(mlmodel, model, shape, precision, weight_compression, fusions, metadata)
    with atomic_output(path) as tmp:
        mlmodel.save(tmp)
    return inspect_coreml(path)


def _checked_arguments(
    model: keras.Model,
    path: str,
    *,
    precision: str,
    weight_compression: str | None,
    minimum_deployment_target: str,
    image_size: int | tuple[int, int] | None,
    image_input: bool,
    class_labels: Sequence[str] | None,
    arguments: tuple[str, str] = ("quantization", "class_names"),
) -> tuple[keras.Model, tuple[int, ...], list[str] | None]:
    """Checks `to_coreml`'s arguments (ValueError on the first bad one) and returns the
    model to convert (at `image_size` for a dynamic-size model), its input shape
    ``(height, width, channels)`` and the class names. `arguments` are the names the
    caller used for the numeric format and the class names (messages name them)."""
    precision_argument, labels_argument = arguments
    if not path.endswith(".mlpackage"):
        raise ValueError(f"A Core ML ML Program is saved as .mlpackage. Received: path={path!r}")
    if precision not in PRECISIONS:
        raise ValueError(
            f"{precision_argument} must be one of {PRECISIONS}. "
            f"Received: {precision_argument}={precision!r}"
        )
    if minimum_deployment_target not in DEPLOYMENT_TARGETS:
        raise ValueError(
            f"minimum_deployment_target must be one of {DEPLOYMENT_TARGETS}. "
            f"Received: minimum_deployment_target={minimum_deployment_target!r}"
        )
    if image_size is not None or has_dynamic_size(model):
        model = with_input_size(model, image_size)
    shape = tuple(model.input_shape[1:])
    if len(shape) != 3 or any(d is None for d in shape):
        raise ValueError(
            f"Core ML export needs a fixed (height, width, channels) input. Received: {shape}"
        )
    if image_input and shape[-1] != 3:
        raise ValueError(
            f"image_input=True needs 3 RGB channels. Received: input shape {shape}; "
            "pass image_input=False for other inputs."
        )
    class_labels = check_class_names(class_labels, model, argument=labels_argument)
    output_shape = tuple(model.output_shape)
    if class_labels is not None and len(output_shape) != 2:
        raise ValueError(
            f"{labels_argument} makes a Core ML classifier, which needs a model with one output "
            f"of shape (batch, classes). Received: output shape {output_shape}"
        )
    return model, shape, class_labels


def _check_activation_quantization(method: str | None, images, target: str,
                                   shape: tuple[int, ...]) -> None:
    """A ValueError for an activation quantization `to_coreml` cannot make."""
    if method not in ACTIVATION_QUANTIZATIONS:
        raise ValueError(f"activation_quantization must be one of {ACTIVATION_QUANTIZATIONS}. "
                         f"Received: activation_quantization={method!r}")
    if method is None:
        if images is not None:
            raise ValueError("calibration_images are only read with "
                             "activation_quantization='int8': drop them or set it.")
        return
    if DEPLOYMENT_IOS.get(target, 0) < MIN_IOS:
        raise ValueError(
            "activation_quantization='int8' needs the iOS 17 opset (quantize / dequantize): "
            f"pass minimum_deployment_target='iOS17' or later. Received: {target!r}")
    if images is None or np.ndim(images) != 4 or tuple(np.shape(images)[1:]) != shape:
        raise ValueError(
            "activation_quantization='int8' calibrates on images: pass calibration_images "
            f"of shape (N, {', '.join(map(str, shape))}) in [0, 1]. Received: "
            f"{None if images is None else np.shape(images)}")


def _convert(ct, model: keras.Model, shape: tuple[int, ...], *, add_softmax: bool,
             image_input: bool, class_labels: list[str] | None, precision: str,
             minimum_deployment_target: str, fuse_pointwise: bool):
    """The traced model converted by coremltools, and the 1x1 convolution pairs fused."""

    @tf.function(input_signature=[tf.TensorSpec((1, *shape), tf.float32, name="image")])
    def serve(image):
        y = model(image, training=False)
        return tf.nn.softmax(y) if add_softmax else y

    if image_input:
        inputs = [
            ct.ImageType(
                name="image", shape=(1, *shape), scale=1.0 / 255.0,
                color_layout=ct.colorlayout.RGB, channel_first=False,
            )
        ]
    else:
        inputs = [ct.TensorType(name="image", shape=(1, *shape))]
    # MobileViTv2 blocks in Core ML's channels-first layout (no layout transposes); other
    # attentions pool tokens element-wise (Core ML computes in float: no int8 rounding).
    with elementwise_token_pooling(), coreml_layout():
        concrete_function = serve.get_concrete_function()
    from keras_mvit2.export.coreml.pointwise_fusion import (
        collect_fusions,
        pipeline_with_pointwise_fusion,
    )

    with collect_fusions() as fusions:
        mlmodel = ct.convert(
            [concrete_function],
            source="tensorflow",
            convert_to="mlprogram",
            inputs=inputs,
            classifier_config=ct.ClassifierConfig(list(class_labels)) if class_labels else None,
            compute_precision=(ct.precision.FLOAT16 if precision == "float16"
                               else ct.precision.FLOAT32),
            minimum_deployment_target=getattr(ct.target, minimum_deployment_target),
            pass_pipeline=pipeline_with_pointwise_fusion() if fuse_pointwise else None,
        )
    return mlmodel, fusions


def _compression_info(weight_compression: str | None, bits: int, granularity: str,
                      group_size: int, activation_quantization: str | None) -> dict:
    """The ``keras_mvit2.compression`` metadata: what was compressed, and how."""
    info: dict = {"weight_compression": weight_compression,
                  "activation_quantization": activation_quantization}
    if weight_compression == "palettize":
        info.update(palettize_bits=bits, palettize_granularity=granularity)
        if granularity == "per_grouped_channel":
            info["palettize_group_size"] = group_size
    return info


def _with_output_name(ct, mlmodel, model: keras.Model):
    """`mlmodel` with its output named ``"probabilities"`` (softmax models) or
    ``"output"``."""
    spec = mlmodel.get_spec()
    old = spec.description.output[0].name
    new = "probabilities" if _is_probability_output(model) else "output"
    ct.utils.rename_feature(spec, old, new)
    return ct.models.MLModel(spec, weights_dir=mlmodel.weights_dir, skip_model_load=True)


def _add_metadata(mlmodel, model: keras.Model, shape: tuple[int, ...], precision: str,
                  weight_compression: str | None, fusions, metadata: dict[str, str] | None
                  ) -> None:
    """Writes the description and the keras_mvit2 metadata (then the user's) into
    `mlmodel`."""
    from keras_mvit2._version import __version__
    from keras_mvit2.attention import names_in

    mlmodel.short_description = f"{model.name} exported by keras_mvit2 {__version__}"
    info = {
        "keras_mvit2.version": __version__,
        "keras_mvit2.model": model.name,
        "keras_mvit2.attention": ",".join(names_in(model)),
        "keras_mvit2.preprocessing": json.dumps(
            {"color": "RGB", "scale": 1.0 / 255.0, "input_shape": list(shape)}
        ),
        "keras_mvit2.precision": precision,
        "keras_mvit2.weight_compression": str(weight_compression),
        "keras_mvit2.pointwise_fusions": json.dumps(
            [{"channels": list(f.channels), "macs_saved": f.macs_saved} for f in fusions]
        ),
        "keras_mvit2.compute_units": COMPUTE_UNITS_GUIDANCE,
    }
    info.update(metadata or {})
    mlmodel.user_defined_metadata.update(info)
