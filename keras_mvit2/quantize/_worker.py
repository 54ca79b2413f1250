"""The tf_keras / TFMOT worker process of `keras_mvit2.quantize`, and its launcher.

TFMOT must never be imported in the user's Keras 3 process (it sets
``TF_USE_LEGACY_KERAS=1`` and flips ``tf.keras`` to tf_keras for the rest of the
process), so `qat`, `prune` and `cluster` run their TFMOT work here, in a child
process started with ``python -u <this file> job.json``:

* The parent (`run_worker`) writes into a private temporary folder:
  ``job.json`` (the task and its options, and whether the user's standard output is a
  terminal: the progress is one line per epoch otherwise), ``spec.json`` (the Keras 3 model's
  class and config, see `tf_keras_twin.model_spec`), ``weights.npz`` (every
  weight, keyed by its Keras 3 variable path), ``reference.npz`` (a few real
  images and the Keras 3 model's outputs on them: the worker's twin must
  reproduce them) and the data files (below).
* The worker installs the ``keras`` shim (tf_keras underneath), imports
  keras_mvit2 and TFMOT, rebuilds the model as a tf_keras twin, checks it
  against the reference outputs, runs the task and writes ``result.json``
  (``{"ok": true, ...}`` or ``{"ok": false, "type", "message", "traceback"}``).
  Its output (progress lines) is streamed to the parent's stdout as it comes.
* A failure in the worker becomes a `QuantizationWorkerError` in the parent, with
  the worker's exception type, message and the last frames of its traceback.

Data files: ``.npz`` archives of numpy arrays (``x``, ``y``, optional
``batch_sizes``), written uncompressed. Images that are exactly ``k / 255`` (the
usual ``uint8 / 255`` preprocessing) are stored as uint8 and rescaled in the
worker (lossless, 4x smaller); other float images are stored as float32.
Datasets are materialized: one epoch's worth of batches (``steps_per_epoch``
of them) is written once and replayed in the same order in every epoch, so
random augmentation is frozen to that one pass.
"""

from __future__ import annotations

import collections
import itertools
import json
import math
import os
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

#: Worker start command: this file run as a script (not `-m`, which would import
#: keras_mvit2 and with it Keras 3 before the shim is installed).
WORKER_SCRIPT = os.path.abspath(__file__)
_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(WORKER_SCRIPT)))
_TAIL_LINES = 60
#: Prefix of the worker's lines on the user's console.
OUTPUT_PREFIX = "[tfmot worker] "


class QuantizationWorkerError(RuntimeError):
    """The tf_keras/TFMOT worker process failed.

    Attributes:
        task: ``"qat"``, ``"prune"``, ``"cluster"`` or ``"twin"``.
        error_type: the worker's exception class name (``None`` if it died
            without reporting one, e.g. killed or crashed).
        worker_message: the worker's exception message.
        worker_traceback: the worker's full traceback text.
        output_tail: the last lines the worker printed.
        returncode: the worker's exit status.
    """

    def __init__(
        self,
        message: str,
        *,
        task: str,
        error_type: str | None,
        worker_message: str,
        worker_traceback: str,
        output_tail: str,
        returncode: int | None,
    ):
        super().__init__(message)
        self.task = task
        self.error_type = error_type
        self.worker_message = worker_message
        self.worker_traceback = worker_traceback
        self.output_tail = output_tail
        self.returncode = returncode


# --------------------------------------------------------------------------------------
# Parent side: files


def pack_images(x: np.ndarray) -> tuple[np.ndarray, bool]:
    """`(array, scaled)`: uint8 when the float images are exactly ``k / 255`` (lossless)."""
    x = np.asarray(x)
    if x.dtype == np.uint8:
        return x, False
    x = x.astype(np.float32, copy=False)
    if x.size and np.all((x >= 0) & (x <= 1)):
        q = np.round(x * 255.0)
        if np.array_equal(q.astype(np.float32) / np.float32(255.0), x):
            return q.astype(np.uint8), True
    return x, False


def unpack_images(x: np.ndarray, scaled: bool) -> np.ndarray:
    if scaled:
        return x.astype(np.float32) / np.float32(255.0)
    return x.astype(np.float32, copy=False)


