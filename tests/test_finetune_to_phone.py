"""`mvit2 finetune PHOTOS --weights ...`: a folder of photos to labelled phone files and a
model card in one command (keras_mvit2.ship, keras_mvit2.models.weights_source).

The photos are Fashion-MNIST training images written as PNG class folders (3 classes).
Published weights come from the loopback stand-in of the Hugging Face hub
(tests/hub_standin.py) serving the run's timm oracle checkpoint of MobileViTV2-0.5 (random
timm weights, tests/torch_oracle.py): the tag `imagenet`, an `hf://` id of another
repository (with timm's `config.json`) and the same file given as a path. The slow tier
runs the command three times at 32x32 (one short epoch): once to the end (exports,
validation, card, without quantization-aware training; its assertions share it), twice
with `--export none` to check where the weights came from (a frozen backbone keeps the
ported checkpoint's values). A folder of 3 classes x 6 photos (smaller than the recipe's
batch) runs end to end at 64x64 from random weights, then again from the `.keras` model it wrote.

Oracles: LiteRT and MediaPipe Tasks running the exported file, the Keras model, the ported
checkpoint (`create_model(weights=file)`), huggingface_hub's model-card parser, `run.json`.
"""

import hashlib
import importlib
import json
import os
import re
import subprocess
import sys

import keras
import numpy as np
import pytest
from hub_standin import HubStandIn, free_port
from model_utils import jax_quick_compile
from PIL import Image

from keras_mvit2.cli.main import main
from keras_mvit2.data.files import (
    FASHION_MNIST_CLASSES,
    FASHION_MNIST_DIR,
    load_fashion_mnist_arrays,
)
from keras_mvit2.ship import check_training_data
from keras_mvit2.ship.phone_files import (
    POST_TRAINING_FILE,
    QAT_FILE,
    QAT_NOT_SHIPPED,
)
from keras_mvit2.training import load_config

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
MODEL = "mobilevitv2_050"
REPO = f"timm/{MODEL}.cvnets_in1k"
OTHER_REPO = "someone/mobilevitv2-050-clothes"
SIZE = 32
CLASSES = ("Bag", "Sneaker", "Trouser")
PER_CLASS = 12
TINY = ["--image-size", str(SIZE), "--epochs", "1", "--set", "data.batch_size=8",
        "--set", "data.validation_fraction=0.25"]

needs_fashion = pytest.mark.skipif(
    not os.path.exists(os.path.join(FASHION_MNIST_DIR, "t10k-images-idx3-ubyte.gz")),
    reason="Debian's dataset-fashion-mnist is not installed")


def _write_photos(folder, classes=CLASSES, per_class=PER_CLASS) -> None:
    x, y = load_fashion_mnist_arrays("train")
    for name in classes:
        label = FASHION_MNIST_CLASSES.index(name)
        os.makedirs(folder / name, exist_ok=True)
        for i, index in enumerate(np.flatnonzero(y == label)[:per_class]):
            Image.fromarray(x[index]).convert("RGB").save(folder / name / f"{i:03d}.png")


def _reload_hub_constants() -> None:
    import huggingface_hub.constants

    importlib.reload(huggingface_hub.constants)


def _hub_environment(mp: pytest.MonkeyPatch, endpoint: str, home) -> None:
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HUB_CACHE", "HF_TOKEN"):
        mp.delenv(var, raising=False)
    mp.setenv("HF_ENDPOINT", endpoint)
    mp.setenv("HF_HOME", str(home / "hf"))
    mp.setenv("KERAS_HOME", str(home / "keras"))
    mp.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    _reload_hub_constants()


def _errors(capsys, argv) -> str:
    code = main(argv)
    captured = capsys.readouterr()
    assert code == 2, captured
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    return lines[0]


# --------------------------------------------------------------------------------------
# Fast: bad --weights values, data checks
# --------------------------------------------------------------------------------------


