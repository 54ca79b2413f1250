"""Training recipe (`keras_mvit2.training`): configs, schedule, optimizer, EMA, stochastic
depth, clipping, resume after a kill, multi-scale, fine-tuning, evaluation, and what a
run leaves on disk.

The mechanics tests (resume, multi-scale, fine-tuning, a run's files) use `tiny_mvit2`, a
two-stage network made of the package's own layers (stem, InvertedResidual,
MobileViTV2Block with stochastic depth, classifier head), so that tracing stays cheap on 2
shared cores. Whether the real recipe learns (MobileViTV2-0.5, a few hundred steps on
Fashion-MNIST) is a benchmark: benchmarks/recipe_learns.py.
"""

import dataclasses
import glob
import json
import logging
import os
import shutil
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf
import yaml
from benchmark_scripts import load_benchmark
from tiny_model import tiny_mvit2

from keras_mvit2 import training
from keras_mvit2.layers.stochastic_depth import StochasticDepth
from keras_mvit2.models import MobileViTV2
from keras_mvit2.training import distribute
from keras_mvit2.training.determinism import (
    DETERMINISTIC_ENV,
    _make_deterministic,
    _onednn_enabled,
)
from keras_mvit2.training.epochs import _tensorboard_available
from keras_mvit2.training.optimizer import make_optimizer
from keras_mvit2.training.train_step import ClassifierTrainer

FASHION = "/usr/share/datasets/fashion-mnist"
needs_fashion = pytest.mark.skipif(
    not os.path.exists(os.path.join(FASHION, "train-images-idx3-ubyte.gz")),
    reason="Debian's dataset-fashion-mnist is not installed",
)


# `tiny_mvit2`: a tiny registered model built from the package's layers (`tiny_model.py`).


def tiny_config(tmp_path, **sections) -> training.TrainConfig:
    """A small Fashion-MNIST run of `tiny_mvit2`; `sections` update the defaults."""
    base = {
        "model": {"name": "tiny_mvit2", "image_size": 32, "num_classes": 10},
        "data": {"source": "fashion_mnist", "train_limit": 256, "validation_limit": 128,
                 "batch_size": 16, "eval_batch_size": 64, "crop_ratio": 1.0},
        "optimizer": {"lr": 0.002, "reference_batch_size": 16},
        "schedule": {"warmup_steps": 3, "min_lr": 1e-5},
        "augment": {"rrc_scale": [0.6, 1.0]},
        "ema": {"decay": 0.9, "warmup": False},
        "training": {"epochs": 2, "steps_per_epoch": 4, "precision": "float32",
                     "validate_every": 0},
        "output": {"dir": str(tmp_path / "run"), "verbose": 0, "tensorboard": False},
    }
    for name, values in sections.items():
        base[name] = {**base.get(name, {}), **values}
    return training.load_config(base)


# --------------------------------------------------------------------------------------
# Config validation
# --------------------------------------------------------------------------------------


def test_unknown_keys_are_named_with_the_valid_ones():
    with pytest.raises(ValueError, match=r"'optimizer\.lrr'.*Valid keys: name, lr,"):
        training.load_config({"optimizer": {"lrr": 0.1}})
    with pytest.raises(ValueError, match=r"Unknown config key 'optimiser'.*Valid keys: model"):
        training.load_config({"optimiser": {}})
    with pytest.raises(ValueError, match=r"augment.*\['foo'\].*Valid keys"):
        training.load_config({"augment": {"foo": 1}})


@pytest.mark.parametrize(
    "section, values, match",
    [
        ("optimizer", {"lr": "fast"}, r"optimizer\.lr must be a number. Received: lr='fast'"),
        ("optimizer", {"lr": -1}, r"optimizer\.lr must be > 0. Received: lr=-1"),
        ("data", {"batch_size": True}, r"batch_size must be an int. Received: batch_size=True"),
        ("data", {"batch_size": 0}, r"batch_size must be an int >= 1. Received: batch_size=0"),
        ("training", {"precision": "fp16"}, r"training\.precision must be one of 'auto'"),
        ("training", {"strategy": "horovod"}, r"training\.strategy must be one of 'default'"),
        ("model", {"name": "resnet50"}, r"model\.name must be one of \[.*mobilevitv2_050"),
        ("model", {"freeze_backbone": True}, r"freeze_backbone must be false unless"),
        ("ema", {"decay": 1.0}, r"ema\.decay must be in \[0, 1\). Received: decay=1.0"),
        ("schedule", {"name": "step"}, r"schedule\.name must be one of 'cosine', 'constant'"),
        ("data", {"source": "image_folder"}, r"data\.train must be the path"),
        ("multiscale", {"scales": [1.0, -2]}, r"multiscale\.scales must be a non-empty list"),
    ],
)
def test_bad_values_name_the_field_and_value(section, values, match):
    with pytest.raises(ValueError, match=match):
        training.load_config({section: values})


def test_overrides_and_yaml_round_trip(tmp_path):
    config = training.load_config(
        "fashion_mnist",
        ["optimizer.lr=0.001", "augment.rrc_scale=[0.35, 1]", "model.weights=null",
         "training.epochs=3"],
    )
    assert config.optimizer.lr == 0.001
    assert config.augment.rrc_scale == (0.35, 1.0)
    assert config.training.epochs == 3
    path = tmp_path / "c.yaml"
    config.save(path)
    assert training.load_config(path) == config
    assert yaml.safe_load(path.read_text())["optimizer"]["lr"] == 0.001
    for bad in ("optimizer.lr", "lr=0.1", "optimizer.adam.beta=1"):
        with pytest.raises(ValueError, match=r"section\.field=value"):
            training.load_config("fashion_mnist", [bad])
    with pytest.raises(ValueError, match=r"'optimizer\.foo'"):
        training.load_config("fashion_mnist", ["optimizer.foo=1"])
    with pytest.raises(FileNotFoundError, match="packaged config: fashion_mnist"):
        training.load_config(tmp_path / "missing.yaml")


