"""`keras_mvit2.optimizer.optimize` / `mvit2 optimize`: the shipped file keeps the budget.

Every figure the optimizer reports is re-measured here by a plain LiteRT interpreter
written in the test (not the package's runner), on the same held-out images.
"""

import importlib
import importlib.util
import json
import os
import shutil
import tempfile

import keras
import numpy as np
import pytest
from ai_edge_litert.interpreter import Interpreter
from PIL import Image

import keras_mvit2 as mv
from keras_mvit2.optimizer import (
    OptimizeData,
    OverBudgetError,
    load_optimize_data,
    optimize,
)

SIZE = 32  # the trained classifier's
TINY = 16

needs_fashion_mnist = pytest.mark.skipif(not os.path.exists("/usr/share/datasets/fashion-mnist"),
                                         reason="needs Debian's dataset-fashion-mnist")


def _litert_top1(path: str, images: np.ndarray) -> np.ndarray:
    """Top-1 of a `.tflite` classifier, one image at a time, float or quantized input."""
    interpreter = Interpreter(model_path=str(path))
    interpreter.allocate_tensors()
    inp = interpreter.get_input_details()[0]
    out = interpreter.get_output_details()[0]
    top1 = []
    for image in images:
        x = image[None].astype(np.float32)
        scale, zero = inp["quantization"]
        if inp["dtype"] != np.float32:
            x = np.clip(np.round(x / scale + zero), np.iinfo(inp["dtype"]).min,
                        np.iinfo(inp["dtype"]).max).astype(inp["dtype"])
        interpreter.set_tensor(inp["index"], x)
        interpreter.invoke()
        y = interpreter.get_tensor(out["index"]).astype(np.float32)
        scale, zero = out["quantization"]
        if out["dtype"] != np.float32:
            y = (y - zero) * scale
        top1.append(int(np.argmax(y)))
    return np.array(top1)