@needs_fashion
def test_bad_weights_values_give_one_clear_line_each(tmp_path, capsys):
    photos = tmp_path / "photos"
    _write_photos(photos, per_class=2)
    base = ["finetune", str(photos), "--model", MODEL, "--export", "none", "-o",
            str(tmp_path / "run")]
    (tmp_path / "copy.weights.h5").write_bytes(b"<html>Sign in</html>")  # a saved web page
    (tmp_path / "model.keras").write_bytes(b"not a zip")
    cases = {
        str(tmp_path / "copy.weights.h5"): ["is not a Keras weights file: the file is an "
                                            "HTML/XML page", "model.save_weights"],
        str(tmp_path / "model.keras"): ["is not a Keras model file: it is not a zip archive",
                                        "model.save('model.keras')"],
        "imagenet21k": ["neither a file nor a published tag", "'imagenet'", "hf://"],
        "missing.weights.h5": ["--weights: file not found", "missing.weights.h5"],
        "hf://no-owner": ["hf://<owner>/<repo>"],
        "mobilevitv2_100_imagenet": ["holds a mobilevitv2_100", "--model mobilevitv2_100"],
        "imagenet22k_ft_in1k": ["No weights 'imagenet22k_ft_in1k' for mobilevitv2_050",
                                "'imagenet'"],
        str(tmp_path): ["is a folder"],
    }
    for value, expected in cases.items():
        line = _errors(capsys, [*base, "--weights", value])
        for text in expected:
            assert text in line, (value, line)
    with pytest.MonkeyPatch.context() as mp:  # the hub cannot be reached
        _hub_environment(mp, f"http://127.0.0.1:{free_port()}", tmp_path)
        mp.setattr("time.sleep", lambda seconds: None)  # huggingface_hub's retry back-off
        line = _errors(capsys, [*base, "--weights", "imagenet"])
    _reload_hub_constants()
    assert "Cannot download" in line and REPO in line and "HF_ENDPOINT" in line
    assert not (tmp_path / "run").exists()  # nothing trained, nothing written


@needs_fashion
def test_data_checks_warn_on_small_or_imbalanced_classes_and_refuse_bad_folders(
        tmp_path, capsys):
    def check(folder, fraction=0.0):
        return check_training_data(load_config("finetune_small_data", [
            f"data.train={folder}", f"data.validation_fraction={fraction}"]))

    photos = tmp_path / "photos"
    _write_photos(photos, classes=("Bag", "Sneaker"), per_class=40)
    _write_photos(photos, classes=("Trouser",), per_class=4)
    checked, _, val = check(photos, 0.25)
    assert checked.class_names == ["Bag", "Sneaker", "Trouser"]
    assert checked.counts == {"train": [30, 30, 3], "validation": [10, 10, 1]}
    assert val.num_examples == 21
    few, imbalance = checked.warnings
    assert "fewer than 10 training images: Trouser (3)" in few
    assert "imbalanced" in imbalance and "Bag has 30" in imbalance and "Trouser 3" in imbalance
    assert "Trouser" in checked.lines()[2] and "3 training" in checked.lines()[2]
    # PyTorch's input (numpy + PIL) reads the same files and split: the same counts.
    from keras_mvit2.data.py_sources import py_image_folder
    from keras_mvit2.ship.data_check import _label_counts

    for split, counts in (("training", [30, 30, 3]), ("validation", [10, 10, 1])):
        source = py_image_folder(photos, split=split, validation_fraction=0.25)
        assert _label_counts(source, 3) == counts

    balanced = tmp_path / "balanced"
    _write_photos(balanced, classes=("Bag", "Sneaker"), per_class=12)
    assert check(balanced)[0].warnings == []

    one = tmp_path / "one"
    _write_photos(one, classes=("Bag",), per_class=3)
    (tmp_path / "empty").mkdir()
    for folder, expected in ((one, "needs at least two classes"),
                             (tmp_path / "empty", "is empty"),
                             (tmp_path / "nowhere", "not found")):
        line = _errors(capsys, ["finetune", str(folder), "--weights", "none"])
        assert expected in line, line


