"""Running `.tflite` files in ``ai_edge_litert``: `run_tflite` and the checks `to_tflite`
runs before it writes a file.

`_check_runs` runs a converted file once (a dynamic batch with batches 2 and 1, which must
agree) and refuses un-frozen variables and non-finite outputs; `_sanity_check` warns when a
calibrated model grossly disagrees with Keras.
"""

from __future__ import annotations

import os
import warnings
from typing import Any

import keras
import numpy as np
from ai_edge_litert.interpreter import Interpreter

from keras_mvit2.export.tflite.inspect import _read_flatbuffer
from keras_mvit2.export.tflite.quantization import TFLiteQuantization

__all__ = ["run_tflite"]

#: Ops that mean the model still holds un-frozen variables (broken conversion).
_VARIABLE_OPS = ("VAR_HANDLE", "READ_VARIABLE", "ASSIGN_VARIABLE")


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
        feed = _to_input(x[start : start + chunk], in_detail)
        interpreter.set_tensor(in_detail["index"], np.ascontiguousarray(feed))
        interpreter.invoke()
        results.append(_dequantize(interpreter.get_tensor(out_detail["index"]), out_detail))
    return np.concatenate(results, axis=0)


def _to_input(x: np.ndarray, detail: dict[str, Any]) -> np.ndarray:
    """`x` in the input's type: cast for a float input, else quantized (from float32) with
    the tensor's scale and zero point."""
    dtype = np.dtype(detail["dtype"])
    if np.issubdtype(dtype, np.floating):
        return x.astype(dtype)
    x = x.astype("float32")
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
        feeds = [_to_input(rng.random([int(d) for d in t["shape"]], dtype=np.float32), t)
                 for t in details]
        _invoke_checked(interpreter, feeds, resize=False, what="once")
        return
    # Dynamic batch: batch 2, then the first sample alone must give the same result.
    feeds = []
    for t in details:
        shape = [int(d) for d in t["shape_signature"]]
        shape = [2, *(1 if d < 0 else d for d in shape[1:])]
        feeds.append(_to_input(rng.random(shape, dtype=np.float32), t))
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


def _sanity_check(
    model: keras.Model, path: str, calibration: np.ndarray, quantization: TFLiteQuantization
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
            if quantization.int16_activations else ""
        )
        warnings.warn(
            f"The {quantization.name} model disagrees with Keras on {len(x)} calibration images: "
            f"max |diff| is {rel:.0%} of the largest output, top-1 agreement {agreement:.0%}."
            f"{hint} Check it with keras_mvit2.export.validate before shipping it.",
            stacklevel=4,  # here <- _write_checked <- to_tflite <- the caller of to_tflite
        )