def save_arrays(path: str, x: np.ndarray, y: np.ndarray | None = None,
                batch_sizes: list[int] | None = None) -> dict[str, Any]:
    """Writes images (packed, see `pack_images`) and labels; returns the file's description."""
    packed, scaled = pack_images(x)
    arrays = {"x": packed}
    if y is not None:
        arrays["y"] = np.asarray(y)
    if batch_sizes is not None:
        arrays["batch_sizes"] = np.asarray(batch_sizes, np.int64)
    np.savez(path, **arrays)
    return {"path": path, "scaled": scaled, "num_examples": len(packed)}


def load_arrays(info: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray | None, Any]:
    """(images float32, labels or None, batch sizes or None) from a `save_arrays` file."""
    with np.load(info["path"]) as data:
        x = unpack_images(data["x"], info["scaled"])
        y = data["y"] if "y" in data else None
        sizes = data["batch_sizes"].tolist() if "batch_sizes" in data else None
    return x, y, sizes


def _is_tf_dataset(data: Any) -> bool:
    return type(data).__module__.startswith("tensorflow") and hasattr(data, "element_spec")


def labelled_arrays(
    data: Any,
    *,
    input_shape: tuple[int, ...],
    what: str,
    batch_size: int,
    max_batches: int | None = None,
    split: str = "train",
    limit: int | None = None,
) -> tuple[np.ndarray, np.ndarray, list[int] | None]:
    """Images and labels from `(x, y)` arrays, a `tf.data.Dataset` of `(x, y)` batches,
    or a folder / ``"fashion_mnist"`` name (read with the evaluation transform).

    Returns `(x, y, batch_sizes)`; `batch_sizes` is `None` for arrays (the worker
    batches and shuffles them) and the dataset's own batch sizes otherwise.

    Raises:
        ValueError: a wrong type, image shape or label count (the message says which).
    """
    height, width, _channels = (int(d) for d in input_shape[1:4])
    if isinstance(data, str | os.PathLike):
        from keras_mvit2.export.calibration import load_labelled_images

        loaded = load_labelled_images(
            data, image_size=(height, width), split=split, limit=limit, shuffle=True
        )
        return _check_xy(loaded.images, loaded.labels, input_shape, what) + (None,)
    if isinstance(data, tuple | list) and len(data) == 2 and not _is_tf_dataset(data[0]):
        x, y = np.asarray(data[0]), np.asarray(data[1])
        if limit is not None:
            x, y = x[:limit], y[:limit]
        return _check_xy(x, y, input_shape, what) + (None,)
    if _is_tf_dataset(data):
        import tensorflow as tf

        if max_batches is None and data.cardinality() == tf.data.INFINITE_CARDINALITY:
            raise ValueError(
                f"{what} is an infinite tf.data.Dataset; pass steps_per_epoch (the number of "
                "batches of one epoch)."
            )
        xs: list[np.ndarray] = []
        ys: list[np.ndarray] = []
        source = data.take(max_batches) if max_batches is not None else data
        for element in source:
            if not isinstance(element, tuple | list) or len(element) < 2:
                raise ValueError(
                    f"{what} must yield (images, labels) batches. Received an element of "
                    f"type {type(element).__name__}."
                )
            x, y = np.asarray(element[0]), np.asarray(element[1])
            if x.ndim == len(input_shape) - 1:      # unbatched dataset
                x, y = x[None], y[None]
            xs.append(x)
            ys.append(y)
        if not xs:
            raise ValueError(f"{what} gave no batches.")
        x, y = np.concatenate(xs), np.concatenate(ys)
        x, y = _check_xy(x, y, input_shape, what)
        return x, y, [len(b) for b in xs]
    raise ValueError(
        f"{what} must be a tuple (images, labels) of numpy arrays, a tf.data.Dataset yielding "
        "(images, labels) batches, or a folder of class sub-folders / 'fashion_mnist'. "
        f"Received: {type(data).__name__}"
    )