def test_default_files_that_lose_top1_to_keras_are_warned_about_with_the_fix():
    from keras_mvit2.ship.phone_files import WARN_DROP_POINTS, export_warnings

    def record(top1, keras_top1=0.70, **extra):
        return {"target": "tflite", "format": "TFLite", "quantization": "int8",
                "path": "phone/model_int8.tflite", "top1": top1, "keras_top1": keras_top1,
                "top1_agreement": 0.69, **extra}

    assert WARN_DROP_POINTS == 1.0
    (message,) = export_warnings([record(0.63), record(0.69), record(0.71)])
    assert message.startswith("the TFLite int8 file (phone/model_int8.tflite) scores 7.0 "
                              "top-1 points below the Keras model")
    assert "agree on 69.0 %" in message and "--max-drop 1" in message
    # Within a point, measured gains, not measured (Core ML off macOS), an optimizer's
    # choice (within its own budget): nothing to say.
    assert export_warnings([
        record(0.695), record(0.80), record(None),
        record(0.63, optimizer_report="phone/optimize_tflite/report.json"),
    ]) == []


# --------------------------------------------------------------------------------------
# Slow: the command end to end, through the stand-in hub
# --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def hub(timm_oracle_dir, tmp_path_factory):
    """The stand-in hub serving the oracle's MobileViTV2-0.5 as the `imagenet` tag's repo
    and as another repo with timm's config.json (input 32x32); HF_* / KERAS_HOME in tmp."""
    home = tmp_path_factory.mktemp("hub_home")
    checkpoint = (timm_oracle_dir / f"{MODEL}.safetensors").read_bytes()
    config = {"architecture": MODEL, "num_classes": 1000,
              "pretrained_cfg": {"input_size": [3, SIZE, SIZE], "crop_pct": 1.0,
                                 "interpolation": "bicubic"}}
    server = HubStandIn()
    server.serve(REPO, "model.safetensors", checkpoint)
    server.serve(OTHER_REPO, "model.safetensors", checkpoint)
    server.serve(OTHER_REPO, "config.json", json.dumps(config).encode())
    with pytest.MonkeyPatch.context() as mp:
        _hub_environment(mp, server.url, home)
        yield {"server": server, "checkpoint": checkpoint,
               "sha256": hashlib.sha256(checkpoint).hexdigest(),
               "file": str(timm_oracle_dir / f"{MODEL}.safetensors")}
    server.stop()
    _reload_hub_constants()


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    folder = tmp_path_factory.mktemp("photos") / "clothes"
    _write_photos(folder)
    return folder


@pytest.fixture(scope="module")
def run(hub, photos, tmp_path_factory):
    """One whole `mvit2 finetune` from the tag, its output and its run.json."""
    import io
    from contextlib import redirect_stdout

    out = tmp_path_factory.mktemp("runs") / "clothes_run"
    buffer = io.StringIO()
    with redirect_stdout(buffer):
        code = main(["finetune", str(photos), "--model", MODEL, "--weights", "imagenet",
                     "-o", str(out), "--qat-steps", "0", *TINY])
    stdout = buffer.getvalue()
    assert code == 0, stdout[-3000:]
    with open(out / "run.json") as f:
        facts = json.load(f)
    return out, stdout, facts


