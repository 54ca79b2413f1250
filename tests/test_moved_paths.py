"""Old import paths keep working for one release after the export redesign's moves and
renames: the same objects, with a DeprecationWarning that names the new path."""

from __future__ import annotations

import importlib
import importlib.util
import sys

import pytest

MOVED_MODULES = [
    ("keras_mvit2.export.flatbuffer", "keras_mvit2.export.tflite.flatbuffer", "parse_flatbuffer"),
    ("keras_mvit2.export.pointwise_fusion", "keras_mvit2.export.tflite.pointwise_fusion",
     "fuse_pointwise_convolutions"),
    ("keras_mvit2.export.detection_postprocess", "keras_mvit2.export.tflite.detection_postprocess",
     "with_detection_postprocess"),
    ("keras_mvit2.export.tflite_standard_metadata", "keras_mvit2.export.tflite.standard_metadata",
     "read_standard_metadata"),
    ("keras_mvit2.export.coreml_detection", "keras_mvit2.export.coreml.detection",
     "to_coreml_detector"),
    ("keras_mvit2.export.coreml_layout", "keras_mvit2.export.coreml.layout", "coreml_layout"),
    ("keras_mvit2.weights.hub", "keras_mvit2.weights.download", "download_weights"),
]


def _fresh_import(name: str):
    for key in [k for k in sys.modules if k == name or k.startswith(name + ".")]:
        del sys.modules[key]
    return importlib.import_module(name)


@pytest.mark.parametrize("old, new, attribute", MOVED_MODULES, ids=[m[0] for m in MOVED_MODULES])
def test_moved_module_reexports_with_a_warning(old, new, attribute):
    with pytest.warns(DeprecationWarning, match=f"{old} moved to {new}"):
        module = _fresh_import(old)
    assert getattr(module, attribute) is getattr(importlib.import_module(new), attribute)


def test_renamed_latency_package_gives_the_same_modules():
    with pytest.warns(DeprecationWarning, match="keras_mvit2.bench moved to keras_mvit2.latency"):
        _fresh_import("keras_mvit2.bench")
    import keras_mvit2.bench.host as old_host

    import keras_mvit2.latency.host as host
    from keras_mvit2.bench import BenchResult
    from keras_mvit2.latency.schema import BenchResult as NewBenchResult

    assert old_host is host and BenchResult is NewBenchResult


@pytest.mark.skipif(importlib.util.find_spec("keras_hub") is None, reason="needs the hub extra")
def test_renamed_kerashub_package_gives_the_same_classes():
    import keras_mvit2.kerashub.mobilevitv2_backbone as backbone

    with pytest.warns(DeprecationWarning, match="keras_mvit2.hub moved to keras_mvit2.kerashub"):
        old = _fresh_import("keras_mvit2.hub")
    import keras_mvit2.hub.mobilevitv2_backbone as old_backbone

    assert old.MobileViTV2Backbone is backbone.MobileViTV2Backbone
    assert old_backbone is backbone  # presets saved with the old module path still load


@pytest.mark.slow
def test_package_code_uses_no_old_path():
    # The package imports only new paths: none of these warnings in a fresh process.
    import subprocess

    code = ("import warnings; warnings.filterwarnings('error', 'keras_mvit2.* moved to', "
            "DeprecationWarning); "
            "import keras_mvit2, keras_mvit2.latency.host, keras_mvit2.export.coreml.layout")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
