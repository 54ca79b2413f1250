"""`read_flatbuffer`: the shared read-only `ModelT`, one per content (no conversion: the
flatbuffers are built with the object API, so this runs in the fast tier)."""

import os

import numpy as np
import pytest
from ai_edge_litert import schema_py_generated as tfl_schema

from keras_mvit2.export.tflite import flatbuffer
from keras_mvit2.export.tflite.flatbuffer import (
    add_tensor,
    op_names,
    parse_flatbuffer,
    read_flatbuffer,
    serialize_flatbuffer,
)


@pytest.fixture(autouse=True)
def _empty_cache():
    flatbuffer._READ_CACHE.clear()
    yield
    flatbuffer._READ_CACHE.clear()


def _model_bytes(op: str = "MUL", metadata: dict | None = None) -> bytes:
    """A one-op model `y = op(x, x)`, x and y float32 (1, 4), optionally with our JSON."""
    model = tfl_schema.ModelT()
    model.version = 3
    code = tfl_schema.OperatorCodeT()
    code.builtinCode = code.deprecatedBuiltinCode = getattr(tfl_schema.BuiltinOperator, op)
    model.operatorCodes = [code]
    model.buffers = [tfl_schema.BufferT()]
    graph = tfl_schema.SubGraphT()
    graph.tensors = []
    x = add_tensor(graph, "x", tfl_schema.TensorType.FLOAT32, [1, 4])
    y = add_tensor(graph, "y", tfl_schema.TensorType.FLOAT32, [1, 4])
    operator = tfl_schema.OperatorT()
    operator.opcodeIndex = 0
    operator.inputs = np.asarray([x, x], np.int32)
    operator.outputs = np.asarray([y], np.int32)
    graph.operators = [operator]
    graph.inputs = np.asarray([x], np.int32)
    graph.outputs = np.asarray([y], np.int32)
    model.subgraphs = [graph]
    if metadata is not None:
        from keras_mvit2.export.tflite.metadata import set_metadata_entry

        set_metadata_entry(model, metadata)
    return serialize_flatbuffer(model)


def test_same_content_is_parsed_once(tmp_path):
    content = _model_bytes()
    path = tmp_path / "m.tflite"
    path.write_bytes(content)
    first = read_flatbuffer(path)
    assert op_names(first) == ["MUL"]
    assert read_flatbuffer(str(path)) is first
    assert read_flatbuffer(content) is first
    moved = tmp_path / "moved.tflite"  # to_tflite's os.replace onto the target path
    os.replace(path, moved)
    assert read_flatbuffer(moved) is first
    # Editors get their own object, never the shared one.
    fresh = parse_flatbuffer(moved)
    assert fresh is not first and parse_flatbuffer(moved) is not fresh


def test_file_rewritten_in_place_is_read_again(tmp_path):
    path = tmp_path / "m.tflite"
    mul, sub = _model_bytes("MUL"), _model_bytes("SUB")
    assert len(mul) == len(sub) and mul != sub  # same size: only the content tells them apart
    path.write_bytes(mul)
    stamp = os.stat(path).st_mtime_ns
    assert op_names(read_flatbuffer(path)) == ["MUL"]
    path.write_bytes(sub)
    os.utime(path, ns=(stamp, stamp))  # same size and time stamp as before
    assert op_names(read_flatbuffer(path)) == ["SUB"]
    path.write_bytes(mul)
    assert op_names(read_flatbuffer(path)) == ["MUL"]


def test_cache_is_bounded(tmp_path):
    ops = ["ADD", "MUL", "SUB", "DIV", "MAXIMUM", "MINIMUM"]
    models = [read_flatbuffer(_model_bytes(op)) for op in ops]
    assert len(flatbuffer._READ_CACHE) == flatbuffer._READ_CACHE_ENTRIES < len(ops)
    assert read_flatbuffer(_model_bytes(ops[-1])) is models[-1]  # recent: kept
    assert read_flatbuffer(_model_bytes(ops[0])) is not models[0]  # oldest: evicted


def test_not_a_flatbuffer_is_refused_and_not_cached():
    with pytest.raises(ValueError, match="TFL3"):
        read_flatbuffer(b"not a tflite file")
    assert not flatbuffer._READ_CACHE


def test_readers_leave_the_shared_model_as_parsed(tmp_path):
    """The read-only readers share one `ModelT` per file: none of them may change it."""
    from keras_mvit2.export.tflite.inspect import inspect_tflite
    from keras_mvit2.export.tflite.metadata import read_tflite_metadata
    from keras_mvit2.export.tflite.standard_metadata import read_standard_metadata
    from keras_mvit2.latency.tflite_facts import tflite_macs, tflite_precision

    path = tmp_path / "m.tflite"
    path.write_bytes(_model_bytes(metadata={"quantization": "float32", "output_kind": "logits"}))
    report = inspect_tflite(path)
    assert report.op_histogram == {"MUL": 1}
    assert report.metadata["quantization"] == "float32"
    assert read_tflite_metadata(path)["quantization"] == "float32"
    assert read_standard_metadata(path) is None
    assert tflite_macs(path) == 0
    assert tflite_precision(path) == "float32"
    assert len(flatbuffer._READ_CACHE) == 1  # one parse served them all
    shared = read_flatbuffer(path)
    assert serialize_flatbuffer(shared) == serialize_flatbuffer(parse_flatbuffer(path))
