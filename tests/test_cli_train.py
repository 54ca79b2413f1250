"""`mvit2 train / finetune / eval` run in-process (`keras_mvit2.cli.main.main`).

The runs train a tiny registered classifier (one strided convolution, BatchNorm and the
package's classifier head: the commands do not care about the architecture, and its train
step traces in seconds on 2 shared cores) on a tiny folder of PNG images written here:
three classes of noisy solid colours, 32x32, so the evaluation transform (resize to the
model's 32x32 with crop ratio 1) leaves the pixels as written and the oracle can read the
PNGs directly.
"""

import json
import os

import keras
import numpy as np
import pytest
import yaml
from PIL import Image

from keras_mvit2 import __version__
from keras_mvit2.cli.main import main
from keras_mvit2.data import FASHION_MNIST_CLASSES
from keras_mvit2.data.files import FASHION_MNIST_DIR
from keras_mvit2.models import list_models
from keras_mvit2.models.builder_utils import classifier_head, load_weights, model_input
from keras_mvit2.models.registry import register_model

CLASSES = ("blue", "green", "red")
COLOURS = {"red": (200, 40, 40), "green": (40, 180, 60), "blue": (40, 60, 200)}
PER_CLASS = 12
SIZE = 32


def cli_tiny_classifier(
    include_top=True,
    weights=None,
    input_tensor=None,
    input_shape=None,
    pooling=None,
    classes=3,
    classifier_activation="softmax",
    dropout=0.0,
    name="cli_tiny_classifier",
):
    inputs, x = model_input(input_tensor, input_shape or (SIZE, SIZE, 3))
    x = keras.layers.Conv2D(8, 3, strides=4, use_bias=False, name="stem_conv")(x)
    x = keras.layers.BatchNormalization(name="stem_bn")(x)
    x = keras.layers.Activation("silu", name="stem_act")(x)
    outputs = classifier_head(x, include_top=include_top, pooling=pooling, classes=classes,
                              classifier_activation=classifier_activation, dropout=dropout)
    model = keras.Model(inputs, outputs, name=name)
    load_weights(model, weights)
    return model


if "cli_tiny_classifier" not in list_models():
    register_model(cli_tiny_classifier)

#: Small settings on top of the packaged Fashion-MNIST recipe.
TINY = ["model.name=cli_tiny_classifier", f"model.image_size={SIZE}", "data.batch_size=8",
        "data.eval_batch_size=16", "training.epochs=2", "schedule.warmup_epochs=0",
        "optimizer.reference_batch_size=8", "output.verbose=0"]


def _sets(items):
    return [arg for item in items for arg in ("--set", item)]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("images")
    rng = np.random.default_rng(0)
    for name in CLASSES:
        os.makedirs(root / name)
        for i in range(PER_CLASS):
            pixels = np.array(COLOURS[name]) + rng.normal(0, 40, (SIZE, SIZE, 3))
            Image.fromarray(np.clip(pixels, 0, 255).astype("uint8")).save(
                root / name / f"{i:02d}.png")
    return root


@pytest.fixture(scope="module")
def run(folder, tmp_path_factory):
    """One `mvit2 train` run on the folder; returns (run folder, exit code, stdout)."""
    import contextlib
    import io

    out = tmp_path_factory.mktemp("run") / "run"
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        code = main(["train", "--config", "fashion_mnist", "--data", str(folder), "-o",
                     str(out), *_sets(TINY)])
    return out, code, stdout.getvalue()


def _errors(capsys, argv):
    code = main(argv)
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1, err
    return err


