"""The contract every registered attention meets to export (docs/architecture.md).

Checked per `keras_mvit2.attention.available()` name, inside MobileViTV2-0.5 at 64x64:

* TFLite: builtin ops only, no tensor of rank > 4 (float32: in test_attention_export.py,
  `test_tflite_builtin_only_and_equal_to_keras`; here the int8 file);
* int8: full-integer conversion; float ops exactly those the layer class declares
  (`int8_float_ops`, read by `keras_mvit2.attention.int8_float_ops`: empty but for the
  measured float islands of RFA, MHA and Linformer); quantization-aware
  training runs its calibrated graph on batches (`keras_mvit2.quantize.tflite_graph`, equal
  to LiteRT), or says it cannot (`QAT_ON_BATCHES`: the attentions whose int8 graph keeps the
  batch as the leading dimension);
* twin: the tf_keras twin that quantization-aware training builds gives the Keras
  outputs (one worker process for all attentions);
* Core ML: converts; the separable attention is traced channels-first
  (`keras_mvit2.export.coreml.layout`), any other attention by its usual call.

Also here: the export forms (`keras_mvit2.layers.export_forms`) are forms of one function
(`keras_mvit2.layers.functional`), in both token layouts.
"""

import itertools

import keras
import numpy as np
import pytest
import tensorflow as tf
from model_utils import ATTENTION_CONFIGS, float_ops_from_interpreter, perturb_norms

import keras_mvit2 as mv
from keras_mvit2.layers import attention_registry, functional
from keras_mvit2.layers.functional import CHANNELS_FIRST, CHANNELS_LAST
from keras_mvit2.layers.multi_head_attention import SOFTMAX_FLOAT_ISLAND

SIZE = 64
NAMES = sorted(ATTENTION_CONFIGS)
#: The attentions whose int8 graph quantization-aware training runs on batches (the others
#: fold the batch into another dimension; their files stay post-training).
QAT_ON_BATCHES = {"linformer", "mha", "rfa", "separable"}


def _host(name: str) -> keras.Model:
    keras.utils.set_random_seed(0)
    model = mv.MobileViTV2(0.5, input_shape=(SIZE, SIZE, 3), classes=10,
                           classifier_activation=None, attention=ATTENTION_CONFIGS[name])
    perturb_norms(model, seed=1)
    return model


def _products(path) -> tuple[int, int, int]:
    """`(all, one-row, sigmoid-second)` BATCH_MATMULs of a `.tflite` file: a one-row one has a
    first operand of one row (after its adjoint flag), as the GroupNorm's x . x or a one-token
    attention, and a second operand computed at run time (a constant one is packed once, at
    load); a sigmoid-second one (of several rows) takes a LOGISTIC's output second, whose int8
    zero point the kernel fixes at -128 (Mobile-Attention's `phi(q) phi(k)^T` for few tokens,
    `functional.kernel_numerator`), so XNNPACK, which takes a product only at zero point 0,
    leaves it to LiteRT's kernel."""
    from keras_mvit2.export.tflite.flatbuffer import (
        constant_array,
        op_names,
        parse_flatbuffer,
        tensor_indices,
    )

    model = parse_flatbuffer(str(path))
    kinds, graph = op_names(model), model.subgraphs[0]
    producer = {out: kinds[op.opcodeIndex] for op in graph.operators
                for out in tensor_indices(op.outputs)}
    one_row, sigmoid_second = [], []
    for op in graph.operators:
        if kinds[op.opcodeIndex] == "BATCH_MATMUL":
            shape = tensor_indices(graph.tensors[int(op.inputs[0])].shape)
            rows = shape[-1] if op.builtinOptions.adjX else shape[-2]
            constant = constant_array(model, graph.tensors[int(op.inputs[1])]) is not None
            one_row.append(rows == 1 and not constant)
            sigmoid_second.append(rows != 1 and producer.get(int(op.inputs[1])) == "LOGISTIC")
    return len(one_row), sum(one_row), sum(sigmoid_second)


