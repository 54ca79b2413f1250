"""Runs the models on one Keras backend, in a process of its own, for tests/test_backends.py.

The backend is fixed when Keras is imported, so each backend needs its own process
(`KERAS_BACKEND` set by the caller); and on this stack a PyTorch convolution segfaults in a
process that has imported TensorFlow, so this script never imports TensorFlow itself and
reports whether anything else did (`"tensorflow" in sys.modules`).

Usage:
    KERAS_BACKEND=jax python tests/backend_worker.py JOB.json RESULT.json

JOB.json (every key optional):

- `"oracle"`: a list of `{"name", "family", "weights", "npz", "static", "dynamic"}`: build
  timm model `name` (`family` `"mobilevitv2"`: `keras_mvit2.create_model`; `"mobilevit"`:
  `keras_mvit2.MobileViT`, variant from the name) with the ported `weights` (a timm
  `.safetensors`), at each `HxW` of `static` (built for that size) and of `dynamic` (one
  model built for `(None, None, 3)`), on the images `x_<H>x<W>` of `npz` (the oracle's
  file); the reference logits are its `logits_<H>x<W>`;
- `"weights_h5"`: `{"width", "size", "classes", "path", "npz"}`: MobileViTV2 `width`
  built at `size` and at `(None, None, 3)`, loading the `.weights.h5` saved on another
  backend, run on the images `x` of `npz` (the saving backend's outputs: `y`); with
  `"save_to"`, the static model's weights are saved back there (`.weights.h5`);
- `"torch_road"`: `{"width", "size", "classes", "weights", "class_names", "npz", "out"}`:
  MobileViTV2 `width` (softmax head) at `size` with the `.weights.h5` `weights`, exported
  to `out` by the `.tflite` target's default road here (PyTorch: litert-torch) with
  `class_names`; its Keras outputs on the images `x` of `npz` are saved to `out + ".npz"`
  (PyTorch only); with `"out_coreml"`, also a float32 `.mlpackage` there by the Core ML
  target's default road (`torch.export` + coremltools); with `"out_coreai"`, a Core AI
  `.aimodel` there (coreai-torch);
- `"tasks"`: `{"width", "size", "classes", "npz", "tensorflow_only"}`: the task model
  `keras_mvit2.tasks.DeepLabV3` `width` at `size` built and run on the images `x` of
  `npz`, and each name of `tensorflow_only` looked up in `keras_mvit2.tasks` (the error it
  raises);
- `"keras_file"`: `{"path", "npz", "save_to"}`: a whole-model `.keras` file saved on another
  backend, loaded and run here on the images `x` of `npz` (the saving backend's outputs:
  `y`), then saved again to `save_to` (a `.keras` file, or its `.weights.h5`);
  `"keras_files"`: `{key: {"path", "npz", "save_to"}}`, each loaded and saved in turn the
  same way (before `"keras_file"`: saving a whole `.keras` file may import TensorFlow);
- `"keras_hub"`: a folder: the KerasHub ImageClassifier made from the first oracle model
  (its first static model, the one `"oracle"` built and ran), run, saved there as a preset
  (`save_to_preset`) and loaded back through
  `keras_hub.models.ImageClassifier.from_preset`, run again, and (PyTorch) its `predict`
  on `raw_photos()` saved there as `predict_raw.npy`; last (keras_hub itself imports
  TensorFlow).

RESULT.json: the backend, `tf_after_import` / `tf_after_run` (was TensorFlow imported),
`stages` (seconds of the import and of each part),
and per case the max |difference| and the max |reference| (`"keras_files"`: per key; each
file's `tf_after_load` / `tf_after_save` tell whether TensorFlow had been imported by then,
by it or by anything before it).
"""

import json
import os
import sys
import time


def _max_abs(a, b=None) -> float:
    import numpy as np

    a = np.asarray(a, dtype=np.float64)
    return float(np.abs(a if b is None else a - np.asarray(b, dtype=np.float64)).max())


def _predict(model, x):
    """`model.predict` on one batch: one traced (JAX: jit-compiled) call, faster than eager
    JAX, which compiles each op on its first call."""
    return model.predict(x, batch_size=len(x), verbose=0)