@pytest.mark.slow
def test_train_writes_the_run_and_prints_metrics_and_paths(run, folder):
    out, code, stdout = run
    assert code == 0
    for name in ("model.keras", "model_ema.keras", "metrics.json", "config.yaml", "run.json",
                 "checkpoints/epoch_0002.weights.h5", "checkpoints/state.json"):
        assert (out / name).exists(), name
    config = yaml.safe_load((out / "config.yaml").read_text())
    # --data replaced the config's Fashion-MNIST source; 10 % of the folder is held out.
    assert config["data"]["source"] == "image_folder"
    assert config["data"]["train"] == str(folder)
    assert config["data"]["validation_fraction"] == 0.1
    assert config["model"]["num_classes"] is None
    assert config["output"]["dir"] == str(out)
    run_info = json.loads((out / "run.json").read_text())
    assert run_info["class_names"] == list(CLASSES)
    assert run_info["keras_mvit2"] == __version__
    assert run_info["train_examples"] + run_info["validation_examples"] == 3 * PER_CLASS
    metrics = json.loads((out / "metrics.json").read_text())
    assert len(metrics["history"]) == 2
    # The table shows the validation metrics of the run; the paths are printed.
    top1 = metrics["metrics"]["ema"]["top1"]
    assert f"{100 * top1:.2f}" in stdout
    for name in ("top-1", *CLASSES, str(out / "model.keras"), str(out / "checkpoints")):
        assert name in stdout


@pytest.mark.slow
def test_eval_report_matches_numpy_on_the_models_predictions(run, folder, capsys):
    out, code, _ = run
    assert code == 0
    report_dir = out.parent / "report"
    capsys.readouterr()
    assert main(["eval", str(out), "--data", str(folder), "-o", str(report_dir)]) == 0
    stdout = capsys.readouterr().out
    report = json.loads((report_dir / "eval.json").read_text())
    assert report["model"] == str(out / "model_ema.keras")  # a run folder: the EMA model
    assert report["class_names"] == list(CLASSES)

    # Oracle: the PNGs as written (32x32 = the model's input, crop ratio 1: no resize).
    model = keras.saving.load_model(out / "model_ema.keras")
    images, truth = [], []
    for label, name in enumerate(CLASSES):
        for file in sorted(os.listdir(folder / name)):
            images.append(np.asarray(Image.open(folder / name / file), "float32") / 255.0)
            truth.append(label)
    predicted = model.predict(np.stack(images), verbose=0).argmax(-1)
    truth = np.array(truth)
    confusion = np.bincount(3 * truth + predicted, minlength=9).reshape(3, 3)
    np.testing.assert_array_equal(report["confusion_matrix"], confusion)
    assert report["num_examples"] == 3 * PER_CLASS
    assert report["top1"] == pytest.approx(np.mean(predicted == truth))
    assert report["top5"] == 1.0  # top-k with k = 3 classes
    for label, name in enumerate(CLASSES):
        assert report["per_class_accuracy"][name] == pytest.approx(
            np.mean(predicted[truth == label] == label))
    png = report_dir / "confusion_matrix.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with Image.open(png) as image:
        image.verify()
    with Image.open(png) as image:
        assert image.format == "PNG" and min(image.size) > 200
    assert f"{100 * report['top1']:.2f}" in stdout and "green" in stdout
    assert str(png) in stdout


@pytest.mark.slow
def test_finetune_with_a_frozen_backbone_keeps_it(run, folder, tmp_path):
    out, code, _ = run
    assert code == 0
    source = keras.saving.load_model(out / "model.keras")
    weights = tmp_path / "pretrained.weights.h5"
    source.save_weights(weights)
    target = tmp_path / "finetuned"
    code = main(["finetune", "--config", "fashion_mnist", "--weights", str(weights),
                 "--freeze-backbone", "--data", str(folder), "-o", str(target), "--export", "none",
                 *_sets([*TINY, "training.epochs=1"])])
    assert code == 0
    tuned = keras.saving.load_model(target / "model.keras")
    for layer in ("stem_conv", "stem_bn"):  # frozen: the pretrained values, BN stats included
        for before, after in zip(source.get_layer(layer).get_weights(),
                                 tuned.get_layer(layer).get_weights(), strict=True):
            np.testing.assert_array_equal(before, after)
    kernel_before = source.get_layer("predictions").get_weights()[0]
    kernel_after = tuned.get_layer("predictions").get_weights()[0]
    assert not np.allclose(kernel_before, kernel_after)  # a new, trained head
    config = yaml.safe_load((target / "config.yaml").read_text())
    assert config["model"]["weights"] == str(weights)
    assert config["model"]["freeze_backbone"] is True


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists(os.path.join(FASHION_MNIST_DIR,
                                                   "t10k-images-idx3-ubyte.gz")),
                    reason="Debian's dataset-fashion-mnist is not installed")
