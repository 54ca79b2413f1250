"""What several test modules need and is expensive to make: built once per pytest run.

`once_per_run` builds a folder once per run, also when pytest-xdist runs the modules in
several worker processes (the workers share the run's base temporary folder and take a
file lock; the first one builds, the others read). The fixtures of `conftest.py` use it for:

- the trained classifier: MobileViTV2-0.5 (logits) fitted on Fashion-MNIST at 32x32
  (`CLASSIFIER_*`: 160 steps of 64 images, Adam with a cosine decay; 80-82 % test accuracy),
  saved as `.keras` (trained on one thread: nearly the same model in every run on a machine),
  for the modules that need a trained MobileViTV2 (post-training
  quantization, the MediaPipe clients; QAT and validation train smaller models of their
  own, which costs less than converting this one);
- the trained detector: SSDLite at 64x64 on that classifier's backbone, 120 steps on pasted
  Fashion-MNIST (`DETECTOR_*`), for the modules that run it in a client (MediaPipe in
  Python, MediaPipe in the browser);
- the timm oracle: `tests/torch_oracle.py` run once, in a subprocess (torch convolutions
  segfault once TensorFlow is imported), for every module that compares with timm.
"""

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
from filelock import FileLock

HERE = os.path.dirname(os.path.abspath(__file__))
ORACLE_SCRIPT = os.path.join(HERE, "torch_oracle.py")

CLASSIFIER_SIZE = 32
CLASSIFIER_STEPS = 160
CLASSIFIER_BATCH = 64
CLASSIFIER_LEARNING_RATE = 3e-3

#: The one timm oracle run: every width and size the parity modules compare, seed 0,
#: perturbed norms, the stage maps of the segmentation backbone included.
ORACLE_MODELS = ("mobilevitv2_050", "mobilevitv2_075", "mobilevitv2_100")
ORACLE_SIZES = ((256, 256), (224, 224), (256, 320), (288, 192), (193, 201))
ORACLE_BLOCK_SIZES = ((32, 32), (15, 17))  # 15x17: odd sides (the align-corners resize)
ORACLE_BATCH = 2
ORACLE_SEED = 0


def once_per_run(base: Path, name: str, build: Callable[[Path], None]) -> Path:
    """`base/name`, made by `build(folder)` once per pytest run and shared by its workers.

    `base` is `tmp_path_factory.getbasetemp()`; under pytest-xdist each worker's base is
    a subfolder of the run's, so the run's folder is its parent.
    """
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent
    folder = base / name
    with FileLock(str(folder) + ".lock"):
        done = folder / ".complete"
        if not done.exists():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir(parents=True)
            build(folder)
            done.touch()
    return folder


def fashion_mnist_ready() -> bool:
    from keras_mvit2.data.sources import FASHION_MNIST_DIR

    return os.path.exists(os.path.join(FASHION_MNIST_DIR, "t10k-images-idx3-ubyte.gz"))


def fashion_mnist_rgb(images: np.ndarray, size: int) -> np.ndarray:
    """uint8 (N, 28, 28) -> float32 (N, size, size, 3) in [0, 1] (bilinear, gray repeated)."""
    import tensorflow as tf

    x = tf.image.resize(images[..., None].astype("float32") / 255.0, (size, size), "bilinear")
    return np.repeat(np.clip(np.asarray(x), 0.0, 1.0), 3, axis=-1)


def train_classifier(folder: Path) -> None:
    """Fits MobileViTV2-0.5 (logits) on the first 160 x 64 Fashion-MNIST training images at
    32x32 and saves it as `folder/model.keras`.

    In a subprocess on one CPU thread, so that every run on a machine trains nearly the same
    model: TensorFlow's multi-threaded kernels sum in an order that varies from run to run,
    and Adam turns those last-bit differences into different models (two seeded trainings in
    two processes differed by up to 1.1 in a weight, also with `enable_op_determinism`, and
    the int8 figures of the tests that use the model moved with them). On one thread they
    differ by 1e-3 at most (what is left: summation orders that depend on where a buffer is
    allocated), in the same 33 s."""
    one_thread = {"OMP_NUM_THREADS": "1", "TF_NUM_INTRAOP_THREADS": "1",
                  "TF_NUM_INTEROP_THREADS": "1", "TF_ENABLE_ONEDNN_OPTS": "0"}
    subprocess.run([sys.executable, __file__, "train_classifier", str(folder)], check=True,
                   stdout=subprocess.DEVNULL, env={**os.environ, **one_thread})


