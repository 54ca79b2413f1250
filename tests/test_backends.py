"""The models on Keras' JAX and PyTorch backends: timm's logits, no TensorFlow, shared weights.

Each backend runs in a process of its own (`tests/backend_worker.py`): Keras fixes its backend
when imported, and on this stack a PyTorch convolution segfaults in a process that has
imported TensorFlow, so the worker must not import it (and checks that nothing did).

Every test here checks what a process on another backend did (slow tier, as `.ci/run` runs
it); all of them share one worker per backend (`_backend_worker`: a process costs its
imports, ~5-8 s, and JAX its start), which does every part below:

- On both backends: every layer of
  `keras_mvit2.layers` (`model_utils.layer_zoo`, three small models: each attention of the
  zoo, the MobileViT v1 and ViT blocks) saved here as `.keras` gives there the outputs it
  gives here, and its weights saved there (`.weights.h5`) load here with them bit for bit
  (JAX's workers compile with XLA's quickest CPU settings, `model_utils.jax_quick_compile`).
- On both backends (whole-model builds, ~7 s each on JAX; PyTorch's test of these reads
  the worker's result): `import keras_mvit2` and a
  MobileViTV2 on the backend load no TensorFlow; a
  `.weights.h5` saved here (TensorFlow) loads there, static and `(None, None, 3)`, with the
  same outputs; the file saved back there loads here with bit-identical weights and outputs;
  a whole-model `.keras` file crosses both ways with the same outputs; a task model
  (DeepLabV3) builds and runs there, and the TensorFlow-only `keras_mvit2.tasks.data` /
  `.train` name the backend and the fix. A TF-only feature used on JAX names the backend
  and the fix.
- The run's timm oracles (conftest.py's `timm_oracle_dir`, `tests/torch_oracle.py`, and
  `timm_oracle_v1_dir`, `tests/timm_oracle_v1_vit.py`):
  MobileViTV2 0.5 and 1.0 and MobileViT v1 XXS with ported timm weights give timm's logits
  (max |difference| <= 1e-5 of the largest logit) on each backend, built for 224x224 (the
  align-corners / half-pixel resizes run) and for `(None, None, 3)` (256x320 and the odd
  193x201; on JAX, its builds being slow, MobileViTV2-0.5 at 224x224 and 256x320 and
  MobileViT v1 XXS at 224x224); on both, also KerasHub's ImageClassifier, run, saved
  there as a preset and loaded back there and here (TensorFlow) through
  `keras_hub.models.ImageClassifier.from_preset` (keras_hub imports TensorFlow: on PyTorch
  this runs after the TensorFlow-free checks); on PyTorch, also the rest of the zoo saved
  here as `.keras` files (MobileViTV2-0.5 with each other attention, MobileViT v1 XXS,
  the task models DeepLabV3 and SSDLite): the same outputs.
"""

import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest
from model_utils import (
    LAYER_ZOO_PARTS,
    TORCH_READY,
    jax_quick_compile,
    layer_zoo,
    perturb_norms,
)

import keras_mvit2 as mv

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "backend_worker.py")
BACKENDS = ("jax", "torch")
REL_TOL = 1e-5          # max |logit difference| / max |logit|
WEIGHTS_SIZE, WEIGHTS_CLASSES = 64, 5
ORACLE_V2 = ("mobilevitv2_050", "mobilevitv2_100")  # of shared_fixtures.ORACLE_MODELS
STATIC = ("224x224",)                                # 7x7 last map: the resize runs
DYNAMIC = ("256x320", "193x201")                     # one (None, None, 3) model, odd sides

pytestmark = pytest.mark.slow  # every test starts a worker process


