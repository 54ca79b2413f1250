"""Why a model does not convert: `UnsupportedOpError` and what builds its message.

The TF 2.21 MLIR converter reports TensorFlow ops without a TFLite builtin kernel in a
`ConverterError` (structured ``errors`` plus text) and ops without a quantized kernel in a
`RuntimeError`. This module reads both, finds the Keras layers that hold those ops (through
the name scopes of the traced graph) and turns them into an `UnsupportedOpError` whose
message names the op(s), the layer(s) and the fix. `keras_mvit2.export.tflite.convert`
calls it when a conversion fails.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import keras

from keras_mvit2.export.tflite.quantization import resolve_quantization

__all__ = ["UnsupportedOpError"]

_OPS_COMPATIBILITY_URL = "https://ai.google.dev/edge/litert/models/ops_compatibility"


class UnsupportedOpError(RuntimeError):
    """The model needs TensorFlow ops that have no TFLite builtin kernel.

    keras_mvit2 converts with ``TFLITE_BUILTINS`` only; such ops would need the
    Flex delegate (SELECT_TF_OPS) or a custom kernel, which mobile runtimes
    usually do not ship.

    Attributes:
        ops: the TensorFlow op names (e.g. ``["Cumprod"]``), sorted.
        layers: the Keras layers that contain them, as ``"outer/inner"`` paths of
            layer names (empty where the converter gave no usable location).
    """

    def __init__(self, message: str, ops: list[str], layers: list[str]):
        super().__init__(message)
        self.ops = ops
        self.layers = layers


def _converter_error(
    err: Exception, concrete_function, model: keras.Model, quantization: str
) -> UnsupportedOpError | None:
    """The `UnsupportedOpError` for a converter error about ops without builtin kernels
    (``None`` when `err` is about something else)."""
    unsupported = _unsupported_ops_from_error(err)
    if not unsupported:
        return None
    graph_def = concrete_function.graph.as_graph_def()
    for op, scopes in _op_scopes_in_graph(graph_def, set(unsupported)).items():
        unsupported[op] |= scopes
    return _unsupported_op_error(unsupported, model, quantization)


def _not_quantizable_error(
    err: Exception, model: keras.Model, quantization: str
) -> UnsupportedOpError | None:
    """The `UnsupportedOpError` for a calibration/quantization error about ops without a
    quantized kernel (``None`` when `err` is about something else)."""
    # The calibration/quantization step reports ops without a quantized kernel as
    # "Quantization to ... not yet supported for op: 'DIV'." (TFLite op names).
    ops = sorted(set(_RE_NOT_QUANTIZABLE.findall(str(err))))
    if not ops:
        return None
    return UnsupportedOpError(
        f"Model {model.name!r} cannot be converted with quantization={quantization!r}: "
        f"TFLite has no quantized kernel for {', '.join(ops)} in this op set. Fix: use "
        "another quantization (e.g. 'int8' or 'dynamic_int8'), or rewrite the layer with "
        f"quantizable ops (see {_OPS_COMPATIBILITY_URL}).",
        ops,
        [],
    )


def _int16x8_hazard_error(hazards: list[str], model: keras.Model) -> UnsupportedOpError:
    """The error for SUB ops (output tensor names `hazards`) that would make TF 2.21's
    int16x8 quantizer abort the process."""
    known = _layer_names(model)
    layers = sorted({_layer_path(h.split(";")[0], known, model.name) for h in hazards} - {""})
    where = ", ".join(layers) if layers else ", ".join(hazards[:5])
    return UnsupportedOpError(
        "quantization='int16x8' would crash: TF 2.21's int16x8 quantizer aborts the process "
        "on a SUB with an all-zero constant operand, found in "
        f"{len(hazards)} op(s) ({where}); typically a normalization shift (beta) still at "
        "its zero initialization. Fix: export a trained model, or use quantization='int8'.",
        ["SUB"],
        layers,
    )


# Error-text patterns of the TF 2.21 MLIR converter.
_RE_SELECT_OPS = re.compile(r"TF Select ops: ([^\n]+)")
_RE_NOT_BUILTIN = re.compile(r"'tf\.(\w+)' op is neither a custom op nor a flex op")
_RE_CUSTOM_SECTION = re.compile(
    r"Ops that need custom implementation[^\n]*:\s*\n((?:\s*tf\.\w+[^\n]*\n?)+)"
)
_RE_NOT_QUANTIZABLE = re.compile(r"not yet supported for op: '(\w+)'")
_RE_LOC = re.compile(r'fused\["(\w+):", "([^"@]+)@')


def _unsupported_ops_from_error(err: Exception) -> dict[str, set[str]]:
    """TF op name -> set of name-scope paths where the converter found it.

    Reads the structured `errors` of a `ConverterError` (operator name and call-site
    location) and falls back on the error text.
    """
    found: dict[str, set[str]] = {}
    for data in getattr(err, "errors", None) or []:
        code = _enum_name(data, "error_code")
        if code not in ("ERROR_NEEDS_FLEX_OPS", "ERROR_NEEDS_CUSTOM_OPS"):
            continue
        op = data.operator.name.removeprefix("tf.")
        if not op:
            continue
        found.setdefault(op, set())
        calls = list(data.location.call)
        if calls:
            scope = calls[0].name.split("@", 1)[0]
            found[op].add(scope)
        elif data.location.name:
            found[op].add(data.location.name.split("@", 1)[0])

    text = str(err)
    for match in _RE_SELECT_OPS.finditer(text):
        for op in match.group(1).split(","):
            if op.strip():
                found.setdefault(op.strip().removeprefix("tf."), set())
    for match in _RE_CUSTOM_SECTION.finditer(text):
        for op in re.findall(r"tf\.(\w+)", match.group(1)):
            found.setdefault(op, set())
    for line in text.splitlines():
        op_match = _RE_NOT_BUILTIN.search(line)
        if not op_match:
            continue
        op = op_match.group(1)
        found.setdefault(op, set())
        for loc_op, scope in _RE_LOC.findall(line):
            if loc_op == op:
                found[op].add(scope)
    return dict(found)


def _op_scopes_in_graph(graph_def, ops: set[str]) -> dict[str, set[str]]:
    """TF op name -> name scopes of the traced graph's nodes that run it.

    The converter's locations miss ops inside a function the layer calls (a
    ``tf.function`` in its ``call``): their scope restarts in the function's body.
    Here such an op is found in the function library, and the scope is the one of
    the graph node that calls the function (``.../my_layer_1/PartitionedCall``).
    """
    library = {f.signature.name: f for f in graph_def.library.function}
    memo: dict[str, set[str]] = {}

    def ops_in_function(name: str) -> set[str]:
        if name not in memo:
            memo[name] = set()  # a function that calls itself adds nothing more
            function = library.get(name)
            memo[name] = _ops_in_nodes(function.node_def if function else [], ops_in_function)
        return memo[name]

    found: dict[str, set[str]] = {}
    for node in graph_def.node:
        for op in _ops_in_nodes([node], ops_in_function) & ops:
            found.setdefault(op, set()).add(node.name)
    return found


def _ops_in_nodes(nodes, ops_in_function: Callable[[str], set[str]]) -> set[str]:
    """The op types the nodes run, including those of the functions they call."""
    found = set()
    for node in nodes:
        found.add(node.op)
        for value in node.attr.values():
            called = [value.func] if value.HasField("func") else list(value.list.func)
            for function in called:
                if function.name:
                    found |= ops_in_function(function.name)
    return found


def _enum_name(message, field: str) -> str:
    value = getattr(message, field, None)
    try:
        return message.DESCRIPTOR.fields_by_name[field].enum_type.values_by_number[value].name
    except (AttributeError, KeyError):
        return str(value)


def _unsupported_op_error(
    unsupported: dict[str, set[str]], model: keras.Model, quantization: str = "float32"
) -> UnsupportedOpError:
    known = _layer_names(model)
    lines = []
    all_layers: list[str] = []
    for op in sorted(unsupported):
        paths = (_layer_path(scope, known, model.name) for scope in unsupported[op])
        layers = sorted({p for p in paths if p})
        all_layers.extend(p for p in layers if p not in all_layers)
        if layers:
            where = ", ".join(f"'{p}' ({known[p.rsplit('/', 1)[-1]]})" for p in layers)
            lines.append(f"  - tf.{op} in layer {where}")
        else:
            lines.append(f"  - tf.{op} (layer unknown)")
    ops = sorted(unsupported)
    op_set = {
        "builtins_int8": "TFLITE_BUILTINS_INT8 (int8 kernels)",
        "int16x8": "the int16x8 builtins",
    }.get(resolve_quantization(quantization).op_set, "TFLITE_BUILTINS")
    message = (
        f"Model {model.name!r} needs TensorFlow op(s) with no TFLite builtin kernel: "
        f"{', '.join(ops)}. keras_mvit2 converts with {op_set} only (no Flex / "
        "SELECT_TF_OPS delegate, which mobile runtimes usually lack).\n"
        + "\n".join(lines)
        + "\nFix: rewrite that computation in the layer with ops that have TFLite builtins "
        f"(see {_OPS_COMPATIBILITY_URL}); if the layer is part of keras_mvit2, please report "
        "it as a bug with this message."
    )
    return UnsupportedOpError(message, ops, all_layers)


def _layer_names(model: keras.Model) -> dict[str, str]:
    """Layer name -> class name, for the model and every nested layer."""
    names: dict[str, str] = {}
    for layer in model._flatten_layers(include_self=True):
        names.setdefault(layer.name, type(layer).__name__)
    return names


def _layer_path(scope: str, known: dict[str, str], model_name: str) -> str:
    """``"functional_1/stage2_block1_1/transformer_0_1/Op"`` -> ``"stage2_block1/transformer_0"``.

    Each name scope is matched against the model's layer names; the ``_<n>``
    suffixes that TF adds to make scopes unique are stripped (first one first,
    as the export trace scopes every layer once more).
    """
    parts = scope.split("/")[:-1]   # the last part is the op name
    path = []
    for part in parts:
        name = _match_layer_name(part, known)
        if name is None:
            continue
        if not path and name == model_name:
            continue
        path.append(name)
    return "/".join(path)


def _match_layer_name(part: str, known: dict[str, str]) -> str | None:
    chain = [part]  # `part`, then with one more `_<n>` suffix stripped each time
    while (shorter := re.sub(r"_\d+$", "", chain[-1])) != chain[-1]:
        chain.append(shorter)
    # TF's own suffix first (the name stripped once), then the name as is, then shorter.
    return next((c for c in chain[1:2] + chain if c in known), None)
