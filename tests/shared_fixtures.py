"""What several test modules share: the committed trained checkpoints and what they were
trained on, and the run's timm oracles.

- The trained checkpoints in `tests/data/checkpoints/` (made by `tests/make_checkpoints.py`,
  which says how to remake them; tests that need *a trained model* load them, tests *of
  training* train): the Fashion-MNIST classifier (`CLASSIFIER_*`), the detector of the
  client tests on its backbone (`DETECTOR_*`) and the task segmenter and detector
  (`TASK_*`, `build_task_*`), with the pasted Fashion-MNIST sets they are measured on.
- `once_per_run` builds a folder once per run, also when pytest-xdist runs the modules in
  several worker processes (the workers share the run's base temporary folder and take a
  file lock; the first one builds, the others read). The fixtures of `conftest.py` use it
  for the timm oracles, each run once, in a subprocess (torch convolutions segfault once
  TensorFlow is imported), for every module that compares with timm:
  `tests/torch_oracle.py` (MobileViTV2, `ORACLE_*`) and `tests/timm_oracle_v1_vit.py`
  (MobileViT v1 and DeiT, `V1_VIT_ORACLE_*`).
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
V1_VIT_ORACLE_SCRIPT = os.path.join(HERE, "timm_oracle_v1_vit.py")
#: The committed trained checkpoints (tests/make_checkpoints.py).
CHECKPOINTS = Path(HERE) / "data" / "checkpoints"

#: The trained classifier (`classifier.keras`): MobileViTV2-0.5 (logits) fitted at 32x32 on
#: the first CLASSIFIER_STEPS x CLASSIFIER_BATCH Fashion-MNIST training images.
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

#: The one run of the MobileViT v1 / DeiT oracle: every model and size that
#: tests/test_backends.py, tests/test_mobilevit_v1.py and tests/test_vit.py compare, batch 2,
#: seed 0 (the weights depend on the seed alone). The script draws a model's images in the
#: order of its sizes from one numpy seed: test_backends' three sizes come first, as in the
#: run it made of its own.
V1_VIT_ORACLE_MODELS = {
    "mobilevit_xxs": ((224, 224), (256, 320), (193, 201), (256, 256)),
    "deit_tiny_patch16_224": ((224, 224),),
}
V1_VIT_ORACLE_BATCH = 2
V1_VIT_ORACLE_SEED = 0


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
    from keras_mvit2.data.files import FASHION_MNIST_DIR

    return os.path.exists(os.path.join(FASHION_MNIST_DIR, "t10k-images-idx3-ubyte.gz"))


def fashion_mnist_rgb(images: np.ndarray, size: int) -> np.ndarray:
    """uint8 (N, 28, 28) -> float32 (N, size, size, 3) in [0, 1] (bilinear, gray repeated)."""
    import tensorflow as tf

    x = tf.image.resize(images[..., None].astype("float32") / 255.0, (size, size), "bilinear")
    return np.repeat(np.clip(np.asarray(x), 0.0, 1.0), 3, axis=-1)


#: The detectors and the segmenter of the checkpoints: input side (64x64 pasted Fashion-MNIST)
#: and the segmenter's classes (Trouser and Bag: from scratch, 300 steps learn two classes
#: reliably; with Sneaker as a third class some initializations stay on all-background).
TASK_SIZE = 64
TASK_SEG_CLASSES = (1, 8)
#: The detector of the client tests (`detector.weights.h5`, on the classifier's backbone):
#: input side, training steps, validation images, and the score threshold of its
#: post-processing op.
DETECTOR_SIZE = TASK_SIZE
DETECTOR_STEPS = 120
DETECTOR_NUM_TEST = 200
DETECTOR_SCORE_THRESHOLD = 0.3


def task_anchors():
    """The detectors' small-image anchors: maps of 8x8 (stride 8), 4x4, 2x2 and a global one."""
    from keras_mvit2.tasks import AnchorConfig

    return AnchorConfig(output_strides=(8, 16, 32, -1),
                        aspect_ratios=((2,), (2, 3), (2, 3), (2,)),
                        min_scale=0.15, max_scale=0.9)


