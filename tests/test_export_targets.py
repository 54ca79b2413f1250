"""The export target interface: the registry, dispatch by name and suffix, one vocabulary.

`mvit2 export`, `validate` and `mvit2 bench` find a target through the registry, so a new
target is one sub-package and one `register_target` call. The test registers a small real
target of its own (the Keras file format: `.keras`, run in Keras) and drives the CLI and
`validate` through it without touching them.
"""

from __future__ import annotations

import json
import os

import keras
import numpy as np
import pytest

import keras_mvit2 as mv
from keras_mvit2.cli.main import main
from keras_mvit2.export import (
    ExportTarget,
    available_targets,
    get_target,
    register_target,
    target_for_path,
    validate,
)
from keras_mvit2.export import target as target_module


class KerasFileReport:
    def __init__(self, path: str, model: keras.Model):
        self.path = path
        self.size_bytes = os.path.getsize(path)
        counts: dict[str, int] = {}
        for layer in model.layers[1:]:
            counts[type(layer).__name__] = counts.get(type(layer).__name__, 0) + 1
        self.op_histogram = dict(sorted(counts.items()))
        self.num_ops = sum(counts.values())
        self.input_dtype = self.output_dtype = "float32"
        self.metadata = {}

    def to_dict(self):
        return {"path": self.path, "size_bytes": self.size_bytes, "num_ops": self.num_ops}


class KerasFileTarget(ExportTarget):
    """A `.keras` file run in Keras: the smallest real target (what a new one implements)."""

    name = "keras_file"
    display_name = "Keras file"
    suffixes = (".keras",)
    formats = ("float32",)
    runtime = "Keras"

    def _convert(self, model, path, shared, options):
        self.check_options(options, self._save)
        self.check_format(shared.quantization)
        names = self.check_class_names(shared.class_names, model)
        self._save(model, os.fspath(path), names)
        return self.inspect(path)

    @staticmethod
    def _save(model, path, names, *, include_optimizer: bool = False):
        model.save(path, include_optimizer=include_optimizer)
        with open(path + ".json", "w") as f:
            json.dump({"quantization": "float32", "class_names": names}, f)

    def inspect(self, path):
        return KerasFileReport(os.fspath(path), keras.saving.load_model(path, compile=False))

    def run(self, path, images, *, num_threads=1):
        return np.asarray(keras.saving.load_model(path, compile=False).predict(images, verbose=0))

    def metadata(self, path):
        with open(os.fspath(path) + ".json") as f:
            return json.load(f)

    def report_rows(self, report):
        return [("layers", f"{report.num_ops}: {report.op_histogram}")]


@pytest.fixture
def keras_file_target():
    target = register_target(KerasFileTarget())
    yield target
    del target_module._TARGETS[target.name]


@pytest.fixture(scope="module")
def classifier():
    keras.utils.set_random_seed(0)
    return mv.MobileViTV2(0.5, input_shape=(64, 64, 3), classes=3)


def test_builtin_targets_are_registered_under_one_vocabulary():
    assert {"tflite", "coreml"} <= set(available_targets())
    tflite, coreml = get_target("tflite"), get_target("coreml")
    assert target_for_path("m.tflite") is tflite
    assert target_for_path("dir/m.mlpackage/") is coreml
    assert tflite.default_format == "float32" and "int8" in tflite.calibrated_formats
    assert coreml.default_format == "float16" and set(coreml.formats) == {"float16", "float32"}
    with pytest.raises(ValueError, match="Cannot tell the export target"):
        target_for_path("m.onnx")
    with pytest.raises(ValueError, match="Unknown export target 'onnx'"):
        get_target("onnx")
    with pytest.raises(ValueError, match="already registered"):
        register_target(type(tflite)())
    with pytest.raises(ValueError, match=r"coreml exports take quantization in \['float16'"):
        coreml.check_format("int8")


