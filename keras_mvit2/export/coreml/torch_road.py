"""The PyTorch road to a Core ML ML Program: ``torch.export`` + coremltools, our metadata.

`to_coreml_via_torch` converts a model that Keras runs on PyTorch (``KERAS_BACKEND=torch``):
its inference call (with a softmax appended when class names make a classifier of a logits
model) is captured by ``torch.export.export`` and decomposed to core ATen ops
(``run_decompositions()``: coremltools 9 has no converter for some ops Keras' torch backend
emits, e.g. ``aten.subtract``), then converted by coremltools' PyTorch frontend, with the
same input description, class labels, 1x1 convolution fusion pass, weight compression and
metadata as the TensorFlow road's `to_coreml` (`keras_mvit2.export.coreml.description`),
plus ``keras_mvit2.converter`` (JSON: road, tool, versions).

Forms: MobileViTv2 blocks are traced in Core ML's channels-first layout
(`keras_mvit2.export.coreml.layout`, as on the TensorFlow road) and the other attentions
pool tokens element-wise (`keras_mvit2.layers.export_forms.FLOAT_RUNTIME`).

No TensorFlow in the process: coremltools imports TensorFlow when it is installed, and on
this stack a PyTorch convolution crashes beside it, so coremltools is imported with
TensorFlow hidden (`keras_mvit2.export.roads.import_coremltools`). Activation quantization
(W8A8) calibrates by running the program's MIL in TensorFlow: TensorFlow road only.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from importlib.metadata import version

import keras

from keras_mvit2.export.coreml.compress import check_compression, compress_weights
from keras_mvit2.export.coreml.description import (
    add_metadata,
    checked_arguments,
    compression_info,
    input_types,
    is_probability_output,
    with_output_name,
)
from keras_mvit2.export.coreml.inspect import CoreMLReport, _coremltools, inspect_coreml
from keras_mvit2.export.roads import check_road
from keras_mvit2.export.torch_export import torch_program
from keras_mvit2.utils.files import atomic_output

__all__ = ["INEXACT_PASSES", "to_coreml_via_torch"]

#: coremltools passes left out of the torch road's pipeline because they change the function.
#: ``fuse_elementwise_to_batchnorm`` (coremltools 9.0) rewrites ``x * gamma + beta`` as a
#: ``batch_norm`` with mean 0, variance 1 and the default epsilon 1e-5, i.e. ``gamma /
#: sqrt(1 + 1e-5)``: 5e-6 relative per folded batch norm, which the decomposed batch norms of
#: ``torch.export`` all hit (the trained test classifier's probabilities moved by 2e-4 of
#: their largest). Without it the same ``mul`` / ``add`` still fold into the convolutions
#: (``fuse_conv_scale``, ``fuse_conv_bias``), exactly. The TensorFlow graph's fused batch
#: norms never take that pass's pattern.
INEXACT_PASSES = ("common::fuse_elementwise_to_batchnorm",)


def to_coreml_via_torch(
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
    palettize_granularity: str = "per_tensor",
    palettize_group_size: int = 16,
    metadata: Mapping[str, str] | None = None,
    image_size: int | tuple[int, int] | None = None,
    fuse_pointwise: bool = True,
) -> CoreMLReport:
    """Converts a Keras model running on PyTorch to a Core ML ML Program, saved atomically.

    The program takes ``image``, batch 1, ``(1, H, W, 3)``: an RGB image scaled by 1/255
    (or with `image_input` False a float tensor in [0, 1]); with `class_names` it is a Core
    ML classifier (``classLabel``, ``classLabel_probs``), else its output is
    ``probabilities`` (softmax models) or ``output``, as `to_coreml`'s.

    Args:
        model: a built Keras model with one image input ``(batch, H, W, 3)``, on the
            PyTorch backend. A ``(None, None, 3)`` model is exported at `image_size`.
        path: destination, ending in ``.mlpackage``.
        quantization: the compute precision, ``"float16"`` (default) or ``"float32"``.
        image_input: declare the input as an RGB image (see above).
        class_names: one name per output class: a Core ML classifier (a logits model gets
            a softmax appended).
        minimum_deployment_target: one of `DEPLOYMENT_TARGETS`.
        weight_compression: as `to_coreml`'s (`keras_mvit2.export.coreml.compress`), and so
            are `palettize_bits`, `prune_sparsity`, `palettize_granularity` and
            `palettize_group_size`.
        metadata: extra user-defined metadata strings.
        image_size: the size to export a model built with ``(None, None, 3)`` at.
        fuse_pointwise: fuse back-to-back 1x1 convolutions (the same coremltools pass as
            `to_coreml`'s).

    Returns:
        A `CoreMLReport` of the saved program.

    Raises:
        ValueError: not the PyTorch backend, or an argument `to_coreml` would refuse too.
        ImportError: coremltools is not installed.
    """
    check_road("torch", "coreml")
    ct = _coremltools()
    path = os.fspath(path)
    model, shape, class_names = checked_arguments(
        model, path, quantization=quantization, weight_compression=weight_compression,
        minimum_deployment_target=minimum_deployment_target, image_size=image_size,
        image_input=image_input, class_names=class_names)
    check_compression(weight_compression, bits=palettize_bits, sparsity=prune_sparsity,
                      granularity=palettize_granularity, group_size=palettize_group_size,
                      minimum_deployment_target=minimum_deployment_target)
    add_softmax = class_names is not None and not is_probability_output(model)
    program = torch_program(model, shape, add_softmax=add_softmax)
    from keras_mvit2.export.coreml.pointwise_fusion import (
        collect_fusions,
        pipeline_with_pointwise_fusion,
    )

    passes = pipeline_with_pointwise_fusion() if fuse_pointwise else ct.PassPipeline.DEFAULT
    passes.remove_passes(INEXACT_PASSES)
    with collect_fusions() as fusions:
        mlmodel = ct.convert(
            program,
            convert_to="mlprogram",
            inputs=input_types(ct, shape, image_input),
            classifier_config=ct.ClassifierConfig(list(class_names)) if class_names else None,
            compute_precision=(ct.precision.FLOAT16 if quantization == "float16"
                               else ct.precision.FLOAT32),
            minimum_deployment_target=getattr(ct.target, minimum_deployment_target),
            pass_pipeline=passes,
        )
    if not class_names:
        mlmodel = with_output_name(ct, mlmodel, model)
    mlmodel = compress_weights(mlmodel, weight_compression, palettize_bits, prune_sparsity,
                               granularity=palettize_granularity, group_size=palettize_group_size)
    compression = compression_info(weight_compression, palettize_bits, palettize_granularity,
                                   palettize_group_size, None)
    converter = {"road": "torch", "tool": "coremltools", "version": version("coremltools"),
                 "source": "torch.export", "torch": version("torch")}
    info = {"keras_mvit2.compression": json.dumps(compression),
            "keras_mvit2.converter": json.dumps(converter), **(metadata or {})}
    add_metadata(mlmodel, model, shape, quantization, weight_compression, fusions, info)
    with atomic_output(path) as tmp:
        mlmodel.save(tmp)
    return inspect_coreml(path)