def _available(backend: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(backend) is not None


def run_worker(backend: str, job: dict, folder, timeout: int = 600, *, worker: str = WORKER,
               env: dict[str, str] | None = None) -> dict:
    """`worker` (default `tests/backend_worker.py`) under `KERAS_BACKEND=backend`, with
    `env` added to the environment (JAX: `model_utils.jax_quick_compile`); returns its result."""
    if not _available(backend):
        pytest.skip(f"the {backend} backend is not installed (pip install -e '.[{backend}]')")
    job_path, result_path = folder / f"{backend}_job.json", folder / f"{backend}_result.json"
    job_path.write_text(json.dumps(job))
    env = dict(os.environ, KERAS_BACKEND=backend, **(env or {}))
    env.pop("TF_USE_LEGACY_KERAS", None)
    if backend == "jax":
        env = jax_quick_compile(env)
    process = subprocess.run([sys.executable, worker, str(job_path), str(result_path)],
                             env=env, capture_output=True, text=True, timeout=timeout)
    assert process.returncode == 0, process.stderr[-4000:]
    return json.loads(result_path.read_text())


def _check_preset_here(preset: str, case: dict, predicted_there: bool) -> None:
    """A KerasHub preset saved on another backend, loaded here (TensorFlow) through
    `keras_hub.models.ImageClassifier.from_preset`: timm's logits within `REL_TOL`, and
    the `predict` on raw photos made there (PyTorch; JAX runs the same TensorFlow form of
    the preprocessing)."""
    import keras_hub

    import keras_mvit2.kerashub  # noqa: F401  (registers the classes with KerasHub)

    with np.load(case["npz"]) as data:
        ref = dict(data)
    tag = case["static"][0]
    loaded = keras_hub.models.ImageClassifier.from_preset(preset)
    logits = keras.ops.convert_to_numpy(loaded(ref[f"x_{tag}"], training=False))
    expected = ref[f"logits_{tag}"]
    assert type(loaded).__name__ == "MobileViTV2ImageClassifier"
    assert np.abs(logits - expected).max() <= REL_TOL * np.abs(expected).max()
    if not predicted_there:
        return
    # `predict` on raw photos there (keras-hub's preprocessor in tf.data) = here
    from backend_worker import raw_photos

    there = np.load(os.path.join(preset, "predict_raw.npy"))
    here = loaded.predict(raw_photos(), verbose=0)
    assert there.shape == here.shape == (2, expected.shape[-1])
    np.testing.assert_allclose(there, here, rtol=0, atol=1e-5)


def _report(capsys, lines: list[str]) -> None:
    with capsys.disabled():
        print("\n" + "\n".join(lines))


# --------------------------------------------------------------------------------------
# No TensorFlow, and weights saved on one backend load on another
# --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tf_saved_weights(tmp_path_factory):
    """A perturbed MobileViTV2-0.5 saved here (TensorFlow), its inputs and its outputs."""
    assert keras.backend.backend() == "tensorflow"
    folder = tmp_path_factory.mktemp("backends_h5")
    keras.utils.set_random_seed(0)
    model = mv.MobileViTV2(0.5, input_shape=(WEIGHTS_SIZE, WEIGHTS_SIZE, 3),
                           classes=WEIGHTS_CLASSES, classifier_activation=None)
    perturb_norms(model, seed=0)
    x = np.random.default_rng(1).random((2, WEIGHTS_SIZE, WEIGHTS_SIZE, 3)).astype("float32")
    y = np.asarray(model(x, training=False))
    path = folder / "tf.weights.h5"
    model.save_weights(path)
    model.save(folder / "tf.keras")
    np.savez(folder / "io.npz", x=x, y=y)
    return {"folder": folder, "model": model, "path": path, "x": x, "y": y}


@pytest.fixture(scope="module")
def tf_zoo(tmp_path_factory) -> list[dict]:
    """The other models, built and saved here (TensorFlow) as `.keras` files with their
    inputs and outputs: MobileViTV2-0.5 with each other attention of the zoo, MobileViT v1
    XXS, and the task models DeepLabV3 and SSDLite (one output: each anchor's box offsets and
    class logits) on MobileViTV2-0.5. `import keras_mvit2` registers the task models'
    classes on every backend, so their files load there."""
    folder = tmp_path_factory.mktemp("backends_zoo")
    small = {"input_shape": (32, 32, 3), "classes": 5, "classifier_activation": None}
    builders = {f"mobilevitv2_050_{name}": (lambda name=name: mv.mobilevitv2_050(
        attention=name, **small)) for name in ("mha", "linformer", "mobile_attention", "rfa")}
    builders.update({
        "mobilevit_xxs": lambda: mv.MobileViT("xxs", **small),
        "deeplabv3_050": lambda: mv.tasks.DeepLabV3(0.5, input_shape=(64, 64, 3), classes=3),
        "ssdlite_050": lambda: mv.tasks.SSDLite(0.5, input_shape=(64, 64, 3), classes=3),
    })
    cases = []
    for i, (name, build) in enumerate(builders.items()):
        keras.utils.set_random_seed(i)
        model = build()
        perturb_norms(model, seed=i)
        shape = (2, *model.inputs[0].shape[1:])
        x = np.random.default_rng(i).random(shape).astype("float32")
        outputs = model(x, training=False)
        outputs = outputs if isinstance(outputs, list | tuple) else [outputs]
        model.save(folder / f"{name}.keras")
        np.savez(folder / f"{name}.npz", x=x,
                 **{f"y{j}": np.asarray(y) for j, y in enumerate(outputs)})
        cases.append({"name": name, "path": str(folder / f"{name}.keras"),
                      "npz": str(folder / f"{name}.npz"), "outputs": len(outputs)})
    return cases


def _crossing_job(backend: str, saved: dict) -> dict:
    """The worker's job for `check_crossing`: load the TF-saved `.weights.h5` and `.keras`,
    save them back there, and build the task models."""
    folder = saved["folder"]
    return {
        "weights_h5": {"width": 0.5, "size": WEIGHTS_SIZE, "classes": WEIGHTS_CLASSES,
                       "path": str(saved["path"]), "npz": str(folder / "io.npz"),
                       "save_to": str(folder / f"{backend}.weights.h5")},
        "keras_file": {"path": str(folder / "tf.keras"), "npz": str(folder / "io.npz"),
                       "save_to": str(folder / f"{backend}.keras")},
        "tasks": {"width": 0.5, "size": WEIGHTS_SIZE, "classes": 3,
                  "npz": str(folder / "io.npz"), "tensorflow_only": ["data", "train"]}}


def _check_crossing(backend: str, result: dict, saved: dict, capsys) -> None:
    """What a `_crossing_job` worker reported, and the files it saved back, loaded here."""
    folder = saved["folder"]
    assert result["backend"] == backend
    assert not result["tf_after_import"], "import keras_mvit2 imported TensorFlow"
    assert not result["tf_after_run"], "building / running / loading imported TensorFlow"
    loaded = result["keras_file"]
    assert not loaded["tf_after_load"], "loading a .keras file imported TensorFlow"
    _report(capsys, [f"[{backend}] TF-saved .weights.h5, {r['input']}: max|d out| = "
                     f"{r['max_abs_diff']:.1e} (|out| <= {r['max_abs_ref']:.2f})"
                     for r in result["weights_h5"]])
    assert [r["input"] for r in result["weights_h5"]] == ["static", "dynamic"]
    for r in result["weights_h5"]:
        assert r["max_abs_diff"] <= REL_TOL * max(1.0, r["max_abs_ref"]), r
    # The file written there loads here: the same weights, bit for bit, the same outputs.
    model = mv.MobileViTV2(0.5, input_shape=(WEIGHTS_SIZE, WEIGHTS_SIZE, 3),
                           classes=WEIGHTS_CLASSES, classifier_activation=None)
    model.load_weights(folder / f"{backend}.weights.h5")
    for a, b in zip(model.weights, saved["model"].weights, strict=True):
        assert a.path == b.path
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    np.testing.assert_array_equal(np.asarray(model(saved["x"], training=False)), saved["y"])
    # A whole-model .keras file (architecture + weights) crosses backends both ways too.
    _report(capsys, [f"[{backend}] TF-saved .keras: max|d out| = {loaded['max_abs_diff']:.1e}"])
    assert (loaded["class"], loaded["name"]) == ("Functional", saved["model"].name)
    assert loaded["max_abs_diff"] <= REL_TOL * max(1.0, loaded["max_abs_ref"]), loaded
    model = keras.saving.load_model(folder / f"{backend}.keras")
    np.testing.assert_array_equal(np.asarray(model(saved["x"], training=False)), saved["y"])
    # The task models build and run there (no TensorFlow: `tf_after_run` above); their
    # TensorFlow-only helpers name the backend and the fix.
    tasks = result["tasks"]
    assert tasks["output_shape"] == [len(saved["x"]), WEIGHTS_SIZE, WEIGHTS_SIZE, 3]
    assert tasks["finite"]
    assert sorted(tasks["errors"]) == ["data", "train"]
    for name, error in tasks["errors"].items():
        assert error.startswith("TensorFlowBackendRequiredError: "), error
        assert f"keras_mvit2.tasks.{name}" in error and repr(backend) in error, error
        assert "KERAS_BACKEND=tensorflow" in error, error


# Each backend's crossing rides on its one worker (`_backend_worker`, below). JAX's is
# checked by its timm-oracle test; PyTorch's here.
def test_no_tensorflow_and_weights_cross_backends_on_pytorch(torch_worker, tf_saved_weights,
                                                             capsys):
    _, result = torch_worker
    _check_crossing("torch", result, tf_saved_weights, capsys)


@pytest.fixture(scope="module")
def tf_layer_zoo(tmp_path_factory) -> dict:
    """The three parts of `model_utils.layer_zoo` (every layer, each attention) with perturbed
    norms, saved here (TensorFlow) as `.keras` files, with their inputs and outputs."""
    folder = tmp_path_factory.mktemp("backends_layers")
    saved = {"folder": folder}
    for i, part in enumerate(LAYER_ZOO_PARTS):
        keras.utils.set_random_seed(3 + i)
        model = layer_zoo(part)
        perturb_norms(model, seed=3 + i)
        x = np.random.default_rng(3 + i).random((2, *model.inputs[0].shape[1:]))
        x = x.astype("float32")
        y = np.asarray(model(x, training=False))
        model.save(folder / f"{part}.keras")
        np.savez(folder / f"{part}.npz", x=x, y=y)
        saved[part] = {"x": x, "y": y}
    return saved


def _layer_zoo_job(backend: str, saved: dict) -> dict:
    """The worker's `keras_files`: each part of `tf_layer_zoo` loaded in turn, run, and its
    weights saved there (`.weights.h5`)."""
    folder = saved["folder"]
    return {part: {"path": str(folder / f"{part}.keras"), "npz": str(folder / f"{part}.npz"),
                   "save_to": str(folder / f"{part}_{backend}.weights.h5")}
            for part in LAYER_ZOO_PARTS}


@pytest.fixture(scope="module")
def layer_zoo_worker(backend, request) -> dict:
    """What the worker on `backend` (the module-scoped parameter of the layer test) did with
    `tf_layer_zoo` (`_backend_worker`, which also does the whole models)."""
    return request.getfixturevalue(f"{backend}_worker")[1]


# The backend matrix: every layer on JAX and PyTorch (the whole models: the crossing above
# and the timm-oracle test below). Three parts, so that each JAX model compiles in a few
# seconds; the backend's one worker runs all three (a process per part took 9-13 s each on
# an idle AVX2-only 2-core host; a process for the layers apart from the whole models paid
# the imports again: the result's `stages`), and each part's test reads its row. A part's
# `tf_after_load` / `tf_after_save` count what the worker did before it too (the whole
# models, the tasks).
@pytest.mark.parametrize("part", LAYER_ZOO_PARTS)
@pytest.mark.parametrize("backend", BACKENDS, scope="module")
def test_every_layer_gives_tensorflows_outputs_on_each_backend(backend, part, tf_layer_zoo,
                                                               layer_zoo_worker, capsys):
    folder = tf_layer_zoo["folder"]
    result = layer_zoo_worker
    loaded = result["keras_files"][part]
    assert result["backend"] == backend
    assert not result["tf_after_import"] and not loaded["tf_after_load"]
    assert not loaded["tf_after_save"]
    _report(capsys, [f"[{backend}] layers {part} (TF-saved .keras): max|d out| = "
                     f"{loaded['max_abs_diff']:.1e} (|out| <= {loaded['max_abs_ref']:.2f})"])
    assert (loaded["class"], loaded["name"]) == ("Functional", f"layer_zoo_{part}")
    assert loaded["max_abs_ref"] > 0.5, loaded  # O(1) outputs: the tolerance means something
    assert loaded["max_abs_diff"] <= REL_TOL * loaded["max_abs_ref"], loaded
    # the weights saved there load here with the outputs they had here, bit for bit
    model = keras.saving.load_model(folder / f"{part}.keras")
    for variable in model.weights:
        variable.assign(np.zeros(variable.shape, variable.dtype))
    model.load_weights(folder / f"{part}_{backend}.weights.h5")
    np.testing.assert_array_equal(np.asarray(model(tf_layer_zoo[part]["x"], training=False)),
                                  tf_layer_zoo[part]["y"])


def test_tensorflow_only_features_name_the_backend_and_the_fix(tmp_path):
    if not _available("jax"):
        pytest.skip("the jax backend is not installed")
    code = ("import sys, keras_mvit2 as mv\n"
            "try:\n    mv.export.to_tflite\n"
            "except ImportError as e:\n    print(type(e).__name__, '|', e)\n"
            "print('tensorflow' in sys.modules)\n")
    env = dict(os.environ, KERAS_BACKEND="jax")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, timeout=300, cwd=os.path.dirname(HERE))
    assert out.returncode == 0, out.stderr[-3000:]
    first, second = out.stdout.strip().splitlines()[-2:]
    assert first.startswith("TensorFlowBackendRequiredError |")
    assert "keras_mvit2.export" in first and "'jax'" in first
    assert "KERAS_BACKEND=tensorflow" in first
    assert second == "False"


