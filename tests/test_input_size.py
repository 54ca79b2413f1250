"""Models built for any input size: builders, `.keras` round trip, `with_input_size`, CLI.

Parity with timm at many sizes is in `test_dynamic_input.py`; the TFLite graph of a
dynamic model exported at a size in `test_tflite_export.py`. These tests use small
random models (64-100 px) and compare the dynamic model with itself or with a model
built for the size.
"""

import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf
from model_utils import perturb_norms

import keras_mvit2 as mv
from keras_mvit2.models.input_size import default_export_size, has_dynamic_size
from keras_mvit2.models.mobilevitv2.mobilevitv2_presets import check_pretrained_config

SIZES = ((64, 64), (65, 97), (96, 72))  # even, odd (every stage), non-square


def _logits(model, x):
    return keras.ops.convert_to_numpy(model(x, training=False))


@pytest.mark.parametrize(
    "build",
    [
        lambda s: mv.MobileViTV2(0.5, input_shape=s, classes=7),
        lambda s: mv.mobilevitv2_075(input_shape=s, include_top=False, pooling="avg"),
        lambda s: mv.create_model("mobilevitv2_050", input_shape=s, classes=7),
        lambda s: mv.create_model("mobilevit_xxs", input_shape=s, classes=7),
    ],
    ids=["MobileViTV2", "named_builder", "create_model", "mobilevit_v1"],
)
def test_dynamic_model_equals_the_model_built_for_each_size(build, rng):
    dynamic = build((None, None, 3))
    perturb_norms(dynamic)
    assert dynamic.input_shape == (None, None, None, 3)
    for size in SIZES:
        fixed = build((*size, 3))
        fixed.set_weights(dynamic.get_weights())
        x = rng.uniform(size=(2, *size, 3)).astype("float32")
        np.testing.assert_allclose(_logits(dynamic, x), _logits(fixed, x), atol=1e-5)


@pytest.mark.parametrize("dynamic_shape,size", [((None, 72, 3), (65, 72)),
                                                ((65, None, 3), (65, 97))])
def test_one_dynamic_side(dynamic_shape, size, rng):
    dynamic = mv.MobileViTV2(0.5, input_shape=dynamic_shape, classes=7)
    perturb_norms(dynamic)
    assert dynamic.input_shape == (None, *dynamic_shape)
    fixed = mv.MobileViTV2(0.5, input_shape=(*size, 3), classes=7)
    fixed.set_weights(dynamic.get_weights())
    x = rng.uniform(size=(2, *size, 3)).astype("float32")
    serve = tf.function(lambda t: dynamic(t, training=False),
                        input_signature=[tf.TensorSpec((None, *dynamic_shape))])
    np.testing.assert_allclose(serve(x).numpy(), _logits(fixed, x), atol=1e-5)


