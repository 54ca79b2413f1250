"""keras_mvit2.kerashub: MobileViTv2 as a KerasHub Backbone / ImageClassifier with presets.

Oracles: `keras_mvit2.MobileViTV2` with the same weights (the same model), our own
preprocessing (`preprocess_images`), timm (tests/torch_oracle.py, in a subprocess) for
the presets, served by the loopback hub stand-in (tests/hub_standin.py); round trips
go through KerasHub's own `from_preset`.
"""

import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest
from model_utils import perturb_norms
from test_pretrained import hub_env  # noqa: F401

import keras_mvit2 as mv

keras_hub = pytest.importorskip("keras_hub")
import keras_mvit2.kerashub as mvhub  # noqa: E402

SIZE = 64
REPO = "timm/mobilevitv2_050.cvnets_in1k"


def _perturbed(model: keras.Model, seed: int = 0) -> keras.Model:
    """Non-trivial weights: perturbed norms and every variable jittered."""
    perturb_norms(model, seed)
    rng = np.random.default_rng(seed)
    for v in model.weights:
        if v.path.endswith(("moving_variance", "gamma")):
            continue
        v.assign(np.asarray(v) + rng.normal(0.0, 0.02, v.shape).astype("float32"))
    return model


@pytest.fixture(scope="module")
def net() -> keras.Model:
    """The reference: `mv.MobileViTV2(0.5)` at 64x64, 5 classes, logits."""
    return _perturbed(mv.MobileViTV2(0.5, input_shape=(SIZE, SIZE, 3), classes=5,
                                     classifier_activation=None))


@pytest.fixture(scope="module")
def classifier(net):
    return mvhub.classifier_from_model(net, 0.5)


@pytest.fixture(scope="module")
def preset_dir(classifier, tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("hub") / "mobilevitv2_050_test")
    classifier.save_to_preset(path)
    return path


def _raw_images(n: int = 3, height: int = 80, width: int = 100, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (n, height, width, 3)).astype("uint8")


# --------------------------------------------------------------------------------------
# Import: the core package never imports keras_hub; KerasHub finds our classes anyway
# --------------------------------------------------------------------------------------


