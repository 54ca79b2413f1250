"""The export roads (`keras_mvit2.export.roads`): which converter a target's `convert` takes,
and the errors of a road this process cannot take. Fast tier, no subprocess.

`mvit2 export --road` is parsed and refused here too (no conversion: a road of another
backend re-runs the command in a new process, which is stubbed).

The torch road's files themselves (`.tflite` and `.mlpackage`: outputs against Keras and the
TensorFlow road, metadata, MediaPipe) are tested in the slow tier by
tests/test_mediapipe_clients.py, on the run's trained classifier, in one
``KERAS_BACKEND=torch`` worker (tests/backend_worker.py).
"""

import importlib.util
import subprocess
import sys

import numpy as np
import pytest

from keras_mvit2.cli.main import main
from keras_mvit2.export import get_target, roads


def test_the_default_road_is_the_backends():
    assert roads.ROADS == ("tensorflow", "torch")
    assert roads.default_road() == "tensorflow"
    assert roads.check_road(None, "tflite") == "tensorflow"


@pytest.mark.parametrize("target,suffix", [("tflite", ".tflite"), ("coreml", ".mlpackage")])
def test_torch_road_on_tensorflow_names_the_backend_and_the_fix(target, suffix, tmp_path):
    with pytest.raises(ValueError, match="KERAS_BACKEND=torch") as err:
        get_target(target).convert(None, tmp_path / f"x{suffix}", road="torch")
    assert "'tensorflow' here" in str(err.value) and f"-o out{suffix}" in str(err.value)
    assert not (tmp_path / f"x{suffix}").exists()


def test_coreml_torch_road_refuses_the_tensorflow_roads_options():
    from keras_mvit2.export.coreml.torch_road import to_coreml_via_torch

    target = get_target("coreml")
    with pytest.raises(TypeError, match="activation_quantization"):
        target.check_options({"activation_quantization": "int8"}, to_coreml_via_torch)
    target.check_options({"weight_compression": "int8", "image_input": False},
                         to_coreml_via_torch)


def test_export_road_flag_is_parsed_with_its_choices(capsys):
    with pytest.raises(SystemExit):
        main(["export", "model.keras", "-o", "x.tflite", "--road", "onnx"])
    assert "invalid choice: 'onnx'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["export", "--help"])
    assert "--road {tensorflow,torch}" in capsys.readouterr().out


