"""`quantization` is resolved once (`resolve_quantization`) into the description the converter
reads; the file's metadata records the export forms its graph was traced in; and the writer
serializes the flatbuffer once."""

import keras
import numpy as np
import pytest
from ai_edge_litert import schema_py_generated as tfl_schema

from keras_mvit2.export import inspect_tflite, read_tflite_metadata, to_tflite
from keras_mvit2.export.tflite.quantization import (
    CALIBRATED,
    IO_DTYPES,
    QUANTIZATIONS,
    TFLITE_QUANTIZATIONS,
    resolve_quantization,
)
from keras_mvit2.layers import GroupNorm1, export_forms

CALIBRATION = np.random.default_rng(2).random((8, 8, 8, 3), dtype=np.float32)


def _tiny_with_group_norm() -> keras.Model:
    """Conv -> GroupNorm1 (the layer whose variance form int8 changes) -> pooled logits."""
    keras.utils.set_random_seed(0)
    inputs = keras.Input((8, 8, 3))
    x = keras.layers.Conv2D(4, 3, padding="same")(inputs)
    x = GroupNorm1()(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, keras.layers.Dense(3)(x), name="tiny_gn")


def test_each_quantization_resolves_to_one_description():
    assert QUANTIZATIONS == ("float32", "float16", "dynamic_int8", "int8", "int16x8")
    assert CALIBRATED == ("int8", "int16x8")
    assert IO_DTYPES == {"float32": ("float32",), "float16": ("float32",),
                         "dynamic_int8": ("float32",), "int8": ("float32", "int8", "uint8"),
                         "int16x8": ("float32", "int16")}
    int8, int16x8 = resolve_quantization("int8"), resolve_quantization("int16x8")
    assert (int8.op_set, int8.activation_ranges, int8.forms, int8.integer_only) == (
        "builtins_int8", "p99.99", export_forms.INT8, True)
    assert (int16x8.op_set, int16x8.activation_ranges, int16x8.forms) == (
        "int16x8", "minmax", export_forms.KERAS)
    assert [q.name for q in TFLITE_QUANTIZATIONS.values() if q.float_weights] == [
        "float32", "float16"]
    assert resolve_quantization(int8) is int8
    with pytest.raises(ValueError, match=r"quantization must be one of .*Received: "
                                         r"quantization='int4'"):
        resolve_quantization("int4")


def _pack_counter(monkeypatch) -> list[int]:
    """Counts `ModelT.Pack` calls: one per serialization of a parsed flatbuffer."""
    calls = [0]
    pack = tfl_schema.ModelT.Pack

    def counting(self, builder):
        calls[0] += 1
        return pack(self, builder)

    monkeypatch.setattr(tfl_schema.ModelT, "Pack", counting)
    return calls


def test_files_record_the_forms_they_were_traced_in(tmp_path, monkeypatch):
    """float32 keeps the one-pass variance (a MEAN of x * x); full int8 traces E[x^2] as a
    BATCH_MATMUL (`export_forms.INT8`); a caller's `forms=` wins. The metadata
    says which, and the file's ops agree with it. The float32 writer serializes once."""
    model = _tiny_with_group_norm()
    packs = _pack_counter(monkeypatch)
    float32 = to_tflite(model, tmp_path / "f32.tflite", class_names=["a", "b", "c"])
    assert packs[0] == 1  # signature, JSON and standard metadata: one serialization
    int8 = to_tflite(model, tmp_path / "int8.tflite", quantization="int8",
                     representative_data=CALIBRATION, num_calibration_samples=8)
    centred = to_tflite(model, tmp_path / "centred.tflite",
                        forms=export_forms.ExportForms(variance="centred"))

    forms = {name: read_tflite_metadata(report.path)["forms"]
             for name, report in (("float32", float32), ("int8", int8), ("centred", centred))}
    assert forms["float32"] == {"token_pooling": "matmul", "token_normaliser": "exp_mean",
                                "variance": "one_pass", "unfold": "space_to_depth",
                                "flow_epsilon": "add", "products": "as_written",
                                "layout": "channels_last", "road": "tensorflow"}
    assert forms["int8"] == {**forms["float32"], "variance": "one_pass_matmul",
                             "flow_epsilon": "omit", "products": "small_second"}
    assert forms["centred"] == {**forms["float32"], "variance": "centred"}
    assert "BATCH_MATMUL" not in float32.op_histogram
    assert int8.op_histogram.get("BATCH_MATMUL", 0) >= 1
    assert inspect_tflite(float32.path).metadata["forms"] == forms["float32"]
    # The standard metadata still carries the labels after the single serialization.
    labels = float32.metadata["tflite_metadata"]["associatedFileContents"]
    assert labels == {"labels.txt": "a\nb\nc\n"}
