"""The full-int8 file's rewrites for LiteRT's fast kernels (`keras_mvit2.export.tflite.
int8_kernels`): elementwise functions as 256-entry tables (`lookup_tables`) and constant
matrix-product operands at zero point 0 (`int8_kernels.symmetric_constant_matmul_operands`),
and, in a file that may hold float ops, the SOFTMAX as a float island
(`int8_kernels.float_softmax_islands`).

Oracles: the functions written out here in numpy on the int8 grid, and LiteRT running the
file before and after the rewrite.
"""

import numpy as np
import pytest
import tensorflow as tf
from ai_edge_litert.interpreter import Interpreter, OpResolverType

from keras_mvit2.export import inspect_tflite
from keras_mvit2.export.tflite.flatbuffer import op_names, parse_flatbuffer, serialize_flatbuffer
from keras_mvit2.export.tflite.int8_kernels import (
    float_softmax_islands,
    symmetric_constant_matmul_operands,
)
from keras_mvit2.export.tflite.lookup_tables import tabulate_elementwise

SHAPE = (2, 3, 5, 8)


def _int8_file(function, rng, *, input_range=(0.0, 4.0), signature=SHAPE) -> bytes:
    """`function` converted to a full-int8 flatbuffer with int8 I/O."""

    @tf.function(input_signature=[tf.TensorSpec(signature, tf.float32)])
    def graph(x):
        return function(x)

    lo, hi = input_range

    def representative():
        for _ in range(8):
            yield [rng.uniform(lo, hi, signature).astype(np.float32)]

    converter = tf.lite.TFLiteConverter.from_concrete_functions([graph.get_concrete_function()])
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    converter.representative_dataset = representative
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    converter.inference_input_type = converter.inference_output_type = tf.int8
    return converter.convert()


