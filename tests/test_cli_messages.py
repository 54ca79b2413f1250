"""What a newcomer reads: model files that are not what their names say are named as such
(`keras_mvit2.utils.model_files`), and the summary tables of `mvit2` print at full width off
a terminal (`keras_mvit2.utils.console`).

Oracles: the files are written here byte by byte (a real `.keras` archive and a real
`.weights.h5` from Keras, an HDF5 signature, a zip without `config.json`); the printed
table is read back line by line from captured standard output (a pipe, as in a CI log).
"""

import os
import zipfile

import keras
import pytest

from keras_mvit2.cli.main import main
from keras_mvit2.demo import DemoStep, print_steps
from keras_mvit2.utils.console import LOG_WIDTH, output_console
from keras_mvit2.utils.model_files import (
    HDF5_SIGNATURE,
    check_file_format,
    file_format_problem,
    load_keras_model,
)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Good and broken model / weights files: name -> path."""
    root = tmp_path_factory.mktemp("files")
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2, name="predictions")])
    paths = {name: str(root / name) for name in (
        "good.keras", "good.weights.h5", "text.keras", "empty.keras", "page.keras",
        "torch_zip.keras", "text.weights.h5", "text.pt", "zip.pt", "pickle.pth",
        "text.safetensors", "notes.txt")}
    model.save(paths["good.keras"])
    model.save_weights(paths["good.weights.h5"])
    writes = {"text.keras": b"not a zip", "empty.keras": b"",
              "page.keras": b"<!DOCTYPE html><html><body>Sign in</body></html>",
              "text.weights.h5": b"junk", "text.pt": b"junk", "pickle.pth": b"\x80\x02}q\x00.",
              "text.safetensors": b"junk", "notes.txt": b"hello"}
    for name, data in writes.items():
        with open(paths[name], "wb") as f:
            f.write(data)
    for name in ("torch_zip.keras", "zip.pt"):  # what torch.save writes: a zip of data.pkl
        with zipfile.ZipFile(paths[name], "w") as z:
            z.writestr("archive/data.pkl", b"\x80\x02}q\x00.")
    return paths


def test_file_format_problem_reads_what_each_file_is(files):
    assert file_format_problem(files["good.keras"]) is None
    assert file_format_problem(files["good.weights.h5"]) is None
    assert open(files["good.weights.h5"], "rb").read(8) == HDF5_SIGNATURE
    assert file_format_problem(files["zip.pt"]) is None
    assert file_format_problem(files["pickle.pth"]) is None  # torch < 1.6's format
    assert file_format_problem(files["notes.txt"]) is None  # its name says nothing checkable
    expected = {
        "text.keras": "it is not a zip archive (9 bytes, starting b'not a zip')",
        "empty.keras": "the file is empty",
        "page.keras": "the file is an HTML/XML page",
        "torch_zip.keras": "it is a zip archive without config.json (it holds "
                           "archive/data.pkl)",
        "text.weights.h5": "it is not an HDF5 file (4 bytes, starting b'junk')",
        "text.pt": "it is neither a zip archive nor a pickle",
        "text.safetensors": "the file is not a valid safetensors file",
    }
    for name, phrase in expected.items():
        problem = file_format_problem(files[name])
        assert problem is not None and problem.startswith(phrase), (name, problem)
    # a download is checked by the published name, whatever the cache calls the file
    assert "not an HDF5 file" in file_format_problem(files["notes.txt"], name="x.weights.h5")
    assert file_format_problem(os.path.dirname(files["notes.txt"])) == (
        "it is a folder, not a file")


def test_check_and_load_name_the_problem_and_the_fix(files):
    gone = os.path.join(os.path.dirname(files["good.keras"]), "gone.keras")
    check_file_format(files["good.keras"])
    check_file_format(gone)  # a missing file is the caller's FileNotFoundError
    with pytest.raises(ValueError) as info:
        check_file_format(files["text.weights.h5"], what="--weights 'x'")
    assert str(info.value).startswith("--weights 'x' is not a Keras weights file: it is not "
                                      "an HDF5 file")
    assert "model.save_weights" in str(info.value)
    with pytest.raises(ValueError, match=r"is not a Keras model file: it is not a zip archive"
                                         r".*model\.save\('model\.keras'\)"):
        load_keras_model(files["text.keras"])
    with pytest.raises(FileNotFoundError, match="Model file not found"):
        load_keras_model(gone)
    model = load_keras_model(files["good.keras"])
    assert [layer.name for layer in model.layers] == ["predictions"]


def _one_error(capsys, argv) -> str:
    code = main(argv)
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1, err
    return err


def test_commands_say_a_model_file_is_not_a_keras_file(files, tmp_path, capsys):
    broken, photos = files["text.keras"], str(tmp_path)
    exported = str(tmp_path / "m.tflite")
    open(exported, "wb").close()
    for argv in (["export", broken, "-o", str(tmp_path / "out.tflite")],
                 ["optimize", broken, "--data", photos, "--max-drop", "1", "-o",
                  str(tmp_path / "opt")],
                 ["validate", exported, "--reference", broken, "--data", photos],
                 ["bench", broken]):
        err = _one_error(capsys, argv)
        assert f"mvit2 {argv[0]}: error: {broken!r} is not a Keras model file: it is not a " \
               "zip archive" in err, err
        assert "File not found" not in err  # Keras' own message, while the file exists
    err = _one_error(capsys, ["predict", files["notes.txt"], "--weights",
                              files["text.weights.h5"]])
    assert f"weights={files['text.weights.h5']!r} is not a Keras weights file" in err


def test_tables_off_a_terminal_print_at_full_width(capsys, tmp_path):
    assert output_console().width == LOG_WIDTH  # pytest captures: not a terminal
    long_path = tmp_path / ("a_long_folder_name_" * 4) / "model_int8.tflite"
    steps = [DemoStep("export TFLite int8", "1.54 MB, top-1 81.0 %, agrees with Keras on "
                      "96.7 % of 1,000 held-out images, 0.25 ms on this host",
                      str(long_path), 12.0),
             DemoStep("train", "10,240 images x 1 epoch at 64x64", None, 3.0)]
    print_steps("mvit2 demo: MobileViTV2-0.5 on Fashion-MNIST, 95 s", steps, str(tmp_path),
                "summary.json: all figures")
    lines = capsys.readouterr().out.splitlines()
    row = next(line for line in lines if "export TFLite int8" in line)
    # the whole row on one line: no cell wrapped, no path cut with an ellipsis
    assert "0.25 ms on this host" in row and "model_int8.tflite" in row, lines
    assert os.path.relpath(long_path, tmp_path) in row
    assert len(row) > 80 and "…" not in "".join(lines)
    assert any(line.startswith("│ train ") for line in lines)