def test_packaged_configs_are_the_papers_recipe():
    names = training.packaged_configs()
    widths = ["050", "075", "100", "125", "150", "175", "200"]
    for w in widths:
        c = training.load_config(f"imagenet_mobilevitv2_{w}")
        assert c.model.name == f"mobilevitv2_{w}" and c.model.image_size == 256
        o, s = c.optimizer, c.schedule
        assert (o.name, o.lr, o.reference_batch_size, o.weight_decay, o.clip_global_norm) == (
            "adamw", 0.002, 1024, 0.05, 10.0)
        assert o.no_decay_1d and (s.warmup_init_lr, s.min_lr) == (1e-6, 0.0002)
        # 20k warm-up iterations at batch 1024 on the 1,281,167 ImageNet-1k images
        assert round(s.warmup_epochs * 1281167 / 1024) == pytest.approx(20000, abs=20)
        assert c.data.batch_size * 8 == 1024 and c.training.label_smoothing == 0.1
        assert c.ema.enabled and c.ema.decay == 0.9995 and c.training.epochs == 300
        advanced = w not in ("050", "075")  # Fig. 9: advanced augmentation from 4.5 M params
        assert c.augment.rand_augment == advanced and c.augment.mixes_labels == advanced
    ft = training.load_config("imagenet_finetune_384")
    assert (ft.model.image_size, ft.optimizer.name, ft.optimizer.lr, ft.schedule.name) == (
        384, "sgd", 0.001, "constant")
    assert (ft.optimizer.weight_decay, ft.training.epochs, ft.model.new_head) == (4e-5, 10, False)
    assert "finetune_small_data" in names and "fashion_mnist" in names
    fm = training.load_config("fashion_mnist")
    assert (fm.model.name, fm.model.image_size, fm.training.precision) == (
        "mobilevitv2_050", 48, "float32")


# --------------------------------------------------------------------------------------
# Schedule, scaling, precision
# --------------------------------------------------------------------------------------


def test_warmup_cosine_matches_closed_form():
    peak, total, warm, init, low = 0.002, 1000, 100, 1e-6, 2e-4
    schedule = training.WarmupCosineDecay(peak, total, warm, init, low)
    steps = np.array([0, 1, 50, 99, 100, 101, 400, 550, 999, 1000, 1500])
    expected = np.where(
        steps < warm,
        init + (peak - init) * steps / warm,
        low + 0.5 * (peak - low) * (1 + np.cos(np.pi * np.clip((steps - warm) / (total - warm),
                                                                0, 1))),
    )
    got = np.array([float(schedule(int(s))) for s in steps])
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-12)
    assert got[0] == pytest.approx(1e-6) and got[4] == pytest.approx(peak)
    # Serializable inside an optimizer (what a .keras file stores).
    optimizer = keras.optimizers.AdamW(learning_rate=schedule)
    clone = keras.optimizers.AdamW.from_config(optimizer.get_config())
    assert isinstance(clone.learning_rate, training.WarmupCosineDecay) or isinstance(
        clone._learning_rate, training.WarmupCosineDecay)
    assert keras.optimizers.schedules.deserialize(
        keras.optimizers.schedules.serialize(schedule)).get_config() == schedule.get_config()
    with pytest.raises(ValueError, match="warmup_steps <= total_steps"):
        training.WarmupCosineDecay(0.1, 10, 20)


def test_linear_scaling_rule():
    s = training.scale_for_replicas(128, 8, 1024)
    assert (s.global_batch, s.lr_factor) == (1024, 1.0)
    s = training.scale_for_replicas(64, 2, 1024)
    assert (s.global_batch, s.lr_factor) == (128, 0.125)
    with pytest.raises(ValueError, match="Received"):
        training.scale_for_replicas(0, 1, 1024)


def test_a_batch_larger_than_the_training_set_is_lowered_to_fit_it(tmp_path):
    from PIL import Image

    from keras_mvit2.training.optimizer import _steps_per_epoch, plan_schedule
    from keras_mvit2.training.run_data import build_run_data, fit_batch_size

    config = training.load_config("finetune_small_data")  # data.batch_size 32
    same, line = fit_batch_size(config, 32, 1)
    assert same is config and line is None
    fitted, line = fit_batch_size(config, 15, 1)
    expected = config.to_dict()
    expected["data"]["batch_size"] = 15
    assert fitted.to_dict() == expected  # only the batch changes
    assert line == ("data.batch_size 32 is more than the 15 training images: training with "
                    "data.batch_size 15, one step per epoch (--set data.batch_size=N picks "
                    "another batch).")
    fitted, line = fit_batch_size(config, 15, 2)
    assert fitted.data.batch_size == 7
    assert "data.batch_size 32 x 2 replicas" in line and "data.batch_size 7 x 2" in line
    with pytest.raises(ValueError, match=r"fewer images than the run has replicas \(4\): "
                                         r"no batch fits.*--strategy default"):
        fit_batch_size(config, 3, 4)
    # A plan built on a batch that does not fit names the flag that changes it.
    with pytest.raises(ValueError, match=r"--set data\.batch_size=15 on the command line"):
        _steps_per_epoch(config, 15, training.scale_for_replicas(32, 1, 128), None)

    # A folder of 3 classes x 6 photos, 1 per class held out: 15 training images.
    for name in ("a", "b", "c"):
        (tmp_path / name).mkdir()
        for i in range(6):
            Image.fromarray(np.full((8, 8, 3), 40 * i, "uint8")).save(tmp_path / name / f"{i}.png")
    config = config.replace(data={"train": str(tmp_path), "validation_fraction": 0.1})
    data = build_run_data(config, replicas=1)
    assert data.train_source.num_examples == 15 and data.val_source.num_examples == 3
    assert data.config.data.batch_size == 15 and data.scaling.global_batch == 15
    assert data.eval_batch == 15 and data.batch_line.startswith("data.batch_size 32 is more")
    assert plan_schedule(data.config, data).steps_per_epoch == 1
    assert plan_schedule(data.config, data).fields["data.batch_size"] == 15


