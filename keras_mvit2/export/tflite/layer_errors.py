"""Which Keras layers cost accuracy in full int8: `layer_errors` and `plot_layer_errors`.

`layer_errors` converts the model exactly as ``to_tflite(quantization="int8")`` does (the
same traced function, converter settings, calibration images from
`keras_mvit2.export.calibration`, 1x1 convolution fusion before calibration and the
activation ranges of `keras_mvit2.export.tflite.activation_ranges`), hands the
converter to TensorFlow Lite's ``tf.lite.experimental.QuantizationDebugger`` and runs the
debug model on `images`. The debug model is the shipped int8 graph (float I/O) with a
``NumericVerify`` op after each quantized op: in its default per-layer mode the float
version of the op runs on the *same* dequantized input as the int8 op, so each op's
difference is its own quantization error, not the error accumulated upstream. What
differs from a file `to_tflite` writes: the NumericVerify ops and their float twins, and
the I/O (float here; int8/uint8 I/O only add a QUANTIZE / DEQUANTIZE at the boundary).

Per op (output tensor ``t``, int8 scale ``s``, float twin ``f``):

* ``rmse_over_scale = sqrt(mean((t - f)^2)) / s``: the error in quantization steps; plain
  rounding gives 1/sqrt(12) = 0.29, clipping, a blown-up weight range or a kernel's own
  approximation more (TensorFlow's recommended metric for this debugger);
* ``max_abs_error_over_scale = max|t - f| / s``;
* ``mean_error_over_scale = mean(t - f) / s``: the systematic part (a shifted output);
* ``std_error_over_scale = sqrt(mean((t - f)^2) - mean(t - f)^2) / s`` (over all images
  and elements): the error without a shift common to all images
  (``rank_by="std_error_over_scale"``). A shift of many steps points at a kernel: every
  attention's context product showed one of 5-14 steps here until the ranges gave that
  product's second operand zero point 0 (`activation_ranges.zero_offset_matmul_operands`).

Not measured: how coarse a step is for the signal (that needs the float twins' values,
which the debugger keeps only when run from a model file, where TF's interpreter fails on
these graphs).

Ops are named with the Keras layer they belong to (`keras_mvit2.export.tflite.layer_names`
states the rule) and aggregated per layer: its worst op's values, ranked by
``rmse_over_scale``.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

import keras
import numpy as np

from keras_mvit2.export.tflite.flatbuffer import (
    decode_name,
    op_names,
    read_flatbuffer,
    tensor_indices,
)
from keras_mvit2.export.tflite.layer_names import LayerNames
from keras_mvit2.utils.files import atomic_output

__all__ = [
    "ROUNDING_ONLY",
    "LayerError",
    "layer_errors",
    "layer_errors_of_file",
    "plot_layer_errors",
]

#: ``rmse_over_scale`` of pure rounding to the int8 grid (uniform error over one step).
ROUNDING_ONLY = 1.0 / math.sqrt(12.0)
_RANK_BY = ("rmse_over_scale", "std_error_over_scale")
#: The custom op the debug model compares each quantized op with its float twin through.
_NUMERIC_VERIFY = "NumericVerify"


@dataclasses.dataclass
class LayerError:
    """The int8 quantization error of one Keras layer (its worst op).

    Attributes:
        layer: the Keras layer path (``"stage3_block1/transformer_0/attn"``), or the op's
            output tensor name where no layer could be told (`mapped` False).
        mapped: whether `layer` is a Keras layer path.
        rmse_over_scale: RMS error of the worst op in its output's int8 steps (0.29 is
            rounding only).
        max_abs_error_over_scale: largest |error| of an op of the layer, in steps.
        mean_error_over_scale: the mean error (signed) of the worst op, in steps.
        std_error_over_scale: the largest error standard deviation (over the images and
            elements: without a constant shift) among its ops, in steps.
        num_ops: quantized ops of the layer that were measured.
        worst_op: TFLite op type of the worst op (``"CONV_2D"``).
        worst_tensor: that op's output tensor name.
        ops: every op: ``{"op", "tensor", "scale", "rmse_over_scale",
            "max_abs_error_over_scale", "mean_error_over_scale", "std_error_over_scale"}``,
            worst first.
    """

    layer: str
    mapped: bool
    rmse_over_scale: float
    max_abs_error_over_scale: float
    mean_error_over_scale: float
    std_error_over_scale: float
    num_ops: int
    worst_op: str
    worst_tensor: str
    ops: list[dict[str, Any]]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serializable dict (NaN stays NaN, as `json` writes it)."""
        return dataclasses.asdict(self)


