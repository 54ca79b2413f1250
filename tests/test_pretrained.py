"""weights="imagenet": download through huggingface_hub from a loopback stand-in of the
hub, parity with timm, the cache, the failure modes, the tag table and preprocessing.

The checkpoints are made by timm (random weights, perturbed norms and biases) in a
subprocess (tests/torch_oracle.py: torch convolutions segfault once TensorFlow is
imported) and served by tests/hub_standin.py on 127.0.0.1; `HF_ENDPOINT` and `HF_HOME`
point at the stand-in and a tmp folder. huggingface_hub reads its environment when
imported (Keras imports it), so the `hub_env` fixture reloads `huggingface_hub.constants`
after setting the variables: the library itself then reads HF_ENDPOINT / HF_HOME /
HF_HUB_OFFLINE from the real environment, as in a fresh process.
"""

import importlib
import importlib.util
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
from hub_standin import HubStandIn, free_port
from model_utils import TORCH_READY
from shared_fixtures import ORACLE_MODELS, ORACLE_SIZES

import keras_mvit2 as mv
from keras_mvit2.models.mobilevitv2.mobilevitv2_presets import (
    PRETRAINED_WEIGHTS,
    check_pretrained_config,
    find_preset,
    find_weights,
    model_name_for_width,
)
from keras_mvit2.weights.download import WeightsDownloadError

HERE = os.path.dirname(os.path.abspath(__file__))
needs_oracle = pytest.mark.skipif(not TORCH_READY, reason="needs torch, timm, safetensors")

MODELS = {"mobilevitv2_050": 0.5, "mobilevitv2_075": 0.75}
assert set(MODELS) <= set(ORACLE_MODELS) and (256, 256) in ORACLE_SIZES
LOGIT_ATOL = 1e-4


def _repo(name: str) -> str:
    return f"timm/{name}.cvnets_in1k"


@pytest.fixture(scope="module")
def checkpoints(timm_oracle_dir) -> dict:
    """timm checkpoints (safetensors, .pth) and logits at 256x256 for the two widths, from
    the run's timm oracle (conftest.py)."""
    out = timm_oracle_dir
    result = {}
    for name in MODELS:
        with np.load(out / f"{name}.npz") as data:
            result[name] = {
                "safetensors": (out / f"{name}.safetensors").read_bytes(),
                "pth": (out / f"{name}.pth").read_bytes(),
                "x": data["x_256x256"], "logits": data["logits_256x256"],
            }
    return result


def _reload_hub_constants() -> None:
    import huggingface_hub.constants

    importlib.reload(huggingface_hub.constants)


@pytest.fixture
def hub_env(tmp_path, monkeypatch):
    """A stand-in hub on 127.0.0.1, HF_ENDPOINT / HF_HOME / KERAS_HOME in tmp_path."""
    server = HubStandIn()
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HUB_CACHE", "HF_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    monkeypatch.setenv("KERAS_HOME", str(tmp_path / "keras"))
    monkeypatch.setenv("MVIT2_APPLE_URL", server.url + "/apple")
    _reload_hub_constants()
    yield server
    server.stop()
    monkeypatch.undo()
    _reload_hub_constants()


def _set_env(monkeypatch, **env) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    _reload_hub_constants()


def _cached_files(root) -> list[str]:
    found = []
    for folder, _, files in os.walk(root):
        found.extend(os.path.relpath(os.path.join(folder, f), root) for f in files)
    return sorted(found)


# --------------------------------------------------------------------------------------
# Download, parity, cache
# --------------------------------------------------------------------------------------


