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

from keras_mvit2.export.coreml.activation_quantization import (
    ACTIVATION_QUANTIZATIONS,
    MIN_IOS,
    quantize_activations,
)
from keras_mvit2.export.coreml.compress import DEPLOYMENT_IOS, check_compression, compress_weights
from keras_mvit2.export.coreml.description import (
    COMPUTE_UNITS_GUIDANCE,
    DEPLOYMENT_TARGETS,
    PRECISIONS,
    add_metadata,
    checked_arguments,
    compression_info,
    input_types,
    is_probability_output,
    with_output_name,
)
from keras_mvit2.export.coreml.inspect import CoreMLReport, _coremltools, inspect_coreml
from keras_mvit2.export.coreml.layout import coreml_tracing
from keras_mvit2.utils.files import atomic_output

__all__ = ["COMPUTE_UNITS_GUIDANCE", "DEPLOYMENT_TARGETS", "PRECISIONS", "to_coreml"]

def to_coreml(
    model: keras.Model,
    path: str | os.PathLike,
    *,
    quantization: str = "float16",
    image_input: bool = True,
    class_names: Sequence[str] | None = None,
    minimum_deployment_target: str = "iOS16",
    weight_compression: str | None = None,
    palettize_bits: int = 4,
    prune_sparsity: float = 0.5,
    metadata: dict[str, str] | None = None,
    image_size: int | tuple[int, int] | None = None,
    fuse_pointwise: bool = True,
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
    ct = _coremltools()
    path = os.fspath(path)
    model, shape, class_names = checked_arguments(
        model, path, quantization=quantization, weight_compression=weight_compression,
        minimum_deployment_target=minimum_deployment_target, image_size=image_size,
        image_input=image_input, class_names=class_names,
    )
    check_compression(weight_compression, bits=palettize_bits, sparsity=prune_sparsity,
                      granularity=palettize_granularity, group_size=palettize_group_size,
                      minimum_deployment_target=minimum_deployment_target)
    _check_activation_quantization(activation_quantization, calibration_images,
                                   minimum_deployment_target, shape)
    add_softmax = class_names is not None and not is_probability_output(model)
    mlmodel, fusions = _convert(
        ct, model, shape, add_softmax=add_softmax, image_input=image_input,
        class_names=class_names, quantization=quantization,
        minimum_deployment_target=minimum_deployment_target, fuse_pointwise=fuse_pointwise,
    )
    if not class_names:
        mlmodel = with_output_name(ct, mlmodel, model)
    if activation_quantization is not None:
        mlmodel = quantize_activations(mlmodel, calibration_images)
    mlmodel = compress_weights(mlmodel, weight_compression, palettize_bits, prune_sparsity,
                               granularity=palettize_granularity, group_size=palettize_group_size)
    compression = compression_info(weight_compression, palettize_bits, palettize_granularity,
                                   palettize_group_size, activation_quantization)
    metadata = {"keras_mvit2.compression": json.dumps(compression), **(metadata or {})}
    add_metadata(mlmodel, model, shape, quantization, weight_compression, fusions, metadata)
    with atomic_output(path) as tmp:
        mlmodel.save(tmp)
    return inspect_coreml(path)


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
             image_input: bool, class_names: list[str] | None, quantization: str,
             minimum_deployment_target: str, fuse_pointwise: bool):
    """The traced model converted by coremltools, and the 1x1 convolution pairs fused."""

    @tf.function(input_signature=[tf.TensorSpec((1, *shape), tf.float32, name="image")])
    def serve(image):
        y = model(image, training=False)
        return tf.nn.softmax(y) if add_softmax else y

    inputs = input_types(ct, shape, image_input)
    # MobileViTv2 blocks in Core ML's channels-first layout (no layout transposes); other
    # attentions pool tokens element-wise (Core ML computes in float: no int8 rounding).
    with coreml_tracing():
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
            classifier_config=ct.ClassifierConfig(list(class_names)) if class_names else None,
            compute_precision=(ct.precision.FLOAT16 if quantization == "float16"
                               else ct.precision.FLOAT32),
            minimum_deployment_target=getattr(ct.target, minimum_deployment_target),
            pass_pipeline=pipeline_with_pointwise_fusion() if fuse_pointwise else None,
        )
    return mlmodel, fusions