def test_precision_resolution_on_cpu():
    assert not tf.config.list_physical_devices("GPU")  # this suite runs on CPU
    assert training.resolve_precision("auto") == "float32"
    assert training.resolve_precision("mixed_bfloat16") == "mixed_bfloat16"
    with pytest.raises(ValueError, match="precision must be one of"):
        training.resolve_precision("half")
    with distribute.precision_policy("mixed_bfloat16"):
        assert keras.config.dtype_policy().name == "mixed_bfloat16"
    assert keras.config.dtype_policy().name == "float32"


def test_multi_worker_needs_tf_config(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    with pytest.raises(ValueError, match="TF_CONFIG environment variable"):
        training.make_strategy("multi_worker")
    monkeypatch.setenv("TF_CONFIG", "{not json")
    with pytest.raises(ValueError, match="TF_CONFIG must be JSON"):
        training.make_strategy("multi_worker")
    with pytest.raises(ValueError, match="strategy must be one of"):
        training.make_strategy("horovod")


# --------------------------------------------------------------------------------------
# Optimizer: weight decay, clipping
# --------------------------------------------------------------------------------------


def test_adamw_decays_only_weights_of_rank_2_and_more():
    model = tiny_mvit2(input_shape=(32, 32, 3), classifier_activation=None)
    config = training.load_config({"optimizer": {"weight_decay": 0.05}})
    lr = 0.01
    optimizer = make_optimizer(config, lr, model.trainable_weights, "float32")
    before = [w.numpy() for w in model.trainable_weights]
    # Zero gradients: Adam's step is 0, so only the decoupled decay moves weights.
    optimizer.apply([tf.zeros_like(w) for w in before], model.trainable_weights)
    decayed = kept = 0
    for w, old in zip(model.trainable_weights, before, strict=True):
        if len(w.shape) <= 1:  # norms' gamma/beta, biases
            np.testing.assert_array_equal(w.numpy(), old)
            kept += 1
        else:
            np.testing.assert_allclose(w.numpy(), old * (1 - lr * 0.05), rtol=1e-6)
            decayed += 1
    assert kept > 10 and decayed > 10


def test_clipping_acts_on_the_global_gradient_norm(rng):
    model = tiny_mvit2(input_shape=(32, 32, 3), classifier_activation=None)
    x = rng.uniform(0, 1, (8, 32, 32, 3)).astype("float32")
    y = keras.utils.to_categorical(rng.integers(0, 10, 8), 10)
    loss_fn = keras.losses.CategoricalCrossentropy(from_logits=True)
    with tf.GradientTape() as tape:
        loss = loss_fn(y, model(x, training=True))
    raw = tape.gradient(loss, model.trainable_weights)
    raw_norm = float(tf.linalg.global_norm(raw))
    clip = raw_norm / 10

    # The gradient the train step clips, as it computed it. An eager gradient is not exact
    # enough to compare the step with element by element: in one CI run the train step (a
    # graph, oneDNN's kernels, two pytest processes on two cores) got a stem-convolution
    # gradient up to 3.3e-6 away from the eager one after scaling; here they are equal.
    seen = [tf.Variable(tf.zeros_like(w), trainable=False) for w in model.trainable_weights]

    class RecordingTrainer(ClassifierTrainer):
        def _clip_global(self, grads):
            for variable, grad in zip(seen, grads, strict=True):
                variable.assign(grad)
            return super()._clip_global(grads)

    # Recompute from the same state: BN statistics don't affect the training forward.
    trainer = RecordingTrainer(model, clip_global_norm=clip)
    trainer.compile(optimizer=keras.optimizers.SGD(1.0), loss=loss_fn, jit_compile=False)
    before = [w.numpy() for w in model.trainable_weights]
    trainer.train_on_batch(x, y)
    delta = [b - w.numpy() for b, w in zip(before, model.trainable_weights, strict=True)]
    step_grads = [v.numpy() for v in seen]
    step_norm = float(tf.linalg.global_norm(step_grads))
    # The step clipped the whole loss's gradient (not a scaled or averaged one).
    off = float(tf.linalg.global_norm([s - r for s, r in zip(step_grads, raw, strict=True)]))
    assert off < 1e-3 * raw_norm, (off, raw_norm)
    np.testing.assert_allclose(float(tf.linalg.global_norm(delta)), clip, rtol=1e-4)
    # Same direction as the gradient, scaled by clip / norm (one factor for all weights).
    for d, g in zip(delta, step_grads, strict=True):
        np.testing.assert_allclose(d, g * clip / step_norm, atol=1e-6)


# --------------------------------------------------------------------------------------
# EMA and stochastic depth
# --------------------------------------------------------------------------------------


def test_ema_follows_numpy_and_swaps_exactly(rng, tmp_path):
    model = tiny_mvit2(input_shape=(32, 32, 3))
    ema = training.ExponentialMovingAverage(0.9, warmup=True)
    ema.track(model.weights)
    names = [w.path for w in ema.targets]
    assert any(n.endswith("moving_mean") for n in names)  # BN statistics are averaged too
    assert len(ema.targets) == len(model.weights) == len(ema.weights)
    shadow = [w.numpy() for w in model.weights]
    for step in range(1, 4):
        for w in model.weights:
            w.assign(w.numpy() + rng.normal(0, 0.1, w.shape).astype("float32"))
        ema.update(step)
        d = min(0.9, (1 + step) / (10 + step))
        shadow = [d * s + (1 - d) * w.numpy() for s, w in zip(shadow, model.weights, strict=True)]
    for s, avg in zip(shadow, ema.averaged_values(), strict=True):
        np.testing.assert_allclose(avg, s, rtol=1e-5, atol=1e-6)
    raw = [w.numpy() for w in model.weights]
    with ema.swapped():
        for w, s in zip(model.weights, shadow, strict=True):
            np.testing.assert_allclose(w.numpy(), s, rtol=1e-5, atol=1e-6)
    for w, r in zip(model.weights, raw, strict=True):
        np.testing.assert_array_equal(w.numpy(), r)  # bitwise back
    with pytest.raises(ValueError, match="decay must be in"):
        training.ExponentialMovingAverage(1.5)


def test_stochastic_depth_drops_whole_samples():
    layer = StochasticDepth(0.3, seed=3)
    x = np.ones((4000, 3, 2, 5), "float32")
    y = keras.ops.convert_to_numpy(layer(x, training=True))
    per_sample = y.reshape(4000, -1)
    assert set(np.unique(per_sample)) <= {0.0, np.float32(1 / 0.7)}
    assert (per_sample.min(1) == per_sample.max(1)).all()  # all-or-nothing per sample
    dropped = (per_sample[:, 0] == 0).mean()
    assert abs(dropped - 0.3) < 4 * np.sqrt(0.3 * 0.7 / 4000)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(layer(x, training=False)), x)
    np.testing.assert_array_equal(
        keras.ops.convert_to_numpy(StochasticDepth(0.0)(x, training=True)), x)
    with pytest.raises(ValueError, match=r"rate must be in \[0, 1\)"):
        StochasticDepth(1.0)