def test_unknown_options_name_the_known_ones(classifier, tmp_path):
    with pytest.raises(TypeError, match=r"no option \['io_dtype'\].*weight_compression"):
        get_target("coreml").convert(classifier, tmp_path / "m.mlpackage", io_dtype="int8")
    with pytest.raises(TypeError, match=r"no option \['weight_compression'\].*io_dtype"):
        get_target("tflite").convert(classifier, tmp_path / "m.tflite", weight_compression="int8")
    with pytest.raises(ValueError, match="not calibrated"):
        get_target("coreml").convert(classifier, tmp_path / "m.mlpackage",
                                     calibration_data=np.zeros((2, 64, 64, 3), "float32"))
    assert os.listdir(tmp_path) == []


def test_class_names_are_checked_the_same_way_for_every_target(classifier, tmp_path):
    for name, path in (("tflite", "m.tflite"), ("coreml", "m.mlpackage")):
        with pytest.raises(ValueError, match="class_names has 2 entries but the model outputs 3"):
            get_target(name).convert(classifier, tmp_path / path, class_names=["a", "b"])
        with pytest.raises(ValueError, match="class_names must be a list of strings"):
            get_target(name).convert(classifier, tmp_path / path, class_names="abc")
    assert os.listdir(tmp_path) == []


@pytest.mark.slow  # a conversion and LiteRT runs: 15.5 s on an AVX2-only host
def test_tflite_target_round_trip(classifier, tmp_path):
    target = get_target("tflite")
    path = tmp_path / "m.tflite"
    report = target.convert(classifier, path, class_names=["a", "b", "c"])
    assert report.num_ops == sum(report.op_histogram.values()) > 100
    meta = target.metadata(path)
    assert meta["class_names"] == ["a", "b", "c"] and meta["quantization"] == "float32"
    x = np.random.default_rng(0).uniform(0, 1, (2, 64, 64, 3)).astype("float32")
    np.testing.assert_allclose(target.run(path, x), classifier.predict(x, verbose=0), atol=1e-5)
    rows = dict(target.report_rows(report))
    assert rows["quantization"] == "float32" and rows["class names"].startswith("3: a, b, c")
    assert rows["export forms"] == ("token_pooling matmul, token_normaliser exp_mean, variance "
                                    "one_pass, unfold space_to_depth, flow_epsilon add, "
                                    "products as_written, layout channels_last, "
                                    "road tensorflow")


# The Core ML target's conversion (its op count, the class names and format read back):
# tests/test_coreml_export.py::test_classifier_labels_and_float32.


def test_a_new_target_is_reached_by_the_cli(keras_file_target, classifier, tmp_path, capsys):
    source = tmp_path / "source.keras"
    classifier.save(source)
    names = tmp_path / "names.txt"
    names.write_text("a\nb\nc\n")
    out = tmp_path / "exported.keras"
    assert main(["export", str(source), "-o", str(out), "--format", "keras_file",
                 "--class-names", str(names)]) == 0
    assert "Keras file export" in capsys.readouterr().out
    assert keras_file_target.metadata(out)["class_names"] == ["a", "b", "c"]

    assert main(["export", str(source), "-o", str(tmp_path / "bad.keras"),
                 "--format", "keras_file", "--quantization", "int8"]) == 2
    assert "keras_file exports take quantization in ['float32']" in capsys.readouterr().err


@pytest.mark.slow  # loads and traces the model 3 times: 15.8-16.3 s on AVX2-only hosts
def test_a_new_target_is_reached_by_validate(keras_file_target, classifier, tmp_path):
    out = tmp_path / "exported.keras"
    keras_file_target.convert(classifier, out, class_names=["a", "b", "c"])
    x = np.random.default_rng(1).uniform(0, 1, (6, 64, 64, 3)).astype("float32")
    labels = np.arange(6) % 3
    report = validate(out, classifier, x, labels)
    assert report.format == "keras_file" and report.numeric
    assert report.max_abs_diff < 1e-6 and report.top1_agreement == 1.0
    assert report.num_ops == keras_file_target.inspect(out).num_ops
    assert list(report.per_class_accuracy) == ["a", "b", "c"]  # names read from the export