# --------------------------------------------------------------------------------------
# timm's logits on each backend
# --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def oracle_job(timm_oracle_dir, timm_oracle_v1_dir) -> dict:
    """The worker's job: the run's timm oracles of MobileViTV2 and of MobileViT v1 XXS."""
    if not TORCH_READY:
        pytest.skip("needs torch, timm and safetensors")
    v1_dir = timm_oracle_v1_dir
    cases = [{"name": name, "family": "mobilevitv2",
              "weights": str(timm_oracle_dir / f"{name}.safetensors"),
              "npz": str(timm_oracle_dir / f"{name}.npz"),
              "static": list(STATIC), "dynamic": list(DYNAMIC)} for name in ORACLE_V2]
    cases.append({"name": "mobilevit_xxs", "family": "mobilevit",
                  "weights": str(v1_dir / "mobilevit_xxs.safetensors"),
                  "npz": str(v1_dir / "mobilevit_xxs.npz"),
                  "static": list(STATIC), "dynamic": list(DYNAMIC)})
    return {"oracle": cases}


def _backend_worker(backend: str, request, tmp_path_factory) -> tuple[dict, dict]:
    """(job, result) of the one worker on `backend`: every layer (`tf_layer_zoo`), the
    crossing of the weights and files saved here (`_crossing_job`) and, with torch and timm,
    timm's logits (`oracle_job`) and the KerasHub preset; on PyTorch also the rest of the
    zoo."""
    if not _available(backend):  # before the fixtures below build anything
        pytest.skip(f"the {backend} backend is not installed (pip install -e '.[{backend}]')")
    folder = tmp_path_factory.mktemp(f"backends_{backend}")
    job = _crossing_job(backend, request.getfixturevalue("tf_saved_weights"))
    job["keras_files"] = _layer_zoo_job(backend, request.getfixturevalue("tf_layer_zoo"))
    if TORCH_READY:
        cases = request.getfixturevalue("oracle_job")["oracle"]
        if backend == "jax":  # each build and size runs op by op (~11 s): MobileViTV2-0.5
            # static and dynamic at 256x320, MobileViT v1 XXS static (PyTorch runs them all)
            cases = [dict(case,
                          dynamic=DYNAMIC[:1] if case["name"] == "mobilevitv2_050" else [])
                     for case in cases if case["name"] != "mobilevitv2_100"]
        # PyTorch also loads the rest of the zoo saved here (on JAX each load builds op by op)
        tf_zoo = request.getfixturevalue("tf_zoo") if backend == "torch" else []
        preset = str(folder / f"preset_{backend}")
        job.update(oracle=cases, keras_hub=_available("keras_hub") and preset, zoo=tf_zoo)
    return job, run_worker(backend, job, folder)


