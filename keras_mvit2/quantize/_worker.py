"""The tf_keras / TFMOT worker process of `keras_mvit2.quantize` (the child side).

Started by `keras_mvit2.quantize._worker_client.run_worker` as
``python -u <this file> job.json`` (see that module for the job files and the
protocol). `main` installs the ``keras`` shim (tf_keras underneath) before anything
imports Keras 3, registers ``keras_mvit2`` as a bare package (its ``__init__``
does not run), runs the job's task (`_task_twin`, or the TFMOT tasks of
`keras_mvit2.quantize.sparsity`) with a
`WorkerContext`, and writes ``result.json``.

Run as a script, this module imports only the standard library and numpy at the
top: keras_mvit2 modules are imported inside the functions, once the shim and the
bare package are in place.
"""

from __future__ import annotations

import itertools
import json
import os
import sys
import time
import traceback
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

_HERE = os.path.dirname(os.path.abspath(__file__))

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

        `files` is a `twin_transfer.write_model_files` entry (default: the job's ``model``).
        Returns `(twin, weight_map, max_abs_diff)`; `weight_map` maps each Keras 3
        variable path to the twin's variable.
        """
        from keras_mvit2.quantize import tf_keras_twin, twin_transfer

        files = self.job["model"] if files is None else files
        with open(files["spec"]) as f:
            spec = json.load(f)
        twin = tf_keras_twin.build_twin(spec, class_override=class_override)
        with np.load(files["weights"]) as data:
            weights = {p: data[f"w{i}"] for i, p in enumerate(files["weight_paths"])}
        count = twin_transfer.transfer_weights(twin, weights)
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
        return twin, twin_transfer.twin_weight_paths(twin), diff

    def dataset(self, info: Mapping[str, Any], *, batch_size: int, shuffle: bool,
                seed: int = 0):
        """A repeating `tf.data.Dataset` of `(x, y)` batches, and the steps of one epoch."""
        import tensorflow as tf

        from keras_mvit2.quantize._worker_common import load_arrays

        x, y, sizes = load_arrays(info)
        y = y.astype(np.int64)  # (N,) class indices
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
            tf.TensorSpec((None, *y.shape[1:]), tf.as_dtype(y.dtype)),
        )
        ds = tf.data.Dataset.from_generator(batches, output_signature=spec)
        return ds.repeat().prefetch(2), len(sizes)

    def compile(self, model, learning_rate: float, *, metrics: bool = True,
                soft_targets: bool = False) -> None:
        """Adam and cross-entropy against class indices, or against `(N, classes)` soft
        targets (`soft_targets`: the float model's probabilities; "accuracy" is then the
        share of images whose top-1 matches the targets')."""
        import tf_keras

        loss = (tf_keras.losses.CategoricalCrossentropy if soft_targets
                else tf_keras.losses.SparseCategoricalCrossentropy)
        model.compile(
            optimizer=tf_keras.optimizers.Adam(learning_rate),
            loss=loss(from_logits=not self.job["model"]["probabilities"]),
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
        from keras_mvit2.quantize._worker_common import load_arrays

        x, y, _ = load_arrays(info)
        correct = 0
        for start in range(0, len(x), batch_size):
            out = np.asarray(model(x[start:start + batch_size], training=False))
            correct += int(np.sum(np.argmax(out, -1) == y[start:start + batch_size]))
        return correct / max(1, len(x))


def _task_twin(ctx: WorkerContext) -> dict[str, Any]:
    """Builds the twin of each model and runs it on the job's images (no TFMOT)."""
    import tf_keras

    from keras_mvit2.quantize._worker_common import load_arrays

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
    from keras_mvit2.quantize.sparsity import worker_cluster, worker_prune

    return {
        "twin": _task_twin,
        "prune": worker_prune,
        "cluster": worker_cluster,
    }


def _install_shim() -> None:
    import importlib.util
    import warnings

    warnings.filterwarnings("ignore")
    os.environ["TF_USE_LEGACY_KERAS"] = "1"
    spec = importlib.util.spec_from_file_location(
        "_keras_mvit2_twin_bootstrap", os.path.join(_HERE, "tf_keras_twin.py")
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
    root = os.path.dirname(_HERE)
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
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
    with open(argv[1]) as f:
        job = json.load(f)
    result_path = job["result_path"]
    try:
        _install_shim()
        ctx = WorkerContext(job)
        ctx.log(f"task {job['task']!r}: TensorFlow + tf_keras + TFMOT worker started")
        from keras_mvit2.layers import export_forms

        # The forms the parent's export traces (`export_forms.INT8` for QAT).
        with export_forms.tracing(export_forms.ExportForms(**job.get("forms", {}))):
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