def test_model_drop_path_rate_grows_linearly():
    model = MobileViTV2(0.5, input_shape=(64, 64, 3), classes=10, drop_path_rate=0.16)
    rates = [t.drop_path for b in ("stage2_block1", "stage3_block1", "stage4_block1")
             for t in model.get_layer(b).transformer]
    np.testing.assert_allclose(rates, np.linspace(0, 0.16, 9), atol=1e-12)
    x = np.random.default_rng(0).uniform(0, 1, (2, 64, 64, 3)).astype("float32")
    np.testing.assert_array_equal(model(x, training=False), model(x, training=False))
    with pytest.raises(ValueError, match="drop_path_rate must be in"):
        MobileViTV2(0.5, input_shape=(64, 64, 3), drop_path_rate=1.0)


# --------------------------------------------------------------------------------------
# Evaluation
# --------------------------------------------------------------------------------------


def test_evaluate_against_numpy(rng):
    scores = rng.normal(size=(50, 7)).astype("float32")
    truth = rng.integers(0, 7, 50)
    truth[:5] = 6
    model = keras.Sequential([keras.Input((7,)), keras.layers.Identity()])
    dataset = tf.data.Dataset.from_tensor_slices(
        (scores, keras.utils.to_categorical(truth, 7))).batch(16)
    names = [f"c{i}" for i in range(7)]
    result = training.evaluate(model, dataset, names)
    pred = scores.argmax(1)
    cm = np.zeros((7, 7), int)
    np.add.at(cm, (truth, pred), 1)
    np.testing.assert_array_equal(result.confusion_matrix, cm)
    assert result.top1 == pytest.approx((pred == truth).mean())
    top5 = np.argsort(-scores, 1)[:, :5]
    assert result.top5 == pytest.approx((top5 == truth[:, None]).any(1).mean())
    np.testing.assert_allclose(result.per_class_accuracy, np.diag(cm) / cm.sum(1))
    assert result.per_class()["c6"] == pytest.approx(cm[6, 6] / cm[6].sum())
    json.dumps(result.to_dict())
    with pytest.raises(ValueError, match="7 outputs but there are 3 class names"):
        training.evaluate(model, dataset, names[:3])


# --------------------------------------------------------------------------------------
# Training runs (tiny model): resume after a kill, multi-scale, fine-tuning
# --------------------------------------------------------------------------------------


class _KilledError(Exception):
    pass


class _KillAtStep(keras.callbacks.Callback):
    """Simulates a crash in the middle of an epoch."""

    def __init__(self, step: int):
        super().__init__()
        self.step = step

    def on_train_batch_end(self, batch, logs=None):
        if int(self.model.optimizer.iterations.numpy()) == self.step:
            raise _KilledError(f"killed at step {self.step}")


def _final_arrays(result: training.TrainResult):
    raw = keras.saving.load_model(result.model_path)
    ema = keras.saving.load_model(result.ema_model_path)
    return [w.numpy() for w in raw.weights], [w.numpy() for w in ema.weights]