@pytest.fixture(scope="module")
def tiny():
    """A small untrained convolutional classifier at 16x16 (it converts in a second; the
    optimizer does not care what the model is) and images labelled with its own top-1 (so
    the float model scores 100 % and every drop is the export's)."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.Input((TINY, TINY, 3)), keras.layers.Conv2D(16, 3, activation="relu"),
        keras.layers.Conv2D(32, 3, strides=2, activation="relu"),
        keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(10)], name="tiny")
    # Classes 0 and 1 nearly tied, far above the others: the output's int8 step is wider
    # than their gap, so full int8 flips some of them (a drop the budget must see), while
    # float16 and dynamic-range int8 weights keep the order.
    rng = np.random.default_rng(0)
    k = np.abs(rng.normal(size=(32,))).astype(np.float32)
    kernel = np.stack([k, k + 1e-3 * rng.normal(size=32).astype(np.float32)]
                      + [-k] * 8, axis=1)
    model.layers[-1].set_weights([kernel, np.zeros(10, np.float32)])
    calibration = rng.uniform(0, 1, (32, TINY, TINY, 3)).astype(np.float32)
    held_out = rng.uniform(0, 1, (96, TINY, TINY, 3)).astype(np.float32)
    labels = model.predict(held_out, verbose=0).argmax(-1)
    data = OptimizeData(calibration, held_out, labels, [f"class_{i}" for i in range(10)],
                        "uniform noise")
    return model, data


def test_optimize_ships_the_smallest_candidate_within_the_budget(tiny, tmp_path):
    model, data = tiny
    result = optimize(model, tmp_path, data=data, max_drop=100.0, latency_runs=3,
                      objective="size", only=["float32", "float16", "dynamic_int8"],
                      verbose=False)
    sizes = {r.name: os.path.getsize(r.path) for r in result.candidates}
    assert {r.name: r.size_bytes for r in result.candidates} == sizes
    assert result.best.name == min(sizes, key=sizes.get) == "dynamic_int8"
    assert result.best_path == str(tmp_path / "best.tflite")
    with open(result.best_path, "rb") as a, open(result.best.path, "rb") as b:
        assert a.read() == b.read()
    for r in result.candidates:  # every reported figure, re-measured
        top1 = _litert_top1(r.path, data.held_out)
        assert r.top1 == pytest.approx(np.mean(top1 == data.labels))
        assert r.drop_points == pytest.approx(100 * (1.0 - r.top1))
        assert r.latency_ms > 0
    assert result.candidates[0].top1 == 1.0  # float32 is the Keras model
    assert mv.export.get_target("tflite").class_names(result.best_path) == data.class_names
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["best"] == "dynamic_int8" and report["data"]["num_held_out"] == 96
    assert report["data"]["num_calibration"] == 32
    assert [c["name"] for c in report["candidates"]] == ["float32", "float16", "dynamic_int8"]
    assert (tmp_path / "pareto.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_budget_excludes_candidates_and_objective_latency_picks_the_fastest(tiny,
                                                                                 tmp_path):
    model, data = tiny
    result = optimize(model, tmp_path, data=data, max_drop=0.0, objective="latency",
                      latency_runs=5, only=["float32", "int8"], verbose=False)
    int8 = next(r for r in result.candidates if r.name == "int8")
    assert int8.drop_points > 0 and not int8.within_budget  # untrained: int8 flips ties
    assert result.best.name == "float32"


def test_no_candidate_within_the_budget_is_an_error_naming_the_closest(tiny, tmp_path):
    model, data = tiny
    with pytest.raises(OverBudgetError, match="closest is 'int8'") as caught:
        optimize(model, tmp_path, data=data, max_drop=0.0, latency_runs=3, only=["int8"],
                 verbose=False)
    assert caught.value.result.best is None
    assert not (tmp_path / "best.tflite").exists()  # nothing over budget is called best
    assert json.loads((tmp_path / "report.json").read_text())["best"] is None


@pytest.mark.parametrize("kwargs, message", [
    ({"objective": "speed"}, "objective must be one of"),
    ({"max_drop": -1}, "max_drop is the top-1 drop"),
    ({"only": ["int3"]}, "Unknown candidates"),
    ({"target": "onnx"}, "Unknown export target"),
    ({"target": "web"}, r"no optimizer candidates\. Optimize for one of \['coreml', 'tflite'\]"),
])
def test_bad_arguments_are_clear_errors(tiny, tmp_path, kwargs, message):
    model, data = tiny
    with pytest.raises(ValueError, match=message):
        optimize(model, tmp_path, data=data, max_drop=kwargs.pop("max_drop", 1.0), **kwargs)


def test_folder_data_splits_into_disjoint_calibration_and_held_out_images(tmp_path):
    """Each image is one flat grey level: an image in both sets would show up by value."""
    for c in range(2):
        os.makedirs(tmp_path / f"c{c}")
        for i in range(15):
            level = 8 * (15 * c + i) + 4
            Image.fromarray(np.full((8, 8, 3), level, np.uint8)).save(
                tmp_path / f"c{c}" / f"{i}.png")
    data = load_optimize_data(tmp_path, image_size=(8, 8), num_calibration=10,
                              num_held_out=100)
    levels = [set(np.round(s[:, 0, 0, 0] * 255).astype(int)) for s in
              (data.calibration, data.held_out)]
    assert len(data.calibration) == 10 and len(data.held_out) == 20
    assert not levels[0] & levels[1] and len(levels[0] | levels[1]) == 30
    assert sorted(set(data.labels)) == [0, 1]  # the seeded shuffle mixes the classes
    assert data.class_names == ["c0", "c1"]
    with pytest.raises(ValueError, match="too few"):
        load_optimize_data(tmp_path, image_size=(8, 8), num_calibration=30)


@pytest.mark.slow
@needs_fashion_mnist
def test_mvit2_optimize_on_a_trained_classifier_keeps_the_budget(tmp_path, capsys):
    """The issue's command on a trained Fashion-MNIST classifier, every candidate; the
    shipped file re-measured in LiteRT, and loaded by MediaPipe Tasks with its labels.

    The classifier is the committed small MobileViTV2 (`test_sparsity.small_model`: stem,
    inverted residuals, a MobileViTV2 block; `small_mvit.weights.h5`), whose every
    candidate converts in a few seconds; every candidate of the full MobileViTV2-0.5 is
    built and measured by benchmarks/optimize_budget.py (benchmarks/results/
    optimize_budget.json)."""
    from shared_fixtures import CHECKPOINTS
    from test_sparsity import small_model

    from keras_mvit2.cli.main import main
    from keras_mvit2.data.files import FASHION_MNIST_CLASSES

    trained_classifier_path = str(tmp_path / "small_mvit.keras")
    classifier = small_model()
    classifier.load_weights(CHECKPOINTS / "small_mvit.weights.h5")
    classifier.save(trained_classifier_path)
    out = tmp_path / "opt"
    status = main(["optimize", trained_classifier_path, "--data", "fashion_mnist",
                   "--target", "tflite", "--max-drop", "0.5", "--num-held-out", "300",
                   "--latency-runs", "5", "--objective", "size", "--qat-steps", "30",
                   "-o", str(out)])
    printed = capsys.readouterr().out
    assert status == 0, printed
    report = json.loads((out / "report.json").read_text())
    best = next(c for c in report["candidates"] if c["name"] == report["best"])
    data = load_optimize_data("fashion_mnist", image_size=(SIZE, SIZE), num_held_out=300)
    model = keras.saving.load_model(trained_classifier_path)
    keras_top1 = model.predict(data.held_out, verbose=0).argmax(-1)
    reference = np.mean(keras_top1 == data.labels)
    shipped = _litert_top1(out / "best.tflite", data.held_out)
    drop = 100 * (reference - np.mean(shipped == data.labels))
    assert drop <= 0.5 and drop == pytest.approx(best["drop_points"])
    by_name = {c["name"]: c for c in report["candidates"]}
    assert not [c["error"] for c in report["candidates"] if c["error"]]
    assert len(by_name["int8_float_top3"]["recipe"]["float_layers"]) == 3
    ranking = by_name["int8_float_top1"]["recipe"]["layer_ranking"]
    assert by_name["int8_float_top1"]["recipe"]["float_layers"] == [ranking[0]["layer"]]
    assert (out / "layer_errors.png").read_bytes()[:4] == b"\x89PNG"
    assert by_name["float16"]["recipe"]["token_sum"] in ("matmul", "product_mean")
    assert by_name["weight_only_int4"]["size_bytes"] < by_name["int8"]["size_bytes"]
    int8 = by_name["int8"]
    if int8["within_budget"]:
        assert best["size_bytes"] <= int8["size_bytes"]
    # qat_int8 (on fashion_mnist's train split, --data's training part) is tried exactly
    # when no post-training int8 file keeps the budget.
    post_training = [c for c in report["candidates"] if c["name"] != "qat_int8"
                     and c["recipe"].get("quantization") == "int8"]
    assert report["qat"]["built"] == (not any(c["within_budget"] for c in post_training))
    assert ("qat_int8" in by_name) == report["qat"]["built"]
    assert report["qat"]["settings"]["train_data"] == "fashion_mnist:train"
    assert f"best: {report['best']}" in printed
    names = mv.export.get_target("tflite").class_names(out / "best.tflite")
    assert names == list(FASHION_MNIST_CLASSES)
    _mediapipe_names_match(tmp_path, out / "best.tflite", data.held_out[:20], names)


def _mediapipe_names_match(tmp_path, path, images, names) -> None:
    from test_mediapipe_clients import MEDIAPIPE_PYTHON, _run_mediapipe

    if MEDIAPIPE_PYTHON is None:
        pytest.skip("no MediaPipe virtualenv (.ci/run makes .venv-mediapipe)")
    pixels = np.round(images * 255).astype(np.uint8)
    out = _run_mediapipe(tmp_path, pixels, [{"task": "classifier", "path": str(path),
                                            "key": "best"}])
    index = out["best.index"]
    assert [str(n) for n in out["best.names"]] == [names[i] for i in index]
    assert np.mean(index == _litert_top1(path, images)) >= 0.9


@pytest.mark.slow
def test_coreml_ships_the_smallest_measured_package_never_a_simulated_one(tiny, tmp_path):
    """Core ML on Linux: every package's accuracy from its own MIL program and weights;
    W8A8 (activation quantization: only simulated here) is built and reported, never chosen."""
    from keras_mvit2.export.coreml import package_weights, predict_with_package_weights

    model, data = tiny
    result = optimize(model, tmp_path, target="coreml", data=data, max_drop=100.0,
                      only=["fp16", "palettize_4bit", "w8a8"], verbose=False)
    by_name = {r.name: r for r in result.candidates}
    assert not [r.error for r in result.candidates if r.error]
    assert by_name["w8a8"].top1 is None and not by_name["w8a8"].within_budget
    assert by_name["w8a8"].size_bytes < by_name["fp16"].size_bytes
    assert result.best.name == "palettize_4bit"
    assert result.best_path == str(tmp_path / "best.mlpackage")
    assert result.latency_setup is None and result.best.latency_ms is None  # no Core ML here
    top1 = predict_with_package_weights(model, result.best_path, data.held_out).argmax(-1)
    assert result.best.top1 == pytest.approx(np.mean(top1 == data.labels))
    weights = package_weights(result.best_path)
    kernel = next(w for name, w in weights.items() if w.ndim == 4 and w.shape[0] == 32)
    assert len(np.unique(kernel.astype(np.float32))) <= 16  # 4-bit look-up table
    assert mv.export.get_target("coreml").class_names(result.best_path) == data.class_names
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["best"] == "palettize_4bit"


@pytest.mark.slow
def test_finetune_export_step_ships_the_optimizers_choice(tiny, tmp_path):
    """`mvit2 finetune --max-drop`: the phone file is the optimizer's best, validated on the
    same held-out images like the default files."""
    from keras_mvit2.ship.phone_files import PhoneData, _export_phone_files

    model, data = tiny
    phone = PhoneData(data.calibration, data.held_out, data.labels)
    [record] = _export_phone_files(model, tmp_path, phone, class_names=data.class_names,
                                   targets=("tflite",), max_drop=0.0, bench_runs=3)
    report = json.loads((tmp_path / record["optimizer_report"]).read_text())
    assert record["path"] == os.path.join("phone", "optimize_tflite", "best.tflite")
    assert record["quantization"] == report["best"]
    best = next(c for c in report["candidates"] if c["name"] == report["best"])
    assert best["drop_points"] <= 0.0 and record["top1"] == pytest.approx(best["top1"])
    top1 = _litert_top1(tmp_path / record["path"], data.held_out)
    assert record["top1"] == pytest.approx(np.mean(top1 == data.labels))
    int8 = next(c for c in report["candidates"] if c["name"] == "int8")
    assert int8["drop_points"] > 0  # the near-tied classes: int8 was measured and refused


@pytest.mark.slow
def test_mvit2_optimize_over_budget_exits_1_naming_the_closest(tmp_path, capsys):
    """Through the command line: a folder whose labels are the float model's own top-1 (so
    Keras scores ~100 %), a budget of 0 points and only full int8: exit status 1, the
    closest candidate named, no best file. The model's classes come in nearly tied pairs
    (2j, 2j + 1) whose gap is far below the output's int8 step, so int8 flips some."""
    from keras_mvit2.cli.main import main

    # Logits linear in the mean colour: five directions (R, G, B, R+G, G+B), each a pair
    # of classes 1e-3 apart across it, so every class wins some colours.
    model = keras.Sequential([keras.Input((TINY, TINY, 3)),
                              keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(10)],
                             name="paired")
    rng = np.random.default_rng(1)
    directions = np.array([[1, 0, 0], [0, 1, 0], [0, 0, 1], [1, 1, 0], [0, 1, 1]], np.float32)
    directions /= np.linalg.norm(directions, axis=1, keepdims=True)
    across = np.array([[0, 1, -1], [1, 0, -1], [1, -1, 0], [1, -1, 0], [0, 1, -1]],
                      np.float32)  # orthogonal to each direction: a colour difference
    columns = []
    for c, r in zip(directions, across, strict=True):
        columns += [c + 1e-3 * r, c - 1e-3 * r]
    model.layers[-1].set_weights([np.stack(columns, axis=1), np.zeros(10, np.float32)])
    colours = rng.uniform(0, 255, (400, 1, 1, 3))
    pixels = np.clip(colours + rng.normal(0, 8, (400, TINY, TINY, 3)), 0, 255).astype(np.uint8)
    labels = model.predict(pixels / 255.0, verbose=0).argmax(-1)
    assert sorted(set(labels)) == list(range(10))  # every class has images
    for i, (image, label) in enumerate(zip(pixels, labels, strict=True)):
        os.makedirs(tmp_path / "photos" / f"class_{label}", exist_ok=True)
        Image.fromarray(image).save(tmp_path / "photos" / f"class_{label}" / f"{i}.png")
    model.save(tmp_path / "paired.keras")
    status = main(["optimize", str(tmp_path / "paired.keras"), "--data",
                   str(tmp_path / "photos"), "--max-drop", "0", "--only", "int8",
                   "--num-calibration", "50", "--latency-runs", "3", "-o",
                   str(tmp_path / "out")])
    captured = capsys.readouterr()
    assert status == 1, captured.err[-2000:]
    assert "No candidate keeps the top-1 drop within 0 points" in captured.err
    assert "The closest is 'int8'" in captured.err
    assert not (tmp_path / "out" / "best.tflite").exists()
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    # (the folder is read through the evaluation crop, so a colour or two changes class)
    assert report["reference_top1"] > 0.99 and report["candidates"][0]["drop_points"] > 0
    assert report["data"]["num_calibration"] == 50 and report["data"]["num_held_out"] == 350


