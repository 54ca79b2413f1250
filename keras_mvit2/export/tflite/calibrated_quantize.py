"""Calibrate, edit the calibrated graph, then quantize: the hook behind `to_tflite`'s
``activation_ranges`` and ``float_layers`` options.

TF 2.21's converter calibrates and quantizes in ``TFLiteConverter._quantize``, which calls
the MLIR quantizer (``tensorflow.lite.python.convert.mlir_quantize``) on the calibrated
float flatbuffer. `quantize_after_calibration` wraps ``converter._quantize``: it lets the
converter calibrate only, applies the edits to the calibrated graph (new activation ranges,
`keras_mvit2.export.tflite.activation_ranges`) and makes the same ``mlir_quantize`` call as
the converter, with ``denylisted_nodes`` (ops left in float between a DEQUANTIZE and a
QUANTIZE, `keras_mvit2.export.tflite.float_layers`) when asked. Everything else (I/O types,
uint8 I/O included, per-channel weights) is what a plain int8 conversion gives.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

__all__ = ["quantize_after_calibration"]


def quantize_after_calibration(
    converter,
    *,
    edit: Callable[[bytes], bytes] | None = None,
    denylisted_nodes: Callable[[bytes], list[str]] | None = None,
) -> None:
    """Makes `converter` (full int8) calibrate, apply `edit` to the calibrated flatbuffer and
    quantize it, leaving the ops named by `denylisted_nodes(calibrated)` in float.

    Wraps ``converter._quantize`` after any other wrapper (e.g. the 1x1 fusion of
    `keras_mvit2.export.tflite.convert`), so edits and names see the graph it calibrates.
    """
    from tensorflow.lite.python.convert import mlir_quantize

    quantize = converter._quantize

    def calibrate_then_quantize(float_model, input_type, output_type, activations_type,
                                bias_type, allow_float, enable_variable_quantization,
                                debug_options):
        calibrate_only = converter._experimental_calibrate_only
        converter._experimental_calibrate_only = True
        try:
            calibrated = quantize(float_model, input_type, output_type, activations_type,
                                  bias_type, allow_float, enable_variable_quantization,
                                  debug_options)
        finally:
            converter._experimental_calibrate_only = calibrate_only
        calibrated = bytes(calibrated)
        if edit is not None:
            calibrated = edit(calibrated)
        if calibrate_only:  # e.g. a QuantizationDebugger asked for the calibrated model
            return calibrated
        # The call TFLiteConverter._quantize makes (TF 2.21), plus denylisted_nodes.
        return mlir_quantize(
            calibrated,
            converter._experimental_disable_per_channel,
            input_data_type=input_type,
            output_data_type=output_type,
            enable_variable_quantization=enable_variable_quantization,
            disable_per_channel_for_dense_layers=(
                converter._experimental_disable_per_channel_quantization_for_dense_layers),
            debug_options_str=debug_options.SerializeToString(),
            denylisted_nodes=denylisted_nodes(calibrated) if denylisted_nodes else None,
        )

    converter._quantize = calibrate_then_quantize


def representative_images(converter) -> np.ndarray:
    """The images of `converter`'s representative dataset, stacked (its own batches)."""
    dataset = converter.representative_dataset
    generate = getattr(dataset, "input_gen", dataset)  # the converter wraps it
    return np.concatenate([np.asarray(batch[0]) for batch in generate()])
