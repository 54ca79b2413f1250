"""Fusion of back-to-back 1x1 convolutions in exported TFLite models.

Oracles: the Keras model (the fused file must compute the same function), the unfused
file (`fuse_pointwise=False`) for op counts, and the layer shapes of the Keras model for
which pairs may be fused and how many MACs that saves.
"""

import keras
import numpy as np
import pytest
from ai_edge_litert import schema_py_generated as tfl_schema
from ai_edge_litert.interpreter import Interpreter
from model_utils import mobilevitv2_fused_macs, perturb_norms

import keras_mvit2 as mv
from keras_mvit2.export import to_tflite
from keras_mvit2.export.tflite.flatbuffer import op_names, parse_flatbuffer, tensor_indices
from keras_mvit2.export.tflite.pointwise_fusion import fuse_pointwise_convolutions

layers = keras.layers
SIZE = 8


def _stem():
    inputs = keras.Input((SIZE, SIZE, 3))
    return inputs, layers.Conv2D(8, 3, padding="same", activation="relu", name="stem")(inputs)


def _conv(x, filters, name, activation=None, kernel_size=1, strides=1):
    x = layers.Conv2D(filters, kernel_size, strides=strides, padding="same", use_bias=False,
                      name=f"{name}_conv")(x)
    x = layers.BatchNormalization(name=f"{name}_bn")(x)
    return layers.Activation(activation, name=f"{name}_act")(x) if activation else x


def _pair():
    inputs, x = _stem()
    x = _conv(_conv(x, 16, "a"), 16, "b", "relu")                     # 8 -> 16 -> 16
    return keras.Model(inputs, layers.GlobalAveragePooling2D()(x))


def _chain():
    inputs, x = _stem()
    x = _conv(_conv(_conv(x, 16, "a"), 16, "b"), 16, "c", "relu")    # 8 -> 16 -> 16 -> 16
    return keras.Model(inputs, layers.GlobalAveragePooling2D()(x))


def _activation_between():
    inputs, x = _stem()
    x = _conv(_conv(x, 16, "a", "relu"), 16, "b")
    return keras.Model(inputs, layers.GlobalAveragePooling2D()(x))


def _middle_read_twice():
    inputs, x = _stem()
    a = _conv(x, 16, "a")
    x = layers.Add()([a, _conv(a, 16, "b", "relu")])
    return keras.Model(inputs, layers.GlobalAveragePooling2D()(x))


def _middle_is_output():
    inputs, x = _stem()
    a = _conv(x, 16, "a")
    return keras.Model(inputs, [a, _conv(a, 16, "b", "relu")])


def _not_cheaper():
    inputs, x = _stem()
    x = _conv(_conv(x, 2, "a"), 16, "b", "relu")                      # 8*16 > 2*(8+16)
    return keras.Model(inputs, layers.GlobalAveragePooling2D()(x))


def _spatial():
    inputs, x = _stem()
    x = _conv(x, 16, "a", kernel_size=3)                              # 3x3 -> 1x1
    x = _conv(_conv(x, 16, "b"), 16, "c", kernel_size=3)              # 1x1 -> 3x3
    x = _conv(_conv(x, 16, "d", strides=2), 16, "e")                  # strided 1x1 -> 1x1
    return keras.Model(inputs, layers.GlobalAveragePooling2D()(x))


# name -> (builder, expected fused pairs as (in, mid, out) channels)
CASES = {
    "pair": (_pair, [(8, 16, 16)]),
    "chain": (_chain, [(8, 16, 16), (8, 16, 16)]),
    "activation_between": (_activation_between, []),
    "middle_read_twice": (_middle_read_twice, []),
    "middle_is_output": (_middle_is_output, []),
    "not_cheaper": (_not_cheaper, []),
    "spatial": (_spatial, []),
}


def _images(n, size=SIZE, seed=0):
    return np.random.default_rng(seed).uniform(0.0, 1.0, (n, size, size, 3)).astype("float32")


def _build(builder, seed=0):
    keras.utils.set_random_seed(seed)
    model = builder()
    perturb_norms(model, seed)
    return model