def test_deterministic_names_what_the_process_lacks(caplog, monkeypatch):
    # This process's TensorFlow has started (with the default threads, and oneDNN where
    # it is the default): `training.deterministic` cannot fix either, so it says how to
    # start the process instead.
    _ = (tf.constant(1.0) + 1.0).numpy()  # the runtime runs: thread counts are fixed
    onednn_env = os.environ.get("TF_ENABLE_ONEDNN_OPTS")
    if onednn_env is not None:  # the root conftest.py sets 1 on x86
        assert _onednn_enabled() == (onednn_env.strip().lower() in ("1", "true"))
    enabled = []  # recorded, not applied: this process's other tests keep their kernels
    monkeypatch.setattr(tf.config.experimental, "enable_op_determinism",
                        lambda: enabled.append(True))
    with caplog.at_level(logging.WARNING, logger="keras_mvit2.training"):
        _make_deterministic()
    assert enabled == [True]
    assert "TF_NUM_INTRAOP_THREADS=1 TF_NUM_INTEROP_THREADS=1 TF_ENABLE_ONEDNN_OPTS=0" in (
        caplog.text)
    threads_from_env = all(os.environ.get(k) == "1" for k in
                           ("TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS"))
    assert ("several threads" in caplog.text) == (not threads_from_env)
    assert ("oneDNN" in caplog.text) == _onednn_enabled()


#: The tests of this file that need `DETERMINISTIC_ENV`: run together in one child process.
DETERMINISTIC_TESTS = ("test_resume_after_kill_matches_an_uninterrupted_run",
                       "test_multiscale_trains_one_model_for_every_scale")


def _in_deterministic_process() -> bool:
    return all(os.environ.get(k) == v for k, v in DETERMINISTIC_ENV.items())


@pytest.fixture(scope="module")
def deterministic_child(request, tmp_path_factory) -> dict[str, str]:
    """Runs this run's selected `DETERMINISTIC_TESTS` in one child process started with
    `DETERMINISTIC_ENV` (one TensorFlow start for all of them), unless this process already
    is one; their outcome (`passed`, `failed`, ...) by name, and the child's output under "".

    Bitwise equality needs deterministic kernels on one TensorFlow thread, and Eigen's
    kernels rather than oneDNN's (see `_make_deterministic`: CI runs saw the third epoch's
    loss differ in the last bit with either missing). A process's TensorFlow cannot be
    switched once it runs.
    """
    if _in_deterministic_process():
        assert not _onednn_enabled()  # the variable really switched TensorFlow to Eigen
        return {}
    selected = {item.name for item in request.session.items
                if item.path == request.path and item.name in DETERMINISTIC_TESTS}
    folder = tmp_path_factory.mktemp("deterministic_child")
    report = folder / "junit.xml"
    child = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
         "--run-slow", *(f"{__file__}::{name}" for name in sorted(selected)),
         "--basetemp", str(folder / "tmp"), f"--junitxml={report}"],
        env={**os.environ, **DETERMINISTIC_ENV},
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
        capture_output=True, text=True, timeout=1500, check=False,
    )
    outcomes = {"": child.stdout[-6000:] + child.stderr[-3000:]}
    if report.exists():
        import xml.etree.ElementTree as ET

        for case in ET.parse(report).getroot().iter("testcase"):
            failed = [tag.tag for tag in case if tag.tag in ("failure", "error", "skipped")]
            outcomes[case.get("name")] = failed[0] if failed else "passed"
    return outcomes


def _ran_in_deterministic_child(outcomes: dict[str, str], test: str) -> bool:
    """True if `test` ran in the deterministic child (asserting that it passed there);
    False in the child itself, where the test runs."""
    if _in_deterministic_process():
        return False
    assert outcomes.get(test) == "passed", outcomes[""]
    return True


@pytest.mark.slow
@needs_fashion
def test_resume_after_kill_matches_an_uninterrupted_run(tmp_path, deterministic_child):
    if _ran_in_deterministic_child(deterministic_child,
                                   "test_resume_after_kill_matches_an_uninterrupted_run"):
        return
    sections = {
        "model": {"drop_path_rate": 0.2, "dropout": 0.1},  # random ops: seeds must resume too
        "data": {"validation_split": None},
        "training": {"epochs": 3, "steps_per_epoch": 4, "precision": "float32",
                     "deterministic": True},
    }
    full = training.train(tiny_config(tmp_path / "full", **sections))
    config = tiny_config(tmp_path / "killed", **sections)
    with pytest.raises(_KilledError):
        training.train(config, callbacks=[_KillAtStep(6)])  # in epoch 2 of 3
    state = training.latest_checkpoint(config.output.dir)
    assert (state["epoch"], state["optimizer_step"]) == (1, 4)
    resumed = training.train(config)
    assert resumed.initial_epoch == 1
    assert resumed.optimizer_step == full.optimizer_step == 12
    assert [h["step"] for h in resumed.history] == [4, 8, 12]
    for a, b in zip(full.history, resumed.history, strict=True):
        assert a["loss"] == b["loss"] and a["learning_rate"] == b["learning_rate"]
    full_raw, full_ema = _final_arrays(full)
    res_raw, res_ema = _final_arrays(resumed)
    for a, b in zip(full_raw + full_ema, res_raw + res_ema, strict=True):
        np.testing.assert_array_equal(a, b)
    assert not np.allclose(full_raw[1], full_ema[1])  # the EMA really is another set
    # A finished run resumes to "nothing left to do".
    again = training.train(config)
    assert again.initial_epoch == 3 and again.optimizer_step == 12
    # The run folder: final config, derived values, checkpoints kept.
    saved = training.load_config(os.path.join(config.output.dir, "config.yaml"))
    assert saved == config
    run = json.loads(open(os.path.join(config.output.dir, "run.json")).read())
    assert (run["global_batch_size"], run["total_steps"], run["warmup_steps"]) == (16, 12, 3)
    kept = sorted(os.listdir(os.path.join(config.output.dir, "checkpoints")))
    assert kept == ["epoch_0002.weights.h5", "epoch_0003.weights.h5", "state.json"]
    # Resuming with another model in the same folder is refused.
    other = dataclasses.replace(config, model=dataclasses.replace(config.model, dropout=0.0))
    with pytest.raises(ValueError, match="different 'model' config"):
        training.train(other)


