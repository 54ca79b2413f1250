"""keras_mvit2.quantize: the tf_keras twin, pruning and clustering (TFMOT, in the worker).

Real data (Fashion-MNIST, padded to 32x32 RGB), a small model made of keras_mvit2's
layers trained for 300 steps (int8 checks need trained weights; the committed checkpoint
`small_mvit.weights.h5`, made by tests/make_checkpoints.py), and real oracles:
the twin against the Keras 3 model, LiteRT runs of the exported files on held-out
test images, and the kernels read back from the exported flatbuffers.
"""

import importlib.util
import os

import keras
import numpy as np
import pytest

from keras_mvit2.layers import InvertedResidual
from keras_mvit2.models import MobileViTV2Block

FASHION_MNIST = "/usr/share/datasets/fashion-mnist"
pytestmark = [
    pytest.mark.skipif(not os.path.exists(FASHION_MNIST),
                       reason="needs Debian's dataset-fashion-mnist"),
    pytest.mark.skipif(
        importlib.util.find_spec("tensorflow_model_optimization") is None
        or importlib.util.find_spec("tf_keras") is None,
        reason="needs the tfmot extra (tf_keras, tensorflow-model-optimization)",
    ),
]

#: The checkpoint's training (`train_small_model` in tests/make_checkpoints.py): the first
#: TRAIN_STEPS x BATCH training images, one epoch.
TRAIN_STEPS = 300
BATCH = 64
#: The training images the tests below fit on (at most 30 batches: prune).
FIT_IMAGES = 30 * BATCH


def _images(x: np.ndarray) -> np.ndarray:
    """28x28 uint8 -> 32x32x3 float32 in [0, 1] (zero padding keeps values k/255)."""
    x = np.pad(x, ((0, 0), (2, 2), (2, 2)))
    return np.repeat(x[..., None], 3, -1).astype("float32") / 255.0


@pytest.fixture(scope="module")
def fmnist():
    from keras_mvit2.data import load_fashion_mnist_arrays

    x, y = load_fashion_mnist_arrays("train")
    xt, yt = load_fashion_mnist_arrays("test")
    return {
        "x": _images(x[:FIT_IMAGES]), "y": y[:FIT_IMAGES].astype("int64"),
        "x_test": _images(xt[:1000]), "y_test": yt[:1000].astype("int64"),
    }


def small_model() -> keras.Model:
    """Stem + InvertedResidual + MobileViTV2Block (unfold, GN1, separable attention,
    FFN, fold) + a residual InvertedResidual + classifier: every layer kind of the
    real model, small enough to train in seconds."""
    inputs = keras.Input((32, 32, 3), name="image")
    x = keras.layers.Conv2D(16, 3, strides=2, padding="same", use_bias=False,
                            name="stem_conv")(inputs)
    x = keras.layers.BatchNormalization(momentum=0.9, name="stem_bn")(x)
    x = keras.layers.Activation("silu", name="stem_act")(x)
    x = InvertedResidual(32, strides=2, name="ir1")(x)
    x = MobileViTV2Block(48, num_layers=1, ffn_dim=96, name="mvit")(x)
    x = InvertedResidual(32, strides=1, name="ir2")(x)
    x = keras.layers.GlobalAveragePooling2D(name="pool")(x)
    outputs = keras.layers.Dense(10, name="logits")(x)
    return keras.Model(inputs, outputs, name="small_mvit")


@pytest.fixture(scope="module")
def trained():
    """`small_model()` trained for TRAIN_STEPS steps: the committed checkpoint (its recipe:
    `train_small_model` in tests/make_checkpoints.py)."""
    from shared_fixtures import CHECKPOINTS

    model = small_model()
    model.load_weights(CHECKPOINTS / "small_mvit.weights.h5")
    return model


def _accuracy(logits, labels) -> float:
    return float(np.mean(np.argmax(logits, -1) == labels))


@pytest.mark.slow
def test_float_model_is_trained(trained, fmnist):
    # The int8 checks below mean something only for a trained model.
    acc = _accuracy(trained.predict(fmnist["x_test"], verbose=0), fmnist["y_test"])
    assert acc >= 0.7


# ------------------------------------------------------------------------------- the twin


@pytest.mark.slow
def test_twin_equals_keras3_model(fmnist):
    from model_utils import perturb_norms

    from keras_mvit2 import mobilevitv2_050
    from keras_mvit2.quantize.twin_transfer import twin_outputs

    models = []
    for attention in ("separable", "mha"):
        keras.utils.set_random_seed(1)
        model = mobilevitv2_050(input_shape=(32, 32, 3), classes=10,
                                classifier_activation=None, attention=attention)
        perturb_norms(model, seed=2)
        models.append(model)
    x = fmnist["x_test"][:16]
    twins = twin_outputs(models, x)
    for model, twin in zip(models, twins, strict=True):
        expected = np.asarray(model.predict(x, verbose=0))
        assert twin.shape == expected.shape
        assert np.abs(expected).max() > 0.1          # not a degenerate all-zero output
        assert np.abs(twin - expected).max() <= 1e-5, model.name


# ------------------------------------------------------------------------------- worker


@pytest.mark.slow
def test_worker_failure_is_a_clear_error(fmnist, tmp_path):
    from keras_mvit2.quantize import QuantizationWorkerError, prune

    @keras.saving.register_keras_serializable(package="test_sparsity")
    class Scale(keras.layers.Layer):
        def call(self, x):
            return 2.0 * x

    inputs = keras.Input((32, 32, 3))
    x = Scale(name="my_scale")(inputs)
    x = keras.layers.GlobalAveragePooling2D()(x)
    model = keras.Model(inputs, keras.layers.Dense(10)(x))
    with pytest.raises(QuantizationWorkerError) as info:
        prune(model, (fmnist["x"][:64], fmnist["y"][:64]), steps_per_epoch=2,
              output_path=tmp_path / "never.tflite", verbose=False)
    err = info.value
    assert err.error_type == "TwinError"
    assert "my_scale" in str(err) and "no tf_keras equivalent" in str(err)
    assert "Traceback" in err.worker_traceback
    assert not (tmp_path / "never.tflite").exists()