@needs_oracle
def test_imagenet_equals_timm_then_loads_offline_from_the_cache(
        checkpoints, hub_env, tmp_path, monkeypatch, capsys):
    for name in MODELS:
        hub_env.serve(_repo(name), "model.safetensors", checkpoints[name]["safetensors"])
    first = {}
    for name in MODELS:
        model = mv.create_model(name, weights="imagenet", classifier_activation=None)
        assert model._keras_mvit2_weights_file.endswith("model.safetensors")
        logits = model.predict(checkpoints[name]["x"], verbose=0)
        diff = float(np.abs(logits - checkpoints[name]["logits"]).max())
        with capsys.disabled():
            print(f"\n[pretrained] {name}: max |keras - timm| = {diff:.2e}", end="")
        assert diff < LOGIT_ATOL
        first[name] = logits
    cached = _cached_files(tmp_path / "hf")
    h5 = [f for f in cached if f.endswith(".weights.h5")]
    assert len(h5) == 2 and all(".imagenet." in f and f.endswith(".top.weights.h5") for f in h5)

    # Second load: server stopped, HF_HUB_OFFLINE=1 -> the cached .weights.h5.
    hub_env.stop()
    _set_env(monkeypatch, HF_HUB_OFFLINE="1")
    model = mv.MobileViTV2(0.5, weights="imagenet", classifier_activation=None)
    assert model._keras_mvit2_weights_file.endswith(".top.weights.h5")
    np.testing.assert_array_equal(
        model.predict(checkpoints["mobilevitv2_050"]["x"], verbose=0), first["mobilevitv2_050"])

    # Offline and never downloaded: one clear error.
    with pytest.raises(WeightsDownloadError, match="HF_HUB_OFFLINE is set") as info:
        mv.MobileViTV2(1.0, weights="imagenet")
    assert "timm/mobilevitv2_100.cvnets_in1k/model.safetensors" in str(info.value)


@needs_oracle
def test_backbone_at_other_sizes_and_apple_384_file(checkpoints, hub_env, tmp_path):
    """include_top=False at 64x64 takes the same weights; the Apple-URL path
    (keras.utils.get_file, .pt, needs torch) loads the same tensors."""
    ckpt = checkpoints["mobilevitv2_050"]
    hub_env.serve(_repo("mobilevitv2_050"), "model.safetensors", ckpt["safetensors"])
    hub_env.serve_plain("imagenet1k/384x384/mobilevitv2-0.5.pt", ckpt["pth"])
    timm = mv.MobileViTV2(0.5, weights="imagenet", include_top=False, input_shape=(64, 64, 3))
    apple = mv.MobileViTV2(0.5, weights="imagenet_384", include_top=False,
                           input_shape=(64, 64, 3))
    assert apple._keras_mvit2_weights_file.startswith(str(tmp_path / "keras" / "keras_mvit2"))
    for a, b in zip(timm.weights, apple.weights, strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=a.path)
    assert not np.allclose(np.asarray(timm.get_layer("stem_bn").moving_mean), 0.0)


# --------------------------------------------------------------------------------------
# Failures: one clear error each, nothing broken left in the cache
# --------------------------------------------------------------------------------------


@needs_oracle
@pytest.mark.parametrize("fault", ["truncated", "html", "404", "refused"])
def test_bad_downloads_give_one_clear_error_and_a_clean_retry(
        fault, checkpoints, hub_env, tmp_path, monkeypatch):
    good = checkpoints["mobilevitv2_050"]["safetensors"]
    repo = _repo("mobilevitv2_050")
    if fault in ("truncated", "html"):
        hub_env.serve(repo, "model.safetensors", good, fault=fault)
    elif fault == "404":
        hub_env.serve(repo, "config.json", b"{}")  # the repo exists, the file does not
    else:
        _set_env(monkeypatch, HF_ENDPOINT=f"http://127.0.0.1:{free_port()}")
        # huggingface_hub retries a failed connection with exponential backoff (about
        # 23 s of sleeping in all); the retries still happen, without the waits.
        monkeypatch.setattr("time.sleep", lambda seconds: None)
    with pytest.raises(WeightsDownloadError) as info:
        mv.MobileViTV2(0.5, weights="imagenet")
    message = str(info.value)
    assert "timm/mobilevitv2_050.cvnets_in1k/model.safetensors" in message
    assert "run the same call again" in message.lower()
    expected = {"truncated": "not a valid safetensors file", "html": "HTML",
                "404": "no such file (404)", "refused": "could not be reached"}[fault]
    assert expected in message
    if fault in ("truncated", "html"):
        assert "removed from the cache" in message
    # Nothing of the file is left in the cache: no blob, no snapshot link, no partial.
    leftovers = [f for f in _cached_files(tmp_path / "hf")
                 if "mobilevitv2_050" in f and ("blobs" in f or "snapshots" in f)]
    assert leftovers == []
    if fault == "truncated":  # the retry, with the server fixed, downloads and loads
        hub_env.serve(repo, "model.safetensors", good)
        model = mv.MobileViTV2(0.5, weights="imagenet", include_top=False,
                               input_shape=(32, 32, 3))
        assert model._keras_mvit2_weights_file.endswith("model.safetensors")