def layer_errors(
    model: keras.Model,
    images: Any,
    *,
    calibration_data: Any = None,
    quantization: str = "int8",
    num_calibration_samples: int = 200,
    calibration_seed: int = 0,
    fuse_pointwise: bool = True,
    float_layers: Sequence[str] | None = None,
    image_size: int | tuple[int, int] | None = None,
    depth: int | None = None,
    rank_by: str = "rmse_over_scale",
    activation_ranges: str | None = None,
) -> list[LayerError]:
    """Ranks the layers of `model`'s full-int8 conversion by their own quantization error.

    Args:
        model: the Keras model (one image input), as for `to_tflite`.
        images: the images to measure on, ``(N, H, W, 3)`` float in [0, 1] or uint8, at
            the model's input size; held-out images, ideally not the calibration set.
            The debug model runs them one at a time.
        calibration_data: what `to_tflite`'s `representative_data` takes (a folder,
            ``"fashion_mnist"``, an array, a `tf.data.Dataset`); ``None`` calibrates on
            `images`.
        quantization: ``"int8"`` (the only one the debugger measures).
        num_calibration_samples: as for `to_tflite` (the same values of this and the
            three below give the same calibration and graph).
        calibration_seed: as for `to_tflite`.
        fuse_pointwise: as for `to_tflite`.
        image_size: as for `to_tflite`.
        float_layers: layers kept in float, as `to_tflite`'s `float_layers`: their ops are
            not measured and the others are measured as in that file.
        depth: aggregate at this many levels of the layer path (1: top-level layers such
            as ``"stage3_block1"``); ``None`` keeps the full path.
        rank_by: ``"rmse_over_scale"`` (TF's metric for this debugger) or
            ``"std_error_over_scale"`` (without constant shifts; see the module notes).
        activation_ranges: as for `to_tflite` (default: the int8 default, the 99.99 %
            interval).

    Returns:
        One `LayerError` per layer (and per unmapped op), worst first by `rank_by` (a
        layer's value: its worst op's).
    """
    import tensorflow as tf

    from keras_mvit2.export.tflite import convert as tflite_convert
    from keras_mvit2.export.tflite.activation_ranges import select_ranges
    from keras_mvit2.export.tflite.calibrated_quantize import representative_images

    if quantization != "int8":
        raise ValueError(
            "layer_errors measures full-integer int8 conversions (TensorFlow Lite's "
            f"QuantizationDebugger). Received: quantization={quantization!r}; use 'int8'."
        )
    if rank_by not in _RANK_BY:
        raise ValueError(f"rank_by must be one of {_RANK_BY}. Received: rank_by={rank_by!r}")
    if depth is not None and (isinstance(depth, bool) or not isinstance(depth, int) or depth < 1):
        raise ValueError(f"depth must be a positive int or None. Received: depth={depth!r}")
    source = images if calibration_data is None else calibration_data
    model, input_shape, _, quant = tflite_convert._checked_arguments(
        model, quantization="int8", io_dtype="float32", representative_data=source,
        image_size=image_size, batch_size=1, class_names=None,
        num_calibration_samples=num_calibration_samples, metadata=None,
        float_layers=float_layers,
    )
    x = _debug_images(images, input_shape)
    activation_ranges = tflite_convert._activation_ranges(activation_ranges, quant)
    calibration, _ = tflite_convert._calibration_data(
        source, quant, input_shape, num_calibration_samples, calibration_seed)
    converter = tflite_convert._make_converter(
        tflite_convert._concrete_function(model, input_shape), quant, "float32",
        calibration, batch=1)
    if fuse_pointwise:
        tflite_convert._fuse_before_calibration(converter, [])
    names = LayerNames(model)
    debug = tf.lite.experimental
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tf.lite.Interpreter's deprecation, converter notes
        debugger = debug.QuantizationDebugger(
            converter=converter, debug_dataset=_one_at_a_time(x[:1]))
        # The file's ranges, as to_tflite chooses them ("minmax" leaves the model as it is).
        debugger.calibrated_model = select_ranges(
            bytes(debugger.calibrated_model), representative_images(converter),
            activation_ranges)
        options = debug.QuantizationDebugOptions()
        if float_layers:
            from keras_mvit2.export.tflite.float_layers import selected_nodes

            nodes = selected_nodes(bytes(debugger.calibrated_model), names, float_layers)
            options = debug.QuantizationDebugOptions(denylisted_nodes=nodes)
        debugger.options = options  # (re)builds the debug model from the calibrated one
        debug_model = bytes(debugger.quant_model)
        shipped_names = _tensor_names(bytes(debugger.calibrated_model))
    rows = _measure(debug_model, x, shipped_names)  # outside: its warning must show
    return _aggregate(rows, names, depth, rank_by)


