"""Training on Keras' JAX and PyTorch backends: the recipe, checkpoints, resume, the EMA.

Each backend trains in a process of its own (`tests/backend_training_worker.py`): `tiny_mvit2`
on 64 Fashion-MNIST images, 2 epochs of 3 steps, three runs (uninterrupted; killed after
epoch 1 and resumed). The tests check what the runs did:

- the loss is finite and lower after epoch 2 than after epoch 1; the run folder holds
  `config.yaml`, `run.json`, `metrics.json`, both models and one checkpoint per epoch;
- the resumed run starts at epoch 1 and ends at the same optimizer step with the same
  checkpoint, bit for bit, as the uninterrupted one (weights, EMA, optimizer state);
- `model.keras` / `model_ema.keras` load and predict probabilities, and differ;
- the EMA update of one optimizer step is the formula of `ExponentialMovingAverage`
  (numpy transcription below) with the warm-up decay at that step, on every averaged
  weight, BatchNorm statistics included;
- PyTorch: TensorFlow is never loaded; multi-scale training and TFRecords input are
  refused with the backend and the fix named;
- JAX trains multi-scale (batches of 64x64 and 32x32) with TensorFlow's batch shapes and
  step losses (within 1e-5; measured 2.4e-7), PyTorch refuses it;
- JAX computes TensorFlow's steps: every run starts from one `start.keras`, and a run of
  the same config here on TensorFlow (its own train step, one device) gives the JAX run's
  step losses within 1e-5 (measured 2.4e-7) and its raw and EMA weights within 1e-3
  (measured 2.8e-4: after 6 Adam steps of at most 0.004).

JAX trains with `training.strategy: mirrored`, i.e. `keras.distribution.DataParallel` over
2 host devices (`XLA_FLAGS=--xla_force_host_platform_device_count=2`), 8 images per device:
the distributed path, whose losses match one device's (measured: within 3e-7).
Measured on 2 shared, busy cores: the PyTorch worker 3-12 s, the JAX worker 27-36 s (a
persistent compilation cache lets its three runs compile once); the file 41-53 s.
"""

import os

import keras
import numpy as np
import pytest
from backend_training_worker import _config, _multiscale_config, _Record, _Shapes
from test_backends import run_worker
from tiny_model import tiny_mvit2

from keras_mvit2 import training

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "backend_training_worker.py")
FASHION = "/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz"
EMA_DECAY = 0.99  # the worker's config: ema.decay, with warm-up
TWO_HOST_DEVICES = {"XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
#: PyTorch on one CPU thread: with two OpenMP threads on 2 shared, busy cores (pytest-xdist
#: beside it) steps took 1-9 s in bursts instead of 0.1 s (the threads spin-wait for each
#: other); one thread ran every step in 0.11-0.12 s (MobileViTV2-0.5, batch 32, 32x32).
ONE_THREAD = {"OMP_NUM_THREADS": "1"}

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not os.path.exists(FASHION),
                       reason="Debian's dataset-fashion-mnist is not installed"),
]


def ema_update(before: np.ndarray, weight: np.ndarray, step: int, decay: float) -> np.ndarray:
    """`ExponentialMovingAverage.update` after optimizer step `step`, with warm-up:
    `d = min(decay, (1 + step) / (10 + step))`, `ema = d * ema + (1 - d) * weight`."""
    d = np.float32(min(decay, (1.0 + step) / (10.0 + step)))
    return d * before.astype(np.float32) + (np.float32(1.0) - d) * weight.astype(np.float32)


@pytest.fixture(scope="module")
def tensorflow_run(tmp_path_factory) -> dict:
    """The worker's first run here, on TensorFlow (`ClassifierTrainer`'s own train step),
    from a `tiny_mvit2` saved as `start.keras` that every backend's runs start from."""
    assert keras.backend.backend() == "tensorflow"
    folder = tmp_path_factory.mktemp("train_tensorflow")
    keras.utils.set_random_seed(0)
    start = folder / "start.keras"
    tiny_mvit2(input_shape=(32, 32, 3), classes=10, classifier_activation=None).save(start)
    losses: list = []
    result = training.train(_config(str(folder / "run"), "default", str(start)),
                            callbacks=[_Record(losses, str(folder / "ema_step.npz"))])
    return {"start": str(start), "losses": losses, "model_path": result.model_path,
            "ema_model_path": result.ema_model_path}


@pytest.fixture(scope="module")
def tensorflow_multiscale_run(tmp_path_factory, tensorflow_run) -> dict:
    """The worker's multi-scale run (64x64 and 32x32 batches), here on TensorFlow
    (`ClassifierTrainer`'s `tf.function` for every shape), from the same `start.keras`."""
    folder = tmp_path_factory.mktemp("multiscale_tensorflow")
    losses: list = []
    shapes: list = []
    training.train(_multiscale_config(str(folder / "run"), "default", tensorflow_run["start"]),
                   callbacks=[_Record(losses, str(folder / "ema_step.npz")), _Shapes(shapes)])
    return {"losses": losses, "batch_shapes": shapes}


@pytest.fixture(scope="module", params=["torch", "jax"])
def run(request, tmp_path_factory, tensorflow_run):
    backend = request.param
    folder = tmp_path_factory.mktemp(f"train_{backend}")
    strategy, env = ("mirrored", TWO_HOST_DEVICES) if backend == "jax" else ("default",
                                                                              ONE_THREAD)
    job = {"folder": str(folder / "run"), "strategy": strategy,
           "weights": tensorflow_run["start"]}
    result = run_worker(backend, job, folder, worker=WORKER, env=env)
    return backend, folder, result


