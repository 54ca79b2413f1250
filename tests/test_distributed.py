"""Distributed training on CPU: MirroredStrategy over 2 logical CPU devices, and
MultiWorkerMirroredStrategy with 2 local worker processes on loopback, each compared with
one replica at the same global batch (same data order, same initialization, no dropout,
synchronized BatchNorm).

Every run happens in a subprocess: logical devices must be configured before TensorFlow
initializes them, and a multi-worker strategy needs one process per worker. Processes are
bounded in time and always killed at the end.

Tolerance: the per-step training losses of the distributed runs match the single-replica
run to a relative 1e-4 (they differ only by the float32 summation order of the gradient
all-reduce and of the synchronized BatchNorm moments), and the trained models give the
same class probabilities on test images (absolute 1e-4).
"""

import functools
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest

import keras_mvit2  # noqa: F401 (registers the layers for loading the saved models)
from keras_mvit2.data import fashion_mnist, make_eval_dataset

FASHION = "/usr/share/datasets/fashion-mnist"
pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    not os.path.exists(os.path.join(FASHION, "train-images-idx3-ubyte.gz")),
    reason="Debian's dataset-fashion-mnist is not installed",
)]
TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
TIMEOUT_S = 420
LOSS_RTOL = 1e-4
PROB_ATOL = 1e-4

WORKER = textwrap.dedent(
    """
    import json, os, pathlib, sys
    mode, out = sys.argv[1], pathlib.Path(sys.argv[2])
    import tensorflow as tf
    if mode == "mirrored":
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    sys.path.insert(0, sys.argv[3])
    import keras
    from test_training import tiny_config  # registers tiny_mvit2
    from keras_mvit2 import training

    def run(name, strategy, batch_per_replica):
        config = tiny_config(
            out / name,
            model={"sync_batch_norm": True, "dropout": 0.0, "drop_path_rate": 0.0},
            data={"batch_size": batch_per_replica, "train_limit": 512,
                  "validation_split": None},
            ema={"enabled": False},
            optimizer={"reference_batch_size": 16},
            training={"epochs": 2, "steps_per_epoch": 5, "strategy": strategy},
        )
        losses = []
        record = keras.callbacks.LambdaCallback(
            on_train_batch_end=lambda batch, logs: losses.append(float(logs["loss"])))
        result = training.train(config, callbacks=[record])
        return {"losses": losses, "model": result.model_path,
                "replicas": result.num_replicas, "global_batch": result.global_batch_size,
                "lr": result.learning_rate, "step": result.optimizer_step}

    if mode == "mirrored":
        report = {"reference": run("reference", "default", 16),
                  "mirrored": run("mirrored", "mirrored", 8)}
    else:
        report = {"worker": run("multi_worker", "multi_worker", 8)}
    (out / f"{mode}_{os.environ.get('WORKER_INDEX', '0')}.json").write_text(json.dumps(report))
    """
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(tmp_path, mode: str, env_extra: dict | None = None) -> subprocess.Popen:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="-1",
               **(env_extra or {}))
    log = open(tmp_path / f"{mode}_{(env_extra or {}).get('WORKER_INDEX', '0')}.log", "w")
    return subprocess.Popen(
        [sys.executable, str(script), mode, str(tmp_path), TESTS_DIR],
        stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
    )


def _wait_all(procs: list[subprocess.Popen], tmp_path) -> None:
    """Waits for every process (bounded); kills all of them on timeout or failure."""
    try:
        for p in procs:
            p.wait(timeout=TIMEOUT_S)
        failed = [p for p in procs if p.returncode != 0]
        if failed:
            logs = "\n".join(
                f"--- {f.name}\n" + f.read_text()[-3000:] for f in sorted(tmp_path.glob("*.log"))
            )
            pytest.fail(f"worker(s) exited with {[p.returncode for p in failed]}:\n{logs}")
    except subprocess.TimeoutExpired:
        pytest.fail(f"distributed run did not finish in {TIMEOUT_S} s")
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


@functools.cache
def _test_images() -> np.ndarray:
    source = fashion_mnist("test", limit=64)
    return next(iter(make_eval_dataset(source, image_size=32, batch_size=64, num_classes=10,
                                       crop_ratio=1.0)))[0]


@functools.cache
def _predictions(path: str) -> np.ndarray:
    """What the saved model at `path` predicts for 64 test images (the reference run's model
    is compared by both tests: loaded once)."""
    return keras.saving.load_model(path).predict(_test_images(), verbose=0)


def _assert_same_run(run: dict, reference: dict) -> None:
    assert run["global_batch"] == reference["global_batch"] == 16
    assert run["lr"] == reference["lr"] and run["step"] == reference["step"] == 10
    a, b = np.array(run["losses"]), np.array(reference["losses"])
    assert a.shape == b.shape == (10,)
    np.testing.assert_allclose(a, b, rtol=LOSS_RTOL)
    assert b[0] > 2.0 and not np.allclose(b, b[0])  # a real, changing loss curve
    # The trained models compute the same function. (Single weights are not compared: a few
    # have an exactly-zero true gradient, e.g. a GroupNorm shift followed by a BatchNorm,
    # and Adam turns their float32 rounding noise into lr-sized random steps.)
    np.testing.assert_allclose(_predictions(run["model"]), _predictions(reference["model"]),
                               atol=PROB_ATOL)


@pytest.fixture(scope="module")
def mirrored_report(tmp_path_factory) -> dict:
    tmp_path = tmp_path_factory.mktemp("mirrored")
    _wait_all([_launch(tmp_path, "mirrored")], tmp_path)
    return json.loads((tmp_path / "mirrored_0.json").read_text())


def test_mirrored_two_cpu_replicas_match_one_replica(mirrored_report):
    reference, mirrored = mirrored_report["reference"], mirrored_report["mirrored"]
    assert (reference["replicas"], mirrored["replicas"]) == (1, 2)
    diff = np.max(np.abs(np.array(mirrored["losses"]) / np.array(reference["losses"]) - 1))
    print(f"MirroredStrategy (2 CPUs x 8) vs 1 replica x 16: max relative loss diff {diff:.2e}")
    _assert_same_run(mirrored, reference)


def test_multi_worker_two_processes_match_one_replica(mirrored_report, tmp_path):
    ports = [_free_port(), _free_port()]
    cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
    procs = [
        _launch(tmp_path, "multi_worker", {
            "TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": "worker", "index": i}}),
            "WORKER_INDEX": str(i),
        })
        for i in range(2)
    ]
    _wait_all(procs, tmp_path)
    chief = json.loads((tmp_path / "multi_worker_0.json").read_text())["worker"]
    other = json.loads((tmp_path / "multi_worker_1.json").read_text())["worker"]
    reference = mirrored_report["reference"]
    assert chief["replicas"] == other["replicas"] == 2
    assert other["model"] is None  # only the chief writes
    np.testing.assert_allclose(other["losses"], chief["losses"], rtol=1e-6)
    diff = np.max(np.abs(np.array(chief["losses"]) / np.array(reference["losses"]) - 1))
    print(f"MultiWorkerMirrored (2 workers x 8) vs 1 replica x 16: max relative diff {diff:.2e}")
    _assert_same_run(chief, reference)