def build_detector(num_classes: int = 4, backbone_weights=None):
    """SSDLite (MobileViTV2-0.5, 64x64, `task_anchors`): both detector checkpoints."""
    from keras_mvit2.tasks import SSDLite

    return SSDLite(0.5, input_shape=(TASK_SIZE, TASK_SIZE, 3), classes=num_classes,
                   anchor_config=task_anchors(), proj_channels=(64, 64, 64, 32),
                   backbone_weights=backbone_weights)


def build_segmenter(num_classes: int = len(TASK_SEG_CLASSES) + 1):
    """DeepLabV3 (MobileViTv2-0.5, 64x64, output stride 8, ASPP 64 channels)."""
    from keras_mvit2.tasks import DeepLabV3

    # Rates 2 and 3 are real dilations on the 8x8 map; 12 reaches past it (center tap).
    return DeepLabV3(0.5, input_shape=(TASK_SIZE, TASK_SIZE, 3), classes=num_classes,
                     output_stride=8, aspp_channels=64, aspp_rates=(2, 3, 12))


def pasted_data(split: str, count: int, seed: int, classes=(1, 7, 8), **kwargs):
    """Pasted Fashion-MNIST at 64x64 (`keras_mvit2.tasks.data.pasted_fashion_mnist`), the
    items 0.4-0.8 of the side, one or two an image: what the detectors and the segmenter of
    the checkpoints were trained (and are measured) on."""
    from keras_mvit2.tasks import data as td

    return td.pasted_fashion_mnist(count, TASK_SIZE, classes=classes, scale_range=(0.4, 0.8),
                                   objects_per_image=(1, 2), split=split, seed=seed, **kwargs)


def detection_data(split: str, count: int | None = None):
    """The detectors' images (Trouser, Sneaker, Bag): 1024 training images (seed 2) or
    `count` (default 128) validation images (seed 3)."""
    if split == "train":
        return pasted_data("train", count or 1024, 2)
    return pasted_data("val", count or 128, 3)


def segmentation_data(split: str):
    """The segmenter's images (Trouser and Bag): 1024 training images with an ignore band at
    the item borders (seed 0) or 128 validation images (seed 1)."""
    if split == "train":
        return pasted_data("train", 1024, 0, TASK_SEG_CLASSES, ignore_borders=True)
    return pasted_data("val", 128, 1, TASK_SEG_CLASSES)


def load_detector(folder: Path = CHECKPOINTS):
    """(model, uint8 validation images, class names): the committed detector on the
    classifier's backbone and DETECTOR_NUM_TEST validation images."""
    classes = json.loads((folder / "detector.json").read_text())
    model = build_detector(classes["num_classes"])
    model.load_weights(folder / "detector.weights.h5")
    images = detection_data("val", DETECTOR_NUM_TEST).images
    uint8 = np.clip(np.round(images * 255.0), 0, 255).astype(np.uint8)
    return model, uint8, classes["class_names"]


def load_task_models(folder: Path = CHECKPOINTS):
    """(segmenter, detector): the committed task checkpoints (the detector started from the
    segmenter's backbone)."""
    segmenter = build_segmenter()
    segmenter.load_weights(folder / "task_segmenter.weights.h5")
    detector = build_detector()
    detector.load_weights(folder / "task_detector.weights.h5")
    return segmenter, detector


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


def run_timm_oracle_v1_vit(folder: Path) -> None:
    """tests/timm_oracle_v1_vit.py with the V1_VIT_ORACLE_* settings, in a subprocess, into
    `folder`."""
    models = ",".join(f"{name}:" + "+".join(f"{h}x{w}" for h, w in sizes)
                      for name, sizes in V1_VIT_ORACLE_MODELS.items())
    subprocess.run(
        [sys.executable, V1_VIT_ORACLE_SCRIPT, "--out-dir", str(folder), "--models", models,
         "--batch", str(V1_VIT_ORACLE_BATCH), "--seed", str(V1_VIT_ORACLE_SEED)],
        check=True, stdout=subprocess.DEVNULL, timeout=600,
    )


