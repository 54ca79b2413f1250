"""Why full int8 loses MobileViTV2-0.5's answers at 256x256: the measurements of docs/int8.md.

    python benchmarks/int8_root_cause.py
        [--model runs/int8_fidelity/mobilevitv2_050_256_seed0.keras]
        [--test-images 300] [--out benchmarks/results]

Runs on a model trained by `benchmarks/int8_fidelity.py` (its first 256x256 MobileViTV2-0.5
by default; the calibration and test images are that benchmark's). Sections of
``int8_root_cause.json`` / ``.md``:

* ``prefix``: the error of an int8 prefix feeding a float suffix. The int8 file runs on
  each test image with every tensor kept; at the output of each top-level Keras layer
  (where the file has that tensor) its dequantized value goes through the float Keras
  layers that follow: argmax agreement with Keras and the logits' relative error, for the
  converter's min / max ranges and for the default ranges. Cumulative: everything before
  the boundary is int8, everything after is float.
* ``ranges``: per activation tensor the calibrated (min / max) range against its 99.9 and
  99.99 % intervals and its RMS (`keras_mvit2.export.tflite.activation_ranges.RangeStats`),
  summarised by the op that writes it, for the same weights at 256x256 and at 64x64.
* ``channels``: per-channel ranges of the tensors that enter a 1x1 convolution after each
  GroupNorm and after each attention (largest / median channel range; share of the
  tensor's range the median channel uses).
* ``suspects``: each suspect changed alone in the default int8 file, agreement and logit
  error: the GroupNorm statistics (one-pass variance over the tokens) kept float, the
  centred variance form, the ``exp_mean`` normaliser kept float, the token sum's other
  forms, the 1x1 fusion before calibration off, and how many ops `float_layers` keeps
  float for one GroupNorm and one attention against the ops those layers have.
* ``noise_budget``: how many tensors each int8 file rounds, and how finely: ours against
  the MobileNetV2 control of `benchmarks/int8_fidelity.py`, at 256x256 and 64x64, every
  seed whose files that benchmark wrote (``--only noise``: this section with the next two).
* ``one_rounding``: in the float model, uniform noise of one step added to the stem's
  output alone (conv + BN, the file's first int8 tensor), white or smooth (drawn at a
  fraction of the resolution and upsampled, same power): how much one rounding costs.
* ``float_islands``: the default int8 file with its first layers kept float
  (`to_tflite(float_layers=...)`).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import os
import re
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import int8_fidelity as fidelity  # noqa: E402

CHANNEL_TENSORS = {
    "after GroupNorm (into qkv / fc1 / conv_proj)": r"norm\d?_1/add_1$",
    "after attention: ReLU(v) * context (into out_proj)": r"attn_1/mul_3$",
}
SUSPECTS = {
    "default int8 (p99.99 ranges)": {},
    "GroupNorm statistics float (mean, E[x^2], rsqrt)":
        {"float_ops": r"norm\d?_1/(Mean|Mean_1|mul|mul_1|mul_2|mul_3|sub|sub_1|add|Rsqrt)$"},
    "GroupNorm centred variance form": {"forms": {"variance": "centred"}},
    "exp_mean normaliser float (max, exp, N * mean, division)":
        {"float_ops": r"attn_1/(Max|sub|Exp|mul|Mean|truediv)$"},
    "token sum as product_sum": {"forms": {"token_pooling": "product_sum"}},
    "token sum as product_mean": {"forms": {"token_pooling": "product_mean"}},
    "no 1x1 fusion before calibration": {"fuse_pointwise": False},
}
FLOAT_LAYERS = ["stage3_block1/transformer_0/norm1", "stage3_block1/transformer_0/attn"]


def _top_level(model):
    import keras

    return [layer for layer in model.layers if not isinstance(layer, keras.layers.InputLayer)]


def _keep_all_interpreter(path: str):
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    interpreter = Interpreter(
        model_path=path, experimental_preserve_all_tensors=True,
        experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
    interpreter.allocate_tensors()
    return interpreter


def _dequantized(interpreter, detail):
    """A kept tensor as float (`keras_mvit2.export.tflite.run`'s dequantization)."""
    from keras_mvit2.export.tflite.run import _dequantize

    return _dequantize(interpreter.get_tensor(detail["index"]), detail)


def prefix_errors(model, path: str, images, reference) -> list[dict]:
    """Agreement / logit error with int8 up to each top-level layer, float after it."""
    import keras
    import numpy as np

    layers = _top_level(model)
    interpreter = _keep_all_interpreter(path)
    details = interpreter.get_tensor_details()
    writers = [i for op in interpreter._get_ops_details() for i in op["outputs"]]
    boundaries = {}
    for index, layer in enumerate(layers[:-1]):
        pattern = re.compile(rf"/{re.escape(layer.name)}(_\d+)?/")
        shape = tuple(layer.output.shape[1:])
        # The last tensor the layer writes with the layer's output shape (its output, where
        # the converter kept it: a 1x1 fusion or a folded BN can remove it).
        # (The last ";" part names what the tensor holds: a conv with its BN folded into it
        # writes the BN's output, not the conv's.)
        found = [i for i in writers
                 if pattern.search(details[i]["name"].split(";")[-1])
                 and tuple(details[i]["shape"][1:]) == shape]
        if found and _is_layer_output(layer, details[found[-1]]["name"]):
            boundaries[index] = details[found[-1]]
    values = {index: [] for index in boundaries}
    source = interpreter.get_input_details()[0]
    for image in images:
        interpreter.set_tensor(source["index"], image[None].astype(np.float32))
        interpreter.invoke()
        for index, detail in boundaries.items():
            values[index].append(_dequantized(interpreter, detail)[0])
    rows = []
    for index in sorted(boundaries):
        x = np.stack(values[index])
        outputs = []
        for start in range(0, len(x), 32):
            y = keras.ops.convert_to_tensor(x[start:start + 32])
            for layer in layers[index + 1:]:
                y = layer(y, training=False)
            outputs.append(keras.ops.convert_to_numpy(y))
        out = np.concatenate(outputs)
        rows.append({"int8 up to": layers[index].name, **fidelity_figures(out, reference)})
    return rows


def _is_layer_output(layer, name: str) -> bool:
    """Whether tensor `name` is the output of `layer` rather than an inner tensor of it."""
    from keras_mvit2.layers.inverted_residual import InvertedResidual
    from keras_mvit2.models import MobileViTV2Block

    last = name.split(";")[-1]
    if isinstance(layer, MobileViTV2Block):
        return "proj_bn" in name
    if isinstance(layer, InvertedResidual):
        return "project_bn" in name or last.endswith("/add")
    return True


def fidelity_figures(out, reference) -> dict:
    import numpy as np

    return {
        "agreement": float(np.mean(out.argmax(1) == reference.argmax(1))),
        "logit_rel_error": float(
            np.sqrt(((out - reference) ** 2).mean() / (reference ** 2).mean())),
    }


def range_summary(stats) -> list[dict]:
    """RangeStats grouped by the op that writes the tensor: medians of the ratios."""
    import numpy as np

    groups = collections.defaultdict(list)
    for s in stats:
        groups[s.op].append(s)
    rows = []
    for op, items in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        def width(r):
            return r[1] - r[0]

        rows.append({
            "op": op, "tensors": len(items),
            "max_abs_over_rms": float(np.median([
                max(abs(s.calibrated[0]), abs(s.calibrated[1])) / max(s.rms, 1e-12)
                for s in items])),
            "calibrated_over_p99_99": float(np.median([
                width(s.calibrated) / max(width(s.p99_99), 1e-12) for s in items])),
            "calibrated_over_p99_9": float(np.median([
                width(s.calibrated) / max(width(s.p99_9), 1e-12) for s in items])),
            "rms_in_minmax_steps": float(np.median([
                s.rms / max(width(s.calibrated) / 255, 1e-12) for s in items])),
            "rms_in_chosen_steps": float(np.median([
                s.rms / max(width(s.chosen) / 255, 1e-12) for s in items])),
        })
    return rows


def calibration_stats(model, calibration) -> list:
    """RangeStats of every activation of `model`'s int8 conversion on `calibration`."""
    from keras_mvit2.export.tflite import convert
    from keras_mvit2.export.tflite.activation_ranges import select_ranges

    shape = (1, *model.inputs[0].shape[1:])
    converter = convert._make_converter(
        convert._concrete_function(model, shape), "int8", "float32", calibration)
    convert._fuse_before_calibration(converter, [])
    converter._experimental_calibrate_only = True
    calibrated = bytes(converter.convert())
    stats: list = []
    select_ranges(calibrated, calibration, "p99.99", stats=stats)
    return stats


def channel_spreads(float_file: str, images) -> list[dict]:
    import numpy as np

    interpreter = _keep_all_interpreter(float_file)
    details = interpreter.get_tensor_details()
    source = interpreter.get_input_details()[0]
    picked = {kind: [d for d in details if re.search(pattern, d["name"])]
              for kind, pattern in CHANNEL_TENSORS.items()}
    values = collections.defaultdict(list)
    for image in images:
        interpreter.set_tensor(source["index"], image[None].astype(np.float32))
        interpreter.invoke()
        for kind, found in picked.items():
            for d in found:
                values[(kind, d["name"])].append(interpreter.get_tensor(d["index"]))
    rows = []
    for (kind, name), vs in values.items():
        v = np.stack(vs)
        v = v.reshape(-1, v.shape[-1])
        per_channel = v.max(0) - v.min(0)
        median = float(np.median(per_channel))
        rows.append({"tensor": kind, "name": name.split(";")[-1],
                     "largest_over_median": float(per_channel.max() / max(median, 1e-12)),
                     "median_over_tensor": float(median / max(v.max() - v.min(), 1e-12))})
    return rows


#: Ops that move int8 values without requantizing them (same scale in and out).
MOVING_OPS = frozenset({"RESHAPE", "SPACE_TO_DEPTH", "DEPTH_TO_SPACE", "PAD", "CONCATENATION",
                        "SPLIT", "STRIDED_SLICE", "TRANSPOSE", "QUANTIZE", "MAX_POOL_2D"})
NOISE_BUDGET_FILES = {"mobilevitv2_050 int8 default": "mobilevitv2_050_int8_p99.99.tflite",
                      "mobilenetv2_050 plain converter": "mobilenetv2_050_int8_float32.tflite"}


def rounding_census(int8_file: str, images) -> dict:
    """The int8 tensors a file requantizes and their RMS in steps, on `images`.

    A requantized tensor is an int8 output of an op that computes (not of a reshape,
    pad, ...); a feature map is one with more than one position (not a per-sample
    statistic such as a GroupNorm mean). Each adds its own rounding noise, about
    ``step / sqrt(12)``, relative to a signal of ``RMS`` (here counted in steps).
    """
    import numpy as np

    interpreter = _keep_all_interpreter(int8_file)
    details = {d["index"]: d for d in interpreter.get_tensor_details()}
    source = interpreter.get_input_details()[0]
    ops = interpreter._get_ops_details()
    computed = [(op["op_name"], i) for op in ops for i in op["outputs"]
                if details[i]["dtype"] == np.int8 and op["op_name"] not in MOVING_OPS]
    squares = collections.defaultdict(list)
    for image in images:
        interpreter.set_tensor(source["index"], image[None].astype(source["dtype"]))
        interpreter.invoke()
        for _, i in computed:
            q = interpreter.get_tensor(i).astype(np.float64) - details[i]["quantization"][1]
            squares[i].append(float(np.mean(q ** 2)))
    maps = [(op, i) for op, i in computed
            if len(details[i]["shape"]) == 4 and np.prod(details[i]["shape"][1:3]) > 1]
    rms = {i: float(np.sqrt(np.mean(squares[i]))) for _, i in computed}
    return {"ops": len(ops), "requantized": len(computed),
            "feature_maps": len(maps),
            "feature_maps_by_op": dict(collections.Counter(op for op, _ in maps)),
            "feature_map_rms_in_steps": float(np.median([rms[i] for _, i in maps])),
            "conv_rms_in_steps": float(np.median([
                rms[i] for op, i in maps if op in ("CONV_2D", "DEPTHWISE_CONV_2D")]))}


def noise_budget(work: str, test_images: int = 16) -> dict:
    """`rounding_census` of ours and the control, per size, medians over the seeds."""
    import numpy as np

    x, _ = fidelity.fashion_mnist("test", test_images)
    table: dict = {}
    for size in (256, 64):
        images = np.asarray(fidelity.as_model_input(x, size))
        for label, name in NOISE_BUDGET_FILES.items():
            paths = sorted(os.path.join(work, d, name) for d in os.listdir(work)
                           if d.startswith(f"{size}_seed")
                           and os.path.exists(os.path.join(work, d, name)))
            if not paths:
                continue
            census = [rounding_census(p, images) for p in paths]
            row = {k: (float(np.median([c[k] for c in census])) if k != "feature_maps_by_op"
                       else census[0][k]) for k in census[0]}
            table[f"{size} {label}"] = {"seeds": len(paths), **row}
            print(size, label, table[f"{size} {label}"], flush=True)
    return table


#: The layer whose output takes the noise of `one_rounding`, the steps per RMS tried (the
#: file's step there, the control's typical step, ours), and the one smooth noise is tried at.
STEM_OUTPUT = "stem_bn"
STEPS_PER_RMS = (51, 26, 17)
SMOOTH_AT_STEPS = 26
FLOAT_ISLANDS = {"none (the default file)": None,
                 "stem": ["stem_conv", "stem_bn", "stem_act"],
                 "stem and stage 0": ["stem_conv", "stem_bn", "stem_act", "stage0_block0"]}


def one_rounding(model, images, reference) -> list[dict]:
    """Agreement / logit error with one int8 step of uniform noise on `STEM_OUTPUT` alone."""
    import keras
    import numpy as np
    import tensorflow as tf

    stem = keras.Model(model.inputs, model.get_layer(STEM_OUTPUT).output)
    rest = keras.Model(model.get_layer(STEM_OUTPUT).output, model.outputs)
    h = np.asarray(stem.predict(images, batch_size=32, verbose=0))
    rms = float(np.sqrt(np.mean(h ** 2)))
    rng = np.random.default_rng(0)
    rows = []

    def measure(delta, **row):
        out = np.asarray(rest.predict(h + delta, batch_size=32, verbose=0))
        rows.append({**row, **fidelity_figures(out, reference)})
        print(rows[-1], flush=True)

    for steps in STEPS_PER_RMS:
        step = rms / steps
        white = rng.uniform(-step / 2, step / 2, h.shape).astype(np.float32)
        measure(white, noise="white", steps_per_rms=steps)
        if steps != SMOOTH_AT_STEPS:
            continue
        for factor in (2, 4, 8):
            coarse = rng.uniform(-1, 1, (h.shape[0], h.shape[1] // factor,
                                         h.shape[2] // factor, h.shape[3])).astype(np.float32)
            smooth = np.array(tf.image.resize(coarse, h.shape[1:3], method="bilinear"))
            measure(smooth * (white.std() / smooth.std()), noise=f"smooth (1/{factor})",
                    steps_per_rms=steps)
    return rows


def float_islands(model, folder: str, calibration, images, reference) -> dict:
    """The default int8 file with each `FLOAT_ISLANDS` entry kept float (None: none)."""
    import keras_mvit2 as mv
    from keras_mvit2.export.tflite.run import run_tflite

    rows = {}
    for name, layers in FLOAT_ISLANDS.items():
        path = os.path.join(folder, "island.tflite")
        mv.export.to_tflite(model, path, quantization="int8", representative_data=calibration,
                            float_layers=layers)
        rows[name] = fidelity_figures(run_tflite(path, images), reference)
        print(name, rows[name], flush=True)
    return rows


def convert_variant(model, path: str, calibration, *, forms=None, float_ops=None,
                    fuse_pointwise=True) -> None:
    """The default int8 file with one thing changed (`SUSPECTS`)."""
    import keras_mvit2 as mv
    from keras_mvit2.layers import export_forms

    if float_ops is None:
        mv.export.to_tflite(model, path, quantization="int8", representative_data=calibration,
                            fuse_pointwise=fuse_pointwise, allow_float_ops=True,
                            forms=dataclasses.replace(export_forms.INT8, **(forms or {})))
        return
    from keras_mvit2.export.tflite import convert
    from keras_mvit2.export.tflite.activation_ranges import select_ranges
    from keras_mvit2.export.tflite.calibrated_quantize import quantize_after_calibration
    from keras_mvit2.export.tflite.flatbuffer import decode_name, parse_flatbuffer

    shape = (1, *model.inputs[0].shape[1:])
    converter = convert._make_converter(
        convert._concrete_function(model, shape), "int8", "float32", calibration)
    convert._fuse_before_calibration(converter, [])

    def denylist(calibrated: bytes) -> list[str]:
        fb = parse_flatbuffer(calibrated)
        tensors = fb.subgraphs[0].tensors
        names = [decode_name(tensors[op.outputs[0]].name) for op in fb.subgraphs[0].operators]
        return [n for n in names if re.search(float_ops, n)]

    quantize_after_calibration(
        converter, edit=lambda c: select_ranges(c, calibration, "p99.99"),
        denylisted_nodes=denylist)
    with open(path, "wb") as f:
        f.write(converter.convert())


def float_layer_op_counts(model, folder: str, calibration) -> dict:
    """Ops `float_layers` keeps float for `FLOAT_LAYERS`, against the ops of those layers in
    the float32 file (by the same naming rule)."""
    import keras_mvit2 as mv
    from keras_mvit2.export.tflite.flatbuffer import decode_name, op_names, parse_flatbuffer
    from keras_mvit2.export.tflite.inspect import _FLOAT_TENSOR_TYPES
    from keras_mvit2.export.tflite.layer_names import LayerNames

    names = LayerNames(model)
    path = os.path.join(folder, "float_layers.tflite")
    mv.export.to_tflite(model, path, quantization="int8", representative_data=calibration,
                        float_layers=FLOAT_LAYERS)
    f32 = os.path.join(folder, "float32.tflite")

    def count(file: str, float_only: bool) -> dict:
        fb = parse_flatbuffer(file)
        kinds = op_names(fb)
        tensors = fb.subgraphs[0].tensors
        counts: dict = {}
        for op in fb.subgraphs[0].operators:
            out = tensors[op.outputs[0]]
            layer = next((n for n in FLOAT_LAYERS
                          if names.selected(decode_name(out.name), [n])), None)
            if layer is None or kinds[op.opcodeIndex] in ("QUANTIZE", "DEQUANTIZE"):
                continue
            if float_only and int(out.type) not in _FLOAT_TENSOR_TYPES:
                continue
            counts.setdefault(layer, collections.Counter())[kinds[op.opcodeIndex]] += 1
        return {k: dict(v) for k, v in counts.items()}

    return {"float32 file: ops of the layers": count(f32, False),
            "int8 file: float ops of the layers": count(path, True)}


def conv_output_bias(float_file: str, int8_file: str, images) -> dict:
    """What bias correction would remove: per convolution output channel, the mean of the
    int8 file's error (against the float32 file, same tensor names) over the images and
    positions, relative to the tensor's RMS. Medians / maxima over the channels and tensors."""
    import numpy as np

    float_run, int8_run = _keep_all_interpreter(float_file), _keep_all_interpreter(int8_file)
    kinds = {i: op["op_name"] for op in int8_run._get_ops_details() for i in op["outputs"]}
    float_index = {d["name"]: d for d in float_run.get_tensor_details()}
    picked = [d for d in int8_run.get_tensor_details()
              if kinds.get(d["index"]) in ("CONV_2D", "DEPTHWISE_CONV_2D")
              and d["name"] in float_index and d["quantization"][0]]
    errors = collections.defaultdict(list)
    signal = collections.defaultdict(list)
    for image in images:
        for run in (float_run, int8_run):
            source = run.get_input_details()[0]
            run.set_tensor(source["index"], image[None].astype(np.float32))
            run.invoke()
        for d in picked:
            reference = float_run.get_tensor(float_index[d["name"]]["index"]).astype(np.float64)
            got = _dequantized(int8_run, d).astype(np.float64)
            channels = reference.shape[-1]
            errors[d["name"]].append((got - reference).reshape(-1, channels).mean(0))
            signal[d["name"]].append(float(np.sqrt(np.mean(reference ** 2))))
    per_tensor = []
    for name in errors:
        bias = np.abs(np.mean(errors[name], axis=0)) / max(np.mean(signal[name]), 1e-12)
        per_tensor.append((float(np.median(bias)), float(np.max(bias))))
    return {"tensors": len(per_tensor),
            "median_channel_bias_over_rms": float(np.median([m for m, _ in per_tensor])),
            "largest_channel_bias_over_rms": float(np.max([x for _, x in per_tensor]))}


def bias_correction(model, calibration, images, reference, rounds: int = 2) -> list[dict]:
    """Empirical bias correction (Nagel et al. 2019) on the default int8 file, measured: per
    convolution (in the calibrated float graph), the mean error of each output channel of
    the int8 file on 48 calibration images is subtracted from the convolution's float bias,
    all at once, and the graph is quantized again; `rounds` times."""
    import numpy as np
    import tensorflow as tf
    from tensorflow.lite.python.convert import mlir_quantize

    from keras_mvit2.export.tflite import convert
    from keras_mvit2.export.tflite.activation_ranges import select_ranges
    from keras_mvit2.export.tflite.flatbuffer import (
        decode_name,
        op_names,
        parse_flatbuffer,
        serialize_flatbuffer,
        tensor_indices,
    )
    from keras_mvit2.export.tflite.run import run_tflite

    shape = (1, *model.inputs[0].shape[1:])
    converter = convert._make_converter(
        convert._concrete_function(model, shape), "int8", "float32", calibration)
    convert._fuse_before_calibration(converter, [])
    converter._experimental_calibrate_only = True
    calibrated = select_ranges(bytes(converter.convert()), calibration, "p99.99")
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        float_path, int8_path = (os.path.join(folder, n) for n in ("cal.tflite", "q.tflite"))
        for step in range(rounds + 1):
            with open(int8_path, "wb") as f:
                f.write(mlir_quantize(calibrated, False, input_data_type=tf.float32,
                                      output_data_type=tf.float32))
            rows.append({"rounds": step, **fidelity_figures(run_tflite(int8_path, images),
                                                            reference)})
            print("bias correction", rows[-1], flush=True)
            if step == rounds:
                break
            with open(float_path, "wb") as f:
                f.write(calibrated)
            quantized, floating = (_keep_all_interpreter(p) for p in (int8_path, float_path))
            q_details = {d["name"]: d for d in quantized.get_tensor_details()}
            f_details = {d["name"]: d for d in floating.get_tensor_details()}
            fb = parse_flatbuffer(calibrated)
            graph, kinds = fb.subgraphs[0], op_names(fb)
            convs = []
            for op in graph.operators:
                inputs = tensor_indices(op.inputs)
                out = decode_name(graph.tensors[op.outputs[0]].name)
                if (kinds[op.opcodeIndex] in ("CONV_2D", "DEPTHWISE_CONV_2D") and len(inputs) > 2
                        and inputs[2] >= 0 and out in q_details and out in f_details):
                    convs.append((inputs[2], out))
            errors = {out: 0.0 for _, out in convs}
            used = calibration[:48]
            for image in used:
                for run in (quantized, floating):
                    run.set_tensor(run.get_input_details()[0]["index"], image[None])
                    run.invoke()
                for _, out in convs:
                    got = _dequantized(quantized, q_details[out])
                    want = floating.get_tensor(f_details[out]["index"])
                    errors[out] = errors[out] + (got - want).reshape(
                        -1, want.shape[-1]).mean(0) / len(used)
            for bias_index, out in convs:
                buffer = fb.buffers[graph.tensors[bias_index].buffer]
                bias = np.frombuffer(np.asarray(buffer.data, np.uint8).tobytes(), np.float32)
                buffer.data = np.frombuffer((bias - errors[out]).astype(np.float32).tobytes(),
                                            np.uint8)
            calibrated = serialize_flatbuffer(fb, len(calibrated) + 1024)
    return rows


def mse_clipping(model, calibration) -> list[dict]:
    """The share of each tensor's min / max width the ``mse`` and ``p99.99`` methods keep, by
    the op that writes the tensor (medians)."""
    import numpy as np

    from keras_mvit2.export.tflite import convert
    from keras_mvit2.export.tflite.activation_ranges import select_ranges

    shape = (1, *model.inputs[0].shape[1:])
    converter = convert._make_converter(
        convert._concrete_function(model, shape), "int8", "float32", calibration)
    convert._fuse_before_calibration(converter, [])
    converter._experimental_calibrate_only = True
    stats: list = []
    select_ranges(bytes(converter.convert()), calibration, "mse", stats=stats)
    groups = collections.defaultdict(list)
    for st in stats:
        width = max(st.calibrated[1] - st.calibrated[0], 1e-12)
        groups[st.op].append(((st.chosen[1] - st.chosen[0]) / width,
                             (st.p99_99[1] - st.p99_99[0]) / width))
    return [{"tensor": op, "tensors": len(v),
             "kept_share_median": float(np.median([m for m, _ in v])),
             "p99_99_kept_share_median": float(np.median([p for _, p in v]))}
            for op, v in sorted(groups.items(), key=lambda kv: -len(kv[1]))]


def main(argv: list[str] | None = None) -> int:
    import keras
    import numpy as np

    import keras_mvit2 as mv
    from keras_mvit2.export.tflite.run import run_tflite

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=os.path.join(
        ROOT, "runs", "int8_fidelity", "mobilevitv2_050_256_seed0.keras"))
    parser.add_argument("--test-images", type=int, default=300)
    parser.add_argument("--train-images", type=int, default=3000)
    parser.add_argument("--out", default=os.path.join(HERE, "results"))
    parser.add_argument("--only", choices=("bias", "noise"),
                        help="only these sections, merged into an existing "
                             "int8_root_cause.json: bias: the convolution-bias, "
                             "bias-correction and range-share sections; noise: the noise "
                             "budget")
    args = parser.parse_args(argv)
    model = keras.saving.load_model(args.model, compile=False)
    size = int(model.inputs[0].shape[1])
    x_train, _ = fidelity.fashion_mnist("train", args.train_images)
    calibration = np.asarray(fidelity.as_model_input(
        x_train[:fidelity.CALIBRATION_IMAGES], size))
    x, _ = fidelity.fashion_mnist("test", args.test_images)
    images = np.asarray(fidelity.as_model_input(x, size))
    reference = np.asarray(model.predict(images, batch_size=32, verbose=0))
    record: dict = {"model": os.path.relpath(args.model, ROOT), "size": size,
                    "test_images": len(images)}
    json_path = os.path.join(args.out, "int8_root_cause.json")
    if args.only and os.path.exists(json_path):
        with open(json_path) as f:
            record = json.load(f)
    if args.only in (None, "noise"):
        record["noise_budget"] = noise_budget(os.path.dirname(os.path.abspath(args.model)))
        record["noise_test_images"] = len(images)
        record["one_rounding"] = one_rounding(model, images, reference)
        with tempfile.TemporaryDirectory() as folder:
            record["float_islands"] = float_islands(model, folder, calibration, images,
                                                    reference)
    if args.only == "noise":
        _write(record, args.out)
        return 0
    with tempfile.TemporaryDirectory() as folder:
        f32 = os.path.join(folder, "float32.tflite")
        int8 = os.path.join(folder, "int8.tflite")
        mv.export.to_tflite(model, f32)
        mv.export.to_tflite(model, int8, quantization="int8", representative_data=calibration)
        record["conv_output_bias"] = conv_output_bias(f32, int8, images[:16])
        record["mse_clipping"] = mse_clipping(model, calibration)
        print(record["conv_output_bias"], record["mse_clipping"], flush=True)
    record["bias_correction"] = bias_correction(model, calibration, images, reference)
    if args.only:
        _write(record, args.out)
        return 0
    with tempfile.TemporaryDirectory() as folder:
        f32 = os.path.join(folder, "float32.tflite")
        mv.export.to_tflite(model, f32)
        files = {}
        for method in ("minmax", "p99.99"):
            files[method] = os.path.join(folder, f"int8_{method}.tflite")
            mv.export.to_tflite(model, files[method], quantization="int8",
                                representative_data=calibration, activation_ranges=method)
        record["prefix"] = {
            method: prefix_errors(model, path, images, reference)
            + [{"int8 up to": "(whole file)", **fidelity_figures(
                run_tflite(path, images), reference)}]
            for method, path in files.items()}
        print(json.dumps(record["prefix"], indent=1), flush=True)
        record["channels"] = channel_spreads(f32, images[:8])
        small = mv.MobileViTV2(0.5, input_shape=(64, 64, 3), classes=model.outputs[0].shape[-1],
                               classifier_activation=None)
        small.set_weights(model.get_weights())
        small_calibration = np.asarray(fidelity.as_model_input(
            x_train[:fidelity.CALIBRATION_IMAGES], 64))
        record["ranges"] = {f"{size}x{size}": range_summary(calibration_stats(model, calibration)),
                            "64x64 (same weights)": range_summary(
                                calibration_stats(small, small_calibration))}
        print(json.dumps(record["ranges"], indent=1), flush=True)
        suspects = {}
        for name, options in SUSPECTS.items():
            path = os.path.join(folder, "suspect.tflite")
            convert_variant(model, path, calibration, **options)
            suspects[name] = fidelity_figures(run_tflite(path, images), reference)
            print(name, suspects[name], flush=True)
        record["suspects"] = suspects
        record["float_layers"] = float_layer_op_counts(model, folder, calibration)
    _write(record, args.out)
    return 0


def _write(record: dict, out: str) -> None:
    from keras_mvit2.utils.files import atomic_output, write_text

    os.makedirs(out, exist_ok=True)
    with atomic_output(os.path.join(out, "int8_root_cause.json")) as tmp, open(tmp, "w") as f:
        json.dump(record, f, indent=1)
    write_text(os.path.join(out, "int8_root_cause.md"), markdown(record))
    print(markdown(record))


def markdown(record: dict) -> str:
    lines = ["# Why full int8 loses MobileViTV2-0.5's answers at 256x256", "",
             f"`python benchmarks/int8_root_cause.py` on `{record['model']}` "
             f"({record['test_images']} test images).", "",
             "## int8 prefix, float suffix (cumulative)", "",
             "| int8 up to | agreement (min/max) | logit error (min/max) | agreement (p99.99) "
             "| logit error (p99.99) |", "|---|---:|---:|---:|---:|"]
    by_layer = collections.OrderedDict()
    for method, rows in record["prefix"].items():
        for row in rows:
            by_layer.setdefault(row["int8 up to"], {})[method] = row
    for layer, methods in by_layer.items():
        cells = []
        for method in ("minmax", "p99.99"):
            row = methods.get(method)
            cells += (["-", "-"] if row is None else
                      [f"{100 * row['agreement']:.1f} %", f"{row['logit_rel_error']:.3f}"])
        lines.append(f"| {layer} | " + " | ".join(cells) + " |")
    for label, rows in record["ranges"].items():
        lines += ["", f"## Activation ranges at {label}, by the op that writes the tensor",
                  "(medians over the tensors)", "",
                  "| op | tensors | max abs / RMS | min-max width / 99.99 % width | "
                  "min-max width / 99.9 % width | RMS in min-max steps | RMS in p99.99 steps |",
                  "|---|---:|---:|---:|---:|---:|---:|"]
        for r in rows[:12]:
            lines.append(
                f"| {r['op']} | {r['tensors']} | {r['max_abs_over_rms']:.1f} | "
                f"{r['calibrated_over_p99_99']:.2f} | {r['calibrated_over_p99_9']:.2f} | "
                f"{r['rms_in_minmax_steps']:.1f} | {r['rms_in_chosen_steps']:.1f} |")
    lines += ["", "## Per-channel ranges entering a 1x1 convolution", "",
              "| tensor | count | largest / median channel (median, max) | median channel's "
              "share of the tensor range (median) |", "|---|---:|---:|---:|"]
    import numpy as np

    for kind in CHANNEL_TENSORS:
        rows = [r for r in record["channels"] if r["tensor"] == kind]
        if rows:
            spread = [r["largest_over_median"] for r in rows]
            share = [r["median_over_tensor"] for r in rows]
            lines.append(f"| {kind} | {len(rows)} | {np.median(spread):.1f}, "
                         f"{np.max(spread):.1f} | {np.median(share):.2f} |")
    lines += ["", "## Suspects, each changed alone in the default int8 file", "",
              "| change | agreement | logit error |", "|---|---:|---:|"]
    for name, row in record["suspects"].items():
        lines.append(f"| {name} | {100 * row['agreement']:.1f} % | "
                     f"{row['logit_rel_error']:.3f} |")
    bias = record.get("conv_output_bias")
    if bias:
        lines += ["", "## What bias correction would remove", "",
                  f"Over {bias['tensors']} convolution outputs of the default int8 file (16 "
                  "images), the mean error of a channel is "
                  f"{100 * bias['median_channel_bias_over_rms']:.2f} % of the tensor's RMS "
                  f"(median; largest {100 * bias['largest_channel_bias_over_rms']:.1f} %)."]
    if record.get("bias_correction"):
        lines += ["", "## Empirical bias correction of the default int8 file", "",
                  "| rounds | agreement | logit error |", "|---:|---:|---:|"]
        for row in record["bias_correction"]:
            lines.append(f"| {row['rounds']} | {100 * row['agreement']:.1f} % | "
                         f"{row['logit_rel_error']:.3f} |")
    if record.get("mse_clipping"):
        lines += ["", "## The share of the min / max width each method keeps", "",
                  "| tensor | count | mse (median) | 99.99 % interval (median) |",
                  "|---|---:|---:|---:|"]
        for row in record["mse_clipping"][:9]:
            lines.append(f"| {row['tensor']} | {row['tensors']} | "
                         f"{100 * row['kept_share_median']:.0f} % | "
                         f"{100 * row.get('p99_99_kept_share_median', float('nan')):.0f} % |")
    if record.get("noise_budget"):
        lines += ["", "## Noise budget: what each int8 file rounds", "",
                  "| size | file | seeds | ops | requantized tensors | feature maps | "
                  "feature-map RMS in steps | convolution outputs' RMS in steps |",
                  "|---:|---|---:|---:|---:|---:|---:|---:|"]
        for key, row in record["noise_budget"].items():
            size, label = key.split(" ", 1)
            lines.append(f"| {size} | {label} | {row['seeds']} | {row['ops']:.0f} | "
                         f"{row['requantized']:.0f} | {row['feature_maps']:.0f} | "
                         f"{row['feature_map_rms_in_steps']:.1f} | "
                         f"{row['conv_rms_in_steps']:.1f} |")
    if record.get("one_rounding"):
        lines += ["", f"## One rounding: uniform noise on `{STEM_OUTPUT}` alone, float model",
                  "", f"({record['noise_test_images']} test images; so are the float islands)", "",
                  "| noise | steps per RMS | agreement | logit error |",
                  "|---|---:|---:|---:|"]
        for row in record["one_rounding"]:
            lines.append(f"| {row['noise']} | {row['steps_per_rms']} | "
                         f"{100 * row['agreement']:.1f} % | {row['logit_rel_error']:.3f} |")
    if record.get("float_islands"):
        lines += ["", "## Float islands in the default int8 file", "",
                  "| kept float | agreement | logit error |", "|---|---:|---:|"]
        for name, row in record["float_islands"].items():
            lines.append(f"| {name} | {100 * row['agreement']:.1f} % | "
                         f"{row['logit_rel_error']:.3f} |")
    lines += ["", "## float_layers by Keras name", "", "```",
              json.dumps(record["float_layers"], indent=1), "```"]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
