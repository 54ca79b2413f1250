"""Quantization recipes the TFLite converter cannot do, through Google's ai-edge-quantizer.

`quantize_with_edge_quantizer` takes a float32 `.tflite` written by `to_tflite` and writes a
quantized copy with one of the named `EDGE_RECIPES` (int4 weights, int4/int8 mixes, static
int8 / int16x8 with float I/O) and optional per-layer overrides (`layer_recipes`: keep a
layer in float, in int16 activations or in int8). The converter stays the tool for what it
does better (uint8 I/O, `to_tflite`'s calibrated int8 with fused 1x1 convolutions).

Full int8 (``static_wi8_ai8``) shares the TensorFlow road's int8 choices through the same
functions: each activation's range from `activation_ranges` (the 99.99 % interval by
default), the matrix products' second operands as `zero_offset_matmul_operands` sets them
(before quantization), and the rewrites for LiteRT's fast int8 kernels
(`int8_kernels.for_fast_kernels`, after it).

The quantizer (``pip install "keras_mvit2[quantizer]"``) re-serializes the model, which
loses the standard metadata's packed ``labels.txt``, so the output gets its metadata
rewritten (`serialize_with_metadata`: our JSON with ``quantization`` = the recipe and a
``quantizer`` entry, the standard metadata, the signature) and is run once in LiteRT before
it is moved onto `output`.

Layer names (`tflite_layer_names`, the keys of `layer_recipes`): `to_tflite` traces the
Keras model, so each tensor name is a TensorFlow name-scope path
``<model>_1/<layer>_1/<sublayer>_1/.../<op>`` (fused ops join several such names with
``;``). A tensor's *layer path* is that path without its first component (the model), without
its last (the op), and with TensorFlow's de-duplication suffix ``_<n>`` removed from each
component: ``mobilevitv2_050_1/stage3_block1_1/transformer_0_1/attn_1/Mean`` lies in
``stage3_block1/transformer_0/attn``. A key of `layer_recipes` is a Keras layer name or a
``/``-path of nested layer names, and must equal one of the layer paths (or a leading part of
one: ``stage3_block1`` covers everything under it) found in the file, compared as exact
strings (TensorFlow's own scopes inside a layer, e.g. ``norm/Cast``, are listed too). An op
belongs to a layer when one of its output tensors or constant inputs (weights)
lies in it; the quantizer is then given the exact op scopes, never a pattern.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from keras_mvit2.export.tflite.flatbuffer import (
    decode_name,
    op_names,
    parse_flatbuffer,
    read_flatbuffer,
    serialize_flatbuffer,
    tensor_indices,
)
from keras_mvit2.export.tflite.inspect import TFLiteReport, inspect_tflite
from keras_mvit2.export.tflite.metadata import (
    read_tflite_metadata,
    serialize_with_metadata,
    tensor_entry,
)
from keras_mvit2.export.tflite.run import _check_runs
from keras_mvit2.export.tflite.signature import (
    SERVING_INPUT_NAME,
    SERVING_SIGNATURE,
    serving_output_names,
    set_serving_signature,
)
from keras_mvit2.export.tflite.tensors import TensorDetails, io_tensors
from keras_mvit2.utils.files import atomic_output

__all__ = [
    "EDGE_RECIPES",
    "LAYER_PRECISIONS",
    "MIXED_INT4_MIN_ELEMENTS",
    "EdgeRecipe",
    "quantize_with_edge_quantizer",
    "tflite_layer_names",
]


@dataclasses.dataclass(frozen=True)
class EdgeRecipe:
    """A named recipe: `mode` is the quantizer's ``"weight_only"`` (weights stored in
    `weight_bits`, dequantized to float once; float compute), ``"dynamic"`` (int8 weights,
    activations quantized on the fly) or ``"static"`` (calibrated activations of
    `activation_bits`, float I/O)."""

    mode: str
    weight_bits: int
    activation_bits: int | None
    description: str

    @property
    def calibrated(self) -> bool:
        return self.mode == "static"


#: The recipes `quantize_with_edge_quantizer` offers.
EDGE_RECIPES: dict[str, EdgeRecipe] = {
    "dynamic_wi8_afp32": EdgeRecipe(
        "dynamic", 8, None, "int8 weights (per channel); activations quantized at run time"),
    "weight_only_wi8_afp32": EdgeRecipe(
        "weight_only", 8, None, "int8 weights (per channel), float compute"),
    "weight_only_wi4_afp32": EdgeRecipe(
        "weight_only", 4, None, "int4 weights (per channel), float compute; depthwise "
        "kernels stay float (the quantizer has no int4 depthwise)"),
    "weight_only_wi4_wi8": EdgeRecipe(
        "weight_only", 4, None, "int4 weights where a kernel has >= MIXED_INT4_MIN_ELEMENTS "
        "elements, int8 weights elsewhere, depthwise kernels included (per channel), float "
        "compute: smaller and more accurate than weight_only_wi4_afp32 on MobileViTV2"),
    "weight_only_wf16_afp32": EdgeRecipe(
        "weight_only", 16, None, "float16 weights (the quantizer's float casting), float "
        "compute: the torch road's float16 (`to_tflite_via_torch`)"),
    "static_wi8_ai8": EdgeRecipe(
        "static", 8, 8, "int8 weights and int8 activations (calibrated), float32 I/O"),
    "static_wi8_ai16": EdgeRecipe(
        "static", 8, 16, "int8 weights and int16 activations (calibrated), float32 I/O"),
}
#: What a layer of `layer_recipes` can be set to.
LAYER_PRECISIONS = ("int8", "int16x8", "float")
#: ``weight_only_wi4_wi8``: kernels with at least this many elements get int4 weights.
MIXED_INT4_MIN_ELEMENTS = 4096
#: Ops whose input 1 is the weight the weight-only / dynamic recipes quantize.
_WEIGHT_OPS = ("CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED", "BATCH_MATMUL",
               "TRANSPOSE_CONV", "CONV_3D", "EMBEDDING_LOOKUP")
_SUFFIX = re.compile(r"_\d+$")


def quantize_with_edge_quantizer(
    float_tflite: str | os.PathLike,
    output: str | os.PathLike,
    *,
    recipe: str,
    calibration_images: np.ndarray | None = None,
    layer_recipes: Mapping[str, str] | None = None,
    class_names: Sequence[str] | None = None,
    quantization_name: str | None = None,
    activation_ranges: str = "p99.99",
) -> TFLiteReport:
    """Quantizes a float32 `to_tflite` export with ai-edge-quantizer and writes it, checked.

    Args:
        float_tflite: a float32 `.tflite` written by `to_tflite` (our JSON metadata says
            ``quantization: "float32"``).
        output: the `.tflite` to write (atomically; run once in LiteRT first).
        recipe: one of `EDGE_RECIPES`.
        calibration_images: float32 ``(N, H, W, 3)`` in [0, 1], for the calibrated
            (``static_*``) recipes: fed through the ``serving_default`` signature. A few
            hundred images of the deployment distribution.
        layer_recipes: ``{layer path: precision}`` with precisions from `LAYER_PRECISIONS`:
            ``"float"`` leaves the layer's ops unquantized; ``"int8"`` gives them int8
            (static recipes: int8 activations and weights; the others: int8 weights);
            ``"int16x8"`` int16 activations and int8 weights (static recipes only). Layer
            paths follow the rule of the module docstring (see `tflite_layer_names`).
        class_names: the class names for both metadata (default: the float file's).
        quantization_name: what the metadata's ``quantization`` says (default: `recipe`;
            the torch road writes its target format, e.g. ``"int8"``, and the recipe stays
            under ``quantizer``).
        activation_ranges: for the int8-activation recipes, how each activation's range is
            chosen from its values on the calibration images, as `to_tflite`'s full int8
            chooses them (`keras_mvit2.export.tflite.activation_ranges`): ``"p99.99"``
            (default), ``"mse"``, ``"p<percent>"`` or ``"minmax"`` (ai-edge-quantizer's
            own min / max). Recorded under ``calibration``.

    Returns:
        The `TFLiteReport` of the written file.

    Raises:
        ImportError: ai-edge-quantizer is not installed.
        ValueError: an unknown recipe, layer or precision, calibration images missing,
            unused or of the wrong shape or range, or a file that is not a float32 export.
    """
    float_tflite, output = os.fspath(float_tflite), os.fspath(output)
    chosen, info = _checked_recipe(recipe, float_tflite, calibration_images, layer_recipes)
    from keras_mvit2.export.tflite.activation_ranges import check_range_method

    activation_ranges = check_range_method(activation_ranges)
    aeq = _import_quantizer()
    with open(float_tflite, "rb") as f:
        float_bytes = f.read()
    model = parse_flatbuffer(float_bytes)
    inputs, outputs = io_tensors(model)
    if _add_missing_signature(model, outputs, info):  # the quantizer feeds the signature
        float_bytes = serialize_flatbuffer(model, len(float_bytes) + 4096)
    names = None if class_names is None else _checked_names(class_names, info)
    images = _checked_images(calibration_images, inputs) if chosen.calibrated else None
    scopes = _layer_scopes(model, float_bytes, dict(layer_recipes or {}))

    quantizer = aeq.quantizer.Quantizer(bytearray(float_bytes))
    _configure(quantizer, aeq, chosen, _large_weight_scopes(model) if recipe ==
               "weight_only_wi4_wi8" else [], scopes, dict(layer_recipes or {}))
    calibration = None
    if quantizer.need_calibration:
        batch = max(1, int(inputs[0].shape[0]))
        feeds = [{SERVING_INPUT_NAME: images[i:i + batch]}
                 for i in range(0, len(images) - batch + 1, batch)]
        calibration = quantizer.calibrate({SERVING_SIGNATURE: feeds},
                                          num_threads=os.cpu_count() or 1)
        if chosen.activation_bits == 8:
            calibration = _chosen_ranges(calibration, float_bytes, images, activation_ranges)
    quantized = bytes(quantizer.quantize(calibration, enable_progress_bar=False,
                                         enable_progress_report=False).quantized_model)

    quantized_model = parse_flatbuffer(quantized)  # edited in place, serialized once
    if chosen.activation_bits == 8:  # the TensorFlow road's rewrites for the fast kernels
        from keras_mvit2.export.tflite.int8_kernels import for_fast_kernels

        for_fast_kernels(quantized_model)
    inputs, outputs = io_tensors(quantized_model)
    info.update({
        "quantization": quantization_name or recipe,
        "input": tensor_entry(inputs[0]) if inputs else None,
        "output": tensor_entry(outputs[0]) if outputs else None,
        "quantizer": {"tool": "ai-edge-quantizer", "version": _version(), "recipe": recipe,
                      "layer_recipes": dict(layer_recipes or {})},
        "calibration": None if calibration is None else {
            "source": "calibration_images", "num_samples": len(images),
            **({"activation_ranges": activation_ranges} if chosen.activation_bits == 8
               else {})},
    })
    if names is not None:
        info["class_names"] = names
    info.pop("tflite_metadata", None)
    quantized = serialize_with_metadata(quantized_model, info, outputs,
                                        size_hint=len(quantized))
    with atomic_output(output) as tmp_path:
        with open(tmp_path, "wb") as f:
            f.write(quantized)
        _check_runs(tmp_path, dynamic_batch=bool(inputs[0].shape_signature[0] < 0))
    return inspect_tflite(output)


def _chosen_ranges(calibration: dict[str, Any], float_bytes: bytes, images: np.ndarray,
                   method: str) -> dict[str, Any]:
    """ai-edge-quantizer's calibration result with each per-tensor min / max replaced by the
    range `method` chooses (`select_named_ranges`) and, as the TensorFlow road's full int8
    does for every method but ``"minmax"``, the matrix products' operands given the ranges
    `zero_offset_matmul_operands` gives them (`_zero_offset_products`), in the result's own
    array shapes."""
    from keras_mvit2.export.tflite.activation_ranges import select_named_ranges

    ranges = {name: (float(np.min(entry["min"])), float(np.max(entry["max"])))
              for name, entry in calibration.items()
              if "min" in entry and np.size(entry["min"]) == 1}
    chosen = select_named_ranges(float_bytes, images, ranges, method)
    if method != "minmax":
        chosen = _zero_offset_products(float_bytes, chosen)
    out = dict(calibration)
    for name, (lo, hi) in chosen.items():
        entry = dict(calibration[name])
        entry["min"] = np.full_like(np.asarray(entry["min"]), lo)
        entry["max"] = np.full_like(np.asarray(entry["max"]), hi)
        out[name] = entry
    return out


def _zero_offset_products(float_bytes: bytes,
                          ranges: dict[str, tuple[float, float]]) -> dict[str, tuple[float, float]]:
    """`ranges` (by tensor name) after the TensorFlow road's own rule for the matrix
    products' operands: the float graph is annotated with them as the converter annotates
    its calibrated graph, `activation_ranges.zero_offset_matmul_operands` (the function
    `to_tflite`'s full int8 calls) widens what it widens, and the ranges are read back. The
    quantizer computes each zero point from these ranges, so an operand the TensorFlow road
    gives zero point 0 gets it here too (the zero point picks the product's kernel: XNNPACK
    takes an int8 BATCH_MATMUL only at zero point 0)."""
    from ai_edge_litert import schema_py_generated as tfl_schema

    from keras_mvit2.export.tflite.activation_ranges import zero_offset_matmul_operands

    model = parse_flatbuffer(float_bytes)
    tensors = model.subgraphs[0].tensors
    index = {decode_name(t.name): i for i, t in enumerate(tensors)}
    for tensor in tensors:
        tensor.quantization = None
    for name, (lo, hi) in ranges.items():
        if name in index:
            annotation = tfl_schema.QuantizationParametersT()
            annotation.min = np.array([lo], np.float32)
            annotation.max = np.array([hi], np.float32)
            tensors[index[name]].quantization = annotation
    zero_offset_matmul_operands(model)
    out = dict(ranges)
    for name, (lo, hi) in ranges.items():
        q = tensors[index[name]].quantization if name in index else None
        if q is not None and (q.min[0] != np.float32(lo) or q.max[0] != np.float32(hi)):
            out[name] = (float(q.min[0]), float(q.max[0]))
    return out


def tflite_layer_names(float_tflite: str | os.PathLike | bytes) -> list[str]:
    """Every layer path of a `to_tflite` file (the keys `layer_recipes` accepts), sorted:
    each layer and each of its nested layers (``stage3_block1``,
    ``stage3_block1/transformer_0``, ...), by the rule of the module docstring."""
    model = read_flatbuffer(float_tflite)
    paths: set[str] = set()
    for op in model.subgraphs[0].operators or []:
        for path in _op_layer_paths(model, op):
            parts = path.split("/")
            paths.update("/".join(parts[:i]) for i in range(1, len(parts) + 1))
    return sorted(paths)


# --------------------------------------------------------------------------------------
# Checks


def _checked_recipe(recipe: Any, path: str, images: Any,
                    layer_recipes: Mapping[str, str] | None) -> tuple[EdgeRecipe, dict]:
    """The recipe and the float file's JSON metadata, or a ValueError naming the fix."""
    if recipe not in EDGE_RECIPES:
        raise ValueError(
            f"recipe must be one of {sorted(EDGE_RECIPES)}. Received: recipe={recipe!r}")
    chosen = EDGE_RECIPES[recipe]
    info = read_tflite_metadata(path)
    if info is None or info.get("quantization") != "float32":
        found = "no keras_mvit2 metadata" if info is None else (
            f"quantization={info.get('quantization')!r}")
        raise ValueError(
            f"{path} is not a float32 export of keras_mvit2 ({found}). ai-edge-quantizer "
            "quantizes float models: export one with to_tflite(model, path) (the default "
            "quantization='float32') and pass that file.")
    for layer, precision in (layer_recipes or {}).items():
        if precision not in LAYER_PRECISIONS:
            raise ValueError(
                f"layer_recipes[{layer!r}] must be one of {LAYER_PRECISIONS}. "
                f"Received: {precision!r}")
        if precision == "int16x8" and not chosen.calibrated:
            raise ValueError(
                f"layer_recipes[{layer!r}]='int16x8' quantizes activations, which needs a "
                f"calibrated recipe ({[n for n, r in EDGE_RECIPES.items() if r.calibrated]}); "
                f"recipe={recipe!r} keeps activations in float. Use 'float' or 'int8'.")
    if chosen.calibrated and images is None:
        raise ValueError(
            f"recipe={recipe!r} calibrates activation ranges: pass calibration_images, "
            "float32 (N, H, W, 3) in [0, 1] (a few hundred real images).")
    if not chosen.calibrated and images is not None:
        raise ValueError(
            f"recipe={recipe!r} does not calibrate; drop calibration_images or use one of "
            f"{[n for n, r in EDGE_RECIPES.items() if r.calibrated]}.")
    info.pop("tflite_metadata", None)
    return chosen, info


def _checked_images(images: Any, inputs: Sequence[TensorDetails]) -> np.ndarray:
    x = np.asarray(images)
    want = tuple(int(d) for d in inputs[0].shape[1:])
    if x.ndim != 4 or x.shape[1:] != want or not np.issubdtype(x.dtype, np.floating):
        raise ValueError(
            f"calibration_images must be float (N, {', '.join(map(str, want))}) in [0, 1]. "
            f"Received: dtype {x.dtype}, shape {x.shape}")
    if len(x) == 0 or x.min() < 0.0 or x.max() > 1.0:
        raise ValueError(
            "calibration_images must hold at least one image with values in [0, 1] (pixels "
            f"/ 255). Received: {len(x)} images, range [{x.min(initial=0):.3g}, "
            f"{x.max(initial=0):.3g}]")
    return x.astype(np.float32)


def _checked_names(class_names: Sequence[str], info: Mapping[str, Any]) -> list[str]:
    names = [str(n) for n in class_names]
    shape = (info.get("output") or {}).get("shape") or []
    if len(shape) in (2, 4) and len(names) != int(shape[-1]):
        raise ValueError(
            f"class_names has {len(names)} entries but the model has {shape[-1]} classes.")
    return names


def _import_quantizer():
    try:
        import ai_edge_quantizer
        from ai_edge_quantizer import quantizer  # noqa: F401
    except ImportError as err:
        raise ImportError(
            "quantize_with_edge_quantizer needs ai-edge-quantizer: "
            'pip install "keras_mvit2[quantizer]" (ai-edge-quantizer==0.10.0).') from err
    return ai_edge_quantizer


def _version() -> str:
    from importlib.metadata import version

    return version("ai-edge-quantizer")


def _add_missing_signature(model: Any, outputs: Sequence[TensorDetails],
                           info: Mapping[str, Any]) -> bool:
    """Gives the parsed `model` (edited in place) a ``serving_default`` signature if it has
    none (files exported before there was one); whether it did."""
    if any(decode_name(s.signatureKey) == SERVING_SIGNATURE for s in model.signatureDefs or []):
        return False
    shapes = [t.shape_signature for t in outputs]
    set_serving_signature(model, serving_output_names(shapes, str(info.get("output_kind")
                                                                  or "logits")))
    return True


# --------------------------------------------------------------------------------------
# Layers and scopes


def _layer_paths(tensor_name: str) -> list[str]:
    """The layer paths of a tensor name (one per ``;``-joined part that has one)."""
    paths = []
    for part in tensor_name.split(";"):
        components = part.split("/")[1:-1]
        if components:
            paths.append("/".join(_SUFFIX.sub("", c) for c in components))
    return paths


def _op_layer_paths(model: Any, op: Any) -> list[str]:
    """The layer paths of an op: those of its outputs and of its constant inputs (the final
    dense layer's output is the model's ``Identity``, its kernel is named for the layer)."""
    tensors = model.subgraphs[0].tensors
    indices = [i for i in tensor_indices(op.outputs) if i >= 0] + [
        i for i in tensor_indices(op.inputs)
        if i >= 0 and model.buffers[tensors[i].buffer].data is not None
        and len(model.buffers[tensors[i].buffer].data)]
    return [p for i in indices for p in _layer_paths(decode_name(tensors[i].name))]


def _op_scope(model: Any, op: Any) -> str:
    """The quantizer's scope of an op: its output tensor names joined by ``;``, plus ``;``."""
    tensors = model.subgraphs[0].tensors
    names = [decode_name(tensors[i].name) for i in tensor_indices(op.outputs) if i >= 0]
    names = [n for n in names if n]
    return ";".join(names) + ";" if names else ""


def _layer_scopes(model: Any, buf: bytes,
                  layer_recipes: Mapping[str, str]) -> dict[str, list[str]]:
    """``{layer path: exact scopes of its ops}``; ValueError for a layer not in the file."""
    scopes: dict[str, list[str]] = {layer: [] for layer in layer_recipes}
    for op in model.subgraphs[0].operators or []:
        paths = _op_layer_paths(model, op)
        for layer in layer_recipes:
            if any(p == layer or p.startswith(layer + "/") for p in paths):
                scopes[layer].append(_op_scope(model, op))
    missing = [layer for layer, found in scopes.items() if not found]
    if missing:
        top = sorted({n.split("/")[0] for n in tflite_layer_names(buf)})
        raise ValueError(
            f"layer_recipes names layers that have no ops in this file: {missing}. Layers are "
            "Keras layer names or /-paths of nested ones, matched exactly (see "
            "keras_mvit2.export.tflite.edge_quantizer); the file's top-level layers are "
            f"{top} (tflite_layer_names(path) lists the nested ones).")
    return scopes


def _large_weight_scopes(model: Any) -> list[str]:
    """Scopes of the weight ops whose constant kernel has >= MIXED_INT4_MIN_ELEMENTS."""
    names = op_names(model)
    tensors = model.subgraphs[0].tensors
    found = []
    for op in model.subgraphs[0].operators or []:
        inputs = tensor_indices(op.inputs)
        if names[op.opcodeIndex] not in _WEIGHT_OPS or len(inputs) < 2 or inputs[1] < 0:
            continue
        kernel = tensors[inputs[1]]
        data = model.buffers[kernel.buffer].data
        if data is not None and len(data) and int(np.prod(tensor_indices(kernel.shape))) >= (
                MIXED_INT4_MIN_ELEMENTS):
            found.append(_op_scope(model, op))
    return found


def _exact(scopes: Sequence[str]) -> str:
    """A regex that matches exactly these scopes (the quantizer uses `re.search`)."""
    return "^(?:" + "|".join(re.escape(s) for s in scopes) + ")$"


def _configure(quantizer: Any, aeq: Any, recipe: EdgeRecipe, int4_scopes: Sequence[str],
               layer_scopes: Mapping[str, list[str]], layer_recipes: Mapping[str, str]) -> None:
    """The quantizer's rules, later ones winning: the recipe on every op, the int4 kernels
    of the mixed recipe, the per-layer overrides, and float I/O for the static recipes."""
    ops = aeq.qtyping.TFLOperationName
    no_quantize = aeq.algorithm_manager.AlgorithmName.NO_QUANTIZE

    def add(regex: str, bits: int, activation_bits: int | None = None) -> None:
        if recipe.mode == "static" or activation_bits is not None:
            quantizer.add_static_config(regex, ops.ALL_SUPPORTED,
                                        activation_bits or recipe.activation_bits, bits)
        elif recipe.mode == "dynamic":
            quantizer.add_dynamic_config(regex, ops.ALL_SUPPORTED, bits)
        elif bits == 16:  # float16 weights: the quantizer's float casting
            quantizer.add_weight_only_config(
                regex, ops.ALL_SUPPORTED, 16,
                algorithm_key=aeq.algorithm_manager.AlgorithmName.FLOAT_CASTING)
        else:
            quantizer.add_weight_only_config(regex, ops.ALL_SUPPORTED, bits)

    add(".*", 8 if int4_scopes else recipe.weight_bits)
    if int4_scopes:
        add(_exact(int4_scopes), 4)
    for layer, precision in layer_recipes.items():
        regex = _exact(layer_scopes[layer])
        if precision == "float":
            quantizer.update_quantization_recipe(regex, ops.ALL_SUPPORTED,
                                                 algorithm_key=no_quantize)
        else:
            add(regex, 8, {"int16x8": 16, "int8": 8}[precision] if recipe.calibrated else None)
    if recipe.calibrated:  # float32 input and output, as our other exports by default
        for op in (ops.INPUT, ops.OUTPUT):
            quantizer.update_quantization_recipe(".*", op, algorithm_key=no_quantize)