@pytest.mark.slow
def test_import_is_lazy_and_keras_hub_import_registers_the_classes():
    code = (
        "import sys, keras_mvit2, keras\n"
        "assert 'keras_hub' not in sys.modules and 'keras_mvit2.kerashub' not in sys.modules\n"
        "import keras_hub\n"
        "names = ['MobileViTV2Backbone', 'MobileViTV2ImageClassifier',\n"
        "         'MobileViTV2ImageClassifierPreprocessor', 'MobileViTV2ImageConverter']\n"
        "got = [keras.saving.get_registered_object('keras_mvit2>' + n) for n in names]\n"
        "assert [c.__name__ for c in got] == names, got\n"
        "assert keras_mvit2.kerashub.MobileViTV2Backbone is got[0]\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().endswith("ok")


# --------------------------------------------------------------------------------------
# The same model
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("width, attention", [(0.75, "separable"), (0.5, "mha")])
def test_backbone_has_the_variables_of_mobilevitv2_notop(width, attention):
    ref = _perturbed(mv.MobileViTV2(width, include_top=False, input_shape=(32, 48, 3),
                                    attention=attention))
    backbone = mvhub.MobileViTV2Backbone(width, image_shape=(32, 48, 3), attention=attention)
    assert isinstance(backbone, keras_hub.models.Backbone)
    assert [(v.path, tuple(v.shape)) for v in backbone.weights] == [
        (v.path, tuple(v.shape)) for v in ref.weights]
    for a, b in zip(backbone.weights, ref.weights, strict=True):
        a.assign(b)
    x = np.random.default_rng(0).random((2, 32, 48, 3)).astype("float32")
    np.testing.assert_array_equal(np.asarray(backbone(x)), np.asarray(ref(x)))
    # get_config -> __init__ accepts every key (KerasHub's Backbone.from_config is cls(**config))
    config = backbone.get_config()
    clone = mvhub.MobileViTV2Backbone.from_config(json.loads(json.dumps(config)))
    assert clone.get_config() == config and clone.count_params() == backbone.count_params()


def test_classifier_logits_and_raw_image_predict_equal_mobilevitv2(net, classifier):
    assert isinstance(classifier, keras_hub.models.ImageClassifier)
    x = np.random.default_rng(2).random((4, SIZE, SIZE, 3)).astype("float32")
    diff = float(np.abs(np.asarray(classifier(x)) - np.asarray(net(x))).max())
    print(f"\n[keras_hub] max |hub classifier - MobileViTV2| logits = {diff:.1e}")
    assert diff <= 1e-6
    # predict on raw uint8 photos (any size) = our preprocessing + our model
    raw = _raw_images()
    expected = net.predict(mv.preprocess_images(raw, net), verbose=0)
    converter = classifier.preprocessor.image_converter
    np.testing.assert_array_equal(np.asarray(converter(raw)), mv.preprocess_images(raw, net))
    np.testing.assert_array_equal(np.asarray(converter(raw[0])),
                                  mv.preprocess_images(raw[0], net)[0])
    got = classifier.predict(raw, verbose=0)
    diff = float(np.abs(got - expected).max())
    print(f"[keras_hub] max |predict(uint8) - MobileViTV2(preprocess_images)| = {diff:.1e}")
    assert diff <= 1e-6


def test_save_to_preset_round_trips_through_keras_hubs_own_from_preset(classifier, preset_dir):
    files = set(os.listdir(preset_dir))
    assert {"config.json", "task.json", "model.weights.h5", "task.weights.h5",
            "preprocessor.json", "image_converter.json", "metadata.json"} <= files
    with open(os.path.join(preset_dir, "config.json")) as f:
        assert json.load(f)["registered_name"] == "keras_mvit2>MobileViTV2Backbone"
    raw = _raw_images(seed=3)
    expected = classifier.predict(raw, verbose=0)

    loaded = keras_hub.models.ImageClassifier.from_preset(preset_dir)
    assert type(loaded) is mvhub.MobileViTV2ImageClassifier
    assert type(loaded.preprocessor.image_converter) is mvhub.MobileViTV2ImageConverter
    np.testing.assert_array_equal(loaded.predict(raw, verbose=0), expected)


def test_preset_loads_through_the_backbone_the_subclass_and_the_preprocessor(classifier,
                                                                             preset_dir):
    backbone = keras_hub.models.Backbone.from_preset(preset_dir)
    assert type(backbone) is mvhub.MobileViTV2Backbone
    x = np.random.default_rng(4).random((2, SIZE, SIZE, 3)).astype("float32")
    np.testing.assert_array_equal(np.asarray(backbone(x)), np.asarray(classifier.backbone(x)))

    raw = _raw_images(seed=3)
    same = mvhub.MobileViTV2ImageClassifier.from_preset(preset_dir)
    np.testing.assert_array_equal(same.predict(raw, verbose=0),
                                  classifier.predict(raw, verbose=0))
    preprocessor = keras_hub.models.ImageClassifierPreprocessor.from_preset(preset_dir)
    assert type(preprocessor) is mvhub.MobileViTV2ImageClassifierPreprocessor


#: The fixed batch `fit` runs on: the first Fashion-MNIST training images.
FIT_IMAGES = 32


@pytest.mark.slow
def test_fit_on_fashion_mnist_lowers_the_loss(classifier, preset_dir):
    """`fit` after `from_preset` with a new head and size: on raw uint8 photos (the
    preprocessor in the step) with KerasHub's default loss, three steps on one fixed batch
    of FIT_IMAGES lower the loss below half its first value (0.15, 0.12, 0.17 of it for
    seeds 0, 1, 2). Eager steps: tracing MobileViTV2's training step takes ~3x the three
    steps; KerasHub's harness fits this class traced, three ways
    (tests/test_keras_hub_harness.py, `run_task_test`)."""
    from keras_mvit2.data.files import FASHION_MNIST_DIR, load_fashion_mnist_arrays

    if not os.path.isdir(FASHION_MNIST_DIR):
        pytest.skip(f"Fashion-MNIST not found in {FASHION_MNIST_DIR}")
    images, labels = load_fashion_mnist_arrays("train")
    images = np.repeat(images[:FIT_IMAGES, :, :, None], 3, axis=-1)  # uint8 (32, 28, 28, 3)
    labels = labels[:FIT_IMAGES].astype("int32")
    keras.utils.set_random_seed(0)
    # KerasHub's semantics: num_classes -> a new head, the preset's backbone weights;
    # image_shape -> the backbone at another size (the converter's size is set apart).
    tuned = mvhub.MobileViTV2ImageClassifier.from_preset(
        preset_dir, num_classes=10, image_shape=(32, 32, 3))
    tuned.preprocessor.image_size = (32, 32)
    assert tuned.output_dense.units == 10 and tuned.input_shape == (None, 32, 32, 3)
    assert tuned.preprocessor.image_converter(images[:2]).shape == (2, 32, 32, 3)
    for a, b in zip(tuned.backbone.weights, classifier.backbone.weights, strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=a.path)
    tuned.compile(optimizer=keras.optimizers.Adam(1e-3), run_eagerly=True)
    history = tuned.fit(images, labels, batch_size=FIT_IMAGES, epochs=3, verbose=0)
    losses = history.history["loss"]
    print(f"\n[keras_hub] Fashion-MNIST fit loss per epoch: {np.round(losses, 3).tolist()}")
    assert np.isfinite(losses).all()
    assert losses[-1] < 0.5 * losses[0]


# --------------------------------------------------------------------------------------
# Presets: published names and timm checkpoints through the hub stand-in
# --------------------------------------------------------------------------------------


def test_presets_list_one_name_per_published_tag():
    names = set(mvhub.PRESETS)
    assert len(names) == len(mv.list_weights())
    assert {"mobilevitv2_050_imagenet", "mobilevitv2_200_imagenet22k_ft_in1k_384",
            "mobilevitv2_050_imagenet_384"} <= names
    assert set(mvhub.MobileViTV2ImageClassifier.presets) == names
    assert set(mvhub.MobileViTV2Backbone.presets) == names


@pytest.fixture(scope="module")
def timm_050(timm_oracle_dir) -> dict:
    """A timm mobilevitv2_050 checkpoint (random weights, perturbed norms) and its
    logits at 256x256, from the run's timm oracle (conftest.py)."""
    out = timm_oracle_dir
    with np.load(out / "mobilevitv2_050.npz") as data:
        return {"safetensors": (out / "mobilevitv2_050.safetensors").read_bytes(),
                "x": data["x_256x256"], "logits": data["logits_256x256"]}


#: timm's config.json of the repo (its hub page, see docs/pretrained.md).
TIMM_CONFIG = {
    "architecture": "mobilevitv2_050", "num_classes": 1000, "num_features": 256,
    "pretrained_cfg": {
        "tag": "cvnets_in1k", "input_size": [3, 256, 256], "interpolation": "bicubic",
        "crop_pct": 0.888, "crop_mode": "center", "mean": [0.0, 0.0, 0.0],
        "std": [1.0, 1.0, 1.0], "num_classes": 1000, "pool_size": [8, 8],
        "first_conv": "stem.conv", "classifier": "head.fc",
    },
}


@pytest.mark.slow
def test_published_name_and_hf_timm_presets_equal_timm(timm_050, hub_env, tmp_path,  # noqa: F811
                                                       monkeypatch):
    from test_pretrained import _set_env

    hub_env.serve(REPO, "model.safetensors", timm_050["safetensors"])
    hub_env.serve(REPO, "config.json", json.dumps(TIMM_CONFIG).encode())
    x = timm_050["x"]

    named = mvhub.MobileViTV2ImageClassifier.from_preset("mobilevitv2_050_imagenet")
    assert type(named) is mvhub.MobileViTV2ImageClassifier
    converter = named.preprocessor.image_converter
    assert (converter.image_size, converter.crop_pct, converter.interpolation) == (
        (256, 256), 0.888, "bicubic")
    logits = np.asarray(named(x))
    diff_timm = float(np.abs(logits - timm_050["logits"]).max())
    reference = mv.MobileViTV2(0.5, weights="imagenet", classifier_activation=None)
    diff_ours = float(np.abs(logits - np.asarray(reference(x))).max())

    ported = mvhub.MobileViTV2ImageClassifier.from_preset(f"hf://{REPO}")
    diff_hf = float(np.abs(np.asarray(ported(x)) - logits).max())
    print(f"\n[keras_hub] mobilevitv2_050_imagenet: max |hub - timm| = {diff_timm:.1e}, "
          f"|hub - MobileViTV2(weights='imagenet')| = {diff_ours:.1e}, "
          f"|hf://timm - named| = {diff_hf:.1e}")
    assert diff_timm < 1e-4 and diff_ours <= 1e-6 and diff_hf <= 1e-6
    assert ported.preprocessor.image_converter.get_config() == converter.get_config()
    raw = _raw_images(n=2, height=300, width=260, seed=6)
    np.testing.assert_array_equal(
        named.predict(raw, verbose=0),
        reference.predict(mv.preprocess_images(raw, reference), verbose=0))

    backbone = mvhub.MobileViTV2Backbone.from_preset("mobilevitv2_050_imagenet")
    np.testing.assert_array_equal(np.asarray(backbone(x)), np.asarray(named.backbone(x)))

    # Converted once into a KerasHub preset directory under $KERAS_HOME; the next load
    # works offline from the caches, and the directory is an ordinary KerasHub preset.
    cached = sorted(os.listdir(tmp_path / "keras" / "keras_mvit2" / "presets"))
    assert [c.split(".")[0] for c in cached] == ["mobilevitv2_050_imagenet", "timm"]
    hub_env.stop()
    _set_env(monkeypatch, HF_HUB_OFFLINE="1")
    again = mvhub.MobileViTV2ImageClassifier.from_preset("mobilevitv2_050_imagenet")
    np.testing.assert_array_equal(np.asarray(again(x)), logits)
    plain = keras_hub.models.ImageClassifier.from_preset(
        str(tmp_path / "keras" / "keras_mvit2" / "presets" / cached[0]))
    assert type(plain) is mvhub.MobileViTV2ImageClassifier


# --------------------------------------------------------------------------------------
# Export: TFLite and Core ML, with or without the preprocessing
# --------------------------------------------------------------------------------------


@pytest.mark.slow
def test_tflite_export_with_and_without_preprocessing(net, classifier, tmp_path):
    from keras_mvit2.export import run_tflite, to_tflite

    raw = _raw_images(n=2, height=80, width=96, seed=7)
    # Without: the classifier itself, the network's input; the app resizes and crops.
    to_tflite(classifier, tmp_path / "bare.tflite")
    x = mv.preprocess_images(raw, net)
    diff_bare = float(np.abs(run_tflite(tmp_path / "bare.tflite", x)
                             - classifier.predict(raw, verbose=0)).max())
    # With: raw photos in; bilinear without antialiasing (TFLite's RESIZE_BILINEAR).
    with_pre = mvhub.inference_model(classifier, input_shape=(80, 96, 3),
                                     interpolation="bilinear", antialias=False)
    report = to_tflite(with_pre, tmp_path / "with.tflite")
    assert report.op_histogram.get("RESIZE_BILINEAR") == 1
    diff_pre = float(np.abs(run_tflite(tmp_path / "with.tflite", raw.astype("float32"))
                            - with_pre.predict(raw.astype("float32"), verbose=0)).max())
    print(f"\n[keras_hub] TFLite max |tflite - keras|: bare {diff_bare:.1e}, "
          f"with preprocessing {diff_pre:.1e}")
    assert diff_bare < 1e-4 and diff_pre < 1e-4
    # The Keras model with the converter's own transform is the classifier's predict.
    exact = mvhub.inference_model(classifier, input_shape=(80, 96, 3))
    diff_exact = float(np.abs(exact.predict(raw, verbose=0)
                              - classifier.predict(raw, verbose=0)).max())
    print(f"[keras_hub] max |inference_model(photos) - classifier.predict(photos)| = "
          f"{diff_exact:.1e}")
    assert diff_exact < 1e-5  # one graph vs preprocessing and network apart: rounding only


@pytest.mark.slow
def test_coreml_export_with_and_without_preprocessing(classifier, tmp_path):
    pytest.importorskip("coremltools")
    from keras_mvit2.export import to_coreml

    bare = to_coreml(classifier, tmp_path / "bare.mlpackage", quantization="float32")
    (image,) = bare.inputs
    assert (image["type"], image["width"], image["height"]) == ("imageType", SIZE, SIZE)
    # Core ML's image input divides by 255 itself: rescale=False.
    model = mvhub.inference_model(classifier, input_shape=(80, 96, 3),
                                  interpolation="bilinear", antialias=False, rescale=False)
    with_pre = to_coreml(model, tmp_path / "with.mlpackage", quantization="float32")
    (image,) = with_pre.inputs
    assert (image["type"], image["width"], image["height"]) == ("imageType", 96, 80)
    assert with_pre.op_histogram.get("resize_bilinear", 0) + with_pre.op_histogram.get(
        "upsample_bilinear", 0) == 1