# --------------------------------------------------------------------------------------
# The tag table
# --------------------------------------------------------------------------------------


def test_tag_table_against_the_builders():
    """Every tag resolves to its width's builder, at its input size, with 1000 classes."""
    assert len(PRETRAINED_WEIGHTS) == 7 + 3 + 3 + 7
    for entry in PRETRAINED_WEIGHTS:
        assert model_name_for_width(entry.width_multiplier) == entry.model
        assert entry.model in mv.list_models("mobilevitv2_*")
        found, shape = check_pretrained_config(
            entry.width_multiplier, entry.tag, include_top=True, classes=1000,
            input_shape=None, input_tensor=None, attention="separable")
        assert found is entry and shape == (entry.input_size, entry.input_size, 3)
        assert entry.resize_size == (288 if entry.input_size == 256 else 384)
        if entry.timm_tag is not None:
            assert find_weights(entry.model, entry.timm_tag) is entry
            assert entry.location == f"timm/{entry.model}.{entry.timm_tag}"
        else:
            assert entry.location.endswith(f"/imagenet1k/384x384/mobilevitv2-"
                                           f"{entry.width_multiplier}.pt")
    # The named builder builds the width of its tag (the stage widths follow alpha).
    model = mv.create_model("mobilevitv2_075", include_top=False, input_shape=(32, 32, 3))
    assert model.output_shape[-1] == mv.models.mobilevitv2_widths(0.75).stages[-1]
    with pytest.raises(ValueError, match="Its tags: \\['imagenet', 'imagenet_384'\\]"):
        mv.MobileViTV2(0.5, weights="imagenet22k_ft_in1k")
    with pytest.raises(ValueError, match="classes=1000"):
        mv.MobileViTV2(1.5, weights="imagenet22k_ft_in1k_384", classes=10)
    with pytest.raises(ValueError, match=r"must be \(384, 384, 3\)"):
        mv.MobileViTV2(1.5, weights="imagenet22k_ft_in1k_384", input_shape=(256, 256, 3))
    with pytest.raises(ValueError, match="published for the widths"):
        mv.MobileViTV2(0.6, weights="imagenet")


def test_preset_names_are_the_table_rows_and_need_no_keras_hub(monkeypatch):
    """KerasHub's preset names are the table's rows (`<model>_<tag>`); `finetune` and
    `mvit2 finetune --weights` read them from the table, without keras-hub."""
    import argparse

    from keras_mvit2.cli.finetune_cmd import _model_name
    from keras_mvit2.models.weights_source import resolve_weights_source

    names = [entry.preset for entry in PRETRAINED_WEIGHTS]
    assert len(set(names)) == len(PRETRAINED_WEIGHTS)
    for entry in PRETRAINED_WEIGHTS:
        assert entry.preset == f"{entry.model}_{entry.tag}"
        assert find_preset(entry.preset) is entry
    assert find_preset("imagenet") is None and find_preset("mobilevitv2_060_imagenet") is None

    for name in [m for m in sys.modules if m.startswith("keras_mvit2.kerashub")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "keras_hub", None)  # `import keras_hub` fails
    args = argparse.Namespace(model=None, weights="mobilevitv2_050_imagenet_384")
    assert _model_name(args, "mobilevitv2_100") == "mobilevitv2_050"
    assert _model_name(argparse.Namespace(model=None, weights="imagenet"),
                       "mobilevitv2_100") == "mobilevitv2_100"
    with pytest.raises(ValueError, match="holds a mobilevitv2_050, but the model is "
                                         "mobilevitv2_100"):  # checked before any download
        resolve_weights_source("mobilevitv2_050_imagenet", "mobilevitv2_100")
    assert not any(m.startswith("keras_mvit2.kerashub") for m in sys.modules)


