"""Trains on one Keras backend, in a process of its own, for tests/test_backend_training.py.

Like `backend_worker.py`: the backend is fixed when Keras is imported, and on PyTorch this
process must not import TensorFlow (it reports whether anything did; on JAX the tf.data
input loads it, as it may).

Usage:
    KERAS_BACKEND=torch python tests/backend_training_worker.py JOB.json RESULT.json

JOB.json: `{"folder": str, "strategy": "default" | "mirrored", "weights": str | None}`. The
worker trains `tiny_mvit2` (tests/tiny_model.py; from `weights`, a `.weights.h5` with its
classifier, when given) on 64 Fashion-MNIST images, 2 epochs of 3 steps, with
the recipe (AdamW without decay on 1-D weights, warm-up + cosine, label smoothing,
clipping, an EMA with warm-up), three times in `folder`:

- `a/`: uninterrupted; every step's loss is recorded, and around the second optimizer step
  the EMA's averages before it, the classifier's weights after it and the averages after it
  are saved (`ema_step.npz`: `before_<i>`, `weights_<i>`, `after_<i>`, and `step`) for the
  test's numpy transcription of the update;
- `b/`: killed before the first step of epoch 2 (after epoch 1's checkpoint), then trained
  again with the same config: it resumes from the checkpoint.

RESULT.json: the backend, `tf_loaded`, the number of replicas and global batch, the Keras
distribution in effect while `fit` ran (its class name: `DataParallel`, or `NoneType`), the step
losses, the files of `a/` and its checkpoints, the resumed run's first epoch and last step,
the largest |difference| between the last checkpoints of `a/` and `b/` (every array: the
classifier, the EMA's averages, the optimizer's moments and step) and their count, and
what `a/model.keras` / `a/model_ema.keras` predict for 8 test images (largest |sum - 1| of
the probabilities, the largest |raw - EMA| probability difference), the errors of what the
backend refuses (`refused`: multi-scale training; TFRecords input, which needs tf.data),
and seconds per phase.
"""

import json
import os
import sys
import time

import keras  # KERAS_BACKEND is set by the caller
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))


class _KilledError(RuntimeError):
    pass


class _KillAtEpoch2(keras.callbacks.Callback):
    """Stops the run before the first step of epoch 2, as a kill would."""

    def on_train_batch_begin(self, batch, logs=None):
        if int(self.model.optimizer.iterations.numpy()) == 3:
            raise _KilledError("killed before the first step of epoch 2")


class _Record(keras.callbacks.Callback):
    """Every step's loss, and the EMA update of the second optimizer step (`ema_step.npz`)."""

    def __init__(self, losses: list, ema_path: str):
        super().__init__()
        self.losses, self.ema_path = losses, ema_path
        self.before = None
        self.distribution = None

    def on_train_batch_begin(self, batch, logs=None):
        trainer = self.model  # JAX: the step's state synced into the variables
        if int(trainer.optimizer.iterations.numpy()) == 1:
            self.before = trainer.ema.averaged_values()

    def on_train_batch_end(self, batch, logs=None):
        self.losses.append(float(logs["loss"]))
        self.distribution = type(keras.distribution.distribution()).__name__  # in `fit`
        trainer = self.model
        step = int(trainer.optimizer.iterations.numpy())
        if step == 2:  # after this step's EMA update (the trainer's `step_callbacks` run first)
            weights = [keras.ops.convert_to_numpy(v.value) for v in trainer.ema.targets]
            arrays = {"step": np.asarray(step)}
            for i, (b, w, a) in enumerate(zip(self.before, weights,
                                              trainer.ema.averaged_values(), strict=True)):
                arrays[f"before_{i}"], arrays[f"weights_{i}"], arrays[f"after_{i}"] = b, w, a
            np.savez(self.ema_path, **arrays)


def _config(folder: str, strategy: str, weights: str | None = None) -> dict:
    """The runs' config (the test's TensorFlow reference run uses it too)."""
    return {
        "model": {"name": "tiny_mvit2", "image_size": 32, "num_classes": 10,
                  "weights": weights, "new_head": weights is None},
        "data": {"source": "fashion_mnist", "train_limit": 64, "validation_split": None,
                 "batch_size": 8 if strategy == "mirrored" else 16, "crop_ratio": 1.0},
        "optimizer": {"lr": 0.004, "reference_batch_size": 16, "weight_decay": 0.05,
                      "clip_global_norm": 1.0},
        "schedule": {"warmup_steps": 1, "warmup_init_lr": 1e-4, "min_lr": 1e-4},
        "augment": {"rrc_scale": [0.6, 1.0]},
        "ema": {"decay": 0.99, "warmup": True},
        "training": {"epochs": 2, "steps_per_epoch": 3, "precision": "float32",
                     "validate_every": 0, "label_smoothing": 0.1, "strategy": strategy},
        "output": {"dir": folder, "verbose": 0, "tensorboard": False, "keep_checkpoints": 2},
    }


def _max_diff(a_path: str, b_path: str) -> tuple[float, int]:
    """Largest |difference| between two checkpoints' arrays, and how many were compared."""
    import h5py

    def arrays(path: str) -> dict:
        found = {}
        with h5py.File(path, "r") as f:
            f.visititems(lambda name, item: found.__setitem__(name, item[()])
                         if isinstance(item, h5py.Dataset) else None)
        return found

    a, b = arrays(a_path), arrays(b_path)
    if a.keys() != b.keys():
        raise AssertionError(f"the checkpoints hold other arrays: {sorted(a.keys() ^ b.keys())}")
    diffs = [float(np.abs(np.asarray(a[k], np.float64) - np.asarray(b[k], np.float64)).max(
        initial=0.0)) for k in a]
    return max(diffs), len(diffs)


