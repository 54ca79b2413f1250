"""Activation ranges of full-int8 files (`to_tflite(activation_ranges=...)`) and the attention
equalization rewrite (`keras_mvit2.export.equalize_attention`).

Oracles: numpy's percentiles of the raw samples; a brute-force search of the squared
quantization error written out here (clip, round to the int8 grid, compare); the
converter's own min / max file; for the rewrite, the original Keras model's logits.
"""

import keras
import model_utils
import numpy as np
import pytest
import tiny_model
from ai_edge_litert.interpreter import Interpreter

import keras_mvit2 as mv
from keras_mvit2.export import (
    equalize_attention,
    inspect_tflite,
    read_tflite_metadata,
    to_tflite,
)
from keras_mvit2.export.tflite.activation_ranges import (
    BINS,
    check_range_method,
    choose_range,
)


def _heavy_tailed(seed=0, n=200_000):
    """SiLU of a Student-t: most values near 0, a long right tail (as post-SiLU maps)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_t(3, size=n)
    return x / (1 + np.exp(-x))


def _histogram(samples):
    lo, hi = float(samples.min()), float(samples.max())
    return np.histogram(samples, bins=BINS, range=(lo, hi))[0].astype("float64"), lo, hi


def _quantization_mse(samples, a, b):
    """The squared error of int8 fake quantization of `samples` with range [a, b]."""
    step = (b - a) / 255.0
    q = np.round((np.clip(samples, a, b) - a) / step) * step + a
    return float(np.mean((q - samples) ** 2))


def test_percentile_range_matches_numpy():
    samples = _heavy_tailed()
    hist, lo, hi = _histogram(samples)
    a, b = choose_range(hist, lo, hi, "p99.99")
    bin_width = (hi - lo) / BINS
    assert a == pytest.approx(np.percentile(samples, 0.005), abs=bin_width)
    assert b == pytest.approx(np.percentile(samples, 99.995), abs=bin_width)
    assert lo <= a <= 0.0 <= b < hi  # (SiLU piles values at its minimum: a may be lo)


def test_mse_range_is_the_least_squared_error():
    samples = _heavy_tailed(seed=1)
    hist, lo, hi = _histogram(samples)
    a, b = choose_range(hist, lo, hi, "mse")
    chosen = _quantization_mse(samples, a, b)
    # A brute-force search over the same kind of grid, on the raw samples.
    grid = np.linspace(0.05, 1.0, 40)
    best = min(_quantization_mse(samples, lo * fa, hi * fb) for fa in grid for fb in grid)
    assert chosen <= 1.02 * best
    # ... and better than the global min / max on such a tail (0.0019 vs 0.0024 here).
    assert chosen < 0.9 * _quantization_mse(samples, lo, hi)


def test_minmax_and_degenerate_ranges_are_kept():
    hist, lo, hi = _histogram(_heavy_tailed())
    assert choose_range(hist, lo, hi, "minmax") == (lo, hi)
    assert choose_range(np.zeros(BINS), -1.0, 2.0, "p99.99") == (-1.0, 2.0)
    # a non-negative tensor keeps its lower bound
    hist, lo, hi = _histogram(np.abs(_heavy_tailed()))
    assert choose_range(hist, lo, hi, "mse")[0] == lo


@pytest.mark.parametrize("bad", ["p100", "p50", "percentile", "max", None, 99.99])
def test_bad_method_is_a_clear_error(bad):
    with pytest.raises(ValueError, match="activation_ranges must be one of"):
        check_range_method(bad)


def _scales(path):
    interpreter = Interpreter(model_path=str(path))
    return {d["name"]: d["quantization"][0] for d in interpreter.get_tensor_details()
            if d["dtype"] == np.int8 and d["quantization"][0]}


def _zero_points(path):
    interpreter = Interpreter(model_path=str(path))
    return {d["name"]: d["quantization"][1] for d in interpreter.get_tensor_details()}


def _op_outputs(path, op_name):
    interpreter = Interpreter(model_path=str(path))
    details = interpreter.get_tensor_details()
    return {details[i]["name"] for op in interpreter._get_ops_details()
            if op["op_name"] == op_name for i in op["outputs"]}


@pytest.fixture(scope="module")
def small_model():
    """A MobileViTV2-0.5 at 32x32 with non-trivial norm affines and biases (not the 1 / 0
    initialization), and images for it."""
    keras.utils.set_random_seed(0)
    model = mv.MobileViTV2(0.5, input_shape=(32, 32, 3), classes=10, classifier_activation=None)
    rng = np.random.default_rng(0)
    model_utils.spread_affines(model, rng)
    return model, rng.random((12, 32, 32, 3)).astype("float32")


@pytest.mark.slow  # two full-int8 conversions
def test_default_ranges_are_narrower_and_recorded(small_model, tmp_path):
    model, images = small_model
    files = {}
    for method in ("minmax", None):
        files[method] = tmp_path / f"{method}.tflite"
        to_tflite(model, files[method], quantization="int8", representative_data=images,
                  activation_ranges=method)
    minmax, default = _scales(files["minmax"]), _scales(files[None])
    common = set(minmax) & set(default)
    assert len(common) > 100
    # Every clipped range is within the min / max one (a percentile never widens it), but
    # for the matrix products' second operands, made to cover it with zero point 0 ...
    zero_points = _zero_points(files[None])
    widened = {n for n in common if default[n] > minmax[n] * (1 + 1e-6)}
    assert all(zero_points[n] == 0 for n in widened)
    assert all(default[n] <= 255 / 127 * minmax[n] * (1 + 1e-6) for n in widened)
    # ... many are narrower, and the fixed-range outputs (sigmoid: 1/256) are untouched.
    assert sum(default[n] < 0.99 * minmax[n] for n in common) > 20
    for name in _op_outputs(files[None], "LOGISTIC"):
        assert default[name] == pytest.approx(1 / 256)
    assert read_tflite_metadata(files[None])["calibration"]["activation_ranges"] == "p99.99"
    assert read_tflite_metadata(files["minmax"])["calibration"]["activation_ranges"] == "minmax"


def _matmul_operands(path):
    """Per BATCH_MATMUL of the file: its int8 operands, output, adjoint flags and whether its
    first operand is one row, as XNNPACK (LiteRT's default delegate, what phones run)
    computed them on one random image."""
    from keras_mvit2.export.tflite.flatbuffer import op_names, parse_flatbuffer

    model = parse_flatbuffer(str(path))
    kinds = op_names(model)
    flags = [(bool(op.builtinOptions.adjX), bool(op.builtinOptions.adjY))
             for op in model.subgraphs[0].operators if kinds[op.opcodeIndex] == "BATCH_MATMUL"]
    interpreter = Interpreter(model_path=str(path), experimental_preserve_all_tensors=True)
    interpreter.allocate_tensors()
    inp = interpreter.get_input_details()[0]
    image = np.random.default_rng(1).random(inp["shape"]).astype(inp["dtype"])
    interpreter.set_tensor(inp["index"], image)
    interpreter.invoke()
    details = interpreter.get_tensor_details()

    def tensor(i):
        return interpreter.get_tensor(i).astype(np.int64), details[i]["quantization"]

    ops = [op for op in interpreter._get_ops_details() if op["op_name"] == "BATCH_MATMUL"]
    out = []
    for op, (adj_x, adj_y) in zip(ops, flags, strict=True):
        a = tensor(op["inputs"][0])
        rows = a[0].shape[-1] if adj_x else a[0].shape[-2]
        out.append((a, tensor(op["inputs"][1]), tensor(op["outputs"][0]), (adj_x, adj_y),
                    rows == 1))
    return out


def test_matmul_second_operands_pick_the_kernel_and_every_product_is_exact(tmp_path):
    # XNNPACK (LiteRT's CPU delegate) takes an int8 BATCH_MATMUL only where the second
    # operand's zero point is 0: a product whose first operand has several rows gets zero
    # point 0 (XNNPACK, 20-30x LiteRT's kernel on the attentions' products), one of a single
    # row (the GroupNorm's x . x: a one-column operand XNNPACK pads to its tile) a non-zero
    # one (LiteRT's kernel). Either way the product is exact: the oracle is the int8
    # arithmetic written out in numpy, on the values XNNPACK's interpreter computed.
    keras.utils.set_random_seed(0)
    model = tiny_model.tiny_mvit2(classes=10, classifier_activation=None)
    rng = np.random.default_rng(0)
    model_utils.spread_affines(model, rng)  # as a trained model's
    path = tmp_path / "tiny.tflite"
    to_tflite(model, path, quantization="int8",
              representative_data=rng.random((16, 32, 32, 3)).astype("float32"))
    products = _matmul_operands(path)
    one_row = sum(p[-1] for p in products)
    assert one_row >= 3 and len(products) - one_row >= 1  # the norms' and the attentions'
    for (a, (sa, za)), (b, (sb, zb)), (out, (so, zo)), (adj_x, adj_y), row in products:
        assert (zb != 0) if row else (zb == 0)
        a = np.swapaxes(a - za, -1, -2) if adj_x else a - za
        b = np.swapaxes(b - zb, -1, -2) if adj_y else b - zb
        expected = np.clip(np.round(np.matmul(a, b) * (sa * sb / so)) + zo, -128, 127)
        assert np.abs(out - expected).max() <= 1
    # ... and XNNPACK runs every product but those of one row.
    report = inspect_tflite(path)
    assert report.ops_outside_xnnpack.get("BATCH_MATMUL", 0) == one_row


def test_equalize_attention_is_float_exact(small_model):
    model, images = small_model
    equalized, report = equalize_attention(model, images[:4], batch_size=4)
    assert [r.layer for r in report] == [
        f"stage{s}_block1/transformer_{i}/attn" for s, n in ((2, 2), (3, 4), (4, 3))
        for i in range(n)]
    assert all(r.product_spread >= 1.0 and r.value_spread >= 1.0 for r in report)
    before = keras.ops.convert_to_numpy(model(images, training=False))
    after = keras.ops.convert_to_numpy(equalized(images, training=False))
    assert np.max(np.abs(after - before)) <= 1e-5 * max(1.0, np.max(np.abs(before)))
    # the model given is not changed, the copy is
    attn = "stage3_block1/transformer_0/attn"
    original = {w.path: np.array(w) for w in model.weights if attn in w.path}
    changed = {w.path: np.array(w) for w in equalized.weights if attn in w.path}
    assert any(not np.allclose(original[p], changed[p]) for p in original if p in changed)


def test_activation_ranges_need_a_calibrated_quantization(small_model, tmp_path):
    model, _ = small_model
    with pytest.raises(ValueError, match="activation_ranges applies to the calibrated"):
        to_tflite(model, tmp_path / "m.tflite", activation_ranges="p99.99")


def test_cli_option_reaches_to_tflite():
    import argparse

    from keras_mvit2.export.tflite.target import TFLITE

    parser = argparse.ArgumentParser()
    parser.add_argument("--quantization")
    TFLITE.add_cli_arguments(parser.add_argument_group())
    common = ["--calibration-data", "fashion_mnist", "--activation-ranges", "mse"]
    args = parser.parse_args(["--quantization", "int8", *common])
    assert TFLITE.cli_arguments(args)["activation_ranges"] == "mse"
    assert "activation_ranges" not in TFLITE.cli_arguments(
        parser.parse_args(["--quantization", "int8", "--calibration-data", "fashion_mnist"]))
    args = parser.parse_args(["--quantization", "float16", "--activation-ranges", "mse"])
    with pytest.raises(ValueError, match="--activation-ranges applies to --quantization int8"):
        TFLITE.cli_arguments(args)