@pytest.mark.slow
@needs_oracle
def test_tag_table_against_timm_pretrained_cfgs():
    """Repo ids, input sizes, crop_pct, interpolation and mean/std as timm's registry has them."""
    timm_rows = [e for e in PRETRAINED_WEIGHTS if e.source == "timm"]
    script = (
        "import json, sys; sys.path.insert(0, sys.argv[1]);"
        "from torch_oracle import install_torchvision_stub; install_torchvision_stub();"
        "import timm; names = json.loads(sys.argv[2]); out = {}\n"
        "for n in names:\n"
        "    c = timm.models.get_pretrained_cfg(n)\n"
        "    out[n] = dict(hf_hub_id=c.hf_hub_id, input_size=list(c.input_size),"
        " crop_pct=c.crop_pct, interpolation=c.interpolation, mean=list(c.mean),"
        " std=list(c.std), num_classes=c.num_classes)\n"
        "print(json.dumps(out))"
    )
    names = [f"{e.model}.{e.timm_tag}" for e in timm_rows]
    result = subprocess.run([sys.executable, "-c", script, HERE, json.dumps(names)],
                            check=True, capture_output=True, text=True)
    cfgs = json.loads(result.stdout.strip().splitlines()[-1])
    for entry, name in zip(timm_rows, names, strict=True):
        cfg = cfgs[name]
        assert cfg["hf_hub_id"] in (entry.location, "timm/")  # timm/ expands to timm/<name>
        assert cfg["input_size"] == [3, entry.input_size, entry.input_size], name
        assert math.isclose(cfg["crop_pct"], entry.crop_pct), name
        assert cfg["interpolation"] == entry.interpolation, name
        assert cfg["mean"] == [0, 0, 0] and cfg["std"] == [1, 1, 1], name
        assert cfg["num_classes"] == 1000, name


def test_list_weights_cli_prints_every_tag(capsys):
    from keras_mvit2.cli import main

    assert main(["list", "--weights"]) == 0
    out = capsys.readouterr().out
    for entry in PRETRAINED_WEIGHTS:
        assert f"{entry.top1:.2f}" in out
    assert out.count("imagenet22k_ft_in1k_384") == 3


# --------------------------------------------------------------------------------------
# Preprocessing
# --------------------------------------------------------------------------------------


def _pil_eval_transform(image: np.ndarray, size: int, crop_pct: float) -> np.ndarray:
    """timm's eval transform written with PIL: Resize(int) bicubic + CenterCrop, / 255."""
    from PIL import Image

    im = Image.fromarray(image).convert("RGB")
    resize = math.floor(size / crop_pct)
    width, height = im.size
    if width <= height:
        new_w, new_h = resize, int(resize * height / width)
    else:
        new_w, new_h = int(resize * width / height), resize
    im = im.resize((new_w, new_h), Image.BICUBIC)
    top, left = round((new_h - size) / 2.0), round((new_w - size) / 2.0)
    return np.asarray(im.crop((left, top, left + size, top + size)), np.float32) / 255.0