class _GrabTrainer(keras.callbacks.Callback):
    """Keeps the `ClassifierTrainer` and its classifier's weights when training starts."""

    def __init__(self):
        super().__init__()
        self.start = None

    def on_train_begin(self, logs=None):
        self.start = [w.numpy() for w in self.model.classifier.weights]


@pytest.mark.slow
@needs_fashion
def test_multiscale_trains_one_model_for_every_scale(tmp_path, monkeypatch,
                                                    deterministic_child):
    """One classifier built for any size runs every batch shape, and trains exactly as the
    0.1 layout (one model per resolution sharing the layers, the benchmark's baseline) on
    the same data (bitwise, with deterministic kernels); the run resumes from its
    checkpoint."""
    if _ran_in_deterministic_child(deterministic_child,
                                   "test_multiscale_trains_one_model_for_every_scale"):
        return
    from keras_mvit2.models.input_size import with_dynamic_size
    from keras_mvit2.training import trainer as trainer_module

    sections = {
        "model": {"image_size": 64},
        "data": {"batch_size": 8, "validation_limit": 64},
        "multiscale": {"enabled": True, "scales": [0.5, 1.0]},
        "training": {"epochs": 1, "steps_per_epoch": 4, "validate_every": 1,
                     "deterministic": True},
        "ema": {"enabled": False},
    }
    grab = _GrabTrainer()
    config = tiny_config(tmp_path / "dynamic", **sections)
    result = training.train(config, callbacks=[grab])
    trainer = grab.model
    shapes = trainer.batch_shapes
    # (size, batch) pairs: batch * size^2 constant -> 64 px: 8, 32 px: 32.
    assert set(shapes) == {(8, 64, 64, 3), (32, 32, 32, 3)}, shapes
    assert sum(shapes.values()) == 4
    classifier = trainer.classifier
    assert classifier.input_shape == (None, None, None, 3)
    assert [m for m in trainer._flatten_layers(include_self=False)
            if isinstance(m, keras.Model)] == [classifier]  # the only model
    assert np.isfinite(result.history[-1]["loss"])
    assert result.metrics["raw"].num_examples == 64  # evaluated at the base size
    assert "ema" not in result.metrics and result.ema_model_path is None
    # The saved model is built for the base size; at the small scale (as `mvit2 eval
    # --image-size 32` runs it) it computes the trained classifier's function.
    saved = keras.saving.load_model(result.model_path)
    assert saved.input_shape == (None, 64, 64, 3)
    images = np.random.default_rng(0).uniform(0, 1, (4, 32, 32, 3)).astype("float32")
    np.testing.assert_allclose(
        with_dynamic_size(saved)(images), keras.ops.softmax(classifier(images)), atol=1e-6)

    # The same run with one model per resolution, traced per shape (0.1's layout).
    build = trainer_module.build_classifier
    monkeypatch.setattr(ClassifierTrainer, "reduce_retracing", False)
    per_resolution = load_benchmark("training_throughput").per_resolution_classifier
    monkeypatch.setattr(trainer_module, "build_classifier",
                        lambda config, n, any_size=False: per_resolution(build(config, n), [32]))
    old_grab = _GrabTrainer()
    old = training.train(tiny_config(tmp_path / "per_resolution", **sections),
                         callbacks=[old_grab])
    assert set(old_grab.model.batch_shapes) == set(shapes)
    assert old_grab.model.classifier.base.input_shape == (None, 64, 64, 3)
    for a, b in zip(grab.start, old_grab.start, strict=True):
        np.testing.assert_array_equal(a, b)  # the same initialization
    final = [w.numpy() for w in saved.weights]
    old_final = [w.numpy() for w in keras.saving.load_model(old.model_path).weights]
    # Equal up to rounding: the generic trace reads sizes at run time, and at 32 px the
    # 0.1 twin runs layers built for 64 px, which sum in another order (~1e-7 on a
    # gradient); AdamW's normalized steps carry that to ~6e-6 here. A batch routed,
    # sized or weighted differently would move them as far as training does.
    moved = max(np.abs(a - b).max() for a, b in zip(final, grab.start, strict=True))
    apart = max(np.abs(a - b).max() for a, b in zip(final, old_final, strict=True))
    assert moved > 1e-2 and apart < 1e-4, (moved, apart)
    assert old.history[0]["loss"] == pytest.approx(result.history[0]["loss"], rel=1e-6)

    # The dynamic run resumes from its checkpoint: the trained weights, every scale again
    # (a longer run: an explicit choice, `replan=True`).
    monkeypatch.undo()
    resume_grab = _GrabTrainer()
    resumed = training.train(config.replace(training={"epochs": 2}), callbacks=[resume_grab],
                             replan=True)
    assert resumed.initial_epoch == 1 and resumed.optimizer_step == 8
    assert resume_grab.model.classifier.input_shape == (None, None, None, 3)
    for a, b in zip(resume_grab.start, final, strict=True):
        np.testing.assert_array_equal(a, b)
    assert set(resume_grab.model.batch_shapes) == set(shapes)
    assert np.isfinite(resumed.history[-1]["loss"])


