"""W8A8 for Core ML: int8 activations (``quantize`` / ``dequantize`` pairs, iOS 17+),
calibrated on Linux.

coremltools' `linear_quantize_activations` calibrates by running the model with Core ML
(`MLModel.predict` on every intermediate output), which needs macOS: on Linux it stops
with "Model prediction is only supported on macOS". Here the calibration statistics (each
activation's min and max over the calibration images) come from running the program's
own MIL with TensorFlow (`package_weights.activation_ranges`), and coremltools' own
passes insert the pairs, as `linear_quantize_activations` does:
``compression::insert_prefix_quantize_dequantize_pair``,
``compression::insert_suffix_quantize_dequantize_pair`` and
``common::dequantize_quantize_pair_elimination`` (coremltools 9; the pass options and
`coremltools.models.utils._apply_graph_pass` are coremltools internals, hence the
version check). The min/max is taken over all the images (coremltools 9's own loop
keeps the last image's range, which looks unintended).

The accuracy of a W8A8 package is not measurable here: Core ML's int8 kernels are not
reproduced; `predict_with_package_weights` simulates the pairs in float32 and labels it so.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["ACTIVATION_QUANTIZATIONS", "MIN_IOS", "quantize_activations"]

ACTIVATION_QUANTIZATIONS = (None, "int8")
#: The ``quantize`` / ``dequantize`` ops are in the iOS 17 opset.
MIN_IOS = 17


def _passes(config: Any, stats: dict[str, dict[str, float]]) -> list:
    from coremltools.converters.mil.mil.passes.graph_pass import PassOption
    from coremltools.converters.mil.mil.passes.pass_registry import PASS_REGISTRY

    passes = []
    for name in ("compression::insert_prefix_quantize_dequantize_pair",
                 "compression::insert_suffix_quantize_dequantize_pair"):
        graph_pass = PASS_REGISTRY[name]
        graph_pass.set_options([PassOption("config", config)])
        graph_pass.set_options([PassOption("activation_stats", stats)])
        passes.append(graph_pass)
    passes.append(PASS_REGISTRY["common::dequantize_quantize_pair_elimination"])
    return passes


def quantize_activations(mlmodel: Any, calibration_images: np.ndarray) -> Any:
    """`mlmodel` (a float ML Program, iOS 17+ opset) with int8 activations, calibrated on
    `calibration_images` `(N, H, W, 3)` in [0, 1] (the images a Keras model takes).

    Raises:
        ValueError: no calibration images, or an opset older than iOS 17.
        RuntimeError: this coremltools lacks the passes (they are internals of
            coremltools 9).
    """
    import coremltools as ct
    from coremltools.optimize import coreml as cto

    from keras_mvit2.export.coreml.package_weights import activation_ranges, program_of

    if calibration_images is None or len(calibration_images) == 0:
        raise ValueError(
            "activation_quantization='int8' calibrates the activations on images: pass "
            "calibration_images (N, H, W, 3) in [0, 1] (50-200 held-out training images)."
        )
    if mlmodel.get_spec().specificationVersion < ct._SPECIFICATION_VERSION_IOS_17:
        raise ValueError("activation_quantization='int8' needs minimum_deployment_target "
                         "'iOS17' or later (the quantize / dequantize ops).")
    try:
        from coremltools.models.utils import _apply_graph_pass
        from coremltools.optimize.coreml.experimental._post_training_quantization import (
            _adjust_concat_surrounding_activation_stats,
        )
    except ImportError as error:  # pragma: no cover (another coremltools)
        raise RuntimeError(
            f"coremltools {ct.__version__} lacks the activation quantization internals that "
            "keras_mvit2 calibrates through (written for coremltools 9)."
        ) from error
    program = program_of(mlmodel)
    ranges = activation_ranges(program, np.asarray(calibration_images, np.float32))
    stats = {name: {"rmin": low, "rmax": high} for name, (low, high) in ranges.items()}
    concats = [[v.name for v in op.values] + [op.outputs[0].name]
               for op in program.function.operations if op.op_type == "concat"]
    _adjust_concat_surrounding_activation_stats(concats or None, stats)
    config = cto.OptimizationConfig(
        global_config=cto.OpLinearQuantizerConfig(mode="linear_symmetric"))
    return _apply_graph_pass(mlmodel, _passes(config, stats),
                             spec_version=ct._SPECIFICATION_VERSION_IOS_17,
                             skip_model_load=True)
