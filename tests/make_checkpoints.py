"""Remakes the trained checkpoints the tests load (`tests/data/checkpoints/`).

Tests that need *a trained model* load one of these committed files instead of training it
in every run; the benchmarks of training call the same recipes below
(`benchmarks/task_learning.py`, over seeds). To remake every file (about 10 minutes on 2
cores, one thread, so that a remake on a machine gives nearly the same weights)::

    python tests/make_checkpoints.py            # all seven
    python tests/make_checkpoints.py detector   # one (the detector reads the classifier)

It needs Fashion-MNIST (`apt-get install dataset-fashion-mnist`) and scikit-image (the
photos of the pasted set). The files, each a few MB (weights only, no optimizer state):

- `classifier.keras`: MobileViTV2-0.5 (logits) fitted on Fashion-MNIST at 32x32
  (`shared_fixtures.CLASSIFIER_*`: the first 160 x 64 training images, Adam with a cosine
  decay; 80-82 % test accuracy), for post-training quantization, the optimizer, the Core ML
  and edge-quantizer recipes and the clients;
- `classifier_256.weights.h5`: that classifier fine-tuned at 256x256 (40 steps of 16 of its
  training images, Adam 3e-4, seed 0; a low-margin model trained at the deployment size,
  35-51 % top-1) for the int8 activation-range test of tests/test_quantization_ptq.py;
- `client_segmenter.weights.h5`: DeepLabV3 (32x32, the 10 classes + background) on that
  classifier's backbone, one epoch on its first 3,000 training images, for the MediaPipe
  segmenter test (its recipe: `train_segmenter` in tests/test_mediapipe_clients.py);
- `detector.weights.h5` (+ `detector.json`, its classes): SSDLite at 64x64 on that
  classifier's backbone, `shared_fixtures.DETECTOR_STEPS` steps on pasted Fashion-MNIST, for
  the client tests (MediaPipe, the browser);
- `task_segmenter.weights.h5`: DeepLabV3 (MobileViTv2-0.5, 64x64, Trouser and Bag) from
  scratch, `SEG_STEPS` steps, seed 0;
- `task_detector.weights.h5`: SSDLite (64x64, Trouser, Sneaker, Bag) from that segmenter's
  backbone, `DET_STEPS` steps, seed 0: the export and command-line tests of the task models;
- `small_mvit.weights.h5` (0.2 MB): `test_sparsity.small_model` (stem, two inverted
  residuals, a MobileViTV2 block) fitted on the first `TRAIN_STEPS` x `BATCH` (300 x 64)
  Fashion-MNIST training images padded to 32x32 (Adam, cosine decay from 2e-3, seed 0;
  79 % on the first 1,000 test images) for the pruning and clustering tests of
  tests/test_sparsity.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from shared_fixtures import (  # noqa: E402
    CHECKPOINTS,
    CLASSIFIER_BATCH,
    CLASSIFIER_LEARNING_RATE,
    CLASSIFIER_SIZE,
    CLASSIFIER_STEPS,
    DETECTOR_STEPS,
    build_detector,
    build_segmenter,
    detection_data,
    fashion_mnist_rgb,
    segmentation_data,
)

#: The task checkpoints' training steps (a detection step costs a third of a segmentation
#: step).
SEG_STEPS = 300
DET_STEPS = 600

ONE_THREAD = {"OMP_NUM_THREADS": "1", "TF_NUM_INTRAOP_THREADS": "1",
              "TF_NUM_INTEROP_THREADS": "1", "TF_ENABLE_ONEDNN_OPTS": "0"}


def save_weights(model, fresh, path: Path) -> None:
    """`model`'s weights through `fresh` (the same architecture, uncompiled): a compiled
    model's `save_weights` also writes the optimizer's moments (three times the file)."""
    fresh.set_weights(model.get_weights())
    fresh.save_weights(path)


def train_classifier(path: Path) -> None:
    """Fits MobileViTV2-0.5 (logits) on the first 160 x 64 Fashion-MNIST training images at
    32x32 and saves it as `path` (`.keras`, uncompiled: weights and architecture).

    On one CPU thread (run this script's `main`), so that every remake on a machine trains
    nearly the same model: TensorFlow's multi-threaded kernels sum in an order that varies
    from run to run, and Adam turns those last-bit differences into different models (two
    seeded trainings in two processes differed by up to 1.1 in a weight, also with
    `enable_op_determinism`). On one thread they differ by 1e-3 at most."""
    import keras

    import keras_mvit2 as mv
    from keras_mvit2.data.files import load_fashion_mnist_arrays

    x, y = load_fashion_mnist_arrays("train")
    n = CLASSIFIER_STEPS * CLASSIFIER_BATCH

    def build():
        return mv.MobileViTV2(0.5, input_shape=(CLASSIFIER_SIZE, CLASSIFIER_SIZE, 3),
                              classes=10, classifier_activation=None)

    keras.utils.set_random_seed(0)
    model = build()
    optimizer = keras.optimizers.Adam(keras.optimizers.schedules.CosineDecay(
        CLASSIFIER_LEARNING_RATE, CLASSIFIER_STEPS, alpha=0.05))
    model.compile(optimizer=optimizer,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    optimizer.build(model.trainable_variables)  # else the first step traces twice (slow)
    model.fit(fashion_mnist_rgb(x[:n], CLASSIFIER_SIZE), y[:n].astype("int64"),
              batch_size=CLASSIFIER_BATCH, epochs=1, verbose=0)
    # The same model uncompiled: Adam's two moments would triple the file (and a compiled
    # model with an unbuilt optimizer warns on every load).
    saved = build()
    saved.set_weights(model.get_weights())
    saved.save(path)


def finetune_classifier_256(path: Path, classifier_path: Path) -> None:
    """Fine-tunes the trained classifier (`classifier_path`) at 256x256 on its first 40 x 16
    training images, in order (Adam 3e-4, seed 0), and saves the weights as `path`."""
    import keras

    import keras_mvit2 as mv
    from keras_mvit2.data.files import load_fashion_mnist_arrays

    def build():
        return mv.MobileViTV2(0.5, input_shape=(256, 256, 3), classes=10,
                              classifier_activation=None)

    x, y = load_fashion_mnist_arrays("train")
    steps, batch = 40, 16
    keras.utils.set_random_seed(0)
    model = build()
    model.set_weights(keras.saving.load_model(classifier_path).get_weights())
    model.compile(optimizer=keras.optimizers.Adam(3e-4),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(fashion_mnist_rgb(x[:steps * batch], 256), y[:steps * batch].astype("int64"),
              batch_size=batch, epochs=1, shuffle=False, verbose=0)
    save_weights(model, build(), path)


def train_detector(folder: Path, classifier_path: Path) -> None:
    """Fits `shared_fixtures.build_detector` (backbone: the trained classifier at 32x32) for
    DETECTOR_STEPS steps on pasted Fashion-MNIST (Trouser, Sneaker, Bag on photos; at 80
    steps 70-100 weak boxes an image crowd the score threshold and the 100-box cap) and saves
    its weights (`detector.weights.h5`) and classes (`detector.json`)."""
    import keras

    import keras_mvit2 as mv
    from keras_mvit2.tasks import data as td
    from keras_mvit2.tasks import train as tt

    trained = keras.saving.load_model(classifier_path)
    classifier = mv.mobilevitv2_050(input_shape=(CLASSIFIER_SIZE, CLASSIFIER_SIZE, 3),
                                    classes=10, weights=None)
    classifier.set_weights(trained.get_weights())
    train = detection_data("train")
    keras.utils.set_random_seed(0)
    model = build_detector(train.num_classes, backbone_weights=classifier)
    tt.compile_detection(model, tt.task_optimizer(
        tt.TaskOptimizerConfig("adamw", 3e-3, 3e-4, 0.01, 10, 3e-4, 10.0, None),
        DETECTOR_STEPS))
    dataset = td.detection_dataset(train.images, train.boxes, train.labels, model.anchors, 16,
                                   training=True, config=model.anchor_config, augment=None,
                                   seed=0)
    model.fit(dataset, epochs=1, steps_per_epoch=DETECTOR_STEPS, verbose=0)
    save_weights(model, build_detector(train.num_classes), folder / "detector.weights.h5")
    (folder / "detector.json").write_text(json.dumps(
        {"num_classes": int(train.num_classes), "class_names": list(train.class_names)}))


def _task_optimizer(steps: int):
    from keras_mvit2.tasks import train as tt

    config = tt.TaskOptimizerConfig("adamw", 3e-3, 3e-4, 0.01, 20, 3e-4, 10.0, None)
    return tt.task_optimizer(config, steps)


def train_task_segmenter(train, steps: int, seed: int = 0):
    """(DeepLabV3, per-epoch losses): `build_segmenter` from scratch on `train` (a
    `segmentation_data` set) for `steps` steps in 6 epochs, batch 16."""
    import keras

    from keras_mvit2.tasks import data as td
    from keras_mvit2.tasks import train as tt

    keras.utils.set_random_seed(seed)
    model = build_segmenter(train.num_classes)
    tt.compile_segmentation(model, train.num_classes, _task_optimizer(steps))
    dataset = td.segmentation_dataset(train.images, train.masks, 16, training=True,
                                      augment=None, seed=0)
    history = model.fit(dataset, epochs=6, steps_per_epoch=steps // 6, verbose=0)
    return model, history.history["loss"]


def train_task_detector(train, backbone, steps: int, seed: int = 0):
    """(SSDLite, per-epoch losses): `build_detector` from `backbone`'s weights (a trained
    segmenter) on `train` (a `detection_data` set) for `steps` steps in 6 epochs.

    Detectors start from a trained backbone (the paper's from ImageNet); here from a
    segmenter's, trained on the same kind of images. From scratch, 600 steps learn too
    slowly to test: over seeds 1-3 val mAP 0.006 / 0.007 / 0.051 (0.024 at 1200 steps)."""
    import keras

    from keras_mvit2.tasks import data as td
    from keras_mvit2.tasks import train as tt

    keras.utils.set_random_seed(seed)
    model = build_detector(train.num_classes, backbone_weights=backbone)
    tt.compile_detection(model, _task_optimizer(steps))
    dataset = td.detection_dataset(train.images, train.boxes, train.labels, model.anchors, 16,
                                   training=True, config=model.anchor_config, augment=None,
                                   seed=0)
    history = model.fit(dataset, epochs=6, steps_per_epoch=steps // 6, verbose=0)
    return model, history.history["loss"]


def train_small_model(path: Path) -> None:
    """Fits `test_sparsity.small_model` on the first TRAIN_STEPS x BATCH Fashion-MNIST
    training images (padded to 32x32 RGB; one epoch, shuffled, Adam with a cosine decay
    from 2e-3, seed 0) and saves its weights as `path`."""
    import keras
    from test_sparsity import BATCH, TRAIN_STEPS, _images, small_model

    from keras_mvit2.data.files import load_fashion_mnist_arrays

    x, y = load_fashion_mnist_arrays("train")
    n = TRAIN_STEPS * BATCH
    keras.utils.set_random_seed(0)
    model = small_model()
    schedule = keras.optimizers.schedules.CosineDecay(2e-3, TRAIN_STEPS)
    model.compile(keras.optimizers.Adam(schedule),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(_images(x[:n]), y[:n].astype("int64"), batch_size=BATCH, epochs=1, verbose=0)
    save_weights(model, small_model(), path)


def make(names: list[str]) -> None:
    CHECKPOINTS.mkdir(parents=True, exist_ok=True)
    if "classifier" in names:
        train_classifier(CHECKPOINTS / "classifier.keras")
    if "classifier_256" in names:
        finetune_classifier_256(CHECKPOINTS / "classifier_256.weights.h5",
                                CHECKPOINTS / "classifier.keras")
    if "client_segmenter" in names:
        from test_mediapipe_clients import client_segmenter, train_segmenter

        save_weights(train_segmenter(CHECKPOINTS / "classifier.keras"), client_segmenter(),
                     CHECKPOINTS / "client_segmenter.weights.h5")
    if "detector" in names:
        train_detector(CHECKPOINTS, CHECKPOINTS / "classifier.keras")
    if "task_segmenter" in names:
        segmenter, _ = train_task_segmenter(segmentation_data("train"), SEG_STEPS)
        save_weights(segmenter, build_segmenter(), CHECKPOINTS / "task_segmenter.weights.h5")
    if "task_detector" in names:
        segmenter = build_segmenter()
        segmenter.load_weights(CHECKPOINTS / "task_segmenter.weights.h5")
        detector, _ = train_task_detector(detection_data("train"), segmenter, DET_STEPS)
        save_weights(detector, build_detector(), CHECKPOINTS / "task_detector.weights.h5")
    if "small_mvit" in names:
        train_small_model(CHECKPOINTS / "small_mvit.weights.h5")


NAMES = ["classifier", "classifier_256", "client_segmenter", "detector", "task_segmenter",
         "task_detector", "small_mvit"]

if __name__ == "__main__":
    if not os.environ.get("_MVIT2_ONE_THREAD"):  # again, with one thread from the start
        env = {**os.environ, **ONE_THREAD, "_MVIT2_ONE_THREAD": "1"}
        sys.exit(subprocess.run([sys.executable, __file__, *sys.argv[1:]], env=env).returncode)
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    tf.config.experimental.enable_op_determinism()
    wanted = sys.argv[1:] or NAMES
    unknown = set(wanted) - set(NAMES)
    if unknown:
        sys.exit(f"unknown checkpoints {sorted(unknown)}; choose from {NAMES}")
    make([name for name in NAMES if name in wanted])