def _build(mv, case: dict, input_shape: tuple):
    if case["family"] == "mobilevit":
        variant = case["name"].rsplit("_", 1)[-1]
        return mv.MobileViT(variant, input_shape=input_shape, weights=case["weights"],
                            classifier_activation=None)
    model = mv.create_model(case["name"], input_shape=input_shape, classifier_activation=None)
    mv.load_torch_weights(model, case["weights"])
    return model


def run_oracle(mv, case: dict, built: dict | None = None) -> list[dict]:
    """`case`'s rows; each static model is kept in `built` (key: (name, tag)), for
    `run_keras_hub`, which starts from the first."""
    import numpy as np

    results = []
    with np.load(case["npz"]) as data:
        ref = dict(data)

    def compare(model, tag: str, mode: str) -> None:
        logits = _predict(model, ref[f"x_{tag}"])
        expected = ref[f"logits_{tag}"]
        results.append({"model": case["name"], "input": f"{mode} {tag}",
                        "max_abs_diff": _max_abs(logits, expected),
                        "max_abs_ref": _max_abs(expected)})

    for tag in case.get("static", []):
        height, width = (int(s) for s in tag.split("x"))
        model = _build(mv, case, (height, width, 3))
        compare(model, tag, "static")
        if built is not None:
            built[(case["name"], tag)] = model
    if case.get("dynamic"):
        model = _build(mv, case, (None, None, 3))
        for tag in case["dynamic"]:
            compare(model, tag, "dynamic")
    return results


def run_weights_h5(mv, job: dict) -> list[dict]:
    import numpy as np

    with np.load(job["npz"]) as data:
        x, expected = data["x"], data["y"]
    results = []
    size = int(job["size"])
    for shape in ((size, size, 3), (None, None, 3)):
        model = mv.MobileViTV2(job["width"], input_shape=shape, classes=int(job["classes"]),
                               classifier_activation=None)
        model.load_weights(job["path"])
        got = _predict(model, x)
        results.append({"input": "static" if shape[0] else "dynamic",
                        "max_abs_diff": _max_abs(got, expected),
                        "max_abs_ref": _max_abs(expected)})
        if shape[0] and job.get("save_to"):
            model.save_weights(job["save_to"])
    return results


def run_keras_file(job: dict) -> dict:
    """Loads a whole-model `.keras` file saved on another backend, runs it on the saved
    inputs and saves it again here (`save_to`: a `.keras` file, or its `.weights.h5`)."""
    import keras
    import numpy as np

    with np.load(job["npz"]) as data:
        x, expected = data["x"], data["y"]
    model = keras.saving.load_model(job["path"])
    got = _predict(model, x)
    tf_after_load = "tensorflow" in sys.modules
    # Keras' `serialize_keras_object` checks `isinstance(obj, tf.TensorShape)` through a lazy
    # module that imports TensorFlow wherever it is installed (Keras 3.15): the save is last.
    # A `.weights.h5` `save_to` saves the weights alone (no TensorFlow, ~3 s less).
    if job["save_to"].endswith(".weights.h5"):
        model.save_weights(job["save_to"])
    else:
        model.save(job["save_to"])
    return {"class": type(model).__name__, "name": model.name, "tf_after_load": tf_after_load,
            "tf_after_save": "tensorflow" in sys.modules,
            "max_abs_diff": _max_abs(got, expected), "max_abs_ref": _max_abs(expected)}


def run_zoo(cases: list[dict]) -> list[dict]:
    """Loads each `.keras` file saved on another backend and runs it on that backend's
    inputs: outputs (every output of a multi-output model) against the saved ones."""
    import keras
    import numpy as np

    results = []
    for case in cases:
        with np.load(case["npz"]) as data:
            x = data["x"]
            expected = [data[k] for k in sorted(data.files) if k.startswith("y")]
        got = _predict(keras.saving.load_model(case["path"]), x)
        got = got if isinstance(got, list | tuple) else [got]
        got = list(got.values()) if isinstance(got, dict) else got
        results.append({"name": case["name"], "outputs": len(got),
                        "max_abs_diff": max(_max_abs(g, e) for g, e in
                                            zip(got, expected, strict=True)),
                        "max_abs_ref": max(_max_abs(e) for e in expected)})
    return results