# --------------------------------------------------------------------------------------
# The default objective: the smallest file not slower than float32 (issue 36, item 5)
# --------------------------------------------------------------------------------------


def _measured(name, size_bytes, top1, latency_ms, *, quantization=None, keras_top1=0.80,
              max_drop=0.5):
    """A `CandidateResult` as `optimize` records one (drop against a Keras top-1)."""
    from keras_mvit2.optimizer.candidate import CandidateResult

    drop = 100 * (keras_top1 - top1)
    return CandidateResult(name, {"quantization": quantization or name}, f"c/{name}.tflite",
                           size_bytes, "LiteRT", True, top1=top1, agreement=top1,
                           drop_points=drop, latency_ms=latency_ms,
                           within_budget=drop <= max_drop + 1e-9,
                           float_reference=name == "float32")


def _table_256():
    """The 256x256 TFLite candidates of docs/budget.md (bytes, top-1, ms), and qat_int8."""
    rows = [("float32", 4281222, 0.7967, 8.58, None), ("float16", 2257802, 0.7967, 10.40, None),
            ("dynamic_int8", 1434834, 0.7967, 16.00, None), ("int8", 1461082, 0.7467, 6.65, None),
            ("int16x8", 1597554, 0.7967, 531.04, None),
            ("int8_float_top1", 1493346, 0.7467, 2.41, "int8"),
            ("int8_float_top3", 1569674, 0.7500, 6.45, "int8"),
            ("weight_only_int8", 1348666, 0.7967, 13.93, None),
            ("weight_only_int4", 867554, 0.2133, 52.85, None),
            ("weight_only_int4_int8", 849970, 0.8000, 32.81, None),
            ("qat_int8", 1461082, 0.7933, 6.50, "int8")]
    return [_measured(n, b, t, ms, quantization=q, keras_top1=0.7967) for n, b, t, ms, q in rows]


def test_size_fast_ships_the_smallest_file_that_is_not_slower_than_float32():
    from keras_mvit2.optimizer import (
        DEFAULT_OBJECTIVE,
        OBJECTIVES,
        best_within,
        compare_with_float,
    )

    assert DEFAULT_OBJECTIVE == "size_fast" and {"size", "latency"} < set(OBJECTIVES)
    results = [_measured("float32", 4_000_000, 0.80, 8.0),
               _measured("float16", 2_000_000, 0.80, 9.0),
               _measured("dynamic_int8", 1_400_000, 0.80, 16.0),
               _measured("int8", 1_460_000, 0.75, 6.6),
               _measured("int8_float_top1", 1_490_000, 0.80, 7.9, quantization="int8"),
               _measured("weight_only_int4_int8", 850_000, 0.80, 33.0)]
    # default: int8 breaks the budget, the three smaller files are slower than float32's 8 ms
    assert best_within(results, 0.5).name == "int8_float_top1"
    assert best_within(results, 0.5, "size").name == "weight_only_int4_int8"  # as before
    assert best_within(results, 0.5, "latency").name == "int8_float_top1"
    assert best_within(results, 10.0).name == "int8"  # within a 10-point budget
    # as fast as float32 (the same median) is not slower
    results.append(_measured("same_speed", 1_000_000, 0.80, 8.0))
    assert best_within(results, 0.5).name == "same_speed"
    compare_with_float(results)
    words = {r.name: r.vs_float32 for r in results}
    assert words == {"float32": "reference", "float16": "slower", "dynamic_int8": "slower",
                     "int8": "faster", "int8_float_top1": "faster",
                     "weight_only_int4_int8": "slower", "same_speed": "as fast"}
    assert results[1].latency_vs_float32 == pytest.approx(9.0 / 8.0)
    assert results[3].latency_vs_float32 == pytest.approx(6.6 / 8.0)
    with pytest.raises(ValueError, match="objective must be one of"):
        best_within(results, 0.5, "smallest")


def test_size_fast_without_a_timed_float32_chooses_by_size_and_says_why():
    from keras_mvit2.optimizer import best_within, compare_with_float
    from keras_mvit2.optimizer.search import objective_note

    untimed = [_measured("fp32", 4_000_000, 0.80, None), _measured("fp16", 2_000_000, 0.80, None),
               _measured("palettize_6bit", 1_150_000, 0.80, None)]
    untimed[0].float_reference = True  # Core ML's float32 package, not run off macOS
    assert best_within(untimed, 0.5).name == best_within(untimed, 0.5, "size").name
    compare_with_float(untimed)
    assert {r.vs_float32 for r in untimed} == {None}
    note = objective_note(untimed, "size_fast", can_time=False)
    assert "do not run on this host" in note and "chosen by size alone" in note
    timed = [_measured("int8", 1_460_000, 0.80, 6.6), _measured("float16", 2_000_000, 0.80, 9.0)]
    assert "--only" in objective_note(timed, "size_fast")  # no float32 built
    assert best_within(timed, 0.5).name == "int8"
    assert objective_note(timed, "size") is None
    assert objective_note([_measured("float32", 4_000_000, 0.8, 8.0), *timed], "size_fast") is None


def test_size_fast_refuses_files_within_the_budget_but_slower_naming_objective_size():
    from keras_mvit2.optimizer import OptimizeResult, best_within, compare_with_float
    from keras_mvit2.optimizer.search import _over_budget_message

    # float32 itself loses 0.6 points (LiteRT's float arithmetic flips a near-tie): the
    # files within 0.5 points are all slower than it.
    results = [_measured("float32", 4_000_000, 0.794, 8.0),
               _measured("weight_only_int8", 1_350_000, 0.80, 13.9),
               _measured("weight_only_int4_int8", 850_000, 0.797, 32.8)]
    compare_with_float(results)
    assert best_within(results, 0.5) is None
    assert best_within(results, 0.5, "size").name == "weight_only_int4_int8"
    result = OptimizeResult("tflite", "size_fast", 0.5, {"num_held_out": 1000}, 0.80, results)
    message = _over_budget_message(result)
    assert message.startswith("No candidate within 0.5 top-1 points runs as fast as float32")
    assert "weight_only_int4_int8 (4.10x)" in message and "weight_only_int8 (1.74x)" in message
    assert "--objective size" in message and "float32 itself loses 0.60 points" in message