def _run(path, x) -> list[np.ndarray]:
    """Every output of a batch-1 float TFLite model, image by image, stacked."""
    interpreter = Interpreter(model_path=str(path))
    interpreter.allocate_tensors()
    (inp,), outs = interpreter.get_input_details(), interpreter.get_output_details()
    results = [[] for _ in outs]
    for image in x:
        interpreter.set_tensor(inp["index"], image[None])
        interpreter.invoke()
        for i, out in enumerate(outs):
            results[i].append(interpreter.get_tensor(out["index"]).astype("float32"))
    return [np.concatenate(r) for r in results]


def _assert_same_outputs(model, path, x, atol):
    """Each Keras output equals a distinct output of the TFLite file (any order)."""
    want = model(x, training=False)
    want = want.values() if isinstance(want, dict) else want
    want = [np.asarray(t) for t in (want if not keras.ops.is_tensor(want) else [want])]
    got = _run(path, x)
    assert len(got) == len(want)
    unmatched = list(range(len(got)))
    for w in want:
        assert float(np.ptp(w)) > 1e-2  # not a trivially constant output
        errors = {i: float(np.abs(got[i] - w).max()) for i in unmatched if got[i].shape == w.shape}
        best = min(errors, key=errors.get)
        assert errors[best] <= atol, errors
        unmatched.remove(best)


def _assert_no_orphans(path):
    """Every tensor is used by an op or is a graph input/output; every buffer by a tensor."""
    with open(path, "rb") as f:
        model = parse_flatbuffer(f.read())
    used_buffers = {0} | {m.buffer for m in model.metadata or []}
    for subgraph in model.subgraphs:
        used = set(tensor_indices(subgraph.inputs)) | set(tensor_indices(subgraph.outputs))
        for op in subgraph.operators:
            used |= {t for t in tensor_indices(op.inputs) + tensor_indices(op.outputs) if t >= 0}
        assert used == set(range(len(subgraph.tensors)))
        used_buffers |= {t.buffer for t in subgraph.tensors}
    assert used_buffers == set(range(len(model.buffers)))
    names = {m.name.decode() for m in model.metadata}
    assert {"min_runtime_version", "keras_mvit2"} <= names, names


@pytest.mark.parametrize("case", sorted(CASES))
def test_fuses_exactly_the_eligible_pairs_and_keeps_the_function(case, tmp_path):
    builder, expected = CASES[case]
    model = _build(builder)
    fused = to_tflite(model, tmp_path / "fused.tflite")
    plain = to_tflite(model, tmp_path / "plain.tflite", fuse_pointwise=False)

    convs_saved = plain.op_histogram["CONV_2D"] - fused.op_histogram["CONV_2D"]
    assert convs_saved == len(expected)
    info = fused.metadata["graph_optimizations"]
    assert info["fused_pointwise_convolutions"] == len(expected)
    pixels = SIZE * SIZE
    assert info["macs_saved"] == sum(pixels * (m * (i + o) - i * o) for i, m, o in expected)
    assert plain.metadata["graph_optimizations"] is None
    assert (fused.size_bytes < plain.size_bytes) == bool(expected)
    _assert_no_orphans(fused.path)
    _assert_same_outputs(model, fused.path, _images(4), atol=1e-5)


@pytest.mark.parametrize("quantization", ["float32", "float16"])
def test_constants_shared_with_other_ops_are_left_alone(quantization, tmp_path):
    # Untrained BNs fold into all-zero biases, which the converter stores as one tensor
    # read by every conv: the fused conv gets new constants, the others keep theirs.
    keras.utils.set_random_seed(0)
    model = _chain()
    fused = to_tflite(model, tmp_path / "fused.tflite", quantization=quantization)
    plain = to_tflite(model, tmp_path / "plain.tflite", quantization=quantization,
                      fuse_pointwise=False)
    with open(plain.path, "rb") as f:
        flat = parse_flatbuffer(f.read())
    graph = flat.subgraphs[0]
    biases = [tensor_indices(op.inputs)[2] for op in graph.operators
              if op_names(flat)[op.opcodeIndex] == "CONV_2D"]
    assert len(set(biases)) < len(biases)  # shared: what this test is about
    assert plain.op_histogram["CONV_2D"] - fused.op_histogram["CONV_2D"] == 2
    _assert_no_orphans(fused.path)
    _assert_same_outputs(model, fused.path, _images(4),
                         atol=1e-5 if quantization == "float32" else 5e-3)