# ------------------------------------------------------------------------------- sparsity


def _kernel_size(model, path: str) -> int:
    return int(np.prod(next(w.shape for w in model.weights if w.path == path)))


@pytest.mark.slow
def test_prune_reaches_target_sparsity_in_keras_and_tflite(trained, fmnist, tmp_path):
    from keras_mvit2.export import run_tflite
    from keras_mvit2.quantize import prune

    target = 0.5
    path = tmp_path / "pruned.tflite"
    result = prune(trained, (fmnist["x"][:1920], fmnist["y"][:1920]), target_sparsity=target,
                   steps_per_epoch=30, batch_size=BATCH, output_path=path,
                   validation_data=(fmnist["x_test"], fmnist["y_test"]))
    model = result.model
    assert model is not trained and isinstance(model, keras.Model)
    # every Conv2D / Dense kernel, top-level and nested (attention, FFN, MV2 convs)
    assert "mvit/transformer_0/attn/qkv_proj/kernel" in result.kernels
    assert "ir1/expand_conv/kernel" in result.kernels and "logits/kernel" in result.kernels
    for weight_path, sparsity in result.kernels.items():
        assert sparsity >= target - 1.0 / _kernel_size(model, weight_path), weight_path
        value = next(w for w in model.weights if w.path == weight_path).numpy()
        assert np.mean(value == 0) == pytest.approx(sparsity)
    # The exported float32 file holds exactly those zeros (folding BN into the convs scales
    # output channels, zeros stay zeros). The separable attention reads its qkv_proj kernel
    # as three convs (query, key, value), so 12 kernels give 14 CONV_2D/FC weights.
    checked = [k for k in result.exported_kernels if k["op"] in ("CONV_2D", "FULLY_CONNECTED")]
    assert len(checked) == len(result.kernels) + 2
    sizes = [int(np.prod(k["shape"])) for k in checked]
    exported_zeros = sum(round(k["sparsity"] * n) for k, n in zip(checked, sizes, strict=True))
    pruned_zeros = sum(
        int(np.sum(w.numpy() == 0)) for w in model.weights if w.path in result.kernels
    )
    assert sum(sizes) == sum(_kernel_size(model, p) for p in result.kernels)
    assert exported_zeros == pruned_zeros
    full = [k for k, n in zip(checked, sizes, strict=True) if k["sparsity"] >= target - 1.0 / n]
    assert len(full) >= len(checked) - 3      # all but the three slices of qkv_proj
    # and it is the pruned model
    x = fmnist["x_test"][:32]
    np.testing.assert_allclose(run_tflite(path, x), model.predict(x, verbose=0), atol=1e-4)
    assert result.float_accuracy_after >= result.float_accuracy_before - 0.1


@pytest.mark.slow
def test_pruned_1x1_pairs_are_not_fused_on_export(fmnist, tmp_path):
    # Two back-to-back 1x1 convs (the pair to_tflite fuses by default): the product of
    # two pruned kernels is dense, so the export keeps them apart and keeps their zeros.
    from keras_mvit2.quantize import prune

    keras.utils.set_random_seed(0)
    inputs = keras.Input((32, 32, 3))
    x = keras.layers.Conv2D(16, 3, strides=4, padding="same", activation="relu")(inputs)
    x = keras.layers.Conv2D(32, 1, use_bias=False, name="a")(x)
    x = keras.layers.BatchNormalization(name="a_bn")(x)
    x = keras.layers.Conv2D(32, 1, activation="relu", name="b")(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    model = keras.Model(inputs, keras.layers.Dense(10)(x))
    result = prune(model, (fmnist["x"][:640], fmnist["y"][:640]), target_sparsity=0.5,
                   steps_per_epoch=10, batch_size=BATCH, output_path=tmp_path / "p.tflite")
    assert result.tflite_report.metadata["graph_optimizations"] is None
    convs = [k for k in result.exported_kernels if k["op"] == "CONV_2D"]
    assert len(convs) == 3
    assert all(k["sparsity"] >= 0.5 - 1.0 / np.prod(k["shape"]) for k in convs), convs


@pytest.mark.slow
def test_cluster_leaves_at_most_k_values_per_kernel(trained, fmnist, tmp_path):
    from keras_mvit2.quantize import cluster

    k = 8
    result = cluster(trained, (fmnist["x"][:1280], fmnist["y"][:1280]), num_clusters=k,
                     steps_per_epoch=20, batch_size=BATCH, output_path=tmp_path / "c.tflite")
    # stem, 2 per InvertedResidual (no depthwise), 6 in the block, the head
    assert len(result.kernels) == 12
    assert "mvit/transformer_0/fc1/kernel" in result.kernels
    assert max(result.kernels.values()) <= k
    assert min(result.kernels.values()) >= 2
    untouched = next(w for w in result.model.weights if w.path == "ir1/depthwise_conv/kernel")
    assert np.unique(untouched.numpy()).size > k      # depthwise kernels are not clustered
    exported = {e["op"]: [] for e in result.exported_kernels}
    for entry in result.exported_kernels:
        exported[entry["op"]].append(entry)
    # convs: BN is folded in (a scale per output channel), so <= k values per channel
    for entry in exported["CONV_2D"]:
        assert entry["max_unique_per_channel"] <= k, entry
    (dense,) = exported["FULLY_CONNECTED"]
    assert dense["unique"] <= k