def test_fashion_mnist_train_and_eval(tmp_path, capsys):
    out = tmp_path / "fashion"
    code = main(["train", "--config", "fashion_mnist", "--data", "fashion_mnist", "-o", str(out),
                 *_sets([*TINY, "data.train_limit=64", "data.validation_limit=32",
                         "training.epochs=1"])])
    assert code == 0
    capsys.readouterr()
    assert main(["eval", str(out / "model.keras"), "--data", "fashion_mnist",
                 "--batch-size", "500"]) == 0
    report = json.loads((out / "eval" / "eval.json").read_text())
    assert report["num_examples"] == 10_000  # the whole test set
    assert report["class_names"] == list(FASHION_MNIST_CLASSES)
    confusion = np.array(report["confusion_matrix"])
    # The official test set has 1,000 images of every class.
    np.testing.assert_array_equal(confusion.sum(1), np.full(10, 1000))
    assert report["top1"] == pytest.approx(np.trace(confusion) / 10_000)
    assert "Ankle boot" in capsys.readouterr().out


@pytest.mark.slow
def test_eval_at_another_size_uses_the_same_weights(run, folder, capsys):
    """A model trained at 32x32 evaluated with --image-size 48: the trained layers run the
    48x48 images (as one model for any size), no second model to build."""
    from keras_mvit2 import data as mvdata
    from keras_mvit2.models.input_size import with_dynamic_size

    out, code, _ = run
    assert code == 0
    report_dir = out.parent / "report48"
    assert main(["eval", str(out), "--data", str(folder), "--image-size", "48", "--crop-ratio", "1",
                 "-o", str(report_dir)]) == 0
    report = json.loads((report_dir / "eval.json").read_text())
    assert report["image_size"] == 48 and report["num_examples"] == 3 * PER_CLASS
    trained = keras.saving.load_model(out / "model_ema.keras")
    assert trained.input_shape[1:3] == (32, 32)
    model = with_dynamic_size(trained)
    assert model.input_shape == (None, None, None, 3)
    dataset = mvdata.make_eval_dataset(mvdata.image_folder(str(folder)), image_size=48,
                                       batch_size=8, num_classes=3, crop_ratio=1.0)
    predicted, truth = [], []
    for images, labels in dataset:
        assert tuple(images.shape[1:3]) == (48, 48)
        predicted.append(np.asarray(model(images, training=False)).argmax(-1))
        truth.append(np.asarray(labels).argmax(-1))
    predicted, truth = np.concatenate(predicted), np.concatenate(truth)
    confusion = np.bincount(3 * truth + predicted, minlength=9).reshape(3, 3)
    np.testing.assert_array_equal(report["confusion_matrix"], confusion)