@needs_fashion
def test_finetune_from_a_tag_through_the_standin_hub_leaves_labelled_phone_files(run, hub):
    from keras_mvit2.export import get_target

    out, stdout, facts = run
    assert any(path.startswith(f"/{REPO}/resolve/") for _, path in hub["server"].requests)
    weights = facts["weights"]
    assert weights["kind"] == "tag" and weights["repo_id"] == REPO
    assert weights["sha256"] == hub["sha256"]
    assert weights["license"]["id"] == "other" and "ml-cvnets" in weights["license"]["link"]
    for name in CLASSES:  # the class list, printed before training
        assert name in stdout.split("Run folder")[0]
    for key in ("model_ema.keras", "phone/model_int8.tflite", "phone/model.mlpackage",
                "MODEL_CARD.md", "eval/confusion_matrix.png"):
        assert (out / key).exists(), key
        assert str(out / key) in stdout  # printed where it is
    tflite, coreml = get_target("tflite"), get_target("coreml")
    assert tflite.class_names(out / "phone/model_int8.tflite") == list(CLASSES)
    assert coreml.class_names(out / "phone/model.mlpackage") == list(CLASSES)
    assert tflite.metadata(out / "phone/model_int8.tflite")["quantization"] == "int8"

    # The recorded agreement is the files': LiteRT vs Keras on the held-out images.
    from keras_mvit2.export.calibration import load_labelled_images
    from keras_mvit2.training import make_sources

    _, val = make_sources(load_config(str(out / "config.yaml")))
    held = load_labelled_images(val, image_size=(SIZE, SIZE), shuffle=False)
    model = keras.saving.load_model(out / "model_ema.keras")
    keras_top1 = np.asarray(model.predict(held.images, verbose=0)).argmax(-1)
    int8_top1 = tflite.run(out / "phone/model_int8.tflite", held.images).argmax(-1)
    record = {r["target"]: r for r in facts["exports"]}
    assert record["tflite"]["top1_agreement"] == pytest.approx(np.mean(int8_top1 == keras_top1))
    assert record["tflite"]["top1"] == pytest.approx(np.mean(int8_top1 == held.labels))
    assert facts["evaluation"]["top1"] == pytest.approx(np.mean(keras_top1 == held.labels))
    assert record["tflite"]["size_bytes"] == os.path.getsize(out / "phone/model_int8.tflite")
    assert record["tflite"]["latency"]["median_ms"] > 0
    # --qat-steps 0: no quantization-aware training here (about half of this run's time:
    # tracing the int8 graph for training, two more conversions). Where the export step tries
    # it, how it judges, what it writes and what the card says are tested on a model whose
    # int8 file loses a point by construction (tests/test_optimize.py: the same export step
    # at QAT's defaults, and its record and card on constructed files).
    assert "qat" not in record["tflite"]
    assert not (out / "phone" / QAT_FILE).exists() and not (out / QAT_NOT_SHIPPED).exists()
    assert not (out / "phone" / POST_TRAINING_FILE).exists()
    assert facts["data"]["per_class"] == {n: {"train": 9, "validation": 3} for n in CLASSES}
    # Warned (printed, in the card's limits) exactly when the int8 file loses over a point.
    lost = round(100 * (record["tflite"]["keras_top1"] - record["tflite"]["top1"]), 6) > 1.0
    assert ("warning: the TFLite int8 file" in stdout) == lost
    assert any("the TFLite int8 file" in line for line in facts["limits"]) == lost


@needs_fashion
def test_model_card_holds_the_measured_numbers_of_run_json(run):
    from huggingface_hub import ModelCard

    out, _, facts = run
    text = (out / "MODEL_CARD.md").read_text()
    card = ModelCard(text)  # huggingface_hub's parser: front matter and model-index
    meta = card.data.to_dict()
    assert meta["library_name"] == "keras" and meta["license"] == "other"
    assert meta["license_link"] == facts["weights"]["license"]["link"]
    assert meta["base_model"] == REPO and "image-classification" in meta["tags"]
    results = {r.metric_name: r.metric_value for r in card.data.eval_results}
    assert results["Top-1 accuracy (Keras)"] == round(facts["evaluation"]["top1"], 4)
    record = {r["target"]: r for r in facts["exports"]}
    assert results["Top-1 accuracy (TFLite int8)"] == round(record["tflite"]["top1"], 4)
    pct = "{:.2f} %".format
    body = card.text
    expected = [pct(100 * facts["evaluation"]["top1"]), pct(100 * facts["evaluation"]["top5"]),
                pct(100 * record["tflite"]["top1_agreement"]),
                f"{record['tflite']['size_bytes'] / 1e6:.2f} MB",
                f"{record['coreml']['size_bytes'] / 1e6:.2f} MB",
                f"{record['tflite']['latency']['median_ms']:.2f} ms",
                facts["weights"]["sha256"], f"{facts['recipe']['peak_lr']:.3g}",
                facts["created"], facts["keras_mvit2"],
                f"({facts['evaluation']['confusion_matrix_image']})"]
    for name, accuracy in facts["evaluation"]["per_class_accuracy"].items():
        counts = facts["data"]["per_class"][name]
        expected.append(f"| {name} | {counts['train']} | {counts['validation']} | "
                        f"{pct(100 * accuracy)} |")
    for value in expected:
        assert value in body, value
    for placeholder in (r"\bNone\b", r"\bnan\b", r"[{}]", r"\bTODO\b"):
        assert not re.search(placeholder, body), placeholder