@pytest.fixture(scope="module")
def jax_worker(request, tmp_path_factory) -> tuple[dict, dict]:
    return _backend_worker("jax", request, tmp_path_factory)


@pytest.fixture(scope="module")
def torch_worker(request, tmp_path_factory) -> tuple[dict, dict]:
    return _backend_worker("torch", request, tmp_path_factory)


@pytest.mark.torch
@pytest.mark.parametrize("backend", BACKENDS)
def test_models_give_timms_logits(backend, oracle_job, capsys, request):
    job, result = request.getfixturevalue(f"{backend}_worker")
    cases, tf_zoo = job["oracle"], job["zoo"]
    assert not result["tf_after_import"] and not result["tf_after_run"]
    rows = result["oracle"] + result.get("keras_hub", [])
    _report(capsys, [f"[{backend}] {r['model']} {r['input']}: max|dlogit| = "
                     f"{r['max_abs_diff']:.1e} (|logit| <= {r['max_abs_ref']:.2f})"
                     for r in rows] + [f"[{backend}] worker: {result['seconds']:.0f} s ("
                             + ", ".join(f"{k} {v:.0f} s" for k, v in result["stages"].items())
                             + ")"])
    expected = {(case["name"], f"{mode} {tag}") for case in cases
                for mode, tags in (("static", case["static"]), ("dynamic", case["dynamic"]))
                for tag in tags}
    assert {(r["model"], r["input"]) for r in result["oracle"]} == expected
    for r in rows:
        assert r["max_abs_ref"] > 0.5, r  # O(1) logits: the tolerance means something
        assert r["max_abs_diff"] <= REL_TOL * r["max_abs_ref"], r
    if result.get("keras_hub"):  # the preset saved there loads here with its logits
        _check_preset_here(job["keras_hub"], cases[0], predicted_there=backend == "torch")
    if backend == "jax":  # PyTorch's: test_no_tensorflow_and_weights_cross_backends_on_pytorch
        _check_crossing("jax", result, request.getfixturevalue("tf_saved_weights"), capsys)
    if backend == "torch":  # the rest of the zoo gives there the outputs it gives here
        _report(capsys, [f"[torch] {r['name']}: max|d out| = {r['max_abs_diff']:.1e} "
                         f"(|out| <= {r['max_abs_ref']:.2f})" for r in result["zoo"]])
        assert [(r["name"], r["outputs"]) for r in result["zoo"]] == [
            (case["name"], case["outputs"]) for case in tf_zoo]
        for r in result["zoo"]:
            assert r["max_abs_ref"] > 0.1, r  # not a degenerate all-zero output
            assert r["max_abs_diff"] <= REL_TOL * max(1.0, r["max_abs_ref"]), r