# --------------------------------------------------------------------------------------
# Client files: the `.tflite` exports that tests/test_web.py and tests/test_mediapipe_clients.py
# both load, made once per run (conftest.py's `client_classifier_tflite` and
# `client_detector_tflite`, through `once_per_run`). Each module used to make the same
# conversions of the same weights itself, byte for byte the same files (the appended labels
# archive has a fixed date: tests/test_tflite_standard_metadata.py).

#: The classifier's files of both client modules (`classifier_<quantization>.tflite`, float
#: I/O); the int8 one is calibrated on the first CLIENT_CALIBRATION_IMAGES training images.
CLIENT_CLASSIFIER_QUANTIZATIONS = ("float32", "int8")
CLIENT_CALIBRATION_IMAGES = 200


def client_rgb_uint8(images: np.ndarray, size: int = CLASSIFIER_SIZE) -> np.ndarray:
    """uint8 (N, 28, 28) -> uint8 (N, size, size, 3): what a client is handed (a camera
    frame, a page's photo): bilinear with antialiasing, rounded, gray repeated."""
    import tensorflow as tf

    resized = tf.image.resize(images[..., None].astype("float32"), (size, size), "bilinear",
                              antialias=True)
    return np.repeat(np.clip(np.round(np.asarray(resized)), 0, 255).astype(np.uint8), 3, -1)


def client_classifier(classifier_path):
    """MobileViTV2-0.5 at CLASSIFIER_SIZE with a softmax: the weights of the trained
    classifier (`classifier_path`, its `.keras` file, which ends in logits)."""
    import keras

    import keras_mvit2 as mv

    trained = keras.saving.load_model(classifier_path)
    model = mv.mobilevitv2_050(input_shape=(CLASSIFIER_SIZE, CLASSIFIER_SIZE, 3), classes=10,
                               weights=None)
    model.set_weights(trained.get_weights())
    return model


def write_client_classifier_tflite(folder: Path, classifier_path) -> None:
    """`classifier_<quantization>.tflite` in `folder` for CLIENT_CLASSIFIER_QUANTIZATIONS:
    `client_classifier` by the TFLite target (what the web target's convert runs), float
    I/O, Fashion-MNIST's class names; int8 calibrated on `client_rgb_uint8` of the first
    CLIENT_CALIBRATION_IMAGES training images."""
    from keras_mvit2.data.files import FASHION_MNIST_CLASSES, load_fashion_mnist_arrays
    from keras_mvit2.export import get_target

    model = client_classifier(classifier_path)
    train, _ = load_fashion_mnist_arrays("train")
    calibration = client_rgb_uint8(train[:CLIENT_CALIBRATION_IMAGES])
    for quantization in CLIENT_CLASSIFIER_QUANTIZATIONS:
        get_target("tflite").convert(
            model, folder / f"classifier_{quantization}.tflite", quantization=quantization,
            io_dtype="float32", class_names=list(FASHION_MNIST_CLASSES),
            calibration_data=calibration if quantization == "int8" else None)


def write_client_detector_tflite(folder: Path, model, class_names) -> None:
    """`detector.tflite` in `folder`: the detector `model` ending in the
    TFLite_Detection_PostProcess op (`with_detection_postprocess`, score threshold
    DETECTOR_SCORE_THRESHOLD), float32, with `class_names`."""
    from keras_mvit2.export import get_target, with_detection_postprocess

    get_target("tflite").convert(
        with_detection_postprocess(model, score_threshold=DETECTOR_SCORE_THRESHOLD),
        folder / "detector.tflite", class_names=list(class_names))