def _check_xy(x, y, input_shape, what):
    expected = tuple(int(d) for d in input_shape[1:])
    if x.ndim != len(input_shape) or tuple(x.shape[1:]) != expected:
        raise ValueError(
            f"{what}: images must have shape (N, {', '.join(map(str, expected))}) to match the "
            f"model input. Received: {tuple(x.shape)}"
        )
    if len(y) != len(x):
        raise ValueError(f"{what}: {len(x)} images but {len(y)} labels.")
    if np.issubdtype(x.dtype, np.floating):
        lo, hi = float(np.min(x)), float(np.max(x))
        if lo < -0.05 or hi > 1.05:
            raise ValueError(
                f"{what}: float images must be RGB in [0, 1] (the model's input, see "
                f"keras_mvit2.preprocess_input). Received values in [{lo:.3g}, {hi:.3g}]."
            )
    elif x.dtype == np.uint8:
        x = x.astype(np.float32) / np.float32(255.0)
    else:
        raise ValueError(f"{what}: images must be float in [0, 1] or uint8. Received: {x.dtype}")
    return x.astype(np.float32, copy=False), y


def integer_labels(y: np.ndarray, num_classes: int, what: str) -> np.ndarray:
    """Sparse labels from sparse or one-hot / soft labels, range-checked."""
    y = np.asarray(y)
    if y.ndim == 2 and y.shape[1] == num_classes:
        return np.argmax(y, axis=-1).astype(np.int64)
    if y.ndim == 2 and y.shape[1] == 1:
        y = y[:, 0]
    if y.ndim != 1 or (not np.issubdtype(y.dtype, np.integer) and not np.all(y == np.round(y))):
        raise ValueError(
            f"{what}: labels must be class indices (N,) or one-hot (N, {num_classes}). "
            f"Received: shape {y.shape}, dtype {y.dtype}"
        )
    y = y.astype(np.int64)
    if y.size and (y.min() < 0 or y.max() >= num_classes):
        raise ValueError(
            f"{what}: labels must be in [0, {num_classes}) for a model with {num_classes} "
            f"outputs. Received labels in [{y.min()}, {y.max()}]."
        )
    return y


def load_keras_model(model_or_path: Any):
    """A Keras 3 model from a model object or a ``.keras`` path."""
    import keras

    if isinstance(model_or_path, str | os.PathLike):
        path = os.fspath(model_or_path)
        if not os.path.exists(path):
            raise FileNotFoundError(f"Model file not found: {path!r}")
        if not path.endswith(".keras"):
            raise ValueError(
                f"Expected a Keras 3 model saved as .keras. Received: {path!r}"
            )
        import keras_mvit2  # noqa: F401  (registers the layers for loading)

        return keras.saving.load_model(path)
    if not isinstance(model_or_path, keras.Model):
        raise ValueError(
            "model must be a Keras 3 keras.Model or the path of a .keras file. Received: "
            f"{type(model_or_path).__name__}"
        )
    return model_or_path


def output_is_probabilities(model) -> bool:
    """True when the model ends with a softmax (then the loss gets probabilities)."""
    layer = model.layers[-1]
    activation = getattr(layer, "activation", None)
    name = getattr(activation, "__name__", "") or ""
    return name == "softmax" or type(layer).__name__ == "Softmax"


def write_model_files(model, workdir: str, reference_images: np.ndarray,
                      prefix: str = "") -> dict[str, Any]:
    """spec.json, weights.npz and reference.npz for the worker; returns the job's ``model``."""
    from keras_mvit2.quantize import tf_keras_twin

    spec = tf_keras_twin.model_spec(model)
    weights = tf_keras_twin.keras3_weights(model)
    paths = list(weights)
    spec_path = os.path.join(workdir, f"{prefix}spec.json")
    with open(spec_path, "w") as f:
        json.dump(spec, f)
    weights_path = os.path.join(workdir, f"{prefix}weights.npz")
    np.savez(weights_path, **{f"w{i}": weights[p] for i, p in enumerate(paths)})
    ref = np.ascontiguousarray(reference_images[:8], np.float32)
    outputs = np.asarray(model(ref, training=False))
    ref_path = os.path.join(workdir, f"{prefix}reference.npz")
    np.savez(ref_path, x=ref, y=outputs)
    return {
        "spec": spec_path,
        "weights": weights_path,
        "weight_paths": paths,
        "reference": ref_path,
        "probabilities": output_is_probabilities(model),
        "num_classes": int(model.outputs[0].shape[-1]),
    }