def run_tasks(mv, job: dict) -> dict:
    """A task model built and run here; the TensorFlow-only names of `keras_mvit2.tasks`
    raise (and load no TensorFlow)."""
    import numpy as np

    size = int(job["size"])
    with np.load(job["npz"]) as data:
        x = data["x"]
    model = mv.tasks.DeepLabV3(job["width"], input_shape=(size, size, 3),
                               classes=int(job["classes"]))
    y = _predict(model, x)
    errors = {}
    for name in job["tensorflow_only"]:
        try:
            getattr(mv.tasks, name)
        except ImportError as err:
            errors[name] = f"{type(err).__name__}: {err}"
    return {"output_shape": list(y.shape), "finite": bool(np.isfinite(y).all()),
            "errors": errors}


def raw_photos():
    """Two uint8 "photos" of another size than the model's (the test makes the same)."""
    import numpy as np

    return np.random.default_rng(0).integers(0, 256, (2, 300, 260, 3), dtype=np.uint8)


def run_keras_hub(mv, case: dict, folder: str, built: dict | None = None) -> list[dict]:
    """`case`'s model at its first static size (`built`'s by `run_oracle`, its weights
    unchanged since: the classifier copies them) as a KerasHub ImageClassifier."""
    import keras
    import numpy as np

    from keras_mvit2 import kerashub

    with np.load(case["npz"]) as data:
        ref = dict(data)
    tag = case["static"][0]
    height, width = (int(s) for s in tag.split("x"))
    net = (built or {}).get((case["name"], tag)) or _build(mv, case, (height, width, 3))
    classifier = kerashub.classifier_from_model(net, float(case["name"].rsplit("_", 1)[-1]) / 100)
    # The call, not `predict` (which runs the classifier's preprocessor on raw images).
    logits = keras.ops.convert_to_numpy(classifier(ref[f"x_{tag}"], training=False))
    expected = ref[f"logits_{tag}"]
    classifier.save_to_preset(folder)
    import keras_hub

    loaded = keras_hub.models.ImageClassifier.from_preset(folder)
    reloaded = keras.ops.convert_to_numpy(loaded(ref[f"x_{tag}"], training=False))
    # `predict` on raw photos: keras-hub's preprocessor runs in tf.data on every backend
    # (the same TensorFlow form on JAX: run on PyTorch only, where the step is not compiled).
    if keras.backend.backend() == "torch":
        np.save(os.path.join(folder, "predict_raw.npy"),
                np.asarray(loaded.predict(raw_photos(), verbose=0)))
    return [{"model": f"{case['name']} (KerasHub ImageClassifier)", "input": f"static {tag}",
             "max_abs_diff": _max_abs(logits, expected), "max_abs_ref": _max_abs(expected)},
            {"model": f"{case['name']} (KerasHub preset saved and loaded here, "
                      f"{type(loaded).__name__})", "input": f"static {tag}",
             "max_abs_diff": _max_abs(reloaded, expected), "max_abs_ref": _max_abs(expected)}]