def test_pareto_plot_labels_do_not_overlap_and_off_scale_candidates_sit_at_the_edge(tmp_path):
    from matplotlib.text import Text

    from keras_mvit2.optimizer import OptimizeResult, best_within, compare_with_float
    from keras_mvit2.optimizer.report import pareto_figure, plot_pareto, top1_window

    results = _table_256()
    compare_with_float(results)
    result = OptimizeResult("tflite", "size_fast", 0.5, {"num_held_out": 300}, 0.7967,
                            results, latency_setup={"runs": 20, "threads": 1})
    result.best = best_within(results, 0.5)
    assert result.best.name == "qat_int8"
    fig = pareto_figure(result)
    renderer = fig.canvas.get_renderer()
    low, high = top1_window(0.7967, 0.5, [r.top1 for r in results])
    assert low < 79.67 - 0.5 and high > 79.67 + 0.2  # the budget's floor and Keras in view
    assert high - low < 5  # around the budget, not 21-80 %
    for ax in fig.axes:
        assert ax.get_ylim() == pytest.approx((low, high))
        boxes = []
        for text in ax.texts:
            text.update_positions(renderer)
            boxes.append(Text.get_window_extent(text, renderer))
        assert len(boxes) == 11  # every candidate labelled
        for i, a in enumerate(boxes):
            assert a.x0 >= ax.bbox.x0 - 1 and a.x1 <= ax.bbox.x1 + 1, ax.texts[i].get_text()
            for j in range(i):
                assert not a.overlaps(boxes[j]), (ax.texts[i].get_text(), ax.texts[j].get_text())
        labels = {t.get_text() for t in ax.texts}
        assert "weight_only_int4 (21.3 %)" in labels and "int8 (74.7 %)" in labels
        edge = [c for c in ax.collections if c.get_offsets()[0][1] == pytest.approx(low)]
        assert len(edge) == 4  # int8, int8_float_top1/3, weight_only_int4: at the bottom edge
    assert plot_pareto(result, str(tmp_path / "p.png")) == str(tmp_path / "p.png")


def test_the_report_says_per_candidate_faster_or_slower_than_float32(tiny, tmp_path):
    from rich.console import Console

    from keras_mvit2.optimizer import best_within
    from keras_mvit2.optimizer.report import format_table

    model, data = tiny
    result = optimize(model, tmp_path, data=data, max_drop=100.0, latency_runs=5,
                      only=["float32", "float16", "dynamic_int8"], verbose=False)
    assert result.objective == "size_fast" and result.objective_note is None
    float32 = result.candidates[0]
    assert float32.vs_float32 == "reference"
    for r in result.candidates[1:]:
        ratio = r.latency_ms / float32.latency_ms
        assert r.latency_vs_float32 == pytest.approx(ratio)
        assert r.vs_float32 == ("faster" if ratio < 1 else "as fast" if ratio == 1 else "slower")
    assert result.best.latency_ms <= float32.latency_ms
    not_slower = [r for r in result.candidates if r.latency_ms <= float32.latency_ms]
    assert result.best.name == min(not_slower, key=lambda r: r.size_bytes).name
    assert best_within(result.candidates, 100.0, "size_fast") is result.best
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["objective"] == "size_fast"
    assert [c["vs_float32"] for c in report["candidates"]] == [
        r.vs_float32 for r in result.candidates]
    console = Console(record=True, width=200)
    console.print(format_table(result))
    text = console.export_text()
    assert "vs float32" in text and "reference" in text
    for r in result.candidates[1:]:
        assert f"{r.latency_vs_float32:.2f}x, {r.vs_float32}" in text


# --------------------------------------------------------------------------------------
# qat_int8: quantization-aware training where post-training int8 is not enough (item 4)
# --------------------------------------------------------------------------------------


def test_qat_int8_is_offered_only_when_no_post_training_int8_file_meets_the_budget():
    from keras_mvit2.optimizer import QATSettings, qat_decision

    qat = QATSettings("photos/train")
    results = _table_256()[:-1]  # without qat_int8
    built, why = qat_decision(results, 0.5, qat)
    assert built and why == "no post-training int8 file is within the budget"
    # a mixed int8 / float file within the budget is a post-training int8 file: no QAT
    built, why = qat_decision(results, 5.0, qat)
    assert not built and "'int8_float_top3' is within the budget" in why
    built, why = qat_decision(results, 0.5, None)
    assert not built and "--train-data" in why
    # weight-only and dynamic-range files are not int8 files: they do not stop it
    others = [r for r in results if r.recipe["quantization"] != "int8"]
    assert qat_decision(others, 0.5, qat) == (True, "no post-training int8 file was built")
    # --only decides alone
    assert qat_decision(results, 5.0, qat, only=["int8", "qat_int8"])[0]
    assert not qat_decision(results, 0.5, qat, only=["int8"])[0]


def _qat_facts(shipped, **extra):
    """The facts `_try_qat` records, as the real build returns them (`qat_facts`)."""
    return {"steps": 339, "training_images": 2034, "shipped": shipped,
            "reason": "the QAT file agrees more often (p = 0.0003, below 0.05) with a top-1 "
                      "not lower, and neither is lower on the held-out images",
            "judged_on": "200 held-out images and 678 of the 2712 training images set aside "
                         "before training (seed 0; QAT trained on 2034 others)",
            "judge_images": {"held_out": 200, "set_aside": 678}, "num_judged": 878,
            "agreement_post_training": 0.8, "agreement_qat": 0.875, "only_post_training": 20,
            "only_qat": 86, "p_value": 0.0003, **extra}


def test_the_warning_and_the_summary_say_which_file_qat_shipped_and_both_agreements(tmp_path):
    from keras_mvit2.ship.model_card import _qat_choice
    from keras_mvit2.ship.phone_files import export_warnings
    from keras_mvit2.ship.pipeline import _export_step

    judged = ("agreement with Keras on 878 images neither file trained or calibrated on (200 "
              "held-out images and 678 of the 2712 training images set aside before training "
              "(seed 0; QAT trained on 2034 others)): post-training 80.0 %, "
              "quantization-aware-trained 87.5 %, paired test p = 0.0003")
    post = {"top1": 0.47, "top1_agreement": 0.6, "drop_points": 16.0,
            "path": "phone/model_int8_post_training.tflite"}
    record = {"format": "TFLite", "quantization": "int8", "path": "phone/model_int8.tflite",
              "size_bytes": 1_400_000, "top1": 0.60, "keras_top1": 0.63,
              "top1_agreement": 0.8, "latency": None,
              "qat": _qat_facts("qat", post_training=post, drop_points=3.0)}
    (warning,) = export_warnings([record])
    assert warning.startswith("the TFLite int8 file (phone/model_int8.tflite) scores 3.0 top-1")
    assert ("It is quantization-aware trained (339 steps), which did not fix it; the paired "
            "test chose it over the post-training file (phone/model_int8_post_training.tflite, "
            f"16.0 top-1 points below Keras; {judged}). Before shipping it") in warning
    step = _export_step(record, str(tmp_path), 1.0)
    assert step.figure.endswith(", quantization-aware trained (the post-training file "
                                "agrees with Keras on 60.00 %)"), step.figure
    card = _qat_choice(record)
    assert card.startswith("Int8 file: the quantization-aware-trained file, chosen on 878 "
                           "images neither file trained or calibrated on (200 held-out, 678 "
                           "training images set aside before the training)"), card
    assert "exact one-sided paired test p = 0.0003" in card and "at most 5 % of runs" in card
    # kept: the file is the post-training one, QAT is named as tried and why it was not shipped
    why = "the paired test does not show that the QAT file agrees more often (p = 0.21, not " \
          "below 0.05)"
    kept = {**record, "top1_agreement": 0.6,
            "qat": _qat_facts("post_training", post_training={
                k: v for k, v in post.items() if k != "path"},
                              agreement_qat=0.81, p_value=0.21, reason=why)}
    (warning,) = export_warnings([kept])
    assert (f"Quantization-aware training (339 steps) was not shipped: {why} (agreement with "
            "Keras on 878 images neither file trained or calibrated on") in warning
    assert "quantization-aware" not in _export_step(kept, str(tmp_path), 1.0).figure
    assert _qat_choice(kept).startswith("Int8 file: the post-training file, chosen on 878")
    assert f"p = 0.21; {why}." in _qat_choice(kept)
    failed = {**record, "qat": {"error": "UnsupportedGraphError: no GATHER", "steps": 339}}
    assert ("Quantization-aware training was tried and failed (UnsupportedGraphError: no "
            "GATHER). Before shipping it") in export_warnings([failed])[0]
    # the QAT file fixed it: no warning
    record.update(top1=0.63, qat={**record["qat"], "drop_points": 0.0})
    assert export_warnings([record]) == []