def test_export_torch_road_with_keras_backend_set_says_what_to_run(monkeypatch, capsys):
    monkeypatch.setenv("KERAS_BACKEND", "tensorflow")
    argv = ["export", "my model.keras", "-o", "out.mlpackage", "--road", "torch"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "KERAS_BACKEND=tensorflow is set here" in err
    assert "Run: KERAS_BACKEND=torch mvit2 export 'my model.keras' -o out.mlpackage " \
           "--road torch" in err


def test_export_torch_road_reruns_itself_on_torch(monkeypatch, capsys):
    monkeypatch.delenv("KERAS_BACKEND", raising=False)
    calls = []

    def run(command, env):
        calls.append((command, env["KERAS_BACKEND"]))
        return subprocess.CompletedProcess(command, 0)

    monkeypatch.setattr(subprocess, "run", run)
    argv = ["export", "m.keras", "-o", "out.tflite", "--road", "torch"]
    assert main(argv) == 0
    assert calls == [([sys.executable, "-m", "keras_mvit2.cli", *argv], "torch")]
    assert "re-running with KERAS_BACKEND=torch" in capsys.readouterr().err


@pytest.mark.parametrize("flags,message", [
    (["--io-dtype", "uint8"], "--io-dtype: options of the TensorFlow road"),
    (["--no-fuse-pointwise"], "--no-fuse-pointwise: options of the TensorFlow road"),
    (["--quantization", "int8"], "needs --calibration-data DIR"),
])
def test_export_torch_road_refuses_tensorflow_road_flags(flags, message):
    from keras_mvit2.cli.main import build_parser

    args = build_parser().parse_args(["export", "m.keras", "-o", "x.tflite", "--road",
                                      "tensorflow", *flags])
    args.road = "torch"  # as the re-run process on PyTorch reads it
    from keras_mvit2.export.tflite.target import _torch_road_cli_arguments

    with pytest.raises(ValueError, match=message):
        _torch_road_cli_arguments(args, args.quantization or "float32")
    # int8 calibrates on the images of --calibration-data (read there without TensorFlow)
    args = build_parser().parse_args(["export", "m.keras", "-o", "x.tflite", "--quantization",
                                      "int8", "--calibration-data", "photos",
                                      "--num-calibration-samples", "64"])
    assert _torch_road_cli_arguments(args, "int8") == {
        "road": "torch", "quantization": "int8", "sidecar": False,
        "calibration_data": "photos", "num_calibration_samples": 64}
    args = build_parser().parse_args(["export", "m.keras", "-o", "x.tflite", "--sidecar"])
    assert _torch_road_cli_arguments(args, "float16") == {
        "road": "torch", "quantization": "float16", "sidecar": True}


def test_an_unknown_road_is_refused():
    with pytest.raises(ValueError, match=r"road must be one of \['tensorflow', 'torch'\]"):
        roads.check_road("onnx", "tflite")


def test_missing_litert_torch_names_the_extra(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "litert_torch" else real(name, *a))
    with pytest.raises(ImportError, match=r"keras_mvit2\[litert-torch\]|\.\[torch,litert-torch\]"
                       ) as err:
        roads.import_litert_torch()
    assert "litert-torch==0.10.0" in str(err.value) and "--no-deps" in str(err.value)


def test_coreai_has_the_torch_road_only(tmp_path, capsys):
    from keras_mvit2.export import target_for_path

    target = target_for_path(tmp_path / "x.aimodel")
    assert target.name == "coreai" and target.formats == ("float32",)
    for road in (None, "tensorflow"):
        with pytest.raises(ValueError, match="Core AI converts from PyTorch only"):
            target.convert(None, tmp_path / "x.aimodel", road=road)
    with pytest.raises(ValueError, match="KERAS_BACKEND=torch"):
        target.convert(None, tmp_path / "x.aimodel", road="torch")
    assert main(["export", "m.keras", "-o", str(tmp_path / "x.aimodel")]) == 2
    assert "--road torch" in capsys.readouterr().err
    assert not (tmp_path / "x.aimodel").exists()
    if not target.can_run():
        assert "macOS" in target.host_note()


def test_torch_road_reads_calibration_folders_without_tensorflow(tmp_path):
    """The PyTorch road's calibration reader (numpy + PIL): a seeded subset of a folder at
    the model's size, RGB in [0, 1], whatever the photos' sizes; a missing folder names the
    fix."""
    from PIL import Image

    from keras_mvit2.export.tflite.torch_road import _read_images

    for name, shade in (("dark", 40), ("light", 220)):
        (tmp_path / name).mkdir()
        for i in range(4):  # photos of two sizes, one color per class
            size = (30 + 10 * i, 20 + 5 * i)
            image = np.full((*size, 3), shade, np.uint8)
            Image.fromarray(image).save(tmp_path / name / f"{i}.png")
    images = _read_images(str(tmp_path), (16, 16), 6, seed=0)
    assert images.shape == (6, 16, 16, 3) and images.dtype == np.float32
    means = sorted(round(float(m) * 255) for m in images.mean(axis=(1, 2, 3)))
    assert set(means) == {40, 220}  # both classes in the subset, values kept
    np.testing.assert_array_equal(images, _read_images(str(tmp_path), (16, 16), 6, seed=0))
    with pytest.raises(FileNotFoundError, match="one sub-folder of images per class"):
        _read_images(str(tmp_path / "nowhere"), (16, 16), 6, seed=0)