def _images(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(size=(n, SIZE, SIZE, 3)).astype("float32")


def test_every_attention_declares_its_int8_float_ops():
    assert NAMES == attention_registry.available()
    for name in NAMES:
        allowed = attention_registry.int8_float_ops(name)
        assert isinstance(allowed, frozenset)
        assert all(op.isupper() for op in allowed), allowed
        # A float island is entered and left by QUANTIZE / DEQUANTIZE, declared with it.
        assert not allowed or {"QUANTIZE", "DEQUANTIZE"} <= allowed, (name, allowed)


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_int8_full_integer_within_the_declared_float_ops(name, tmp_path):
    from keras_mvit2.export import run_tflite, to_tflite
    from keras_mvit2.quantize.tflite_graph import QuantizedGraph, UnsupportedGraphError

    allowed = attention_registry.int8_float_ops(name)
    calibrated = []
    # Without a declaration the strict default (no float op) must convert it.
    report = to_tflite(_host(name), tmp_path / "m.tflite", quantization="int8",
                       representative_data=_images(16, seed=1),
                       allow_float_ops=bool(allowed),
                       calibrated_edit=lambda graph, images: calibrated.append(graph) or graph)
    assert report.flex_ops == [] and report.custom_ops == []
    assert report.max_tensor_rank <= 4
    assert report.metadata["attention"] == [name]  # the file says which attention it runs
    assert set(report.float_ops) == allowed, (name, report.float_ops)  # declared = measured
    assert report.float_ops == float_ops_from_interpreter(report.path)
    assert np.all(np.isfinite(run_tflite(report.path, _images(2))))
    if allowed == SOFTMAX_FLOAT_ISLAND:  # islands by choice: the strict default converts too
        strict = to_tflite(_host(name), tmp_path / "strict.tflite", quantization="int8",
                           representative_data=_images(16, seed=1))
        assert strict.float_ops == {} and strict.op_histogram["SOFTMAX"] == report.op_histogram[
            "SOFTMAX"], (name, strict.op_histogram)
        assert np.all(np.isfinite(run_tflite(strict.path, _images(2))))
    # The kernels int8 is fast in (benchmarks/int8_speed.py times them): no int8 DIV (slow,
    # and it fails on a divisor rounded to 0), and every product in XNNPACK but those of one
    # row (which XNNPACK's packing never repays) and those with a sigmoid second (XNNPACK
    # refuses its fixed zero point): they stay in LiteRT's kernel.
    assert "DIV" not in report.op_histogram, (name, report.op_histogram)
    products, one_row, sigmoid_second = _products(report.path)
    assert one_row >= 2 * 9 + 3  # the norms' x . x: two in each of 9 layers, one per block
    assert products > one_row + sigmoid_second  # and the attentions' own
    # Mobile-Attention's scores of the 4 tokens at 64x64, one in each of the 4 blocks
    assert sigmoid_second == (4 if name == "mobile_attention" else 0), (name, sigmoid_second)
    assert report.ops_outside_xnnpack.get("BATCH_MATMUL", 0) == one_row + sigmoid_second, (
        name, report.ops_outside_xnnpack)
    # QAT's trainable graph is the calibrated graph: LiteRT runs it to the same outputs.
    if name not in QAT_ON_BATCHES:
        with pytest.raises(UnsupportedGraphError, match="on batches"):
            QuantizedGraph(calibrated[0], (tmp_path / "m.tflite").read_bytes())
        return
    (tmp_path / "calibrated.tflite").write_bytes(calibrated[0])
    expected = run_tflite(tmp_path / "calibrated.tflite", _images(2))
    graph = QuantizedGraph(calibrated[0], (tmp_path / "m.tflite").read_bytes())
    np.testing.assert_allclose(graph(_images(2), quantize=False).numpy(), expected,
                               atol=1e-4 * np.abs(expected).max(), err_msg=name)


@pytest.mark.slow
def test_tf_keras_twin_gives_the_keras_outputs():
    from keras_mvit2.quantize.twin_transfer import twin_outputs

    models = [_host(name) for name in NAMES]
    x = _images(4)
    twins = twin_outputs(models, x)  # one worker process for every attention
    for name, model, twin in zip(NAMES, models, twins, strict=True):
        expected = np.asarray(model.predict(x, verbose=0))
        assert twin.shape == expected.shape, name
        assert np.abs(expected).max() > 1e-2, name  # a real signal
        scale = max(1.0, float(np.abs(expected).max()))
        np.testing.assert_allclose(twin, expected, rtol=0, atol=1e-5 * scale, err_msg=name)


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_coreml_converts_in_the_attentions_layout(name, tmp_path):
    pytest.importorskip("coremltools")
    from keras_mvit2.export import to_coreml

    report = to_coreml(_host(name), tmp_path / "m.mlpackage", quantization="float32",
                       image_input=False)
    ops = report.op_histogram
    assert report.max_tensor_rank <= 5 and report.outputs[0]["shape"] == [1, 10]
    assert report.metadata["keras_mvit2.attention"] == name  # the package says which one
    assert ops.get("depth_to_space", 0) == 3  # one fold per MobileViTV2 block
    if name == "separable":
        # Channels-first: unfold by a depthwise 0/1 convolution, no space_to_depth.
        assert "space_to_depth" not in ops, ops
        assert ops.get("matmul", 0) == 1, ops  # the classifier only
    else:
        assert ops.get("space_to_depth", 0) == 3, ops  # the usual channels-last unfold


# --------------------------------------------------------------------------------------
# The export forms: one function in two layouts


def _to_first(tokens):
    """`(B, N, P, d)` -> `(B, d, P, N)`."""
    return np.transpose(tokens, (0, 3, 2, 1))


@pytest.mark.parametrize("variance", ["one_pass", "one_pass_matmul", "centred"])
@pytest.mark.parametrize("layout", ["channels_last", "channels_first"])
def test_group_norm_forms_agree(variance, layout, rng):
    x = rng.normal(0.3, 2.0, (2, 16, 4, 8)).astype("float32")
    tokens = tf.constant(x if layout == "channels_last" else _to_first(x))
    gamma = rng.uniform(0.5, 1.5, 8).astype("float32")
    beta = rng.normal(0.0, 0.2, 8).astype("float32")
    mean = x.mean(axis=(1, 2, 3), keepdims=True)
    want = (x - mean) / np.sqrt(x.var(axis=(1, 2, 3), keepdims=True) + 1e-5) * gamma + beta
    if layout == "channels_last":
        got = functional.group_norm1(tokens, gamma, beta, 1e-5, layout=CHANNELS_LAST,
                                     variance=variance)
    else:
        got = functional.group_norm1(tokens, gamma, beta, 1e-5, layout=CHANNELS_FIRST,
                                     variance=variance)
    got = keras.ops.convert_to_numpy(got)
    got = got if layout == "channels_last" else _to_first(got)
    np.testing.assert_allclose(got, want, atol=2e-5)


@pytest.mark.parametrize(
    "pooling, normaliser, layout",
    [(p, n, "channels_last") for p, n in itertools.product(
        ["matmul", "product_mean", "product_sum"], ["exp_mean", "softmax"])]
    + [(p, n, "channels_first") for p, n in itertools.product(
        ["product_mean", "product_sum"], ["exp_mean", "softmax"])],
)
def test_separable_attention_forms_agree(pooling, normaliser, layout, rng):
    from keras_mvit2.layers.export_forms import ExportForms

    layer = mv.layers.SeparableSelfAttention()
    x = rng.normal(size=(2, 16, 4, 8)).astype("float32")
    layer.build(x.shape)
    layer.qkv_proj.bias.assign(rng.normal(0, 0.1, layer.qkv_proj.bias.shape).astype("float32"))
    want = keras.ops.convert_to_numpy(layer(x))
    forms = ExportForms(token_pooling=pooling, token_normaliser=normaliser)
    if layout == "channels_last":
        got = functional.separable_attention(
            tf.constant(x), layer.qkv_proj.kernel, layer.qkv_proj.bias, layer.out_proj,
            layout=CHANNELS_LAST, forms=forms)
    else:
        out = layer.out_proj
        got = _to_first(functional.separable_attention(
            tf.constant(_to_first(x)), layer.qkv_proj.kernel, layer.qkv_proj.bias,
            lambda t: functional.pointwise_conv(t, out.kernel, out.bias, layout=CHANNELS_FIRST),
            layout=CHANNELS_FIRST, forms=forms))
    np.testing.assert_allclose(keras.ops.convert_to_numpy(got), want, atol=1e-5)


def test_tracing_sets_the_forms_and_block_call_and_restores_them():
    """A conversion's `tracing(forms, block_call=...)` is what the layers read inside it,
    nested traces restore the outer one, and leaving it restores `KERAS` and no redirect."""
    from keras_mvit2.layers import export_forms

    def redirect(block, inputs):
        return None

    assert export_forms.current() == export_forms.KERAS
    assert export_forms.current_block_call() is None
    with export_forms.tracing(export_forms.FLOAT_RUNTIME, block_call=redirect) as forms:
        assert forms == export_forms.current() == export_forms.FLOAT_RUNTIME
        assert forms.token_pooling == "product_mean"
        assert export_forms.current_block_call() is redirect
        with export_forms.tracing(export_forms.INT8):
            assert export_forms.current().variance == "one_pass_matmul"
            assert export_forms.current_block_call() is None
        assert export_forms.current() == export_forms.FLOAT_RUNTIME
        assert export_forms.current_block_call() is redirect
    assert export_forms.current() == export_forms.KERAS
    assert export_forms.current_block_call() is None
    with pytest.raises(TypeError, match="forms must be an ExportForms"):
        with export_forms.tracing({"variance": "centred"}):
            pass
    with pytest.raises(ValueError, match=r"ExportForms\.variance must be one of"):
        export_forms.ExportForms(variance="two_pass")


@pytest.mark.parametrize("form", ["space_to_depth", "depthwise_conv"])
@pytest.mark.parametrize("layout", ["channels_last", "channels_first"])
def test_unfold_forms_agree_and_fold_inverts(form, layout, rng):
    x = tf.constant(rng.normal(size=(2, 8, 12, 5)).astype("float32"))
    want = keras.ops.convert_to_numpy(mv.layers.unfold(x, 2))             # (2, 24, 4, 5)
    chosen = CHANNELS_LAST if layout == "channels_last" else CHANNELS_FIRST
    tokens = functional.unfold(x, 2, layout=chosen, form=form)
    got = keras.ops.convert_to_numpy(tokens)
    np.testing.assert_array_equal(got if layout == "channels_last" else _to_first(got), want)
    folded = functional.fold(tokens, (4, 6), 2, layout=chosen)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(folded), x.numpy())