def _run(content: bytes, x: np.ndarray, xnnpack: bool = True) -> np.ndarray:
    resolver = OpResolverType.AUTO if xnnpack else (
        OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
    interpreter = Interpreter(model_content=content, experimental_op_resolver_type=resolver)
    interpreter.allocate_tensors()
    interpreter.set_tensor(interpreter.get_input_details()[0]["index"], x)
    interpreter.invoke()
    return interpreter.get_tensor(interpreter.get_output_details()[0]["index"])


def _io_quantization(content: bytes):
    interpreter = Interpreter(model_content=content)
    return (interpreter.get_input_details()[0]["quantization"],
            interpreter.get_output_details()[0]["quantization"])


def _rewritten(content: bytes, **kwargs) -> tuple[bytes, int, list[str]]:
    model = parse_flatbuffer(content)
    count = tabulate_elementwise(model, **kwargs)
    names = op_names(model)
    kinds = [names[op.opcodeIndex] for op in model.subgraphs[0].operators]
    return serialize_flatbuffer(model), count, kinds


def _every_int8(shape=SHAPE) -> np.ndarray:
    """Every int8 value, repeated to fill `shape`."""
    return np.resize(np.arange(-128, 128, dtype=np.int8), shape)


def test_rsqrt_and_sqrt_become_tables_of_the_functions_on_the_int8_grid(rng):
    def function(x):
        return tf.math.rsqrt(x + 0.25) + tf.math.sqrt(x)

    content = _int8_file(function, rng)
    rewritten, count, kinds = _rewritten(content)
    assert count == 2 and "RSQRT" not in kinds and "SQRT" not in kinds
    assert kinds.count("GATHER") == 2 and kinds.count("CAST") == 2
    x = _every_int8()
    before, after = _run(content, x, xnnpack=False), _run(rewritten, x)
    # LiteRT's own kernels round in fixed point; the tables round once: within a step of the
    # sum's output each.
    assert np.abs(before.astype(int) - after.astype(int)).max() <= 2


def test_a_table_is_the_function_rounded_once(rng):
    content = _int8_file(lambda x: tf.math.rsqrt(x + 0.1), rng)
    rewritten, count, _ = _rewritten(content)
    assert count == 1
    model = parse_flatbuffer(rewritten)
    graph = model.subgraphs[0]
    # The RSQRT's own input and output quantization: read them off the rewritten file.
    names = op_names(model)
    gather = next(op for op in graph.operators if names[op.opcodeIndex] == "GATHER")
    cast = next(op for op in graph.operators if names[op.opcodeIndex] == "CAST")
    source = graph.tensors[int(cast.inputs[0])].quantization
    target = graph.tensors[int(gather.outputs[0])].quantization
    s, z = float(source.scale[0]), int(source.zeroPoint[0])
    so, zo = float(target.scale[0]), int(target.zeroPoint[0])
    levels = np.arange(-128, 128)
    real = (levels - z) * s
    with np.errstate(divide="ignore", invalid="ignore"):
        value = 1.0 / np.sqrt(np.maximum(real, 0.0)) / so
    value = np.where(np.isfinite(value), value, 127 - zo)
    expected = np.clip(np.sign(value) * np.floor(np.abs(value) + 0.5) + zo, -128, 127)
    table_tensor = graph.tensors[int(gather.inputs[0])]
    table = np.frombuffer(bytes(model.buffers[table_tensor.buffer].data), np.int8)
    np.testing.assert_array_equal(table, expected)


def test_a_float_island_becomes_int8_tables_and_an_int8_concatenation(rng):
    def features(x):
        return tf.concat([tf.sin(x), tf.cos(x)], axis=-1)

    content = _int8_file(features, rng, input_range=(-3.0, 3.0))
    _, count, kinds = _rewritten(content)
    assert count == 0 and {"SIN", "COS"} <= set(kinds)  # islands are off by default
    rewritten, count, kinds = _rewritten(content, islands=True)
    assert count == 2 and not {"SIN", "COS", "DEQUANTIZE", "QUANTIZE"} & set(kinds)
    assert kinds.count("CONCATENATION") == 1
    x = _every_int8()
    (s_in, z_in), (s_out, z_out) = _io_quantization(content)
    real = (x.astype(np.float64) - z_in) * s_in
    want = np.concatenate([np.sin(real), np.cos(real)], axis=-1)
    got = (_run(rewritten, x).astype(np.float64) - z_out) * s_out
    # one rounding: within half an output step (and the island's own output, within one)
    assert np.abs(got - want).max() <= 0.5 * s_out + 1e-9
    island = (_run(content, x).astype(np.float64) - z_out) * s_out
    assert np.abs(got - island).max() <= s_out + 1e-9


def test_softmax_becomes_a_float_island_on_the_same_int8_tensors(rng, tmp_path):
    # attention scores: (batch, heads, queries, keys), a softmax over the keys
    shape = (1, 2, 16, 64)
    content = _int8_file(lambda x: tf.nn.softmax(x, axis=-1), rng, input_range=(-6.0, 6.0),
                         signature=shape)
    model = parse_flatbuffer(content)
    names = op_names(model)
    softmax = next(op for op in model.subgraphs[0].operators
                   if names[op.opcodeIndex] == "SOFTMAX")
    source, target = (int(softmax.inputs[0]), int(softmax.outputs[0]))
    assert float_softmax_islands(model, min_elements=np.prod(shape) + 1) == 0  # too small
    assert float_softmax_islands(model) == 1
    names = op_names(model)
    graph = model.subgraphs[0]
    kinds = [names[op.opcodeIndex] for op in graph.operators]
    assert kinds == ["DEQUANTIZE", "SOFTMAX", "QUANTIZE"]
    dequantize, softmax, quantize = graph.operators
    # the island reads and writes the int8 tensors the int8 SOFTMAX did; float inside
    assert int(dequantize.inputs[0]) == source and int(quantize.outputs[0]) == target
    assert graph.tensors[int(softmax.inputs[0])].type == 0  # FLOAT32
    rewritten = serialize_flatbuffer(model)
    (tmp_path / "island.tflite").write_bytes(rewritten)
    report = inspect_tflite(tmp_path / "island.tflite")
    assert report.float_ops == {"DEQUANTIZE": 1, "QUANTIZE": 1, "SOFTMAX": 1}
    assert report.ops_outside_xnnpack == {}  # XNNPACK takes the whole island
    x = rng.integers(-128, 128, shape).astype(np.int8)
    (s_in, z_in), (s_out, z_out) = _io_quantization(content)
    real = (x.astype(np.float64) - z_in) * s_in
    e = np.exp(real - real.max(-1, keepdims=True))
    want = e / e.sum(-1, keepdims=True)
    got = (_run(rewritten, x).astype(np.float64) - z_out) * s_out
    # the softmax in float, rounded once to the output's step (1/256)
    assert np.abs(got - want).max() <= 0.5 * s_out + 1e-6
    kernel = (_run(content, x, xnnpack=False).astype(np.float64) - z_out) * s_out
    assert np.abs(got - kernel).max() <= s_out + 1e-9  # LiteRT's fixed point: a step at most


def test_constant_matmul_operand_is_requantized_to_zero_point_0(rng, tmp_path):
    weights = rng.normal(0.3, 1.0, (4, 8, 16)).astype(np.float32)  # asymmetric values

    def project(x):
        return tf.matmul(x, tf.constant(weights))

    content = _int8_file(project, rng, input_range=(-1.0, 1.0), signature=(4, 5, 8))
    model = parse_flatbuffer(content)
    names = op_names(model)
    graph = model.subgraphs[0]
    matmul = next(op for op in graph.operators if names[op.opcodeIndex] == "BATCH_MATMUL")
    operand = graph.tensors[int(matmul.inputs[1])]
    if int(operand.quantization.zeroPoint[0]) == 0:
        pytest.skip("the converter gave this constant zero point 0 already")
    assert symmetric_constant_matmul_operands(model) == 1
    assert int(operand.quantization.zeroPoint[0]) == 0
    rewritten = serialize_flatbuffer(model)
    x = np.random.default_rng(1).integers(-128, 128, (4, 5, 8)).astype(np.int8)
    (s_in, z_in), (s_out, z_out) = _io_quantization(content)
    want = np.matmul((x.astype(np.float64) - z_in) * s_in, weights)
    for file in (content, rewritten):
        got = (_run(file, x).astype(np.float64) - z_out) * s_out
        # int8 rounding of the input, the weights and the output: a few output steps
        assert np.abs(got - want).max() <= 4 * s_out
    # XNNPACK takes the product now: every op of the file runs in its delegate.
    path = tmp_path / "m.tflite"
    path.write_bytes(rewritten)
    assert inspect_tflite(path).num_ops_outside_xnnpack == 0