@pytest.mark.slow
def test_dynamic_model_round_trips_through_keras_file(tmp_path, rng):
    model = mv.MobileViTV2(0.5, input_shape=(None, None, 3), classes=5)
    perturb_norms(model)
    for i, size in enumerate(SIZES[1:]):
        x = rng.uniform(size=(2, *size, 3)).astype("float32")
        np.save(tmp_path / f"x{i}.npy", x)
        np.save(tmp_path / f"y{i}.npy", _logits(model, x))
    model.save(tmp_path / "m.keras")
    script = textwrap.dedent(
        f"""
        import numpy as np, keras, tensorflow as tf, keras_mvit2
        m = keras.saving.load_model({str(tmp_path / "m.keras")!r})
        print(m.input_shape)
        serve = tf.function(lambda x: m(x, training=False),
                            input_signature=[tf.TensorSpec((None, None, None, 3))])
        for i in range({len(SIZES) - 1}):
            x = np.load({str(tmp_path)!r} + f"/x{{i}}.npy")
            np.save({str(tmp_path)!r} + f"/eager{{i}}.npy", keras.ops.convert_to_numpy(m(x)))
            np.save({str(tmp_path)!r} + f"/traced{{i}}.npy", serve(x).numpy())
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip().splitlines()[-1] == "(None, None, None, 3)"
    for i in range(len(SIZES) - 1):
        expected = np.load(tmp_path / f"y{i}.npy")
        np.testing.assert_array_equal(np.load(tmp_path / f"eager{i}.npy"), expected)
        np.testing.assert_allclose(np.load(tmp_path / f"traced{i}.npy"), expected, atol=1e-5)


def test_with_input_size_builds_the_fixed_graph_with_the_same_weights(rng):
    dynamic = mv.MobileViTV2(0.5, input_shape=(None, None, 3), classes=4)
    perturb_norms(dynamic)
    assert has_dynamic_size(dynamic) and default_export_size(dynamic) == (256, 256)
    fixed = mv.with_input_size(dynamic, (65, 97))
    assert fixed.input_shape == (None, 65, 97, 3) and not has_dynamic_size(fixed)
    assert fixed.name == dynamic.name
    assert [w.path for w in fixed.weights] == [w.path for w in dynamic.weights]
    x = rng.uniform(size=(2, 65, 97, 3)).astype("float32")
    np.testing.assert_array_equal(_logits(fixed, x), _logits(dynamic, x))
    # The twin holds copies: training one does not move the other.
    fixed.get_layer("predictions").kernel.assign(
        np.zeros(fixed.get_layer("predictions").kernel.shape, "float32"))
    assert np.abs(keras.ops.convert_to_numpy(dynamic.get_layer("predictions").kernel)).max() > 0
    assert mv.with_input_size(fixed, (65, 97)) is fixed
    assert mv.with_input_size(dynamic, 80).input_shape == (None, 80, 80, 3)
    half = mv.MobileViTV2(0.5, input_shape=(None, 72, 3), classes=4)
    assert default_export_size(half) == (256, 72)


@pytest.mark.parametrize(
    "size,match",
    [((64, 64), "fixed at 65"), (0, "positive int"), ("big", "positive int"),
     ((64, 64, 3), "positive int")],
)
def test_with_input_size_errors(size, match):
    model = mv.MobileViTV2(0.5, input_shape=(65, 97, 3), classes=4)
    with pytest.raises(ValueError, match=match):
        mv.with_input_size(model, size)


def test_dynamic_graph_resizes_only_odd_maps():
    """Traced for (None, None): one align-corners resize per block, run only when a side
    of its input is odd (a cond), not before every block."""
    model = mv.MobileViTV2(0.5, input_shape=(None, None, 3), include_top=False)
    serve = tf.function(lambda x: model(x, training=False),
                        input_signature=[tf.TensorSpec((None, None, None, 3))])
    graph = serve.get_concrete_function().graph
    ops = [op.type for op in graph.get_operations()]
    assert ops.count("If") + ops.count("StatelessIf") == 3  # one per MobileViTv2 block
    # 64x64: maps of 8, 4, 2 at the blocks; 65x97: 9x13 -> 10x14, 5x7 -> 6x8, 3x4 -> 4x4.
    assert tuple(serve(np.zeros((1, 64, 64, 3), "float32")).shape) == (1, 2, 2, 256)
    assert tuple(serve(np.zeros((1, 65, 97, 3), "float32")).shape) == (1, 4, 4, 256)


def test_pretrained_tag_accepts_a_dynamic_size():
    entry, shape = check_pretrained_config(
        0.5, "imagenet", include_top=True, classes=1000, input_shape=(None, None, 3),
        input_tensor=None, attention="separable")
    assert shape == (None, None, 3) and entry.input_size == 256
    with pytest.raises(ValueError, match="a fixed input must be"):
        check_pretrained_config(
            0.5, "imagenet", include_top=True, classes=1000, input_shape=(224, None, 3),
            input_tensor=None, attention="separable")


@pytest.mark.slow
def test_cli_exports_a_dynamic_keras_file_at_the_size_asked(tmp_path):
    from keras_mvit2.cli.main import main
    from keras_mvit2.export import inspect_tflite

    model = mv.MobileViTV2(0.5, input_shape=(None, None, 3), classes=3)
    model.save(tmp_path / "m.keras")
    assert main(["export", str(tmp_path / "m.keras"), "-o", str(tmp_path / "a.tflite"),
                 "--input-size", "96", "128"]) == 0
    assert inspect_tflite(tmp_path / "a.tflite").inputs[0].shape == (1, 96, 128, 3)


# Slow tier: three task models built at two sizes and traced (12-14 s each on an AVX2-only
# CPU alone, over 30 s beside other work); the fast tier has the classifier's
# (test_dynamic_model_equals_the_model_built_for_each_size).
@pytest.mark.slow
@pytest.mark.parametrize("builder", ["DeepLabV3", "PSPNet", "SSDLite"])
def test_task_models_built_for_any_size(builder, rng):
    from keras_mvit2 import tasks

    build = getattr(tasks, builder)
    keras.utils.set_random_seed(0)
    dynamic = build(0.5, input_shape=(None, None, 3), classes=5)
    perturb_norms(dynamic)
    serve = tf.function(lambda t: dynamic(t, training=False),
                        input_signature=[tf.TensorSpec((None, None, None, 3))])
    for size in ((64, 64), (65, 97)):
        fixed = build(0.5, input_shape=(*size, 3), classes=5)
        fixed.set_weights(dynamic.get_weights())
        x = rng.uniform(size=(2, *size, 3)).astype("float32")
        expected = _logits(fixed, x)
        np.testing.assert_allclose(_logits(dynamic, x), expected, atol=1e-5)
        # The traced graph's fused kernels round differently from eager ones: PSPNet's
        # outputs (up to ~6) differed by up to 1.05e-5 in 8 random initialisations (one in
        # eight over a flat 1e-5, ~2e-6 of the largest output), so the bound is 1e-5 of it.
        scale = max(1.0, float(np.abs(expected).max()))
        np.testing.assert_allclose(serve(x).numpy(), expected, atol=1e-5 * scale)
        if builder == "SSDLite":
            assert dynamic.anchors is None
            np.testing.assert_array_equal(
                tasks.anchors_for_model(dynamic, image_size=size), fixed.anchors)
    if builder == "SSDLite":
        with pytest.raises(ValueError, match="pass image_size"):
            tasks.anchors_for_model(dynamic)
    # The size-free layers (BilinearResize(size=None), Reshape(-1)) survive their configs.
    rebuilt = keras.Model.from_config(dynamic.get_config())
    rebuilt.set_weights(dynamic.get_weights())
    x = rng.uniform(size=(1, 65, 97, 3)).astype("float32")
    np.testing.assert_array_equal(_logits(rebuilt, x), _logits(dynamic, x))


@pytest.mark.slow
def test_segmentation_model_exports_the_fixed_size_graph(tmp_path):
    """PSPNet built for any size, exported at 65x97 (odd maps, uneven pyramid bins): the
    TFLite ops of the model built for 65x97."""
    from keras_mvit2.export import to_tflite
    from keras_mvit2.tasks import PSPNet

    dynamic = PSPNet(0.5, input_shape=(None, None, 3), classes=5)
    fixed = PSPNet(0.5, input_shape=(65, 97, 3), classes=5)
    a = to_tflite(dynamic, tmp_path / "dynamic.tflite", image_size=(65, 97))
    b = to_tflite(fixed, tmp_path / "fixed.tflite")
    assert a.inputs[0].shape == b.inputs[0].shape == (1, 65, 97, 3)
    assert a.op_histogram == b.op_histogram


@pytest.mark.slow
def test_coreml_export_of_a_dynamic_model_at_a_size(tmp_path):
    pytest.importorskip("coremltools")
    from keras_mvit2.export.coreml import to_coreml

    dynamic = mv.MobileViTV2(0.5, input_shape=(None, None, 3), classes=3)
    fixed = mv.MobileViTV2(0.5, input_shape=(64, 96, 3), classes=3)
    a = to_coreml(dynamic, tmp_path / "dynamic.mlpackage", image_size=(64, 96))
    b = to_coreml(fixed, tmp_path / "fixed.mlpackage")
    (image,) = a.inputs
    assert (image["height"], image["width"]) == (64, 96)
    assert a.op_histogram == b.op_histogram