def test_preprocess_images_matches_pil_on_the_cc0_photos(tmp_path):
    import tensorflow as tf
    from PIL import Image
    from skimage import data

    photos = {"astronaut": data.astronaut(), "chelsea": data.chelsea(),
              "coffee": data.coffee(), "rocket": data.rocket()}
    path = str(tmp_path / "astronaut.png")
    Image.fromarray(photos["astronaut"]).save(path)
    inputs = [path, Image.fromarray(photos["chelsea"]), photos["coffee"],
              tf.constant(photos["rocket"])]  # a path, PIL, uint8 array, tf tensor
    for size, crop_pct in ((256, 0.888), (384, 1.0)):
        batch = mv.preprocess_images(inputs, size)
        assert batch.shape == (4, size, size, 3) and batch.dtype == np.float32
        for got, image in zip(batch, photos.values(), strict=True):
            diff = float(np.abs(got - _pil_eval_transform(image, size, crop_pct)).mean())
            assert diff < 1 / 255, (size, diff)
    # The Keras preprocessing model in front of a network gives the same batch.
    prep = mv.preprocessing_model(256)
    np.testing.assert_allclose(np.asarray(prep(photos["chelsea"][None]))[0],
                               mv.preprocess_images(photos["chelsea"])[0], atol=1e-5)
    with pytest.raises(ValueError, match="uint8"):
        mv.preprocess_images(photos["coffee"].astype("float32"))
    # Inside tf.data (keras-hub's `predict`, on any backend) the layer's TensorFlow form
    # with Keras' TensorFlow backend ops: here, the layer's own graph, bit for bit.
    from keras_mvit2.layers import EvalResizeCrop

    layer = EvalResizeCrop(256, crop_pct=0.888)
    batch = np.stack([photos["coffee"]] * 2)  # 400x600
    mapped = tf.data.Dataset.from_tensors(batch).map(layer.in_tf_data)
    np.testing.assert_array_equal(next(iter(mapped)).numpy(), np.asarray(layer(batch)))


# --------------------------------------------------------------------------------------
# mvit2 predict and mvit2 demo --pretrained
# --------------------------------------------------------------------------------------


@needs_oracle
def test_predict_cli_and_pretrained_demo(checkpoints, hub_env, tmp_path, capsys):
    """`mvit2 predict` prints a top-5 table per photo; `mvit2 demo --pretrained` exports
    int8 TFLite (+ Core ML) with the ImageNet labels, calibrated on a folder of photos."""
    from PIL import Image
    from skimage import data

    from keras_mvit2.cli import main
    from keras_mvit2.export import read_tflite_metadata

    hub_env.serve(_repo("mobilevitv2_050"), "model.safetensors",
                  checkpoints["mobilevitv2_050"]["safetensors"])
    photos = tmp_path / "photos" / "any" / "layout"
    photos.mkdir(parents=True)
    paths = []
    for name in ("astronaut", "chelsea", "coffee", "rocket"):
        paths.append(str(photos / f"{name}.png"))
        Image.fromarray(getattr(data, name)()).save(paths[-1])

    assert main(["predict", *paths, "--model", "mobilevitv2_050", "--weights", "imagenet"]) == 0
    out = capsys.readouterr().out
    model = mv.create_model("mobilevitv2_050", weights="imagenet")  # from the cached .h5
    expected = mv.decode_predictions(model.predict(mv.preprocess_images(paths, model),
                                                   verbose=0), top=5)
    for path, top in zip(paths, expected, strict=True):
        assert path in out
        for _, name, score in top:
            assert name in out and f"{score:.4f}" in out

    demo_dir = tmp_path / "demo"
    assert main(["demo", "--pretrained", "--calibration", str(tmp_path / "photos"),
                 "-o", str(demo_dir)]) == 0
    summary = json.loads((demo_dir / "summary.json").read_text())
    assert summary["num_images"] == 4
    assert [row[1] for row in summary["predictions"]] == [top[0][1] for top in expected]
    metadata = read_tflite_metadata(summary["paths"]["tflite"])
    names = metadata["class_names"]
    assert len(names) == 1000 and names[:2] == ["tench", "goldfish"]
    if importlib.util.find_spec("coremltools") is not None:
        assert os.path.isdir(summary["paths"]["coreml"])