def test_errors_are_one_clear_line(folder, tmp_path, capsys):
    err = _errors(capsys, ["train", "--config", str(tmp_path / "nope.yaml")])
    assert "Config file not found" in err and "fashion_mnist" in err
    err = _errors(capsys, ["train", "--config", "fashion_mnist", "--set", "optimizer.lrr=1"])
    assert "Unknown config key 'optimizer.lrr'" in err and "Valid keys: name, lr" in err
    err = _errors(capsys, ["train", "--config", "fashion_mnist", "--set", "epochs=3"])
    assert "section.field=value" in err
    empty = tmp_path / "empty"
    empty.mkdir()
    err = _errors(capsys, ["train", "--config", "fashion_mnist", "--data", str(empty),
                           "-o", str(tmp_path / "r")])
    assert "is empty" in err and "one sub-folder per class" in err
    err = _errors(capsys, ["train", "--config", "fashion_mnist", "--data",
                           str(tmp_path / "missing")])
    assert "image folder not found" in err
    err = _errors(capsys, ["train"])
    assert "needs --config" in err
    err = _errors(capsys, ["train", "--config", "fashion_mnist", "--steps", "5"])
    assert "--steps only appl" in err and "--set" in err
    err = _errors(capsys, ["train", "--task", "segmentation", "--config", "fashion_mnist",
                           "-o", str(tmp_path / "seg")])
    assert "--config" in err and "--task segmentation" in err
    err = _errors(capsys, ["train", "--task", "segmentation"])
    assert "-o DIR" in err
    err = _errors(capsys, ["finetune", "--config", "fashion_mnist", "--weights",
                           str(tmp_path / "missing.weights.h5")])
    assert "--weights: file not found" in err
    err = _errors(capsys, ["eval", str(tmp_path / "missing.keras"), "--data", str(folder)])
    assert "Model not found" in err
    err = _errors(capsys, ["eval", str(tmp_path), "--data", str(folder)])
    assert "No model_ema.keras or model.keras" in err


@pytest.mark.slow
def test_eval_rejects_data_with_other_classes(run, tmp_path, capsys):
    out, code, _ = run
    assert code == 0
    for name in ("cat", "dog", "fox"):
        (tmp_path / name).mkdir()
        Image.new("RGB", (SIZE, SIZE)).save(tmp_path / name / "0.png")
    err = _errors(capsys, ["eval", str(out), "--data", str(tmp_path)])
    assert "are not those the model was trained on" in err
    assert "['cat', 'dog', 'fox']" in err and "['blue', 'green', 'red']" in err


@pytest.mark.slow
def test_diverged_run_exits_3_with_one_line_and_keeps_no_model(folder, tmp_path, capsys):
    out = tmp_path / "diverged"
    code = main(["train", "--config", "fashion_mnist", "--data", str(folder), "-o", str(out),
                 *_sets(TINY), "--set", "optimizer.lr=1000000000000"])
    err = capsys.readouterr().err.strip()
    assert code == 3, err
    assert len(err.splitlines()) == 1, err
    assert "Training diverged" in err and "optimizer.lr" in err and "clip_global_norm" in err
    assert not (out / "model.keras").exists() and not (out / "model_ema.keras").exists()



@pytest.mark.slow
def test_train_on_a_folder_smaller_than_one_batch_lowers_the_batch(folder, tmp_path, capsys):
    # 3 classes x 12 images, 10 % held out per class: 33 training images, batch 64 asked.
    out = tmp_path / "small"
    code = main(["train", "--config", "fashion_mnist", "--data", str(folder), "-o", str(out),
                 *_sets([*TINY, "data.batch_size=64", "training.epochs=1"])])
    stdout = capsys.readouterr().out
    assert code == 0, stdout[-3000:]
    lines = stdout.splitlines()
    note = ("data.batch_size 64 is more than the 33 training images: training with "
            "data.batch_size 33, one step per epoch (--set data.batch_size=N picks another "
            "batch).")
    # Said before training, just before the run folder's line (even with output.verbose=0).
    assert lines[lines.index(note) + 1].startswith(f"Run folder {out}: new run, 1 epoch(s) "
                                                   "of 1 steps.")
    with open(out / "config.yaml") as f:
        assert yaml.safe_load(f)["data"]["batch_size"] == 33
    assert "global batch 33, 1 replica(s)" in stdout
    # The same command again: the same fitted batch, so the finished run is recognised.
    assert main(["train", "--config", "fashion_mnist", "--data", str(folder), "-o", str(out),
                 *_sets([*TINY, "data.batch_size=64", "training.epochs=1"])]) == 0
    assert f"Run folder {out}: already complete" in capsys.readouterr().out
