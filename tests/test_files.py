"""Atomic file output (`keras_mvit2.utils.files`): nothing the user had is lost or half-written."""

import json
import os
import pathlib

import numpy as np
import pytest

from keras_mvit2.utils.files import atomic_output, write_json


def test_atomic_output_replaces_only_on_success(tmp_path):
    path = tmp_path / "model.weights.h5"
    path.write_bytes(b"old")
    with pytest.raises(RuntimeError), atomic_output(path) as tmp:
        assert tmp.endswith(".weights.h5") and os.path.dirname(tmp) != str(tmp_path)
        pathlib.Path(tmp).write_bytes(b"half")
        raise RuntimeError("killed mid-write")
    assert path.read_bytes() == b"old"
    assert sorted(os.listdir(tmp_path)) == ["model.weights.h5"]  # no temporary left
    with atomic_output(path) as tmp:
        pathlib.Path(tmp).write_bytes(b"new")
    assert path.read_bytes() == b"new"
    assert sorted(os.listdir(tmp_path)) == ["model.weights.h5"]


def test_write_json_converts_numpy_and_refuses_the_rest(tmp_path):
    path = tmp_path / "out" / "metrics.json"
    write_json(path, {"acc": np.float32(0.5), "counts": np.arange(3), "n": np.int64(7),
                      "file": tmp_path / "a.png"})
    assert json.loads(path.read_text()) == {"acc": 0.5, "counts": [0, 1, 2], "n": 7,
                                            "file": str(tmp_path / "a.png")}
    with pytest.raises(TypeError, match="Not JSON serializable: object"):
        write_json(path, {"acc": object()})
    assert json.loads(path.read_text())["n"] == 7  # the previous file is intact