def test_trains_and_writes_the_run_folder(run, capsys):
    backend, _, result = run
    with capsys.disabled():
        print(f"\n[{backend}] epoch losses {result['history_loss']}, "
              f"{result['num_replicas']} replica(s), seconds {result['seconds']}")
    assert result["backend"] == backend
    assert result["num_replicas"] == (2 if backend == "jax" else 1)
    # JAX: the batches are split over the devices while `fit` runs, not only the weights.
    assert result["distribution_in_fit"] == ("DataParallel" if backend == "jax" else "NoneType")
    assert result["global_batch_size"] == 16 and result["optimizer_step"] == 6
    losses = result["history_loss"]
    assert np.all(np.isfinite(result["losses"])) and len(result["losses"]) == 6
    assert losses[1] < losses[0], losses
    assert set(result["files"]) >= {"config.yaml", "run.json", "metrics.json", "model.keras",
                                    "model_ema.keras", "checkpoints"}
    assert result["checkpoints"] == ["epoch_0001.weights.h5", "epoch_0002.weights.h5",
                                     "state.json"]


def test_resume_continues_with_identical_weights(run):
    _, _, result = run
    assert result["killed"]
    assert result["resumed_initial_epoch"] == 1 and result["resumed_optimizer_step"] == 6
    max_diff, arrays = result["resume_checkpoint_diff"]
    assert arrays > 50  # classifier, EMA averages, optimizer moments and step
    assert max_diff == 0.0


def test_saved_models_load_and_predict(run):
    _, _, result = run
    predict = result["predict"]
    assert predict["shape"] == [8, 10] and predict["finite"]
    assert predict["max_sum_error"] < 1e-5  # softmax probabilities
    assert predict["max_raw_ema_diff"] > 1e-4  # the EMA model has its own weights


def test_ema_update_is_the_formula(run):
    _, folder, _ = run
    with np.load(folder / "run" / "ema_step.npz") as saved:
        arrays = dict(saved)
    step = int(arrays.pop("step"))
    assert step == 2
    count = len(arrays) // 3
    assert count > 10  # every float weight of tiny_mvit2, BatchNorm statistics included
    moved = 0
    for i in range(count):
        before, weight, after = (arrays[f"{k}_{i}"] for k in ("before", "weights", "after"))
        expected = ema_update(before, weight, step, EMA_DECAY)
        np.testing.assert_allclose(after, expected, rtol=1e-6, atol=1e-7, err_msg=f"weight {i}")
        moved += not np.array_equal(after, weight)
    assert moved > count // 2  # the averages are not the raw weights


def test_what_the_backend_refuses_names_the_fix(run):
    backend, _, result = run
    refused = result["refused"]
    if backend == "torch":
        assert ("multi-scale training runs on the TensorFlow and JAX backends only"
                in refused["multiscale"])
        assert "'torch'" in refused["multiscale"]
        assert "multiscale.enabled=false" in refused["multiscale"]
        assert not result["tf_loaded"], "training on PyTorch imported TensorFlow"
        assert refused["tfrecords"].startswith("TensorFlowBackendRequiredError")
        assert "KERAS_BACKEND=jax" in refused["tfrecords"]
    else:  # JAX reads TFRecords with tf.data: the error is about the missing files
        assert "TensorFlowBackendRequiredError" not in refused["tfrecords"]


def test_jax_computes_tensorflows_steps(run, tensorflow_run):
    backend, folder, result = run
    if backend != "jax":
        pytest.skip("PyTorch reads other batches than tf.data (numpy / PIL crops and flips)")
    # The same data (tf.data, same seeds) and start: Keras' step with the optimizer's global
    # clipping and the EMA callback, on 2 devices, gives TensorFlow's step's losses ...
    np.testing.assert_allclose(result["losses"], tensorflow_run["losses"], rtol=0, atol=1e-5)
    # ... and weights: within a fraction of one Adam step (at most lr = 0.004 per weight;
    # components with near-zero gradients may step either way after rounding differences).
    for name in ("model_path", "ema_model_path"):
        ours = keras.saving.load_model(tensorflow_run[name]).get_weights()
        theirs = keras.saving.load_model(folder / "run" / "a" / os.path.basename(
            tensorflow_run[name])).get_weights()
        diff = max(float(np.abs(a - b).max()) for a, b in zip(ours, theirs, strict=True))
        assert diff < 1e-3, (name, diff)


def test_jax_trains_multiscale_as_tensorflow(run, tensorflow_multiscale_run):
    """Multi-scale training on JAX (tf.data's batches of two sizes, one classifier for any
    size, one compiled step per shape, on 2 devices): every batch shape, the same number of
    steps, and TensorFlow's step losses from the same start and batches."""
    backend, _, result = run
    if backend != "jax":
        pytest.skip("PyTorch refuses multi-scale training (test above)")
    ours = result["multiscale"]
    shapes = ours["batch_shapes"]  # [shape, steps], sorted; global batches (8 / 32 a device)
    assert shapes == tensorflow_multiscale_run["batch_shapes"]
    assert [shape for shape, _ in shapes] == [[16, 64, 64, 3], [64, 32, 32, 3]]
    assert sum(n for _, n in shapes) == 6
    np.testing.assert_allclose(ours["losses"], tensorflow_multiscale_run["losses"], rtol=0,
                               atol=1e-5)
