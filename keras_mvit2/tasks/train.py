"""Training and evaluation of the task models on top of Keras `fit`.

The optimizer presets are the paper's Table 11 (finetuning MobileViTv2 on downstream
tasks): AdamW / SGD, cosine schedule with linear warm-up, gradient clipping at 10 and
an exponential moving average of the weights. Evaluation returns mIoU (segmentation,
confusion-matrix based) and COCO mAP (detection, pycocotools).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import keras
import numpy as np

from keras_mvit2.backend import require_tensorflow
from keras_mvit2.tasks.detection import (
    AnchorConfig,
    Detections,
    SSDLoss,
    coco_map,
    postprocess_detections,
)
from keras_mvit2.tasks.segmentation import (
    SegmentationCrossEntropy,
    SegmentationMeanIoU,
    confusion_matrix,
    iou_from_confusion,
    mean_iou,
)

require_tensorflow("keras_mvit2.tasks.train (the task models' training helpers)")

import tensorflow as tf  # noqa: E402

__all__ = [
    "TABLE11",
    "TaskOptimizerConfig",
    "center_box_baseline",
    "compile_detection",
    "compile_segmentation",
    "evaluate_detection",
    "evaluate_segmentation",
    "predict_detections",
    "predict_segmentation",
    "random_box_baseline",
    "task_optimizer",
]


@dataclass(frozen=True)
class TaskOptimizerConfig:
    """Optimizer and schedule of a task run (fields as the rows of Table 11).

    Attributes:
        optimizer: "adamw" or "sgd" (momentum 0.9).
        base_lr: peak learning rate, reached after the warm-up.
        min_lr: final learning rate of the cosine schedule.
        weight_decay: decoupled weight decay (AdamW) / L2 weight decay (SGD, Keras'
            `weight_decay` of SGD is decoupled too).
        warmup_steps: linear warm-up steps from `warmup_init_lr` (0: none).
        warmup_init_lr: learning rate at step 0 of the warm-up.
        grad_clip: global gradient-norm clipping (Table 11: 10).
        ema_momentum: weight EMA decay per step (`None`: no EMA). ml-cvnets' EMA
            momentum 0.0005 is `1 - decay`, i.e. decay 0.9995. With Keras' `use_ema`,
            `fit` ends by copying the EMA weights into the model.
    """

    optimizer: str = "adamw"
    base_lr: float = 9e-4
    min_lr: float = 1e-6
    weight_decay: float = 0.05
    warmup_steps: int = 500
    warmup_init_lr: float = 9e-5
    grad_clip: float | None = 10.0
    ema_momentum: float | None = 0.9995

    def replace(self, **changes) -> TaskOptimizerConfig:
        return dataclasses.replace(self, **changes)


#: Table 11 of the paper (columns), as `TaskOptimizerConfig`s.
TABLE11 = {
    # SSDLite-MobileViTv2 on MS-COCO: AdamW 0.0009, wd 0.05, 500 warm-up from 9e-5.
    "detection_coco": TaskOptimizerConfig("adamw", 9e-4, 1e-6, 0.05, 500, 9e-5),
    # DeepLabv3 on ADE20k: SGD 0.02, wd 1e-4, no warm-up (ml-cvnets min_lr 2e-4).
    "segmentation_ade20k": TaskOptimizerConfig("sgd", 0.02, 2e-4, 1e-4, 0, 0.02),
    # DeepLabv3 on PASCAL VOC: AdamW 0.0005, wd 0.05, 500 warm-up from 5e-5.
    "segmentation_voc": TaskOptimizerConfig("adamw", 5e-4, 1e-6, 0.05, 500, 5e-5),
}


def task_optimizer(config: TaskOptimizerConfig, total_steps: int) -> keras.optimizers.Optimizer:
    """The Keras optimizer of `config` for a run of `total_steps` optimizer steps."""
    if total_steps < 1:
        raise ValueError(f"total_steps must be >= 1. Received: {total_steps}")
    warmup = min(config.warmup_steps, max(total_steps - 1, 0))
    decay_steps = max(total_steps - warmup, 1)
    schedule = keras.optimizers.schedules.CosineDecay(
        initial_learning_rate=config.warmup_init_lr if warmup else config.base_lr,
        decay_steps=decay_steps,
        alpha=config.min_lr / config.base_lr,
        **({"warmup_target": config.base_lr, "warmup_steps": warmup} if warmup else {}),
    )
    common = {
        "learning_rate": schedule,
        "weight_decay": config.weight_decay or None,
        "global_clipnorm": config.grad_clip,
        "use_ema": config.ema_momentum is not None,
        "ema_momentum": config.ema_momentum if config.ema_momentum is not None else 0.99,
    }
    if config.optimizer == "adamw":
        return keras.optimizers.AdamW(**common)
    if config.optimizer == "sgd":
        return keras.optimizers.SGD(momentum=0.9, nesterov=False, **common)
    raise ValueError(f"optimizer must be 'adamw' or 'sgd'. Received: {config.optimizer!r}")


def _compile(model: keras.Model, optimizer: keras.optimizers.Optimizer, loss,
             metrics=None) -> keras.Model:
    """Compiles `model` without weight decay on biases and norm parameters (ml-cvnets
    no_decay_bn_filter_bias) and builds the optimizer slots now: created inside the first
    traced train step, they would make TensorFlow trace the whole step a second time."""
    if optimizer.weight_decay:
        optimizer.exclude_from_weight_decay(var_names=["bias", "gamma", "beta"])
    model.compile(optimizer=optimizer, loss=loss, metrics=metrics, jit_compile=False)
    model.optimizer.build(model.trainable_variables)
    return model


# --------------------------------------------------------------------------------------
# Segmentation


def compile_segmentation(
    model: keras.Model,
    num_classes: int,
    optimizer: keras.optimizers.Optimizer,
    *,
    ignore_index: int = 255,
    label_smoothing: float = 0.0,
) -> keras.Model:
    """Compiles a segmentation model with the ignore-index cross-entropy and mIoU."""
    return _compile(model, optimizer,
                    SegmentationCrossEntropy(ignore_index, label_smoothing=label_smoothing),
                    metrics=[SegmentationMeanIoU(num_classes, ignore_index)])


def predict_segmentation(model: keras.Model, images: np.ndarray, batch_size: int = 16,
                         predict_fn=None) -> np.ndarray:
    """Class maps `(N, H, W)` int32 (argmax of the logits, resized to the images).

    `predict_fn` maps a batch of images to logits (default: the Keras model); pass e.g.
    a TFLite runner to evaluate an exported model the same way.
    """
    images = np.asarray(images, np.float32)
    out = []
    for start in range(0, len(images), batch_size):
        batch = images[start:start + batch_size]
        logits = model.predict_on_batch(batch) if predict_fn is None else predict_fn(batch)
        logits = np.asarray(logits)
        if logits.shape[1:3] != batch.shape[1:3]:
            logits = tf.raw_ops.ResizeBilinear(
                images=logits, size=batch.shape[1:3], align_corners=True,
                half_pixel_centers=False).numpy()
        out.append(np.argmax(logits, axis=-1).astype(np.int32))
    return np.concatenate(out, axis=0)


def evaluate_segmentation(
    model: keras.Model | None,
    images: np.ndarray,
    masks: np.ndarray,
    num_classes: int,
    *,
    ignore_index: int = 255,
    batch_size: int = 16,
    predict_fn=None,
) -> dict:
    """mIoU, per-class IoU, pixel accuracy and the confusion matrix on `(images, masks)`."""
    predictions = predict_segmentation(model, images, batch_size, predict_fn)
    matrix = confusion_matrix(masks, predictions, num_classes, ignore_index)
    return {
        "miou": mean_iou(matrix),
        "per_class_iou": [None if np.isnan(v) else float(v)
                          for v in iou_from_confusion(matrix)],
        "pixel_accuracy": float(np.trace(matrix) / max(matrix.sum(), 1)),
        "confusion_matrix": matrix.tolist(),
    }


# --------------------------------------------------------------------------------------
# Detection


def compile_detection(
    model: keras.Model,
    optimizer: keras.optimizers.Optimizer,
    *,
    neg_pos_ratio: int = 3,
    label_smoothing: float = 0.0,
) -> keras.Model:
    """Compiles an SSD model with `SSDLoss` (targets from `tasks.data.detection_dataset`)."""
    return _compile(model, optimizer, SSDLoss(neg_pos_ratio, label_smoothing=label_smoothing))


def predict_detections(
    model: keras.Model | None,
    images: np.ndarray,
    anchors: np.ndarray,
    config: AnchorConfig | None = None,
    *,
    batch_size: int = 16,
    predict_fn=None,
    **postprocess,
) -> list[Detections]:
    """Runs the model (or `predict_fn`) and `postprocess_detections` on every image."""
    config = config or AnchorConfig()
    images = np.asarray(images, np.float32)
    out: list[Detections] = []
    for start in range(0, len(images), batch_size):
        batch = images[start:start + batch_size]
        raw = model.predict_on_batch(batch) if predict_fn is None else predict_fn(batch)
        out.extend(postprocess_detections(np.asarray(raw), anchors, config, **postprocess))
    return out


def evaluate_detection(
    model: keras.Model | None,
    images: np.ndarray,
    ground_truth: Sequence[tuple[np.ndarray, np.ndarray]],
    anchors: np.ndarray,
    config: AnchorConfig | None = None,
    *,
    batch_size: int = 16,
    predict_fn=None,
    **postprocess,
) -> dict:
    """COCO mAP@[.5:.95] (and AP50, AP75, AR100) of the model on `images`."""
    detections = predict_detections(model, images, anchors, config, batch_size=batch_size,
                                    predict_fn=predict_fn, **postprocess)
    height, width = np.asarray(images).shape[1:3]
    return coco_map(ground_truth, detections, (height, width))


# --------------------------------------------------------------------------------------
# Trivial baselines (what a model must beat to have learned anything)


def center_box_baseline(
    ground_truth: Sequence[tuple[np.ndarray, np.ndarray]], num_classes: int | None = None
) -> dict:
    """COCO mAP of a detector that ignores the image: in every image, one centred box of
    the mean ground-truth size for each object class, all with score 1 (the mean size is
    taken from the evaluated ground truth itself, which only helps the baseline)."""
    boxes = np.concatenate([np.asarray(b).reshape(-1, 4) for b, _ in ground_truth])
    labels = np.concatenate([np.asarray(lab).reshape(-1) for _, lab in ground_truth])
    size = (boxes[:, 2:] - boxes[:, :2]).mean(axis=0)
    box = np.concatenate([0.5 - size / 2, 0.5 + size / 2]).astype(np.float32)
    classes = np.arange(1, (num_classes or int(labels.max()) + 1))
    guess = Detections(np.tile(box, (len(classes), 1)), classes,
                       np.ones(len(classes), np.float32))
    return coco_map(ground_truth, [guess] * len(ground_truth))


def random_box_baseline(
    ground_truth: Sequence[tuple[np.ndarray, np.ndarray]], *, boxes_per_image: int = 20,
    seed: int = 0,
) -> dict:
    """COCO mAP of random boxes (uniform centres, sides in [0.1, 0.7]), random classes
    and scores, `boxes_per_image` per image."""
    rng = np.random.default_rng(seed)
    labels = np.concatenate([np.asarray(lab).reshape(-1) for _, lab in ground_truth])
    top = int(labels.max())
    guesses = []
    for _ in ground_truth:
        centers = rng.uniform(0.0, 1.0, (boxes_per_image, 2))
        sides = rng.uniform(0.1, 0.7, (boxes_per_image, 2))
        boxes = np.clip(np.concatenate([centers - sides / 2, centers + sides / 2], 1), 0, 1)
        guesses.append(Detections(boxes.astype(np.float32),
                                  rng.integers(1, top + 1, boxes_per_image),
                                  rng.uniform(0, 1, boxes_per_image).astype(np.float32)))
    return coco_map(ground_truth, guesses)