def test_qat_settings_and_the_training_images_of_the_optimizers_data(tmp_path):
    from keras_mvit2.optimizer import QATSettings, qat_settings, training_images_of

    default = QATSettings("x")
    assert (default.max_steps, default.epochs, default.learning_rate) == (300, 3, 1e-6)
    assert default.batch_size == 8
    with pytest.raises(ValueError, match=r"epochs \(--qat-epochs; 0 there: no quanti"):
        QATSettings("x", epochs=0)
    with pytest.raises(ValueError, match=r"max_steps \(--qat-steps; 0 there: no quanti"):
        QATSettings("x", max_steps=-2)
    with pytest.raises(ValueError, match=r"learning_rate \(--qat-lr\) must be a number above 0"):
        QATSettings("x", learning_rate=0.0)
    assert qat_settings("x", steps=0) is None and qat_settings(None) is None
    assert qat_settings("x", steps=20, learning_rate=1e-5, epochs=2).describe() == {
        "train_data": "x", "max_steps": 20, "epochs": 2, "learning_rate": 1e-5,
        "batch_size": 8}
    assert training_images_of("fashion_mnist") == "fashion_mnist:train"
    assert training_images_of(tmp_path) is None  # a flat folder: only held-out cuts
    for split in ("train", "val"):
        for c in ("a", "b"):
            os.makedirs(tmp_path / split / c)
            for i in range(3):
                Image.fromarray(np.full((8, 8, 3), 40 * i, np.uint8)).save(
                    tmp_path / split / c / f"{i}.png")
    assert training_images_of(tmp_path) == str(tmp_path / "train")
    settings = QATSettings(str(tmp_path / "train"), max_steps=2, batch_size=2)
    images, labels = settings.images((8, 8), ["a", "b"])
    assert images.shape == (4, 8, 8, 3) and set(labels) <= {0, 1}  # 2 steps x 2 images
    with pytest.raises(ValueError, match=r"hold the classes \['a', 'b'\].*same class"):
        settings.images((8, 8), ["cat", "dog"])


def test_naming_qat_int8_without_training_images_is_a_clear_error(tiny, tmp_path):
    model, data = tiny
    with pytest.raises(ValueError, match="'qat_int8' candidate trains on training images"):
        optimize(model, tmp_path, data=data, max_drop=1.0, only=["int8", "qat_int8"],
                 verbose=False)
    assert not (tmp_path / "candidates").exists()  # refused before building anything
    if importlib.util.find_spec("coremltools") is not None:
        from keras_mvit2.optimizer import QATSettings

        with pytest.raises(ValueError, match="Core ML has no 'qat_int8' candidate"):
            optimize(model, tmp_path, target="coreml", data=data, max_drop=1.0,
                     only=["fp16", "qat_int8"], qat=QATSettings("photos/train"),
                     verbose=False)
        assert not (tmp_path / "candidates").exists()


def _rule(reference, post, trained, labels, num_held_out):
    """The choice written out: the exact one-sided binomial tail of the images only the
    trained file agrees on (`test_qat._binomial_tail`) below 0.05, its top-1 not lower, and
    on the first `num_held_out` images (the held-out ones) neither its agreement nor its
    top-1 lower. Returns (ship, agreement post, agreement trained, p)."""
    from test_qat import _binomial_tail

    a, b = post == reference, trained == reference
    p = _binomial_tail(int((a & ~b).sum()), int((b & ~a).sum()))
    ship = p < 0.05 and np.mean(trained == labels) >= np.mean(post == labels)
    if num_held_out:
        held = slice(0, num_held_out)
        ship = ship and b[held].mean() >= a[held].mean() and (
            np.mean((trained == labels)[held]) >= np.mean((post == labels)[held]))
    return ship, float(a.mean()), float(b.mean()), p


def _assert_the_choice(facts, reference, post, trained, labels, num_held_out) -> None:
    """The build's facts are the two files' figures, and it shipped the QAT file exactly
    where the rule written out says so."""
    ship, a, b, p = _rule(reference, post, trained, labels, num_held_out)
    assert facts["agreement_post_training"] == pytest.approx(a, abs=1e-6)
    assert facts["agreement_qat"] == pytest.approx(b, abs=1e-6)
    assert facts["p_value"] == pytest.approx(p, rel=1e-9)
    assert facts["num_judged"] == len(reference)
    assert facts["shipped"] == ("qat" if ship else "post_training"), facts


def _standin_qat(write_trained, claim_chosen=False):
    """A stand-in `qat_candidate` with the real build's contract and choice: it converts the
    post-training int8 file, takes `write_trained(path, post_path)` as the quantization-
    aware-trained one, judges both against Keras on the held-out images it is handed
    (`compare_agreement` and `choose_b`, as `keras_mvit2.quantize.qat` does), writes the
    chosen one at `path` and returns the real build's facts (`claim_chosen`: it says the
    test chose the trained file whatever it measured, as where the set-aside images carried
    the test). The export step's handling of them (files, records, the guard, the note and
    the warnings) is under test, re-measured in LiteRT."""
    from keras_mvit2.export import to_tflite
    from keras_mvit2.optimizer.candidate import Candidate
    from keras_mvit2.quantize.agreement import choose_b, compare_agreement

    def qat_candidate(model, settings, *, calibration_data, class_names=None,
                      training_class_names=None, io_dtype=None, held_out=None):
        images, labels = held_out  # the export step hands its held-out images over

        def build(path):
            with tempfile.TemporaryDirectory() as tmp:
                post, trained = os.path.join(tmp, "post.tflite"), os.path.join(tmp, "qat.tflite")
                to_tflite(model, post, quantization="int8", representative_data=calibration_data,
                          num_calibration_samples=len(calibration_data), io_dtype=io_dtype,
                          class_names=list(class_names))
                write_trained(trained, post)
                choice = compare_agreement(model.predict(images, verbose=0).argmax(-1),
                                           _litert_top1(post, images),
                                           _litert_top1(trained, images), labels)
                ship, reason = choose_b(choice, name="the QAT file")
                if claim_chosen:
                    ship, reason = True, "(claimed by the stand-in)"
                shutil.copyfile(trained if ship else post, path)
            return {"training_images": 24, "steps": 3, "qat_seconds": 0.1,
                    "shipped": "qat" if ship else "post_training", "reason": reason,
                    "judged_on": f"{len(images)} held-out images",
                    "judge_images": {"held_out": len(images), "set_aside": 0},
                    "num_judged": len(images),
                    "agreement_post_training": round(choice.agreement_a, 6),
                    "agreement_qat": round(choice.agreement_b, 6),
                    "only_post_training": choice.only_a, "only_qat": choice.only_b,
                    "p_value": choice.p_value}
        return Candidate("qat_int8", {"quantization": "int8",
                                      "quantizer": "quantization-aware training"},
                         build, "LiteRT")
    return qat_candidate


def _float_file_of(model, class_names):
    """`write_trained` of a stand-in whose "trained" file is the float32 one: it agrees with
    Keras everywhere, so it measurably beats the post-training file that flips classes."""
    def write(path, post):
        mv.export.to_tflite(model, path, quantization="float32", class_names=list(class_names))
    return write


def _the_post_training_file_again(path, post):
    """`write_trained` of a stand-in that trains nothing (learning rate 0): the same file."""
    shutil.copyfile(post, path)