def test_returns_the_same_bytes_when_nothing_fuses(tmp_path):
    report = to_tflite(_build(_spatial), tmp_path / "m.tflite", fuse_pointwise=False)
    with open(report.path, "rb") as f:
        data = f.read()
    out, fusions = fuse_pointwise_convolutions(data)
    assert fusions == [] and out is data


def test_float16_weights_stay_float16(tmp_path):
    model = _build(_chain)
    fused = to_tflite(model, tmp_path / "fused.tflite", quantization="float16")
    plain = to_tflite(model, tmp_path / "plain.tflite", quantization="float16",
                      fuse_pointwise=False)
    assert plain.op_histogram["CONV_2D"] - fused.op_histogram["CONV_2D"] == 2
    # each fusion drops the first conv and the DEQUANTIZE ops of its kernel and bias
    assert plain.op_histogram["DEQUANTIZE"] - fused.op_histogram["DEQUANTIZE"] == 4
    with open(fused.path, "rb") as f:
        flat = parse_flatbuffer(f.read())
    names, graph = op_names(flat), flat.subgraphs[0]
    produced_by = {t: op for op in graph.operators for t in tensor_indices(op.outputs)}
    for op in graph.operators:
        if names[op.opcodeIndex] == "CONV_2D":
            kernel = produced_by[tensor_indices(op.inputs)[1]]
            assert names[kernel.opcodeIndex] == "DEQUANTIZE"
            kernel_type = graph.tensors[tensor_indices(kernel.inputs)[0]].type
            assert kernel_type == tfl_schema.TensorType.FLOAT16
    _assert_no_orphans(fused.path)
    _assert_same_outputs(model, fused.path, _images(4), atol=5e-3)


def test_int8_is_fused_before_calibration(tmp_path):
    model = _build(_chain)
    calibration = _images(64, seed=1)
    kwargs = dict(quantization="int8", representative_data=calibration)
    fused = to_tflite(model, tmp_path / "fused.tflite", **kwargs)
    plain = to_tflite(model, tmp_path / "plain.tflite", fuse_pointwise=False, **kwargs)
    assert plain.op_histogram["CONV_2D"] - fused.op_histogram["CONV_2D"] == 2
    assert fused.metadata["graph_optimizations"]["fused_pointwise_convolutions"] == 2
    assert fused.float_ops == {}
    _assert_no_orphans(fused.path)
    x = _images(16, seed=2)
    want = np.asarray(model(x, training=False))
    span = float(np.ptp(want))
    assert span > 0.1
    for report in (fused, plain):
        (got,) = _run(report.path, x)
        # a few int8 steps of the output range, for the fused file as for the plain one
        assert float(np.abs(got - want).max()) < 0.05 * span, report.path


def test_mobilevitv2_fuses_the_three_projection_expansion_pairs(tmp_path):
    size = 64
    keras.utils.set_random_seed(0)
    model = mv.MobileViTV2(0.5, input_shape=(size, size, 3), classifier_activation=None)
    perturb_norms(model)
    report = to_tflite(model, tmp_path / "m.tflite")
    info = report.metadata["graph_optimizations"]
    expected = mobilevitv2_fused_macs(model)
    assert expected > 0
    assert info == {"fused_pointwise_convolutions": 3, "macs_saved": expected}
    _assert_same_outputs(model, report.path, _images(2, size, seed=3), atol=1e-4)


def test_feature_maps_that_are_outputs_are_not_fused(tmp_path):
    size = 64
    keras.utils.set_random_seed(0)
    model = mv.tasks.mobilevitv2_features(0.5, input_shape=(size, size, 3))
    perturb_norms(model)
    report = to_tflite(model, tmp_path / "features.tflite")
    # stage2_block1 and stage3_block1 (conv_proj) end in model outputs: only the stage
    # 0 -> 1 pair inside the backbone may be fused
    assert report.metadata["graph_optimizations"]["fused_pointwise_convolutions"] == 1
    _assert_same_outputs(model, report.path, _images(1, size, seed=4), atol=1e-4)