def run_torch_road(mv, job: dict) -> dict:
    """The `.tflite` of the PyTorch road (`keras_mvit2.export.roads`), and the Keras outputs
    it must reproduce."""
    import numpy as np

    size = int(job["size"])
    model = mv.MobileViTV2(job["width"], input_shape=(size, size, 3),
                           classes=int(job["classes"]), weights=None)
    model.load_weights(job["weights"])
    with np.load(job["npz"]) as data:
        x = data["x"]
    y = _predict(model, x)
    np.savez(job["out"] + ".npz", y=y)
    start = time.perf_counter()
    report = mv.export.get_target("tflite").convert(model, job["out"],
                                                    class_names=job["class_names"])
    seconds = time.perf_counter() - start
    result = {"seconds": seconds, "op_histogram": report.op_histogram}
    if job.get("out_int8"):  # calibrated on images read here without TensorFlow
        start = time.perf_counter()
        mv.export.get_target("tflite").convert(
            model, job["out_int8"], quantization="int8", class_names=job["class_names"],
            calibration_data=job["calibration_data"], num_calibration_samples=64)
        result["int8"] = {"seconds": time.perf_counter() - start,
                          "tf_after_int8": "tensorflow" in sys.modules}
    if job.get("out_coreml"):
        start = time.perf_counter()
        package = mv.export.get_target("coreml").convert(
            model, job["out_coreml"], quantization="float32", class_names=job["class_names"])
        result["coreml"] = {"seconds": time.perf_counter() - start,
                            "op_histogram": package.op_histogram,
                            "tf_after_coreml": "tensorflow" in sys.modules,
                            # the conversion leaves the model's weights as they were
                            "keras_after_vs_before": _max_abs(_predict(model, x[:8]), y[:8])}
    if job.get("out_coreai"):
        start = time.perf_counter()
        asset = mv.export.get_target("coreai").convert(model, job["out_coreai"],
                                                       class_names=job["class_names"])
        result["coreai"] = {"seconds": time.perf_counter() - start, "num_ops": asset.num_ops,
                            "tf_after_coreai": "tensorflow" in sys.modules,
                            "keras_after_vs_before": _max_abs(_predict(model, x[:8]), y[:8])}
    errors = {}
    try:  # the other road asked here: the error names the backend and the fix
        mv.export.get_target("tflite").convert(model, job["out"] + ".tf", road="tensorflow")
    except ImportError as err:
        errors["tensorflow_road"] = f"{type(err).__name__}: {err}"
    return {**result, "errors": errors}


def main(job_path: str, result_path: str) -> None:
    with open(job_path) as f:
        job = json.load(f)
    start = time.perf_counter()
    import keras

    import keras_mvit2 as mv

    result = {"backend": keras.backend.backend(),
              "tf_after_import": "tensorflow" in sys.modules,
              "oracle": [], "weights_h5": []}
    stages = result["stages"] = {"import": time.perf_counter() - start}

    def stage(name: str, run):
        begin = time.perf_counter()
        value = run()
        stages[name] = time.perf_counter() - begin
        return value

    built = {}  # the oracle's static models, the first one reused by "keras_hub"
    for case in job.get("oracle", []):
        result["oracle"] += stage(f"oracle {case['name']}",
                                  lambda case=case: run_oracle(mv, case, built))
    if job.get("weights_h5"):
        result["weights_h5"] = stage("weights_h5", lambda: run_weights_h5(mv, job["weights_h5"]))
    if job.get("torch_road"):
        result["torch_road"] = stage("torch_road",
                                     lambda: run_torch_road(mv, job["torch_road"]))
    if job.get("zoo"):
        result["zoo"] = stage("zoo", lambda: run_zoo(job["zoo"]))
    if job.get("tasks"):
        result["tasks"] = stage("tasks", lambda: run_tasks(mv, job["tasks"]))
    result["tf_after_run"] = "tensorflow" in sys.modules
    # Saving a `.weights.h5` imports no TensorFlow; saving a whole `.keras` file may (Keras'
    # own import, `run_keras_file`): the weight-only saves come first.
    if job.get("keras_files"):
        result["keras_files"] = stage("keras_files", lambda: {
            key: run_keras_file(case) for key, case in job["keras_files"].items()})
    if job.get("keras_file"):  # loading: no TensorFlow; saving: Keras' own import (above)
        result["keras_file"] = stage("keras_file", lambda: run_keras_file(job["keras_file"]))
    if job.get("keras_hub") and job.get("oracle"):
        result["keras_hub"] = stage("keras_hub", lambda: run_keras_hub(
            mv, job["oracle"][0], job["keras_hub"], built))
    result["seconds"] = time.perf_counter() - start
    with open(result_path, "w") as f:
        json.dump(result, f, indent=2)


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    main(sys.argv[1], sys.argv[2])