def test_finetune_replaces_a_default_int8_file_that_loses_a_point_when_the_test_chooses_qat(
        tiny, tmp_path, monkeypatch):
    from keras_mvit2.optimizer import QATSettings
    from keras_mvit2.optimizer.targets import QAT_CANDIDATES
    from keras_mvit2.ship.phone_files import PhoneData, _export_phone_files, export_warnings
    from keras_mvit2.ship.pipeline import _export_step

    model, data = tiny
    phone = PhoneData(data.calibration, data.held_out, data.labels)
    qat = QATSettings((data.calibration, np.zeros(len(data.calibration), np.int64)))
    monkeypatch.setitem(QAT_CANDIDATES, "tflite",
                        _standin_qat(_float_file_of(model, data.class_names)))
    lines = []
    [record] = _export_phone_files(model, tmp_path, phone, class_names=data.class_names,
                                   targets=("tflite",), bench_runs=3, qat=qat,
                                   log=lines.append)
    shipped = tmp_path / "phone" / "model_int8.tflite"
    kept = tmp_path / "phone" / "model_int8_post_training.tflite"
    facts = record["qat"]
    assert record["path"] == os.path.join("phone", "model_int8.tflite")
    assert facts["shipped"] == "qat"
    assert not (tmp_path / "phone" / "model_qat_int8.tflite").exists()
    post = facts["post_training"]
    assert post["path"] == os.path.join("phone", "model_int8_post_training.tflite")
    # re-measured (the labels are Keras' own top-1): the kept file is the post-training
    # one, which lost more than a point; the shipped one agrees everywhere
    kept_top1, shipped_top1 = _litert_top1(kept, data.held_out), _litert_top1(shipped,
                                                                                data.held_out)
    _assert_the_choice(facts, data.labels, kept_top1, shipped_top1, data.labels, 0)
    assert 100 * (1 - np.mean(kept_top1 == data.labels)) == pytest.approx(
        post["drop_points"]) and post["drop_points"] > 1.0
    assert post["top1_agreement"] == pytest.approx(facts["agreement_post_training"])
    assert record["top1"] == record["top1_agreement"] == facts["agreement_qat"] == 1.0
    assert facts["drop_points"] == 0.0 and record["size_bytes"] == os.path.getsize(shipped)
    judged = (f"agreement with Keras on 96 images neither file trained or calibrated on (96 "
              f"held-out images): post-training {100 * np.mean(kept_top1 == data.labels):.1f} "
              f"%, quantization-aware-trained 100.0 %, paired test p = {facts['p_value']:.2g}")
    assert record["note"] == (
        "The TFLite int8 file (phone/model_int8.tflite) is quantization-aware trained "
        "(qat_int8: 3 steps on 24 training images, learning rate 1e-06); "
        f"{judged} (the post-training file is kept as phone/model_int8_post_training.tflite).")
    assert f"shipping the quantization-aware-trained int8 file as phone/model_int8.tflite: " \
           f"{judged}" in lines
    assert export_warnings([record]) == []
    assert "quantization-aware trained" in _export_step(record, str(tmp_path), 1.0).figure
    assert mv.export.get_target("tflite").class_names(shipped) == data.class_names


def test_finetune_keeps_the_post_training_file_when_the_test_does_not_choose_qat(
        tiny, tmp_path, monkeypatch):
    from keras_mvit2.optimizer import QATSettings
    from keras_mvit2.optimizer.targets import QAT_CANDIDATES
    from keras_mvit2.quantize.tflite_graph import UnsupportedGraphError
    from keras_mvit2.ship.phone_files import PhoneData, _export_phone_files, export_warnings
    from keras_mvit2.ship.pipeline import _export_step

    model, data = tiny
    monkeypatch.setitem(QAT_CANDIDATES, "tflite", _standin_qat(_the_post_training_file_again))
    phone = PhoneData(data.calibration, data.held_out, data.labels)
    qat = QATSettings((data.calibration, np.zeros(len(data.calibration), np.int64)))
    lines = []
    [record] = _export_phone_files(model, tmp_path, phone, class_names=data.class_names,
                                   targets=("tflite",), bench_runs=3, qat=qat,
                                   log=lines.append)
    facts, folder = record["qat"], tmp_path / "phone"
    # the file stays the post-training one (its QAT twin, the same file, is deleted)
    assert sorted(os.listdir(folder)) == ["model_int8.tflite"]
    top1 = _litert_top1(folder / "model_int8.tflite", data.held_out)
    _assert_the_choice(facts, data.labels, top1, top1, data.labels, 0)
    assert facts["shipped"] == "post_training" and facts["p_value"] == 1.0
    assert record["top1"] == facts["post_training"]["top1"] == pytest.approx(
        np.mean(top1 == data.labels)) and facts["post_training"]["drop_points"] > 1.0
    assert record["top1_agreement"] == facts["agreement_post_training"]
    assert record["note"] is None and "path" not in facts["post_training"]
    assert any(line.endswith("quantization-aware-trained "
                             f"{100 * np.mean(top1 == data.labels):.1f} %, paired test p = 1: "
                             "the post-training file stays (the paired test does not show "
                             "that the QAT file agrees more often (p = 1, not below 0.05))")
               for line in lines), lines
    (warning,) = export_warnings([record])
    assert "Quantization-aware training (3 steps) was not shipped: the paired test does not " \
           "show that the QAT file agrees more often (p = 1, not below 0.05) (agreement " \
           "with Keras on 96 images" in warning and "--max-drop 1" in warning
    assert "quantization-aware" not in _export_step(record, str(tmp_path), 1.0).figure

    # and where the training cannot run, the record says why and the warning too
    def unsupported(*args, **kwargs):
        raise UnsupportedGraphError("quantization-aware training on the shipped graph does "
                                    "not implement the ops ['GATHER']")

    monkeypatch.setitem(QAT_CANDIDATES, "tflite", unsupported)
    [record] = _export_phone_files(model, tmp_path, phone, class_names=data.class_names,
                                   targets=("tflite",), bench_runs=3, qat=qat)
    assert record["qat"]["error"].startswith("UnsupportedGraphError: quantization-aware")
    assert sorted(os.listdir(folder)) == ["model_int8.tflite"]
    assert record["top1"] == pytest.approx(np.mean(
        _litert_top1(folder / "model_int8.tflite", data.held_out) == data.labels))
    assert "tried and failed (UnsupportedGraphError" in export_warnings([record])[0]


def _always_class_9(model, class_names):
    """`write_trained` of a stand-in whose "trained" file answers class 9 on every image: it
    agrees with Keras less often, and scores a lower top-1, on the held-out images."""
    def write(path, post):
        inputs = keras.Input(model.input_shape[1:])
        nine = keras.ops.one_hot(keras.ops.full((1,), 9, "int32"), 10)
        worse = keras.Model(inputs, model(inputs) + 1e3 * nine)
        mv.export.to_tflite(worse, path, quantization="float32",
                            class_names=list(class_names))
    return write


def test_the_export_steps_guard_never_ships_a_file_worse_on_the_held_out_images(
        tiny, tmp_path, monkeypatch):
    """Where the build says the paired test chose the QAT file (as where the set-aside
    images carried the test) but the file scores a lower top-1 and agrees less often on the
    run's held-out images, the export step keeps the post-training file and says why."""
    from keras_mvit2.optimizer import QATSettings
    from keras_mvit2.optimizer.targets import QAT_CANDIDATES
    from keras_mvit2.ship.model_card import _qat_choice
    from keras_mvit2.ship.phone_files import PhoneData, _export_phone_files, export_warnings

    model, data = tiny
    monkeypatch.setitem(QAT_CANDIDATES, "tflite", _standin_qat(
        _always_class_9(model, data.class_names), claim_chosen=True))
    qat = QATSettings((data.calibration, np.zeros(len(data.calibration), np.int64)))
    lines = []
    [record] = _export_phone_files(model, tmp_path, PhoneData(data.calibration, data.held_out,
                                                              data.labels),
                                   class_names=data.class_names, targets=("tflite",),
                                   bench_runs=3, qat=qat, log=lines.append)
    folder, facts = tmp_path / "phone", record["qat"]
    assert sorted(os.listdir(folder)) == ["model_int8.tflite"]  # the post-training file
    top1 = _litert_top1(folder / "model_int8.tflite", data.held_out)
    post_top1 = np.mean(top1 == data.labels)
    assert record["top1"] == pytest.approx(post_top1) and post_top1 > np.mean(data.labels == 9)
    assert facts["shipped"] == "post_training"
    assert facts["guard"] == (
        f"the quantization-aware-trained file's top-1 on the 96 held-out images is lower "
        f"({100 * np.mean(data.labels == 9):.1f} against {100 * post_top1:.1f} %)")
    assert any(line.endswith(f"the post-training file stays: {facts['guard']}")
               for line in lines), lines
    assert facts["guard"] in export_warnings([record])[0]
    assert _qat_choice(record).startswith("Int8 file: the post-training file")
    assert facts["guard"] in _qat_choice(record)