@needs_fashion
def test_the_command_again_on_a_complete_run_only_exports_and_keeps_its_records(
        run, hub, photos, tmp_path):
    """Re-quantizing without training again: the same command on a copy of the finished
    run folder evaluates and exports only; the records keep the training's speed (its
    epochs' median, not NaN) and the card names the files this call wrote."""
    import io
    import shutil
    import statistics
    from contextlib import redirect_stdout

    first, _, facts = run
    again = tmp_path / "again"
    shutil.copytree(first, again)
    buffer = io.StringIO()
    with redirect_stdout(buffer):
        code = main(["finetune", str(photos), "--model", MODEL, "--weights", "imagenet",
                     "-o", str(again), "--export", "tflite", "--qat-steps", "0", *TINY])
    stdout = buffer.getvalue()
    assert code == 0, stdout[-3000:]
    assert f"Run folder {again}: already complete (1 of 1 epochs" in stdout
    assert "Epoch 1/1" not in stdout  # nothing trained

    def no_nan(word):
        raise AssertionError(f"run.json holds {word}, which is not JSON")

    refacts = json.loads((again / "run.json").read_text(), parse_constant=no_nan)
    history = json.loads((first / "metrics.json").read_text())["history"]
    assert refacts["recipe"]["images_per_second"] == pytest.approx(
        statistics.median(h["images_per_second"] for h in history))
    assert [e["target"] for e in refacts["exports"]] == ["tflite"]
    assert refacts["evaluation"]["top1"] == pytest.approx(facts["evaluation"]["top1"])
    card = (again / "MODEL_CARD.md").read_text()
    assert "with phone files (TFLite int8) that carry the class names" in card
    assert f"{refacts['recipe']['images_per_second']:.1f} training images/s" in card
    assert not re.search(r"\bnan\b", card, re.IGNORECASE)


def _mediapipe_python() -> str | None:
    python = os.environ.get("MVIT2_MEDIAPIPE_PYTHON") or os.path.join(
        ROOT, ".venv-mediapipe", "bin", "python")
    return python if os.path.exists(python) else None


@needs_fashion
@pytest.mark.skipif(_mediapipe_python() is None, reason="no MediaPipe virtualenv (.ci/run "
                    "makes .venv-mediapipe, or set MVIT2_MEDIAPIPE_PYTHON)")