def _predict(folder: str) -> dict:
    from keras_mvit2.data import py_augment
    from keras_mvit2.data.files import load_fashion_mnist_arrays

    images, _ = load_fashion_mnist_arrays("test")
    x = np.stack([py_augment.eval_transform(im[..., None], (32, 32), 1.0) for im in images[:8]])
    raw = keras.saving.load_model(os.path.join(folder, "model.keras"))
    ema = keras.saving.load_model(os.path.join(folder, "model_ema.keras"))
    p_raw = np.asarray(raw.predict(x, verbose=0))
    p_ema = np.asarray(ema.predict(x, verbose=0))
    return {"shape": list(p_raw.shape),
            "finite": bool(np.isfinite(p_raw).all() and np.isfinite(p_ema).all()),
            "max_sum_error": float(max(np.abs(p_raw.sum(-1) - 1).max(),
                                       np.abs(p_ema.sum(-1) - 1).max())),
            "max_raw_ema_diff": float(np.abs(p_raw - p_ema).max())}


def _multiscale_config(folder: str, strategy: str, weights: str | None = None) -> dict:
    """`_config` trained on batches of 64x64 and 32x32 (the test's TensorFlow reference
    multi-scale run uses it too): `multiscale_batch_pairs` gives (64, 16) and (32, 64)
    (8 and 32 per device on 2 devices)."""
    config = _config(folder, strategy, weights)
    config["model"] = {**config["model"], "image_size": 64}
    config["multiscale"] = {"enabled": True, "scales": [0.5, 1.0]}
    return config


class _Shapes(keras.callbacks.Callback):
    """Keeps the trainer's batch shapes (a list of `[shape, steps]`) when training ends."""

    def __init__(self, found: list):
        super().__init__()
        self.found = found

    def on_train_end(self, logs=None):
        self.found[:] = sorted([list(shape), n] for shape, n in
                               self.model.batch_shapes.items())


def _multiscale(folder: str, strategy: str, weights: str | None) -> dict:
    """A multi-scale run here: its step losses and batch shapes."""
    from keras_mvit2 import training

    losses: list = []
    shapes: list = []
    training.train(_multiscale_config(os.path.join(folder, "multiscale"), strategy, weights),
                   callbacks=[_Record(losses, os.path.join(folder, "multiscale_ema.npz")),
                              _Shapes(shapes)])
    return {"losses": losses, "batch_shapes": shapes}


def _refusals(folder: str, strategy: str) -> dict:
    """The messages of what this backend refuses: multi-scale training (PyTorch),
    TFRecords input."""
    from keras_mvit2 import training

    messages = {}
    refused = [("tfrecords", {"data": {"source": "tfrecords",
                                       "train": os.path.join(folder, "*.tfrec")}})]
    if keras.backend.backend() != "jax":
        refused.append(("multiscale", {"multiscale": {"enabled": True}}))
    for name, change in refused:
        config = _config(os.path.join(folder, name), strategy)
        for section, values in change.items():
            config[section] = {**config.get(section, {}), **values}
        try:
            training.train(config)
            messages[name] = None
        except Exception as err:
            messages[name] = f"{type(err).__name__}: {err}"
    return messages


def main(job_path: str, result_path: str) -> None:
    with open(job_path) as f:
        job = json.load(f)
    start = time.perf_counter()
    import tiny_model  # noqa: F401  (registers tiny_mvit2)

    from keras_mvit2 import training

    folder, strategy = job["folder"], job.get("strategy", "default")
    weights = job.get("weights")
    if keras.backend.backend() == "jax":  # the three runs compile the same programs: once
        import jax

        jax.config.update("jax_compilation_cache_dir", os.path.join(folder, "jax_cache"))
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    seconds = {}
    losses: list = []
    record = _Record(losses, os.path.join(folder, "ema_step.npz"))
    a_dir, b_dir = os.path.join(folder, "a"), os.path.join(folder, "b")
    t = time.perf_counter()
    a = training.train(_config(a_dir, strategy, weights),
                       callbacks=[record])
    seconds["train"] = time.perf_counter() - t
    t = time.perf_counter()
    try:
        training.train(_config(b_dir, strategy, weights), callbacks=[_KillAtEpoch2()])
        killed = False
    except _KilledError:
        killed = True
    resumed = training.train(_config(b_dir, strategy, weights))
    seconds["kill_and_resume"] = time.perf_counter() - t
    t = time.perf_counter()
    result = {
        "backend": keras.backend.backend(),
        "num_replicas": a.num_replicas,
        "distribution_in_fit": record.distribution,
        "global_batch_size": a.global_batch_size,
        "losses": losses,
        "history_loss": [h["loss"] for h in a.history],
        "optimizer_step": a.optimizer_step,
        "files": sorted(os.listdir(a_dir)),
        "checkpoints": sorted(os.listdir(os.path.join(a_dir, "checkpoints"))),
        "killed": killed,
        "resumed_initial_epoch": resumed.initial_epoch,
        "resumed_optimizer_step": resumed.optimizer_step,
        "resume_checkpoint_diff": _max_diff(a.checkpoint_path, resumed.checkpoint_path),
        "predict": _predict(a_dir),
    }
    seconds["compare"] = time.perf_counter() - t
    result["refused"] = _refusals(folder, strategy)
    if keras.backend.backend() == "jax":
        t = time.perf_counter()
        result["multiscale"] = _multiscale(folder, strategy, weights)
        seconds["multiscale"] = time.perf_counter() - t
    result["tf_loaded"] = "tensorflow" in sys.modules
    result["seconds"] = {**seconds, "total": time.perf_counter() - start}
    with open(result_path, "w") as f:
        json.dump(result, f, indent=2)


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(HERE))
    sys.path.insert(0, HERE)
    main(sys.argv[1], sys.argv[2])