def test_finetune_tries_qat_below_99_percent_agreement_even_without_a_top1_drop(
        tiny, tmp_path, monkeypatch):
    """QAT is tried where the post-training file agrees with Keras on fewer than 99 % of
    the held-out images, whatever the top-1: here no file predicts the labels (class 9:
    the tiny model scores its classes 2-9 at or below class 0), so both score 0 % and the
    drop is 0, but the int8 file flips classes 0 and 1. On the images where it agrees with
    Keras it is not tried."""
    from keras_mvit2.optimizer import QATSettings
    from keras_mvit2.optimizer.targets import QAT_CANDIDATES
    from keras_mvit2.ship.phone_files import (
        QAT_BELOW_AGREEMENT,
        PhoneData,
        _export_phone_files,
        drop_points,
    )

    model, data = tiny
    monkeypatch.setitem(QAT_CANDIDATES, "tflite", _standin_qat(_the_post_training_file_again))
    qat = QATSettings((data.calibration, np.zeros(len(data.calibration), np.int64)))
    nines = np.full(len(data.labels), 9, np.int64)
    lines = []
    [record] = _export_phone_files(model, tmp_path, PhoneData(data.calibration, data.held_out,
                                                              nines),
                                   class_names=data.class_names, targets=("tflite",),
                                   bench_runs=3, qat=qat, log=lines.append)
    top1 = _litert_top1(tmp_path / "phone" / "model_int8.tflite", data.held_out)
    agree = top1 == data.labels  # the labels of `tiny` are Keras' own top-1
    assert record["top1"] == record["keras_top1"] == 0.0 and drop_points(record) == 0.0
    assert record["top1_agreement"] == pytest.approx(agree.mean())
    assert record["top1_agreement"] < QAT_BELOW_AGREEMENT
    assert record["qat"]["shipped"] == "post_training"  # tried (the stand-in: no better)
    assert (f"the post-training int8 file agrees with Keras on {100 * agree.mean():.1f} % of "
            "the held-out images and scores the Keras model's top-1: quantization-aware "
            "training") in "\n".join(lines)

    def never(*args, **kwargs):
        raise AssertionError("quantization-aware training tried")

    monkeypatch.setitem(QAT_CANDIDATES, "tflite", never)
    [record] = _export_phone_files(
        model, tmp_path, PhoneData(data.calibration, data.held_out[agree], data.labels[agree]),
        class_names=data.class_names, targets=("tflite",), bench_runs=3, qat=qat)
    assert record["top1_agreement"] == 1.0 and drop_points(record) == 0.0
    assert "qat" not in record


def _fashion_mnist(split: str, start: int, count: int) -> tuple[np.ndarray, np.ndarray]:
    from shared_fixtures import fashion_mnist_rgb

    from keras_mvit2.data.files import load_fashion_mnist_arrays

    x, y = load_fashion_mnist_arrays(split)
    return (fashion_mnist_rgb(x[start:start + count], SIZE),
            y[start:start + count].astype(np.int64))


def _keep_both_qat_files(monkeypatch, folder):
    """Runs the real `keras_mvit2.quantize.qat.qat` (what the ``qat_int8`` build calls)
    unchanged but for also writing the two files it chose between to `folder` (post.tflite,
    qat.tflite); returns what it saw: ``{"train": images, "result": QATResult}``."""
    qat_module = importlib.import_module("keras_mvit2.quantize.qat")  # not the function
    real, seen = qat_module.qat, {}

    def spy(model, train_data, **kwargs):
        seen["train"], seen["train_labels"] = np.asarray(train_data[0]), np.asarray(train_data[1])
        seen["result"] = real(model, train_data, post_training_path=folder / "post.tflite",
                              **kwargs)
        shutil.copyfile(seen["result"].qat_path, folder / "qat.tflite")
        return seen["result"]

    monkeypatch.setattr(qat_module, "qat", spy)
    return seen


def _op_list(path) -> tuple[list[str], int]:
    """The file's ops in order and its number of tensors, read from the flatbuffer."""
    from keras_mvit2.export.tflite.flatbuffer import op_names, parse_flatbuffer

    model = parse_flatbuffer(str(path))
    kinds = op_names(model)
    graph = model.subgraphs[0]
    return [kinds[op.opcodeIndex] for op in graph.operators], len(graph.tensors)


def _check_the_real_choice(model, facts, held_out, held_labels, calibration, seen,
                           folder) -> str:
    """The real QAT's choice re-measured in LiteRT: its two files (kept by the spy) judged
    against Keras on the held-out images and the training images it set aside, none of
    them trained or calibrated on; the same graph."""
    train, train_labels, split = seen["train"], seen["train_labels"], seen["result"].split
    assert not set(split.judge.tolist()) & set(split.train.tolist())
    judged = np.concatenate([held_out[split.held_out], train[split.judge]])
    labels = np.concatenate([held_labels[split.held_out], train_labels[split.judge]])
    digests = {image.tobytes() for image in judged}
    assert not digests & {image.tobytes() for image in train[split.train]}
    assert not digests & {image.astype(np.float32).tobytes() for image in calibration}
    reference = model.predict(judged, batch_size=64, verbose=0).argmax(-1)
    post, trained = (_litert_top1(folder / n, judged) for n in ("post.tflite", "qat.tflite"))
    _assert_the_choice(facts, reference, post, trained, labels, len(split.held_out))
    assert facts["judged_on"] == (
        f"{len(held_out)} held-out images and {len(split.judge)} of the {len(train)} training "
        f"images set aside before training (seed 0; QAT trained on {len(split.train)} others)")
    assert len(split.judge) == round(0.25 * len(train))
    assert seen["result"].shipped == facts["shipped"]
    ops, tensors = _op_list(folder / "post.tflite")
    assert _op_list(folder / "qat.tflite") == (ops, tensors) and "FULLY_CONNECTED" in ops
    return facts["shipped"]


