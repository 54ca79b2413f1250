"""The parent side of the tf_keras / TFMOT worker of `keras_mvit2.quantize`: it prepares
the job files, starts the worker process and turns its failures into errors.

TFMOT must never be imported in the user's Keras 3 process (it sets
``TF_USE_LEGACY_KERAS=1`` and flips ``tf.keras`` to tf_keras for the rest of the
process), so `prune` and `cluster` run their TFMOT work in a child process
started with ``python -u keras_mvit2/quantize/_worker.py job.json`` (`WORKER_SCRIPT`;
the child's code is in `keras_mvit2.quantize._worker`):

* The parent (`run_worker`) writes into a private temporary folder:
  ``job.json`` (the task and its options, and whether the user's standard output is a
  terminal: the progress is one line per epoch otherwise), ``spec.json`` (the Keras 3 model's
  class and config, see `tf_keras_twin.model_spec`), ``weights.npz`` (every
  weight, keyed by its Keras 3 variable path), ``reference.npz`` (a few real
  images and the Keras 3 model's outputs on them: the worker's twin must
  reproduce them; these three by `twin_transfer.write_model_files`) and the data
  files (below).
* The worker installs the ``keras`` shim (tf_keras underneath), imports
  keras_mvit2 and TFMOT, rebuilds the model as a tf_keras twin, checks it
  against the reference outputs, runs the task and writes ``result.json``
  (``{"ok": true, ...}`` or ``{"ok": false, "type", "message", "traceback"}``).
  Its output (progress lines) is streamed to the parent's stdout as it comes.
* A failure in the worker becomes a `QuantizationWorkerError` in the parent, with
  the worker's exception type, message and the last frames of its traceback.

The job file, the streamed output and the result file are `keras_mvit2.backend.child`'s
protocol (`run_child`), the one the phone-files export child uses too; the worker, run as
a script before the package can be imported, writes its result file in that format itself.

Data files: see `keras_mvit2.quantize._worker_common` (images stored as uint8 when
that is lossless). Datasets are materialized: one epoch's worth of batches
(``steps_per_epoch`` of them) is written once and replayed in the same order in
every epoch, so random augmentation is frozen to that one pass.
"""

from __future__ import annotations

import math
import os
import sys
import tempfile
from typing import TYPE_CHECKING, Any

import numpy as np

from keras_mvit2.backend.child import run_child
from keras_mvit2.quantize._worker_common import save_arrays

if TYPE_CHECKING:
    import keras

__all__ = [
    "OUTPUT_PREFIX",
    "WORKER_SCRIPT",
    "QuantizationWorkerError",
    "image_input_shape",
    "integer_labels",
    "labelled_arrays",
    "load_keras_model",
    "run_worker",
    "stage_training_data",
    "temporary_workdir",
]

#: Worker start command: the worker module run as a script (not `-m`, which would
#: import keras_mvit2 and with it Keras 3 before the shim is installed).
WORKER_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_worker.py")
_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(WORKER_SCRIPT)))
_TAIL_LINES = 60
#: Prefix of the worker's lines on the user's console.
OUTPUT_PREFIX = "[tfmot worker] "


class QuantizationWorkerError(RuntimeError):
    """The tf_keras/TFMOT worker process failed.

    Attributes:
        task: ``"prune"``, ``"cluster"`` or ``"twin"``.
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
# The user's data and model


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



def load_keras_model(model_or_path: Any) -> keras.Model:
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
        # Registers the layer classes for loading (the package root, which imports these,
        # is already imported here: Python imports it before keras_mvit2.quantize).
        import keras_mvit2.layers
        import keras_mvit2.tasks  # noqa: F401

        return keras.saving.load_model(path)
    if not isinstance(model_or_path, keras.Model):
        raise ValueError(
            "model must be a Keras 3 keras.Model or the path of a .keras file. Received: "
            f"{type(model_or_path).__name__}"
        )
    return model_or_path



def image_input_shape(model) -> tuple[int, ...]:
    """The model's static `(batch, height, width, channels)` input shape, or a clear error."""
    shape = tuple(model.inputs[0].shape)
    if len(shape) != 4 or any(d is None for d in shape[1:]):
        raise ValueError(
            "keras_mvit2.quantize needs an image model with a static input shape "
            f"(batch, height, width, channels). Received: input shape {shape}"
        )
    return shape



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


# --------------------------------------------------------------------------------------
# Running the worker


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

    env = dict(os.environ)
    env["TF_USE_LEGACY_KERAS"] = "1"          # the child only; the parent's env is unchanged
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (_PACKAGE_ROOT, env.get("PYTHONPATH", "")) if p
    )

    def show(line: str) -> None:
        if verbose and _worth_showing(line):
            print(OUTPUT_PREFIX + line, flush=True)

    # The worker's stdout is a pipe: it is told whether the user's is a terminal (progress
    # every tenth of an epoch) or a log file (one line per epoch).
    run = run_child([sys.executable, "-u", WORKER_SCRIPT],
                    dict(job, task=task, terminal=stdout_is_terminal()), workdir,
                    result_key="result_path", env=env, on_line=show,
                    tail_lines=_TAIL_LINES, timeout=timeout)
    result, returncode, output_tail = run.result, run.returncode, run.tail
    if run.ok:
        return result
    if run.failed:
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
        f"ran past its time limit of {timeout:g} s and was stopped" if run.timed_out
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


def temporary_workdir(task: str) -> tempfile.TemporaryDirectory[str]:
    """A private temporary folder for one worker run (removed afterwards)."""
    return tempfile.TemporaryDirectory(prefix=f"keras_mvit2_{task}_")