def read_weights(path: str) -> dict[str, np.ndarray]:
    """``{keras3 path: array}`` written by the worker's `write_twin_weights`."""
    with np.load(path) as data:
        paths = json.loads(str(data["__paths__"]))
        return {p: data[f"w{i}"] for i, p in enumerate(paths)}


# --------------------------------------------------------------------------------------
# Parent side: running the worker


def run_worker(
    task: str,
    job: dict[str, Any],
    workdir: str,
    *,
    verbose: bool = True,
    timeout: float | None = None,
) -> dict[str, Any]:
    """Runs `task` in a fresh worker process; returns its result dict.

    The worker's output is streamed line by line to ``sys.stdout`` (prefixed with
    `OUTPUT_PREFIX`) when `verbose`; the last lines are kept for error messages.

    Raises:
        QuantizationWorkerError: the worker reported an exception, died, or ran
            past `timeout` seconds.
    """
    from keras_mvit2.utils.progress import stdout_is_terminal

    # The worker's stdout is a pipe: it is told whether the user's is a terminal (progress
    # every tenth of an epoch) or a log file (one line per epoch).
    job = dict(job, task=task, result_path=os.path.join(workdir, "result.json"),
               terminal=stdout_is_terminal())
    job_path = os.path.join(workdir, "job.json")
    with open(job_path, "w") as f:
        json.dump(job, f)
    env = dict(os.environ)
    env["TF_USE_LEGACY_KERAS"] = "1"          # the child only; the parent's env is unchanged
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (_PACKAGE_ROOT, env.get("PYTHONPATH", "")) if p
    )
    tail: collections.deque[str] = collections.deque(maxlen=_TAIL_LINES)
    start = time.monotonic()
    process = subprocess.Popen(
        [sys.executable, "-u", WORKER_SCRIPT, job_path],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env=env,
        text=True,
        errors="replace",
        bufsize=1,
    )
    timed_out = False
    try:
        assert process.stdout is not None
        for line in process.stdout:
            line = line.rstrip("\n")
            tail.append(line)
            if verbose and _worth_showing(line):
                print(OUTPUT_PREFIX + line, flush=True)
            if timeout is not None and time.monotonic() - start > timeout:
                timed_out = True
                process.kill()
                break
        returncode = process.wait()
    except BaseException:
        process.kill()
        process.wait()
        raise
    output_tail = "\n".join(tail)
    result = None
    if os.path.exists(job["result_path"]):
        with open(job["result_path"]) as f:
            result = json.load(f)
    if result is not None and result.get("ok") and returncode == 0:
        return result
    if result is not None and not result.get("ok"):
        frames = _last_frames(result.get("traceback", ""))
        message = (
            f"keras_mvit2.quantize: the {task!r} step failed in the tf_keras/TFMOT worker "
            f"process: {result.get('type')}: {result.get('message')}\n"
            f"Worker traceback (last frames):\n{frames}"
        )
        raise QuantizationWorkerError(
            message, task=task, error_type=result.get("type"),
            worker_message=result.get("message", ""),
            worker_traceback=result.get("traceback", ""), output_tail=output_tail,
            returncode=returncode,
        )
    why = (
        f"ran past its time limit of {timeout:g} s and was stopped" if timed_out
        else f"exited with status {returncode} without reporting a result (crashed or killed)"
    )
    raise QuantizationWorkerError(
        f"keras_mvit2.quantize: the tf_keras/TFMOT worker for {task!r} {why}. "
        f"Its last output lines:\n{output_tail[-3000:]}",
        task=task, error_type=None, worker_message="", worker_traceback="",
        output_tail=output_tail, returncode=returncode,
    )