@pytest.mark.slow
@needs_fashion_mnist
def test_qat_int8_is_the_int8_candidates_graph_trained_and_the_chosen_file(tmp_path,
                                                                           monkeypatch):
    """A real QAT of a small MobileViTV2 (stem, inverted residuals, a MobileViTV2 block)
    on a few Fashion-MNIST training images, through the optimizer: the int8 candidate's
    ops, I/O, metadata, labels and signature; the file written is the one its facts say
    (the QAT file only where the paired test on the held-out and set-aside images chooses
    it), every figure re-measured in LiteRT. (4 steps at the default learning rate: the
    graph and the bookkeeping are under test, not what training gains.)"""
    from test_sparsity import small_model

    from keras_mvit2.data.files import FASHION_MNIST_CLASSES
    from keras_mvit2.optimizer import QATSettings

    keras.utils.set_random_seed(0)
    model = small_model()
    train, train_labels = _fashion_mnist("train", 0, 64)
    calibration, _ = _fashion_mnist("train", 64, 32)
    held_out, labels = _fashion_mnist("test", 0, 64)
    names = list(FASHION_MNIST_CLASSES)
    data = OptimizeData(calibration, held_out, labels, names, "Fashion-MNIST")
    qat = QATSettings((train, train_labels), max_steps=4, batch_size=8, epochs=1)
    files = tmp_path / "qat_files"
    seen = _keep_both_qat_files(monkeypatch, files)
    result = optimize(model, tmp_path / "run", data=data, max_drop=100.0, objective="size",
                      only=["int8", "qat_int8"], qat=qat, latency_runs=3, verbose=False)
    by_name = {r.name: r for r in result.candidates}
    assert list(by_name) == ["int8", "qat_int8"]
    assert result.qat["built"] and result.qat["reason"] == "'qat_int8' named in --only"
    qat_file = by_name["qat_int8"]
    assert qat_file.error is None, qat_file.error
    recipe = qat_file.recipe
    assert recipe["quantizer"] == "quantization-aware training"
    # 32 images read (at most 4 steps of 8), 8 of them set aside: 3 steps on 24
    np.testing.assert_array_equal(seen["train"], train[:32])
    assert recipe["steps"] == 3 and recipe["training_images"] == 24
    shipped = _check_the_real_choice(model, recipe, held_out, labels, calibration, seen, files)
    chosen = files / ("qat.tflite" if shipped == "qat" else "post.tflite")
    with open(qat_file.path, "rb") as f:
        assert f.read() == chosen.read_bytes()
    assert recipe["trained_path"] == os.path.join(os.path.dirname(qat_file.path),
                                                  "qat_int8_trained.tflite")
    # the int8 candidate's graph, trained: the same ops and tensors
    assert _op_list(qat_file.path) == _op_list(by_name["int8"].path)
    tflite = mv.export.get_target("tflite")
    int8, trained = (tflite.inspect(p) for p in (by_name["int8"].path, files / "qat.tflite"))
    assert trained.float_ops == {} and int8.float_ops == {}  # full int8 inside
    assert trained.input_dtype == int8.input_dtype == "float32"  # the same I/O
    assert trained.output_dtype == int8.output_dtype == "float32"
    assert trained.op_histogram == int8.op_histogram and trained.op_histogram["CONV_2D"] >= 8
    meta = {n: tflite.metadata(p) for n, p in (("int8", by_name["int8"].path),
                                               ("trained", files / "qat.tflite"),
                                               ("qat_int8", qat_file.path))}
    assert set(meta["int8"]) == set(meta["trained"]) == set(meta["qat_int8"])
    for key in ("quantization", "class_names", "preprocessing", "output_kind", "model"):
        assert meta["int8"][key] == meta["trained"][key] == meta["qat_int8"][key], key
    assert meta["trained"]["quantization"] == "int8"
    facts = meta["trained"]["user"]["quantization_aware_training"]
    assert {k: facts[k] for k in ("epochs", "steps", "learning_rate")} == {
        "epochs": 1, "steps": 3, "learning_rate": 1e-6}
    assert ("quantization_aware_training" in (meta["qat_int8"]["user"] or {})) == (
        shipped == "qat")
    assert tflite.class_names(qat_file.path) == names  # the standard metadata's labels
    signatures = [Interpreter(model_path=str(p)).get_signature_list()
                  for p in (by_name["int8"].path, files / "qat.tflite")]
    assert signatures[0] == signatures[1] and "serving_default" in signatures[1]
    top1 = _litert_top1(qat_file.path, held_out)
    assert qat_file.top1 == pytest.approx(np.mean(top1 == labels))
    keras_top1 = model.predict(held_out, verbose=0).argmax(-1)
    assert qat_file.agreement == pytest.approx(np.mean(top1 == keras_top1))
    assert qat_file.size_bytes == os.path.getsize(qat_file.path) and qat_file.latency_ms > 0


@pytest.mark.slow
@needs_fashion_mnist
def test_finetune_tries_qat_when_its_int8_file_loses_a_point(tmp_path, monkeypatch):
    """The fine-tuning run's export step with a real QAT at the shipped defaults
    (`QATSettings()`: 3 passes at 1e-6, batches of 8): a small MobileViTV2 whose classes 0
    and 1 are nearly tied (full int8 flips them: the default file loses points), labels its
    own top-1 (Keras scores 100 %). QAT is tried; a quarter of the training images is set
    aside first; the file at `phone/model_int8.tflite` is the one the rule written out in
    the test chooses from both files re-measured in LiteRT on the held-out and set-aside
    images. Which file that is depends on the training and is not asserted (the choice's
    behaviour is tested on constructed files: tests/test_qat.py); both outcomes' files and
    records are. Measured (seed 0, the test's): the post-training file written, p = 0.86 on
    the 248 judge images (9 only the trained file agrees on, 13 only the post-training one):
    at the default rate three short passes do not undo the tied classes' flips."""
    from test_sparsity import small_model

    from keras_mvit2.optimizer import QATSettings
    from keras_mvit2.ship.phone_files import PhoneData, _export_phone_files, export_warnings

    keras.utils.set_random_seed(0)
    model = small_model()
    rng = np.random.default_rng(0)
    k = np.abs(rng.normal(size=(32,))).astype(np.float32)
    kernel = np.stack([k, k + 1e-3 * rng.normal(size=32).astype(np.float32)] + [-k] * 8, 1)
    model.get_layer("logits").set_weights([kernel, np.zeros(10, np.float32)])
    train, _ = _fashion_mnist("train", 0, 192)
    calibration, _ = _fashion_mnist("train", 192, 32)
    held_out, _ = _fashion_mnist("test", 0, 200)
    labels = model.predict(held_out, verbose=0).argmax(-1)
    train_labels = model.predict(train, verbose=0).argmax(-1)
    names = [f"class_{i}" for i in range(10)]
    qat = QATSettings((train, train_labels))  # the defaults
    steps = 3 * (144 // 8)  # 192 read, 48 set aside: 3 passes of 18 steps on 144
    files = tmp_path / "qat_files"
    seen = _keep_both_qat_files(monkeypatch, files)
    run = tmp_path / "run"
    [record] = _export_phone_files(model, run, PhoneData(calibration, held_out, labels),
                                   class_names=names, targets=("tflite",), bench_runs=3,
                                   qat=qat)
    facts = record["qat"]
    assert "error" not in facts, facts.get("error")
    assert facts["post_training"]["drop_points"] > 1.0  # the default file lost a point
    assert facts["learning_rate"] == 1e-6 and facts["epochs"] == 3
    assert facts["steps"] == steps and facts["training_images"] == 144
    np.testing.assert_array_equal(seen["train"], train)
    shipped = _check_the_real_choice(model, facts, held_out, labels, calibration, seen, files)
    phone = run / "phone"
    post = _litert_top1(files / "post.tflite", held_out)
    assert 100 * (1 - np.mean(post == labels)) == pytest.approx(
        facts["post_training"]["drop_points"])  # QAT started from the run's own int8 file
    assert facts["post_training"]["top1_agreement"] == pytest.approx(np.mean(post == labels))
    top1 = _litert_top1(phone / "model_int8.tflite", held_out)
    assert record["top1"] == pytest.approx(np.mean(top1 == labels))
    # never a default file that does worse on the held-out images
    assert np.mean(top1 == labels) >= np.mean(post == labels)
    not_shipped = run / "eval" / "model_qat_int8_not_shipped.tflite"
    if shipped == "post_training":  # the trained file is kept out of phone/
        assert sorted(os.listdir(phone)) == ["model_int8.tflite"]
        np.testing.assert_array_equal(top1, post)
        assert record["note"] is None
        assert not_shipped.read_bytes() == (files / "qat.tflite").read_bytes()
        assert facts["not_shipped_path"] == os.path.join("eval", not_shipped.name)
        return
    assert not not_shipped.exists() and "not_shipped_path" not in facts
    assert sorted(os.listdir(phone)) == ["model_int8.tflite", "model_int8_post_training.tflite"]
    assert (phone / "model_int8.tflite").read_bytes() == (files / "qat.tflite").read_bytes()
    kept = _litert_top1(phone / "model_int8_post_training.tflite", held_out)
    np.testing.assert_array_equal(kept, post)
    assert record["top1"] == facts["top1"]
    assert facts["drop_points"] == pytest.approx(100 * (1 - np.mean(top1 == labels)))
    assert f"quantization-aware trained (qat_int8: {steps} steps on 144" in record["note"]
    warned = export_warnings([record])
    assert warned == [] if facts["drop_points"] <= 1.0 else \
        f"It is quantization-aware trained ({steps} steps), which did not fix it" in warned[0]
    tflite = mv.export.get_target("tflite")
    meta = tflite.metadata(phone / "model_int8.tflite")
    assert meta["user"]["quantization_aware_training"]["steps"] == steps
    assert tflite.class_names(phone / "model_int8.tflite") == names