def test_mobile_attention_without_its_flow_epsilon_is_the_same_function(rng):
    """Full int8 omits Mobile-Attention's eps (below one int8 step); in float the two
    forms differ by about eps."""
    from keras_mvit2.layers import export_forms

    layer = mv.layers.MobileAttention(num_heads=4)
    x = rng.normal(size=(2, 16, 4, 32)).astype("float32")
    want = keras.ops.convert_to_numpy(layer(x))
    with export_forms.tracing(export_forms.INT8):
        got = keras.ops.convert_to_numpy(layer(x))
    assert export_forms.INT8.flow_epsilon == "omit"
    assert np.abs(got - want).max() > 0  # a different graph ...
    np.testing.assert_allclose(got, want, atol=1e-5 * np.abs(want).max())  # ... same function


@pytest.mark.parametrize("shapes", [((2, 3, 4, 8), (2, 3, 8, 16)),     # a smaller: flipped
                                    ((2, 3, 16, 8), (2, 3, 8, 4)),     # b smaller: as is
                                    ((5, 8), (2, 3, 8, 16))])          # constant a (E)
@pytest.mark.parametrize("transpose_b", [False, True])
def test_products_in_either_order_are_the_same_function(shapes, transpose_b, rng):
    from keras_mvit2.layers.export_forms import INT8, KERAS

    a = rng.normal(size=shapes[0]).astype("float32")
    b = rng.normal(size=shapes[1]).astype("float32")
    if len(a.shape) == 2:  # Linformer's projection: a constant (p, k) times (B, k, D) tokens
        b = b[:, :, : a.shape[1], :]
    b_given = np.swapaxes(b, -1, -2).copy() if transpose_b else b
    want = np.matmul(a, b)
    for forms in (KERAS, INT8):
        got = functional.product(tf.constant(a), tf.constant(b_given), transpose_b=transpose_b,
                                 constant_a=len(a.shape) == 2, forms=forms)
        np.testing.assert_allclose(keras.ops.convert_to_numpy(got), want, rtol=1e-5, atol=1e-5)