def _train_classifier_here(folder: Path) -> None:
    import keras

    import keras_mvit2 as mv
    from keras_mvit2.data.sources import load_fashion_mnist_arrays

    x, y = load_fashion_mnist_arrays("train")
    n = CLASSIFIER_STEPS * CLASSIFIER_BATCH
    keras.utils.set_random_seed(0)
    model = mv.MobileViTV2(0.5, input_shape=(CLASSIFIER_SIZE, CLASSIFIER_SIZE, 3), classes=10,
                           classifier_activation=None)
    optimizer = keras.optimizers.Adam(keras.optimizers.schedules.CosineDecay(
        CLASSIFIER_LEARNING_RATE, CLASSIFIER_STEPS, alpha=0.05))
    model.compile(optimizer=optimizer,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    optimizer.build(model.trainable_variables)  # else the first step traces twice (slow)
    model.fit(fashion_mnist_rgb(x[:n], CLASSIFIER_SIZE), y[:n].astype("int64"),
              batch_size=CLASSIFIER_BATCH, epochs=1, verbose=0)
    model.save(folder / "model.keras")


#: The trained detector (`train_detector`): input side, training steps, validation images,
#: and the score threshold of its post-processing op.
DETECTOR_SIZE = 64
DETECTOR_STEPS = 120
DETECTOR_NUM_TEST = 200
DETECTOR_SCORE_THRESHOLD = 0.3


def build_detector(num_classes: int, backbone_weights=None):
    """The SSDLite of `train_detector` (MobileViTV2-0.5, 64x64, 4 maps)."""
    from keras_mvit2.tasks import AnchorConfig, SSDLite

    anchors = AnchorConfig(output_strides=(8, 16, 32, -1),
                           aspect_ratios=((2,), (2, 3), (2, 3), (2,)),
                           min_scale=0.15, max_scale=0.9)
    return SSDLite(0.5, input_shape=(DETECTOR_SIZE, DETECTOR_SIZE, 3), classes=num_classes,
                   anchor_config=anchors, proj_channels=(64, 64, 64, 32),
                   backbone_weights=backbone_weights)


def train_detector(folder: Path, classifier_path: str) -> None:
    """Fits `build_detector` (backbone: the trained classifier at 32x32) for DETECTOR_STEPS
    steps on pasted Fashion-MNIST (Trouser, Sneaker, Bag on photos; at 80 steps 70-100 weak
    boxes an image crowd the score threshold and the 100-box cap) and saves its weights
    (`detector.weights.h5`), DETECTOR_NUM_TEST validation images as uint8 (`images.npy`)
    and its classes (`classes.json`)."""
    import keras

    import keras_mvit2 as mv
    from keras_mvit2.tasks import data as td
    from keras_mvit2.tasks import train as tt

    trained = keras.saving.load_model(classifier_path)
    classifier = mv.mobilevitv2_050(input_shape=(CLASSIFIER_SIZE, CLASSIFIER_SIZE, 3),
                                    classes=10, weights=None)
    classifier.set_weights(trained.get_weights())
    train = td.pasted_fashion_mnist(1024, DETECTOR_SIZE, scale_range=(0.4, 0.8),
                                    objects_per_image=(1, 2), seed=2)
    test = td.pasted_fashion_mnist(DETECTOR_NUM_TEST, DETECTOR_SIZE, scale_range=(0.4, 0.8),
                                   objects_per_image=(1, 2), split="val", seed=3)
    keras.utils.set_random_seed(0)
    model = build_detector(train.num_classes, backbone_weights=classifier)
    tt.compile_detection(model, tt.task_optimizer(
        tt.TaskOptimizerConfig("adamw", 3e-3, 3e-4, 0.01, 10, 3e-4, 10.0, None),
        DETECTOR_STEPS))
    dataset = td.detection_dataset(train.images, train.boxes, train.labels, model.anchors, 16,
                                   training=True, config=model.anchor_config, augment=None,
                                   seed=0)
    model.fit(dataset, epochs=1, steps_per_epoch=DETECTOR_STEPS, verbose=0)
    model.save_weights(folder / "detector.weights.h5")
    np.save(folder / "images.npy",
            np.clip(np.round(test.images * 255.0), 0, 255).astype(np.uint8))
    (folder / "classes.json").write_text(json.dumps(
        {"num_classes": int(train.num_classes), "class_names": list(train.class_names)}))


def load_detector(folder: Path):
    """(model, uint8 validation images, class names) of `train_detector`'s folder."""
    classes = json.loads((folder / "classes.json").read_text())
    names = classes["class_names"]
    model = build_detector(classes["num_classes"])
    model.load_weights(folder / "detector.weights.h5")
    return model, np.load(folder / "images.npy"), names


def client_pixels(box: np.ndarray, size: int = DETECTOR_SIZE) -> np.ndarray:
    """A normalized (x1, y1, x2, y2) box as MediaPipe reports it: integer pixels, origin and
    size each truncated (``origin_x = int(xmin * W)``, ``width = int((xmax - xmin) * W)``)."""
    origin = np.floor(box[:2] * size)
    return np.concatenate([origin, origin + np.floor((box[2:] - box[:2]) * size)])


def run_timm_oracle(folder: Path) -> None:
    """tests/torch_oracle.py with the ORACLE_* settings, in a subprocess, into `folder`."""
    tag = "{}x{}".format
    subprocess.run(
        [sys.executable, ORACLE_SCRIPT, "--out-dir", str(folder),
         "--models", ",".join(ORACLE_MODELS),
         "--sizes", ",".join(tag(*s) for s in ORACLE_SIZES),
         "--block-sizes", ",".join(tag(*s) for s in ORACLE_BLOCK_SIZES),
         "--batch", str(ORACLE_BATCH), "--seed", str(ORACLE_SEED),
         "--config", '{"stage_maps": true}'],
        check=True, stdout=subprocess.DEVNULL,
    )


if __name__ == "__main__":  # train_classifier's subprocess
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    tf.config.experimental.enable_op_determinism()
    {"train_classifier": _train_classifier_here}[sys.argv[1]](Path(sys.argv[2]))