def _debug_images(images: Any, input_shape: tuple[int | None, ...]) -> np.ndarray:
    x = np.asarray(images)
    if x.dtype == np.uint8:
        x = x.astype(np.float32) / 255.0
    x = x.astype(np.float32)
    if x.ndim != 4 or tuple(x.shape[1:]) != tuple(input_shape[1:]) or not len(x):
        raise ValueError(
            f"images must be a non-empty batch (N, {', '.join(map(str, input_shape[1:]))}) at "
            f"the model's input size. Received: shape {x.shape}"
        )
    return x


def _tensor_names(flatbuffer: bytes) -> set[str]:
    return {decode_name(t.name) for t in read_flatbuffer(flatbuffer).subgraphs[0].tensors}


def _measure(debug_model: bytes, x: np.ndarray, names: set[str]) -> list[dict[str, Any]]:
    """Runs the debug model on each image and reduces each NumericVerify output (the
    op's int8 result minus its float twin's) to the per-op metrics.

    This is `QuantizationDebugger.run` with its default metrics, image by image: an image
    on which TF's interpreter fails (TF 2.21's int8 DIV refuses a divisor that quantizes
    to 0, where LiteRT's kernel runs on) is left out with a warning naming the op, instead
    of ending the whole run.
    """
    import tensorflow as tf

    fb = read_flatbuffer(debug_model)
    graph = fb.subgraphs[0]
    kinds = op_names(fb)
    producer = {i: op for op in graph.operators for i in tensor_indices(op.outputs)}
    verify = []  # (NumericVerify output, quantized tensor, float twin) indices
    for op in graph.operators:
        if kinds[op.opcodeIndex] == _NUMERIC_VERIFY:
            inputs = tensor_indices(op.inputs)  # (int8 result, float twin's result)
            verify.append((tensor_indices(op.outputs)[0], inputs[0], inputs[-1]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tf.lite.Interpreter's deprecation notice
        # TF's interpreter, not LiteRT's: it has the NumericVerify kernel.
        interpreter = tf.lite.Interpreter(model_content=debug_model)
    interpreter.allocate_tensors()
    index = interpreter.get_input_details()[0]["index"]
    sums = np.zeros((len(verify), 3))  # mean square, mean per image
    peaks = np.zeros(len(verify))
    done, failures = 0, {}
    for i in range(len(x)):
        interpreter.set_tensor(index, x[i : i + 1])
        try:
            interpreter.invoke()
        except RuntimeError as err:
            failures[i] = _failed_op(str(err), graph, kinds)
            continue
        done += 1
        for k, (out, _, _) in enumerate(verify):
            d = interpreter.get_tensor(out).astype(np.float64)
            sums[k] += (np.mean(d * d), np.mean(d), 0.0)
            peaks[k] = max(peaks[k], float(np.max(np.abs(d))) if d.size else 0.0)
    if failures:
        ops = sorted(set(failures.values()))
        warnings.warn(
            f"{len(failures)} of {len(x)} images could not be run in TF's interpreter "
            f"(images {sorted(failures)[:10]}; failing op: {'; '.join(ops)}): the int8 "
            "graph divides by a value that quantizes to 0 there. LiteRT runs such a file "
            "with a saturated result; keeping that layer in float (float_layers) avoids it. "
            "The ranking uses the other images.",
            stacklevel=3,
        )
    if not done:
        raise RuntimeError("layer_errors: the debug model failed on every image; see the "
                           "warning for the op.")
    rows = []
    for k, (_, quantized, twin) in enumerate(verify):
        tensor = graph.tensors[quantized]
        q = tensor.quantization
        scale = float(q.scale[0]) if q is not None and q.scale is not None and len(q.scale) \
            else 0.0
        mse, mean, _ = sums[k] / done
        variance = max(mse - mean * mean, 0.0)  # same-size images: the pooled variance
        op = producer.get(quantized)
        rows.append({
            "op": kinds[op.opcodeIndex] if op is not None else "?",
            "tensor": _shipped_name(graph.tensors[twin].name, tensor.name, names),
            "scale": scale,
            "rmse_over_scale": math.sqrt(mse) / scale if scale > 0 else math.nan,
            "max_abs_error_over_scale": peaks[k] / scale if scale > 0 else math.nan,
            "mean_error_over_scale": mean / scale if scale > 0 else math.nan,
            "std_error_over_scale": math.sqrt(variance) / scale if scale > 0 else math.nan,
        })
    return rows


def _shipped_name(twin: Any, quantized: Any, names: set[str]) -> str:
    """The name the calibrated graph (the shipped file) gives the op's output: the debug
    model appends a digit to the int8 tensor's name, or to both (the graph output)."""
    candidates = [decode_name(twin), decode_name(quantized)]
    for name in candidates + [c[:-1] for c in candidates] + [c[:-2] for c in candidates]:
        if name in names:
            return name
    return candidates[0]


def _failed_op(message: str, graph, kinds: list[str]) -> str:
    """``"DIV -> <tensor name>"`` for TF's ``Node number N (DIV) failed`` message."""
    match = re.search(r"Node number (\d+) \((\w+)\) failed", message)
    if not match or int(match.group(1)) >= len(graph.operators):
        return message.strip().splitlines()[-1][:200]
    op = graph.operators[int(match.group(1))]
    return f"{match.group(2)} -> {decode_name(graph.tensors[tensor_indices(op.outputs)[0]].name)}"


def _one_at_a_time(x: np.ndarray):
    def generate() -> Iterator[list[np.ndarray]]:
        for i in range(len(x)):
            yield [x[i : i + 1]]

    return generate


def _aggregate(rows: list[dict[str, Any]], names: LayerNames,
               depth: int | None, rank_by: str) -> list[LayerError]:
    groups: dict[str, list[dict[str, Any]]] = {}
    mapped: dict[str, bool] = {}
    for row in rows:
        owner = names.owner(row["tensor"])
        key = row["tensor"] if owner is None else "/".join(owner.split("/")[:depth])
        groups.setdefault(key, []).append(row)
        mapped[key] = owner is not None
    out = []
    for key, ops in groups.items():
        ops = sorted(ops, key=lambda r: _rank(r[rank_by]), reverse=True)
        out.append(LayerError(
            layer=key,
            mapped=mapped[key],
            rmse_over_scale=_nanmax(r["rmse_over_scale"] for r in ops),
            max_abs_error_over_scale=_nanmax(r["max_abs_error_over_scale"] for r in ops),
            mean_error_over_scale=ops[0]["mean_error_over_scale"],
            std_error_over_scale=_nanmax(r["std_error_over_scale"] for r in ops),
            num_ops=len(ops),
            worst_op=ops[0]["op"],
            worst_tensor=ops[0]["tensor"],
            ops=ops,
        ))
    return sorted(out, key=lambda e: _rank(getattr(e, rank_by)), reverse=True)


def _rank(value: float) -> float:
    return -math.inf if math.isnan(value) else value


def _nanmax(values) -> float:
    finite = [v for v in values if not math.isnan(v)]
    return max(finite) if finite else math.nan


def plot_layer_errors(errors: Sequence[LayerError], path: str | os.PathLike,
                      top: int = 20, metric: str = "rmse_over_scale") -> str:
    """Writes a horizontal bar chart (PNG) of the first `top` of `errors` (in their order:
    `layer_errors` ranks them) by `metric` (``"rmse_over_scale"`` or
    ``"std_error_over_scale"``), with the rounding-only level (0.29) marked; atomically.
    Returns the path."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    if isinstance(top, bool) or not isinstance(top, int) or top < 1:
        raise ValueError(f"top must be a positive int. Received: top={top!r}")
    if metric not in _RANK_BY:
        raise ValueError(f"metric must be one of {_RANK_BY}. Received: metric={metric!r}")
    shown = [e for e in errors if not math.isnan(getattr(e, metric))][:top]
    if not shown:
        raise ValueError("plot_layer_errors needs at least one measured layer.")
    labels = [_short(e.layer) for e in shown][::-1]
    values = [getattr(e, metric) for e in shown][::-1]
    figure = Figure(figsize=(8.0, 1.2 + 0.3 * len(shown)))
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    axes.barh(labels, values, color="tab:red")
    axes.axvline(ROUNDING_ONLY, color="black", linestyle="--", linewidth=1,
                 label="rounding only (0.29)")
    if max(values) / max(min(values), 1e-12) > 30:
        axes.set_xscale("log")
    what = "RMS error" if metric == "rmse_over_scale" else "error std (no constant shift)"
    axes.set_xlabel(f"{what} / int8 scale (worst op of the layer)")
    axes.set_title(f"int8 quantization error per Keras layer (top {len(shown)})")
    axes.legend(loc="lower right")
    figure.tight_layout()
    path = os.fspath(path)
    with atomic_output(path) as tmp:
        figure.savefig(tmp, format="png", dpi=100)
    return path


def _short(name: str, width: int = 60) -> str:
    return name if len(name) <= width else "..." + name[-(width - 3):]


def layer_errors_of_file(
    model: keras.Model, path: str | os.PathLike, images: Any
) -> tuple[list[LayerError], list[str]]:
    """`layer_errors` of `model` with the recipe a full-int8 `.tflite` from `to_tflite`
    records in its metadata (calibration source, number of images and seed, 1x1 fusion,
    `float_layers`), measured on `images`; and notes for the report.

    Fashion-MNIST and image folders that still exist are calibrated on again (the same
    images: seeded subset); other sources (an array, a `tf.data.Dataset`) cannot be, and
    then `images` calibrate instead, which a note says. A seed not recorded is the default,
    0. Raises ValueError for a file that is not a full-int8 export of keras_mvit2.
    """
    from keras_mvit2.export.tflite.metadata import read_tflite_metadata

    path = os.fspath(path)
    if not path.endswith(".tflite"):
        raise ValueError(
            f"The per-layer ranking needs a full-int8 .tflite file. Received: {path!r}. Fix: "
            "export one with `mvit2 export MODEL -o m.tflite --quantization int8 "
            "--calibration-data DIR|fashion_mnist`."
        )
    meta = read_tflite_metadata(path) or {}
    quantization = meta.get("quantization")
    if quantization != "int8":
        what = f"quantization {quantization!r}" if quantization else "no keras_mvit2 metadata"
        raise ValueError(
            f"The per-layer ranking compares a full-int8 file with float; {path!r} has "
            f"{what}. Fix: export the model with `--quantization int8 --calibration-data "
            "DIR|fashion_mnist` (to_tflite(quantization='int8')) and pass that file."
        )
    calibration = meta.get("calibration") or {}
    source = calibration.get("source")
    notes = []
    if isinstance(source, str) and (source.startswith("fashion_mnist") or os.path.isdir(source)):
        data, count = source, int(calibration.get("num_samples") or 200)
    else:
        data, count = None, 200
        notes.append(
            f"per-layer: the file's calibration ({source!r}) cannot be reproduced here; the "
            f"ranking calibrates on the {len(images)} validation images instead, so its int8 "
            "ranges may differ from the file's."
        )
    errors = layer_errors(
        model, images, calibration_data=data, num_calibration_samples=count,
        calibration_seed=int(calibration.get("seed", 0)),
        fuse_pointwise=meta.get("graph_optimizations") is not None,
        float_layers=calibration.get("float_layers") or None,
        activation_ranges=calibration.get("activation_ranges") or "minmax",
    )
    notes.append(
        f"per-layer: {len(errors)} layers ranked on {len(images)} images, calibrated like the "
        f"file ({data if data is not None else 'validation images'}, {count} images)."
    )
    return errors, notes
