"""The export roads (`keras_mvit2.export.roads`): which converter a target's `convert` takes,
and the errors of a road this process cannot take. Fast tier, no subprocess.

The torch road's files themselves (outputs against Keras and the TensorFlow road, metadata,
MediaPipe) are tested in the slow tier by tests/test_mediapipe_clients.py, on the run's
trained classifier, in one ``KERAS_BACKEND=torch`` worker (tests/backend_worker.py).
"""

import importlib.util

import pytest

from keras_mvit2.export import get_target, roads


def test_the_default_road_is_the_backends():
    assert roads.ROADS == ("tensorflow", "torch")
    assert roads.default_road() == "tensorflow"
    assert roads.check_road(None, "tflite") == "tensorflow"


@pytest.mark.parametrize("target", ["tflite"])
def test_torch_road_on_tensorflow_names_the_backend_and_the_fix(target, tmp_path):
    with pytest.raises(ValueError, match="KERAS_BACKEND=torch") as err:
        get_target(target).convert(None, tmp_path / "x.tflite", road="torch")
    assert "'tensorflow' here" in str(err.value)
    assert not (tmp_path / "x.tflite").exists()


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