def test_load_pretrained_keeps_a_matching_head_from_a_weights_h5_file(tmp_path):
    from keras_mvit2.training.classifier import build_classifier, load_pretrained

    keras.utils.set_random_seed(0)
    source = tiny_mvit2(input_shape=(32, 32, 3), classes=10, classifier_activation=None)
    path = str(tmp_path / "run.weights.h5")
    source.save_weights(path)
    expected = source.get_layer("predictions").kernel.numpy()
    for new_head, copied in ((False, True), (True, False)):
        config = tiny_config(tmp_path, model={"weights": path, "new_head": new_head})
        model = build_classifier(config, 10)
        load_pretrained(model, config, 10)
        kernel = model.get_layer("predictions").kernel.numpy()
        assert np.array_equal(kernel, expected) == copied, new_head
        np.testing.assert_array_equal(model.get_layer("stem_conv").kernel.numpy(),
                                      source.get_layer("stem_conv").kernel.numpy())


@pytest.mark.slow
@needs_fashion
def test_finetune_new_head_and_frozen_backbone(tmp_path):
    source = tiny_mvit2(input_shape=(32, 32, 3), classes=3)
    source.get_layer("stem_conv").kernel.assign(
        np.full(source.get_layer("stem_conv").kernel.shape, 0.01, "float32"))
    weights = str(tmp_path / "pretrained.weights.h5")
    source.save_weights(weights)
    config = tiny_config(tmp_path, training={"epochs": 1, "steps_per_epoch": 2},
                         schedule={"warmup_steps": 1})
    start = {}

    class Grab(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            start["head"] = self.model.classifier.get_layer("predictions").kernel.numpy()

    result = training.finetune(config, weights, freeze_backbone=True, callbacks=[Grab()])
    tuned = keras.saving.load_model(result.model_path)
    assert tuned.output_shape == (None, 10)  # the new head, sized for the data
    for layer in source.layers:
        if layer.weights and layer.name != "predictions":
            for a, b in zip(layer.weights, tuned.get_layer(layer.name).weights, strict=True):
                np.testing.assert_array_equal(a.numpy(), b.numpy())  # frozen: BN stats too
    head = tuned.get_layer("predictions").kernel.numpy()
    assert start["head"].shape == head.shape == (24, 10)
    assert not np.allclose(head, start["head"])  # the new head trained
    saved = training.load_config(result.config_path)
    assert saved.model.weights == weights and saved.model.freeze_backbone
    with pytest.raises(FileNotFoundError, match="Pretrained weights not found"):
        training.finetune(config, tmp_path / "nope.weights.h5")


@pytest.mark.slow
@needs_fashion
def test_mixed_float16_run_saves_a_float32_model(tmp_path):
    config = tiny_config(tmp_path, training={"epochs": 1, "steps_per_epoch": 3,
                                             "precision": "mixed_float16"},
                         data={"validation_limit": 64}, ema={"enabled": False})
    seen = {}

    class Grab(keras.callbacks.Callback):
        def on_train_end(self, logs=None):
            seen["optimizer"] = self.model.optimizer
            seen["policy"] = self.model.classifier.dtype_policy.name

    result = training.train(config, callbacks=[Grab()])
    assert result.precision == "mixed_float16" and seen["policy"] == "mixed_float16"
    assert isinstance(seen["optimizer"], keras.optimizers.LossScaleOptimizer)
    assert np.isfinite(result.history[0]["loss"]) and result.optimizer_step == 3
    model = keras.saving.load_model(result.model_path)
    assert model.dtype_policy.name == "float32" and model.output.dtype == "float32"
    assert keras.config.dtype_policy().name == "float32"  # the global policy is restored


# --------------------------------------------------------------------------------------
# What a run leaves: the log, the metrics, the inference model (whether a few hundred
# steps of the real recipe learn is benchmarks/recipe_learns.py, over seeds)
# --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def two_epoch_run(tmp_path_factory):
    """A finished run of `tiny_config` (2 epochs of 4 steps, TensorBoard on): (config,
    result). Tests that change the run work on a copy of its folder."""
    config = tiny_config(tmp_path_factory.mktemp("two_epochs"), output={"tensorboard": True})
    return config, training.train(config)


@pytest.mark.slow
@needs_fashion
def test_a_run_logs_every_epoch_and_saves_the_model_its_metrics_describe(two_epoch_run):
    """TensorBoard events, `metrics.json` equal to the result, both weights evaluated on
    every validation image, and a softmax inference model."""
    config, result = two_epoch_run
    assert result.optimizer_step == 8
    assert [np.isfinite(epoch["loss"]) for epoch in result.history] == [True, True]
    assert result.metrics["raw"].num_examples == result.metrics["ema"].num_examples == 128
    model = keras.saving.load_model(result.model_path)
    images = np.stack([x for x, _ in training.make_sources(config)[1].dataset.take(4)])
    assert model.output_shape == (None, 10)
    probs = model.predict(
        tf.image.resize(tf.image.grayscale_to_rgb(tf.cast(images, tf.float32) / 255.0),
                        (32, 32)), verbose=0)
    np.testing.assert_allclose(probs.sum(1), 1.0, rtol=1e-5)
    if _tensorboard_available():
        assert glob.glob(os.path.join(result.output_dir, "tensorboard", "train", "events.*"))
    metrics = json.loads(open(os.path.join(result.output_dir, "metrics.json")).read())
    for name in ("raw", "ema"):
        assert metrics["metrics"][name]["top1"] == pytest.approx(result.metrics[name].top1)


# --------------------------------------------------------------------------------------
# Numbers as people write them (YAML 1.1 reads 1e-3 as a string)
# --------------------------------------------------------------------------------------

EXPONENT_TEXTS = ["1e-3", "1E-3", "3e4", ".5", "1.0e+2"]


def _float_fields():
    """(section, field) for every float-typed field of every config section."""
    import typing

    from keras_mvit2.training.config import _SECTIONS

    for section, cls in _SECTIONS.items():
        hints = typing.get_type_hints(cls)
        for field in dataclasses.fields(cls):
            tp = hints[field.name]
            if tp is float or float in typing.get_args(tp):
                yield section, field.name


def test_every_float_field_is_found():
    fields = set(_float_fields())
    assert {("optimizer", "lr"), ("schedule", "min_lr"), ("augment", "random_erasing"),
            ("optimizer", "clip_global_norm"), ("training", "label_smoothing")} <= fields
    assert len(fields) >= 20, sorted(fields)


@pytest.mark.parametrize("section, field", sorted(_float_fields()))
def test_float_fields_read_exponent_notation_from_set_and_yaml(section, field, tmp_path):
    for text in EXPONENT_TEXTS:
        expected = float(text)
        path = tmp_path / f"{field}.yaml"
        path.write_text(f"{section}:\n  {field}: {text}\n")
        for source, overrides in (({}, [f"{section}.{field}={text}"]), (str(path), None)):
            try:
                config = training.load_config(source, overrides)
            except ValueError as e:
                # Out of this field's range is fine; being refused as "not a number" is not.
                assert "must be a number. " not in str(e) and "'" + text not in str(e), str(e)
                assert f"{field}={expected!r}" in str(e), str(e)
                continue
            value = getattr(getattr(config, section), field)
            assert isinstance(value, float) and value == expected, (text, value)


def test_learning_rates_as_people_write_them():
    config = training.load_config("fashion_mnist", ["optimizer.lr=1e-3",
                                                    "schedule.warmup_init_lr=1e-6",
                                                    "schedule.min_lr=1.0e-5"])
    assert config.optimizer.lr == 1e-3 and config.schedule.min_lr == 1e-5
    assert training.load_config({}, ["optimizer.lr=1e9"]).optimizer.lr == 1e9
    # Strings stay strings where the field is a string.
    assert training.load_config({}, ["output.dir=1e-3x"]).output.dir == "1e-3x"


# --------------------------------------------------------------------------------------
# Divergence
# --------------------------------------------------------------------------------------


def _all_finite(path) -> bool:
    model = keras.models.load_model(path)
    return all(np.all(np.isfinite(np.asarray(w))) for w in model.get_weights())


@pytest.mark.slow
@needs_fashion
def test_diverged_run_stops_keeps_earlier_checkpoints_and_resumes(two_epoch_run, tmp_path):
    out = tmp_path / "run"  # `tiny_config(tmp_path)`'s folder: a copy of the finished run
    shutil.copytree(two_epoch_run[1].output_dir, out)
    model_path = out / "model.keras"
    model_mtime = os.path.getmtime(model_path)
    assert _all_finite(model_path)

    # lr 1e12 from epoch 3 on (a longer run at another rate: `replan=True`): the loss is
    # NaN within the epoch.
    diverging = tiny_config(tmp_path, training={"epochs": 3},
                            optimizer={"lr": 1e12, "reference_batch_size": 16})
    with pytest.raises(training.TrainingDivergedError) as info:
        training.train(diverging, replan=True)
    err = info.value
    assert err.epoch == 3 and err.batch is not None and 1 <= err.batch <= 4
    message = str(err)
    assert len(message.splitlines()) == 1
    assert "loss became nan" in message or "loss became inf" in message
    assert "optimizer.lr=1e+12" in message and "clip_global_norm" in message
    assert err.last_checkpoint.endswith("epoch_0002.weights.h5")
    # The finite epoch-2 checkpoint stays and is still the one to resume from; nothing of
    # the diverged epoch and no model was written.
    assert sorted(os.listdir(out / "checkpoints")) == [
        "epoch_0001.weights.h5", "epoch_0002.weights.h5", "state.json"]
    assert training.latest_checkpoint(out)["epoch"] == 2
    assert os.path.getmtime(model_path) == model_mtime and _all_finite(model_path)

    # A rerun with a sane learning rate resumes after epoch 2 and finishes finite.
    resumed = training.train(tiny_config(tmp_path, training={"epochs": 3}), replan=True)
    assert resumed.initial_epoch == 2 and len(resumed.history) == 3
    assert all(np.isfinite(h["loss"]) for h in resumed.history)
    assert _all_finite(resumed.model_path) and _all_finite(resumed.ema_model_path)


@pytest.mark.slow
def test_divergence_at_the_first_epoch_leaves_no_checkpoint_and_no_model(tmp_path):
    with pytest.raises(training.TrainingDivergedError, match="no checkpoint to resume from"):
        training.train(tiny_config(tmp_path, training={"epochs": 2},
                                   optimizer={"lr": 1e12, "reference_batch_size": 16}))
    out = tmp_path / "run"
    assert not (out / "model.keras").exists() and not (out / "model_ema.keras").exists()
    assert [f for f in os.listdir(out / "checkpoints") if f.endswith(".h5")] == []


def test_one_class_is_named_as_the_problem(tmp_path):
    from PIL import Image

    folder = tmp_path / "images" / "cats"
    folder.mkdir(parents=True)
    for i in range(6):
        Image.fromarray(np.full((8, 8, 3), 40 * i, "uint8")).save(folder / f"{i}.png")
    for fraction in (0.0, 0.2):
        config = tiny_config(tmp_path, data={"source": "image_folder",
                                             "train": str(tmp_path / "images"),
                                             "validation_fraction": fraction,
                                             "train_limit": None, "validation_limit": None})
        with pytest.raises(ValueError, match="at least two classes") as info:
            training.train(config)
        assert "cats" in str(info.value)