def test_tflite_classifies_in_mediapipe_with_the_folder_class_names(run, photos, tmp_path):
    from keras_mvit2.export import get_target

    out, _, _ = run
    path = out / "phone/model_int8.tflite"
    files = sorted(p for name in CLASSES for p in (photos / name).glob("*.png"))
    pixels = np.stack([np.asarray(Image.open(p).convert("RGB").resize((SIZE, SIZE)))
                       for p in files]).astype(np.uint8)
    np.save(tmp_path / "images.npy", pixels)
    request = {"images": str(tmp_path / "images.npy"), "out": str(tmp_path / "out.npz"),
               "models": [{"task": "classifier", "path": str(path), "key": "m"}]}
    (tmp_path / "request.json").write_text(json.dumps(request))
    done = subprocess.run([_mediapipe_python(), os.path.join(HERE, "mediapipe_client.py"),
                           str(tmp_path / "request.json")], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONPATH": ""})
    assert done.returncode == 0, done.stderr[-3000:]
    with np.load(tmp_path / "out.npz") as result:
        index, names = result["m.index"], [str(n) for n in result["m.names"]]
    assert names == [CLASSES[i] for i in index]  # the folder's names, from the file
    litert = get_target("tflite").run(path, pixels.astype(np.float32) / 255.0).argmax(-1)
    assert np.mean(index == litert) >= 0.9


@needs_fashion
def test_finetune_from_a_file_and_from_an_hf_id_records_and_uses_those_weights(
        hub, photos, tmp_path):
    import keras_mvit2 as mv
    from keras_mvit2.export import get_target

    ported = mv.create_model(MODEL, weights=hub["file"], input_shape=(SIZE, SIZE, 3),
                             include_top=False)
    quick = ["--epochs", "1", "--set", "data.batch_size=8", "--set",
             "training.steps_per_epoch=1", "--set", "ema.enabled=false", "--val", "0",
             "--freeze-backbone"]
    for weights, kind in ((hub["file"], "file"), (f"hf://{OTHER_REPO}", "hf")):
        out = tmp_path / kind
        # file: the size given; hf: the size of its config.json, and a uint8-I/O int8 file
        extra = (["--image-size", str(SIZE), "--export", "none"] if kind == "file"
                 else ["--export", "tflite", "--io-dtype", "uint8"])
        assert main(["finetune", str(photos), "--model", MODEL, "--weights", weights,
                     "-o", str(out), *quick, *extra]) == 0
        facts = json.loads((out / "run.json").read_text())
        assert facts["weights"]["kind"] == kind and facts["weights"]["sha256"] == hub["sha256"]
        assert facts["recipe"]["image_size"] == SIZE
        tuned = keras.saving.load_model(out / "model.keras")
        for layer in ("stem_conv", "stem_bn"):  # frozen: the checkpoint's values
            for a, b in zip(ported.get_layer(layer).get_weights(),
                            tuned.get_layer(layer).get_weights(), strict=True):
                np.testing.assert_array_equal(a, b)
        assert "Source weights" in (out / "MODEL_CARD.md").read_text()
    assert facts["weights"]["repo_id"] == OTHER_REPO
    (record,) = facts["exports"]
    assert record["io_dtype"] == "uint8" and record["top1_agreement"] is None  # no held-out
    report = get_target("tflite").inspect(tmp_path / "hf" / record["path"])
    assert report.input_dtype == "uint8" and report.output_dtype == "uint8"
    assert get_target("tflite").class_names(tmp_path / "hf" / record["path"]) == list(CLASSES)
    assert any(path.startswith(f"/{OTHER_REPO}/resolve/") and path.endswith("config.json")
               for _, path in hub["server"].requests)


#: `mvit2 ARGV` in a child process; with `no_tensorflow` it fails if TensorFlow was imported.
_MVIT2 = """import sys
from keras_mvit2.cli.main import main
status = main(sys.argv[2:])
if sys.argv[1] == "no_tensorflow":
    assert "tensorflow" not in sys.modules, "the command imported TensorFlow"
sys.exit(status)
"""


def _mvit2_on(backend: str, argv: list[str], no_tensorflow: bool = False) -> str:
    """Runs `mvit2 ARGV` with Keras on `backend`; returns its standard output (fails the
    test, with the output's end, on a non-zero status)."""
    env = {**os.environ, "KERAS_BACKEND": backend}
    env = jax_quick_compile(env) if backend == "jax" else env
    done = subprocess.run([sys.executable, "-c", _MVIT2,
                           "no_tensorflow" if no_tensorflow else "-", *argv],
                          capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    return done.stdout


@pytest.mark.slow
@needs_fashion
def test_a_tiny_folder_fits_its_batch_and_ships_end_to_end_on_pytorch(tmp_path):
    """3 classes x 6 photos, as MediaPipe Model Maker users start: 15 training images
    against the recipe's batch of 32. The batch is lowered to fit (one line says so) and
    the command runs to the int8 file. It runs on Keras' PyTorch backend: it trains
    there, never imports TensorFlow, and writes the phone files through its TensorFlow
    child process (`keras_mvit2.ship.export_step`); the int8 file it wrote validates here
    (TensorFlow backend, LiteRT) to the figures the child recorded. A second run, on JAX,
    starts from the first one's `.keras` model (frozen backbone: its values stay the
    donor's, across the three backends: its file is read here on TensorFlow)."""
    from keras_mvit2.export import get_target, validate
    from keras_mvit2.ship.export_step import _phone_data

    photos = tmp_path / "photos"
    _write_photos(photos, per_class=6)
    out = tmp_path / "tiny_run"
    stdout = _mvit2_on("torch", ["finetune", str(photos), "--model", MODEL, "--weights",
                                 "none", "--epochs", "1", "--image-size", str(SIZE),
                                 "--export", "tflite", "--qat-steps", "0", "-o", str(out)],
                       no_tensorflow=True)
    assert ("data.batch_size 32 is more than the 15 training images: training with "
            "data.batch_size 15, one step per epoch (--set data.batch_size=N picks another "
            "batch).") in stdout
    assert "Epoch 1/1 - 1/1 " in stdout  # one step of 15
    assert "exporting on Keras' TensorFlow backend (a child process; Keras runs on " \
           "'torch' here)" in stdout
    config = load_config(str(out / "config.yaml"))
    assert config.data.batch_size == 15
    facts = json.loads((out / "run.json").read_text())
    assert facts["backend"] == "torch"
    assert facts["global_batch_size"] == 15 and facts["train_examples"] == 15
    assert facts["data"]["per_class"] == {n: {"train": 5, "validation": 1} for n in CLASSES}
    tflite = get_target("tflite")
    assert tflite.class_names(out / "phone/model_int8.tflite") == list(CLASSES)
    assert (out / "MODEL_CARD.md").exists()  # (Core ML: the same child code, tested above)
    # The summary table off a terminal: each row whole on one line (no 80-column wrap).
    row = next(line for line in stdout.splitlines() if line.startswith("│ TFLite int8"))
    assert "phone/model_int8.tflite" in row and "agrees with Keras" in row, row
    record = next(r for r in facts["exports"] if r["target"] == "tflite")
    # The child's figures, reproduced here from the run's files.
    _, train_source, val_source = check_training_data(config)
    data = _phone_data(config, train_source, val_source, SIZE, 200)
    assert len(data.images) == 3 and len(data.calibration) == 15
    checked = validate(out / "phone/model_int8.tflite",
                       keras.saving.load_model(out / "model_ema.keras"), data.images,
                       data.labels, class_names=list(CLASSES))
    assert (checked.accuracy, checked.top1_agreement) == (record["top1"],
                                                          record["top1_agreement"])
    # --qat-steps 0: no quantization-aware training, whatever the post-training file loses
    # (3 held-out images: any disagreement is 33 points). The QAT the command tries where
    # the post-training file agrees with Keras on fewer than 99 % of the held-out images is
    # tested on TensorFlow (tests/test_optimize.py, the same export step).
    from keras_mvit2.ship.phone_files import drop_points

    drop = drop_points(record)
    assert "qat" not in record
    assert "quantization-aware" not in stdout + (out / "MODEL_CARD.md").read_text()
    warned = f"the TFLite int8 file (phone/model_int8.tflite) scores {drop:.1f} top-1 points"
    assert (warned in stdout) == (drop > 1.0), stdout[-2000:]

    # The second run trains on JAX (tf.data input, Keras' JAX step), from PyTorch's file.
    again = tmp_path / "from_keras"
    donor = out / "model_ema.keras"
    stdout = _mvit2_on("jax", ["finetune", str(photos), "--model", MODEL, "--weights",
                               str(donor), "--epochs", "1", "--image-size", str(SIZE),
                               "--freeze-backbone", "--val", "0", "--export", "none",
                               "-o", str(again)])
    assert "Epoch 1/1 - 1/1 " in stdout  # 18 photos, no validation: one step of 18
    facts = json.loads((again / "run.json").read_text())
    assert facts["weights"]["kind"] == "file" and facts["backend"] == "jax"
    source, tuned = (keras.saving.load_model(p) for p in (donor, again / "model.keras"))
    for layer in ("stem_conv", "stem_bn"):
        for a, b in zip(source.get_layer(layer).get_weights(),
                        tuned.get_layer(layer).get_weights(), strict=True):
            np.testing.assert_array_equal(a, b)
    # ... and the head trained there
    assert not np.array_equal(source.get_layer("predictions").get_weights()[0],
                              tuned.get_layer("predictions").get_weights()[0])