_NOISE = (
    "oneDNN custom operations", "cuda drivers", "cuInit", "cpu_feature_guard",
    "rebuild TensorFlow with the appropriate compiler flags", "absl::InitializeLog",
    "AVX2 AVX512F", "Could not find cuda", "TF-TRT", "computation placer",
    "Unable to register cu", "port.cc:", "cudart_stub", "tensorflow/lite/python/",
    "All log messages before absl",
)


def _worth_showing(line: str) -> bool:
    return bool(line.strip()) and not any(n in line for n in _NOISE)


def _last_frames(text: str, limit: int = 12) -> str:
    lines = [ln for ln in text.rstrip().splitlines() if ln.strip()]
    return "\n".join(lines[-limit:])


def temporary_workdir(task: str):
    """A private temporary folder for one worker run (removed afterwards)."""
    return tempfile.TemporaryDirectory(prefix=f"keras_mvit2_{task}_")


# --------------------------------------------------------------------------------------
# Worker side


class WorkerContext:
    """What every task gets in the worker: the job, the twin and helpers."""

    def __init__(self, job: Mapping[str, Any]):
        self.job = job
        self.start = time.monotonic()

    def log(self, message: str) -> None:
        print(f"[{time.monotonic() - self.start:7.1f} s] {message}", flush=True)

    def load_twin(self, class_override: Callable | None = None,
                  files: Mapping[str, Any] | None = None):
        """The tf_keras twin with the Keras 3 weights, checked on the reference images.

        `files` is a `write_model_files` entry (default: the job's ``model``).
        Returns `(twin, weight_map, max_abs_diff)`; `weight_map` maps each Keras 3
        variable path to the twin's variable.
        """
        from keras_mvit2.quantize import tf_keras_twin

        files = self.job["model"] if files is None else files
        with open(files["spec"]) as f:
            spec = json.load(f)
        twin = tf_keras_twin.build_twin(spec, class_override=class_override)
        with np.load(files["weights"]) as data:
            weights = {p: data[f"w{i}"] for i, p in enumerate(files["weight_paths"])}
        count = tf_keras_twin.transfer_weights(twin, weights)
        with np.load(files["reference"]) as data:
            x, expected = data["x"], data["y"]
        got = np.asarray(twin(x, training=False))
        diff = float(np.max(np.abs(got - expected)))
        scale = max(1.0, float(np.max(np.abs(expected))))
        self.log(
            f"tf_keras twin of {twin.name!r}: {len(twin.layers)} layers, {count} weight arrays "
            f"transferred by path; max |twin - keras3| on {len(x)} real images = {diff:.3g}"
        )
        if not np.isfinite(diff) or diff > 1e-3 * scale:
            raise tf_keras_twin.TwinError(
                f"The tf_keras twin does not reproduce the Keras 3 model: max abs difference "
                f"{diff:.3g} on the reference images (tolerance {1e-3 * scale:.3g}). Some layer "
                "computes differently under tf_keras; please report it with the model config."
            )
        return twin, tf_keras_twin.twin_weight_paths(twin), diff

    def dataset(self, info: Mapping[str, Any], *, batch_size: int, shuffle: bool,
                seed: int = 0):
        """A repeating `tf.data.Dataset` of `(x, y)` batches, and the steps of one epoch."""
        import tensorflow as tf

        x, y, sizes = load_arrays(info)
        y = y.astype(np.int64)
        if sizes is None:
            ds = tf.data.Dataset.from_tensor_slices((x, y))
            if shuffle:
                ds = ds.shuffle(min(len(x), 10_000), seed=seed, reshuffle_each_iteration=True)
            steps = -(-len(x) // batch_size)
            return ds.repeat().batch(batch_size).prefetch(2), steps
        bounds = np.cumsum([0, *sizes])

        def batches():
            for a, b in itertools.pairwise(bounds):
                yield x[a:b], y[a:b]

        spec = (
            tf.TensorSpec((None, *x.shape[1:]), tf.float32),
            tf.TensorSpec((None,), tf.int64),
        )
        ds = tf.data.Dataset.from_generator(batches, output_signature=spec)
        return ds.repeat().prefetch(2), len(sizes)

    def compile(self, model, learning_rate: float, *, metrics: bool = True) -> None:
        import tf_keras

        model.compile(
            optimizer=tf_keras.optimizers.Adam(learning_rate),
            loss=tf_keras.losses.SparseCategoricalCrossentropy(
                from_logits=not self.job["model"]["probabilities"]
            ),
            metrics=["accuracy"] if metrics else None,
        )

    def progress_callback(self, what: str, epochs: int, steps: int, every: int | None = None):
        import tf_keras

        context = self
        every = every or max(1, steps // 10)
        if not self.job.get("terminal", True):  # a log file: one line per epoch
            every = steps

        class Progress(tf_keras.callbacks.Callback):
            def on_epoch_begin(self, epoch, logs=None):
                self.epoch = epoch

            def on_train_batch_end(self, batch, logs=None):
                step = batch + 1
                if step % every == 0 or step == steps:
                    parts = " ".join(f"{k}={v:.4f}" for k, v in (logs or {}).items())
                    context.log(f"{what} epoch {self.epoch + 1}/{epochs} step {step}/{steps} "
                                f"{parts}")

        return Progress()

    def evaluate(self, model, info: Mapping[str, Any] | None, batch_size: int = 128):
        """Top-1 accuracy of `model` on a labelled array file (None without one)."""
        if info is None:
            return None
        x, y, _ = load_arrays(info)
        correct = 0
        for start in range(0, len(x), batch_size):
            out = np.asarray(model(x[start:start + batch_size], training=False))
            correct += int(np.sum(np.argmax(out, -1) == y[start:start + batch_size]))
        return correct / max(1, len(x))


def write_twin_weights(weight_map: Mapping[str, Any], path: str) -> None:
    """``{keras3 path: twin variable}`` -> an npz the parent reads with `read_weights`."""
    paths = list(weight_map)
    arrays = {f"w{i}": np.asarray(weight_map[p].numpy()) for i, p in enumerate(paths)}
    np.savez(path, __paths__=np.asarray(json.dumps(paths)), **arrays)


def _task_twin(ctx: WorkerContext) -> dict[str, Any]:
    """Builds the twin of each model and runs it on the job's images (no TFMOT)."""
    import tf_keras

    x, _, _ = load_arrays(ctx.job["images"])
    models = []
    for i, files in enumerate(ctx.job["models"]):
        twin, weight_map, diff = ctx.load_twin(files=files)
        outputs_path = os.path.join(os.path.dirname(ctx.job["result_path"]), f"twin_{i}.npz")
        outputs = [np.asarray(twin(x[i:i + 32], training=False)) for i in range(0, len(x), 32)]
        np.savez(outputs_path, y=np.concatenate(outputs))
        ours = [layer for m in [twin] for layer in m.submodules
                if type(layer).__module__.startswith("keras_mvit2.")]
        models.append({
            "reference_max_abs_diff": diff,
            "outputs": outputs_path,
            "num_weights": len(weight_map),
            "keras_mvit2_layers": sorted({type(layer).__name__ for layer in ours}),
            "all_tf_keras_layers": all(isinstance(layer, tf_keras.layers.Layer)
                                       for layer in ours),
        })
    return {"models": models}


def _tasks() -> dict[str, Callable[[WorkerContext], dict[str, Any]]]:
    import importlib

    # (importlib: the package's `qat` attribute is the function, not the module)
    qat_module = importlib.import_module("keras_mvit2.quantize.qat")
    sparsity_module = importlib.import_module("keras_mvit2.quantize.sparsity")
    return {
        "twin": _task_twin,
        "qat": qat_module.worker_qat,
        "prune": sparsity_module.worker_prune,
        "cluster": sparsity_module.worker_cluster,
    }


def _install_shim() -> None:
    import importlib.util
    import warnings

    warnings.filterwarnings("ignore")
    os.environ["TF_USE_LEGACY_KERAS"] = "1"
    here = os.path.dirname(WORKER_SCRIPT)
    spec = importlib.util.spec_from_file_location(
        "_keras_mvit2_twin_bootstrap", os.path.join(here, "tf_keras_twin.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.install_keras_shim()
    _stub_package_root()
    import tensorflow as tf

    tf.get_logger().setLevel("ERROR")
    import absl.logging

    absl.logging.set_verbosity(absl.logging.ERROR)


def _stub_package_root() -> None:
    """Registers ``keras_mvit2`` as a bare package, so that its ``__init__`` does not run.

    The worker needs the layers (``keras_mvit2.layers``, with their registry) and
    ``keras_mvit2.quantize``, not the rest of the package (data pipelines,
    visualization, ...), some of which subclasses Keras-3-only classes at import
    time. Submodules still import normally from the package folder.
    """
    import importlib.machinery
    import types

    if "keras_mvit2" in sys.modules:
        return
    root = os.path.dirname(os.path.dirname(WORKER_SCRIPT))
    package = types.ModuleType("keras_mvit2")
    package.__path__ = [root]
    package.__file__ = os.path.join(root, "__init__.py")
    package.__package__ = "keras_mvit2"
    package.__spec__ = importlib.machinery.ModuleSpec("keras_mvit2", None, is_package=True)
    package.__spec__.submodule_search_locations = [root]
    package.__version__ = "worker"
    sys.modules["keras_mvit2"] = package


def main(argv: list[str]) -> int:
    """Worker entry point: ``python _worker.py job.json``."""
    # Run as a script: its folder is sys.path[0]; drop it so that nothing there
    # shadows a top-level module.
    here = os.path.dirname(WORKER_SCRIPT)
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    with open(argv[1]) as f:
        job = json.load(f)
    result_path = job["result_path"]
    try:
        _install_shim()
        ctx = WorkerContext(job)
        ctx.log(f"task {job['task']!r}: TensorFlow + tf_keras + TFMOT worker started")
        result = _tasks()[job["task"]](ctx)
        result = {"ok": True, **result, "worker_seconds": time.monotonic() - ctx.start}
        code = 0
    except BaseException as err:
        result = {
            "ok": False,
            "type": type(err).__name__,
            "message": str(err),
            "traceback": traceback.format_exc(),
        }
        traceback.print_exc()
        code = 1
    tmp = result_path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(result, f, default=_json_default)
    os.replace(tmp, result_path)
    return code


def _json_default(value):
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    return str(value)


if __name__ == "__main__":
    sys.exit(main(sys.argv))


def image_input_shape(model) -> tuple[int, ...]:
    """The model's static `(batch, height, width, channels)` input shape, or a clear error."""
    shape = tuple(model.inputs[0].shape)
    if len(shape) != 4 or any(d is None for d in shape[1:]):
        raise ValueError(
            "keras_mvit2.quantize needs an image model with a static input shape "
            f"(batch, height, width, channels). Received: input shape {shape}"
        )
    return shape


def path_get(obj: Any, path: str) -> Any:
    """The attribute / list item at dotted `path` of `obj` ("qkv_proj.kernel", "blocks.0")."""
    for part in path.split("."):
        obj = obj[int(part)] if part.isdigit() else getattr(obj, part)
    return obj


def path_set(obj: Any, path: str, value: Any) -> None:
    """Sets the attribute at dotted `path` of `obj` (see `path_get`)."""
    head, _, last = path.rpartition(".")
    setattr(path_get(obj, head) if head else obj, last, value)


def stage_training_data(model, train_data, workdir: str, *, batch_size: int,
                        steps_per_epoch: int | None):
    """Reads `train_data` for `model` and saves it for the worker.

    Returns `(x, y, path, steps)`: the images and integer labels read, the `.npz` the
    worker trains on, and the steps per epoch (`steps_per_epoch`, or one pass).
    """
    input_shape = image_input_shape(model)
    num_classes = int(model.outputs[0].shape[-1])
    limit = steps_per_epoch * batch_size if steps_per_epoch else None
    x, y, sizes = labelled_arrays(
        train_data, input_shape=input_shape, what="train_data", batch_size=batch_size,
        max_batches=steps_per_epoch, split="train", limit=limit,
    )
    y = integer_labels(y, num_classes, "train_data")
    path = save_arrays(os.path.join(workdir, "train.npz"), x, y, sizes)
    steps = steps_per_epoch or (len(sizes) if sizes else math.ceil(len(x) / batch_size))
    return x, y, path, steps

