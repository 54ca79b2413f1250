"""Quantization-aware training on the shipped graph, shipped only where a paired test says so.

`qat(model, train_data, ...)` starts where post-training quantization ends and writes one
full-int8 TFLite file: the quantization-aware-trained one where an exact paired test on images
neither file trained or calibrated on says it agrees with the Keras model more often, else the
post-training one.

1. **The judge images first.** Before anything trains, `split_judge_images` sets aside a
   seeded share (`judge_fraction`, 25 % by default) of the training images read; with
   `validation_data` the judge images are those held-out images plus that share. QAT trains
   on the rest only; the calibration images are never judge images (an image identical to a
   calibration image, or to an image QAT trains on, is not judged on).
2. **The post-training file.** `to_tflite(quantization="int8")` converts the model as
   ``mvit2 export`` does (the `export_forms.INT8` forms, 1x1 pairs fused, the 99.99 %
   activation ranges); its calibrated float graph is kept.
3. **Training on that graph.** `keras_mvit2.quantize.tflite_graph.QuantizedGraph` runs the
   calibrated graph in TensorFlow with every tensor rounded as the post-training file rounds
   it (its scales and zero points; weights per channel as the converter will quantize them).
   Its convolution and dense weights are trained towards the float graph's own answers
   (distillation: the KL divergence from the float graph's class probabilities, on the
   training images with random horizontal flips); the activation ranges stay the
   post-training ones.
4. **The QAT file.** The same conversion again, with the trained weights written into the
   calibrated graph before the same quantizer call: the same ops and tensors as the
   post-training file (checked); at learning rate 0 the same ops, tensors, quantization
   parameters and outputs (its metadata also records the training schedule).
5. **The choice** (`keras_mvit2.quantize.agreement.choose_b`). Both files run in LiteRT on
   the judge images; the QAT file is written to `output_path` only where McNemar's exact
   one-sided test on the images where the two files disagree gives p < 0.05 that it agrees
   with the Keras model more often, its top-1 on the judge images (their labels) is not
   below the post-training file's, and on the held-out `validation_data` alone neither its
   agreement nor its top-1 is below the post-training file's. Else the post-training file is
   written. Guaranteed: a QAT file that agrees no more often than the post-training file is
   written in at most 5 % of the runs. Not guaranteed: that a written QAT file is better on
   other images by the margin judged, or that a QAT file better by less than the judge images
   can show is written.

No TFMOT, no tf_keras and no worker process: the training runs on the TensorFlow backend in
this process.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import os
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from keras_mvit2.quantize import _worker_client
from keras_mvit2.quantize.agreement import AgreementComparison, choose_b, compare_agreement
from keras_mvit2.utils.arguments import validate_positive_ints

__all__ = ["IO_DTYPES", "JUDGE_FRACTION", "JudgeSplit", "QATResult", "judge_files", "qat",
           "split_judge_images"]

#: Input/output types of the full-integer file.
IO_DTYPES = ("int8", "uint8", "float32")
#: The share of the training images read that is set aside (seeded) as judge images.
JUDGE_FRACTION = 0.25


@dataclasses.dataclass(frozen=True)
class JudgeSplit:
    """Which images QAT trains on and which ones judge it (`split_judge_images`).

    Attributes:
        train: indices into the training images: what QAT trains on.
        judge: indices into the training images: set aside, judged on, never trained on.
        held_out: indices into the held-out images that are judged on (all of them but
            those identical to a calibration image).
        num_training_images: training images read (`train`, `judge` and the left-out
            duplicates of judge images).
        fraction, seed: the share set aside and the seed of the draw.
        dropped: images left out of both sets because they equal a calibration image or a
            judge image (``{"held_out": n, "training": m}``).
    """

    train: np.ndarray
    judge: np.ndarray
    held_out: np.ndarray
    num_training_images: int
    fraction: float
    seed: int
    dropped: dict[str, int]

    @property
    def num_judged(self) -> int:
        """Judge images in all: the held-out ones and the set-aside ones."""
        return len(self.held_out) + len(self.judge)

    def describe(self) -> str:
        """The judge images in words, with their sizes."""
        parts = []
        if len(self.held_out):
            parts.append(f"{len(self.held_out)} held-out images")
        parts.append(f"{len(self.judge)} of the {self.num_training_images} training images "
                     f"set aside before training (seed {self.seed}; QAT trained on "
                     f"{len(self.train)} others)")
        return " and ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {"held_out": len(self.held_out), "set_aside": len(self.judge),
                "trained_on": len(self.train), "training_images": self.num_training_images,
                "fraction": self.fraction, "seed": self.seed, "dropped": dict(self.dropped)}


def _digests(images: np.ndarray | None) -> list[bytes]:
    """One digest per image of its float32 pixels (identical images, identical digests)."""
    if images is None:
        return []
    return [hashlib.blake2b(np.ascontiguousarray(image, np.float32).tobytes(),
                            digest_size=16).digest() for image in images]


def split_judge_images(train: np.ndarray, *, fraction: float = JUDGE_FRACTION, seed: int = 0,
                       held_out: np.ndarray | None = None,
                       calibration: np.ndarray | None = None) -> JudgeSplit:
    """Sets aside judge images from the training images before QAT trains.

    A seeded draw of ``round(fraction * len(train))`` of the training images (at least one
    where `fraction` > 0), never one identical to a calibration or a held-out image, is set
    aside; QAT trains on the others, less any identical to a judge image. The held-out images
    are judged on too, less any identical to a calibration image.

    Args:
        train: `(N, H, W, C)` training images QAT may train on.
        fraction: the share set aside, in [0, 1).
        seed: the draw's seed.
        held_out: `(M, H, W, C)` held-out images (`validation_data`), or None.
        calibration: `(K, H, W, C)` images the converter calibrates on, or None.

    Raises:
        ValueError: `fraction` out of range, no image left to train on, or none to judge on.
    """
    if isinstance(fraction, bool) or not isinstance(fraction, int | float) or not (
            0.0 <= fraction < 1.0):
        raise ValueError(f"judge_fraction must be a number in [0, 1). Received: {fraction!r}")
    calibrated = set(_digests(calibration))
    held_digests = _digests(held_out)
    kept_held = np.array([i for i, d in enumerate(held_digests) if d not in calibrated], np.int64)
    train_digests = _digests(train)
    held_set = {held_digests[i] for i in kept_held}
    candidates = np.array([i for i, d in enumerate(train_digests)
                           if d not in calibrated and d not in held_set], np.int64)
    count = 0 if fraction == 0 else max(1, round(fraction * len(train)))
    count = min(count, len(candidates), len(train) - 1)
    judge = np.sort(np.random.default_rng(seed).choice(candidates, count, replace=False)) if (
        count) else np.zeros(0, np.int64)
    judged = held_set | {train_digests[i] for i in judge}
    chosen = set(judge.tolist())
    trained = np.array([i for i, d in enumerate(train_digests)
                        if i not in chosen and d not in judged], np.int64)
    if not len(trained):
        raise ValueError(
            f"No training image is left for QAT after setting aside the judge images "
            f"({len(train)} read, {len(judge)} set aside); give more training images.")
    if not len(kept_held) and not len(judge):
        raise ValueError(
            "QAT has no image to be judged on: give validation_data (held-out images) or a "
            "judge_fraction above 0 with at least two training images that are not "
            f"calibration images ({len(candidates)} of the {len(train)} read are not).")
    return JudgeSplit(train=trained, judge=judge, held_out=kept_held,
                      num_training_images=len(train), fraction=float(fraction), seed=int(seed),
                      dropped={"held_out": len(held_digests) - len(kept_held),
                               "training": len(train) - len(trained) - len(judge)})


@dataclasses.dataclass
class QATResult:
    """What `qat` built, measured and chose.

    Attributes:
        tflite_path: the file written (the chosen one).
        shipped: ``"qat"`` or ``"post_training"``: which file `tflite_path` holds.
        reason: why, in words (`keras_mvit2.quantize.agreement.choose_b`).
        post_training_path: where the post-training file was also written, or None.
        qat_path: where the quantization-aware-trained file was also written, or None.
        io_dtype: the file's input/output type.
        choice: the two files on every judge image (`AgreementComparison`: a =
            post-training, b = QAT; with the paired test's `p_value` and both top-1s).
        held_out_choice: the same on the held-out images alone (None without
            `validation_data`).
        split: the `JudgeSplit` (which images trained, which judged).
        judged_on: the judge images, in words.
        float_accuracy: the Keras model's top-1 on the judged held-out images (or None).
        int8_accuracy: the written file's top-1 on them (or None).
        num_validation: held-out images judged on.
        num_ops: ops of the file (the post-training and the QAT file have the same).
        history: per epoch, the mean distillation loss.
        epochs, steps_per_epoch, batch_size, learning_rate: the schedule.
        training_images: images trained on.
        train_seconds: wall time of the training.
        seconds: wall time of the whole call.
        report: the `keras_mvit2.export.TFLiteReport` of the written file.
    """

    tflite_path: str
    shipped: str
    reason: str
    post_training_path: str | None
    qat_path: str | None
    io_dtype: str
    choice: AgreementComparison
    held_out_choice: AgreementComparison | None
    split: JudgeSplit
    judged_on: str
    float_accuracy: float | None
    int8_accuracy: float | None
    num_validation: int
    num_ops: int
    history: list[dict[str, float]]
    epochs: int
    steps_per_epoch: int
    batch_size: int
    learning_rate: float
    training_images: int
    train_seconds: float
    seconds: float
    report: Any

    @property
    def accuracy_drop(self) -> float | None:
        """float_accuracy - int8_accuracy, in points (x100), or ``None``."""
        if self.float_accuracy is None or self.int8_accuracy is None:
            return None
        return 100.0 * (self.float_accuracy - self.int8_accuracy)

    @property
    def steps(self) -> int:
        """Training steps run: epochs x steps_per_epoch."""
        return self.epochs * self.steps_per_epoch

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serializable dict."""
        skip = ("report", "choice", "held_out_choice", "split")
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
               if f.name not in skip}
        out["choice"] = self.choice.to_dict()
        out["held_out_choice"] = (None if self.held_out_choice is None
                                  else self.held_out_choice.to_dict())
        out["split"] = self.split.to_dict()
        out["report"] = self.report.to_dict() if hasattr(self.report, "to_dict") else None
        out["accuracy_drop_points"] = self.accuracy_drop
        return out


def qat(
    model_or_path: Any,
    train_data: Any,
    *,
    epochs: int = 1,
    steps_per_epoch: int | None = None,
    learning_rate: float = 1e-6,
    batch_size: int = 8,
    output_path: str | os.PathLike = "model_int8.tflite",
    post_training_path: str | os.PathLike | None = None,
    qat_path: str | os.PathLike | None = None,
    representative_data: Any = None,
    num_calibration_samples: int = 200,
    activation_ranges: str = "p99.99",
    io_dtype: str = "int8",
    validation_data: Any = None,
    judge_fraction: float = JUDGE_FRACTION,
    class_names: Sequence[str] | None = None,
    seed: int = 0,
    verbose: bool = True,
) -> QATResult:
    """Quantization-aware training of the post-training int8 file; writes the file the
    paired test chooses.

    See the module docstring for the steps. The file at `output_path` is the QAT file where
    the exact paired test on the judge images (p < 0.05) and the top-1 and held-out checks
    choose it, else the post-training file (`QATResult.shipped` says which,
    `QATResult.choice` the figures and `QATResult.reason` why).

    Args:
        model_or_path: a trained Keras 3 model (one image input, class scores out) or the
            path of a ``.keras`` file.
        train_data: the training images: ``(images, labels)`` arrays (float in [0, 1] or
            uint8), a `tf.data.Dataset` of ``(images, labels)`` batches, or a folder of class
            sub-folders / ``"fashion_mnist"``. A `judge_fraction` of them is set aside to
            judge the files (their labels give the top-1 check); QAT trains on the rest,
            towards the model's own answers (the labels are not trained on).
        epochs: passes over the training images.
        steps_per_epoch: batches per pass (default: one pass over the images trained on; a
            dataset is read once, this many batches, before the judge images are set aside).
        learning_rate: Adam's learning rate (cosine decay to 0 over the steps). The default
            1e-6: Adam moves every weight by about the rate each step, a small part of a
            weight's int8 step, so few weights cross their rounding per step. 0 gives the
            post-training file's ops, tensors, quantization parameters and outputs.
        batch_size: images per step.
        output_path: the file to write (atomically).
        post_training_path: also write the post-training file here (optional).
        qat_path: also write the quantization-aware-trained file here (optional).
        representative_data: calibration images: `(N, H, W, 3)` arrays (float in [0, 1] or
            uint8) or a folder / ``"fashion_mnist"`` (read here, `num_calibration_samples`
            of them); default: images drawn from those QAT trains on. None of them is a
            judge image.
        num_calibration_samples: calibration images.
        activation_ranges: the post-training range method (`to_tflite`'s, default
            ``"p99.99"``).
        io_dtype: ``"int8"`` (default), ``"uint8"`` or ``"float32"`` input / output.
        validation_data: held-out labelled images (the same forms as `train_data`;
            ``"fashion_mnist"`` means its test split): judged on, with the set-aside
            training images, and the top-1 of the model and the file measured on them.
        judge_fraction: the share of the training images set aside as judge images, in
            [0, 1) (0 only with `validation_data`).
        class_names: one name per class, written into the file's metadata.
        seed: seed of the set-aside draw, the batch order and the flips.
        verbose: print progress.

    Returns:
        A `QATResult`.

    Raises:
        ValueError: invalid arguments or data.
        keras_mvit2.quantize.tflite_graph.UnsupportedGraphError: the model's graph holds an
            op the training does not implement (the post-training file still works).
    """
    start = time.monotonic()
    validate_positive_ints(epochs=epochs, batch_size=batch_size,
                           num_calibration_samples=num_calibration_samples)
    if steps_per_epoch is not None:
        validate_positive_ints(steps_per_epoch=steps_per_epoch)
    if io_dtype not in IO_DTYPES:
        raise ValueError(f"io_dtype must be one of {IO_DTYPES}. Received: io_dtype={io_dtype!r}")
    if isinstance(learning_rate, bool) or not isinstance(learning_rate, int | float) or not (
            learning_rate >= 0):
        raise ValueError(f"learning_rate must be >= 0. Received: learning_rate={learning_rate!r}")
    from keras_mvit2.export.tflite.activation_ranges import check_range_method

    activation_ranges = check_range_method(activation_ranges)
    output_path = os.fspath(output_path)
    log = _logger(verbose)

    model = _worker_client.load_keras_model(model_or_path)
    from keras_mvit2.export.class_names import check_class_names

    class_names = check_class_names(class_names, model)
    input_shape = _worker_client.image_input_shape(model)
    num_classes = int(model.outputs[0].shape[-1])
    limit = steps_per_epoch * batch_size if steps_per_epoch else None
    x, y, _ = _worker_client.labelled_arrays(
        train_data, input_shape=input_shape, what="train_data", batch_size=batch_size,
        max_batches=steps_per_epoch, split="train", limit=limit)
    y = _worker_client.integer_labels(y, num_classes, "train_data")
    xv = yv = None
    if validation_data is not None:
        xv, yv, _ = _worker_client.labelled_arrays(
            validation_data, input_shape=input_shape, what="validation_data",
            batch_size=batch_size, split="test")
        yv = _worker_client.integer_labels(yv, num_classes, "validation_data")
    calibration = _calibration_images(representative_data, input_shape,
                                      num_calibration_samples, batch_size)
    split = split_judge_images(x, fraction=judge_fraction, seed=seed, held_out=xv,
                               calibration=calibration)
    train = x[split.train]
    if calibration is None:
        pick = np.random.default_rng(seed).choice(
            len(train), min(num_calibration_samples, len(train)), replace=False)
        calibration = train[np.sort(pick)]
    judge_x = np.concatenate([xv[split.held_out], x[split.judge]]) if xv is not None \
        else x[split.judge]
    judge_y = np.concatenate([yv[split.held_out], y[split.judge]]) if yv is not None \
        else y[split.judge]
    judged_on = split.describe()
    log(f"judge images, set aside before training: {judged_on}")
    steps = steps_per_epoch or math.ceil(len(train) / batch_size)

    with tempfile.TemporaryDirectory(prefix="keras_mvit2_qat_") as tmp:
        convert = _converter(model, calibration, len(calibration), activation_ranges,
                             io_dtype, class_names)
        post_path = os.path.join(tmp, "post_training.tflite")
        log("converting the post-training int8 file")
        calibrated = convert(post_path, None, {})
        from keras_mvit2.quantize.tflite_graph import QuantizedGraph

        with open(post_path, "rb") as f:
            graph = QuantizedGraph(calibrated, f.read())
        log(f"training {len(graph.variables)} weight tensors on the int8 graph "
            f"({len(graph.quantized_tensors)} rounded tensors): {epochs} x {steps} steps of "
            f"{batch_size}, learning rate {learning_rate:g}")
        train_start = time.monotonic()
        history = _train(graph, train, epochs=epochs, steps=steps, batch_size=batch_size,
                         learning_rate=float(learning_rate), seed=seed, log=log)
        train_seconds = time.monotonic() - train_start
        trained = graph.calibrated_with()

        def replace(fresh: bytes, images: np.ndarray) -> bytes:
            if fresh != calibrated:
                raise RuntimeError(
                    "The converter calibrated a different graph the second time; the trained "
                    "weights cannot be written into it.")
            return trained

        trained_path = os.path.join(tmp, "qat.tflite")
        log("converting the quantization-aware-trained int8 file")
        convert(trained_path, replace, {"epochs": epochs, "steps": epochs * steps,
                                    "learning_rate": float(learning_rate)})
        num_ops = _same_graph(post_path, trained_path)

        log(f"judging both files against the Keras model on {split.num_judged} images")
        choice, held_out_choice, keras_top1 = judge_files(
            model, judge_x, judge_y, post_path, trained_path, len(split.held_out))
        ship, reason = choose_b(choice, held_out_choice, name="the QAT file")
        shipped = "qat" if ship else "post_training"
        log(f"agreement with Keras: post-training {100 * choice.agreement_a:.1f} %, QAT "
            f"{100 * choice.agreement_b:.1f} % (only QAT agrees on {choice.only_b} images, "
            f"only the post-training file on {choice.only_a}; paired test p = "
            f"{choice.p_value:.3g}): writing the "
            f"{'QAT' if ship else 'post-training'} file ({reason})")
        _copy(trained_path if ship else post_path, output_path)
        if post_training_path is not None:
            post_training_path = os.fspath(post_training_path)
            _copy(post_path, post_training_path)
        if qat_path is not None:
            qat_path = os.fspath(qat_path)
            _copy(trained_path, qat_path)

    from keras_mvit2.export.tflite.inspect import inspect_tflite

    float_acc = int8_acc = None
    if held_out_choice is not None and held_out_choice.num_images:
        held = judge_y[:held_out_choice.num_images]
        float_acc = float(np.mean(keras_top1[:len(held)] == held))
        int8_acc = held_out_choice.top1_b if ship else held_out_choice.top1_a
    return QATResult(
        tflite_path=output_path, shipped=shipped, reason=reason,
        post_training_path=post_training_path, qat_path=qat_path, io_dtype=io_dtype,
        choice=choice, held_out_choice=held_out_choice, split=split, judged_on=judged_on,
        float_accuracy=float_acc, int8_accuracy=int8_acc, num_validation=len(split.held_out),
        num_ops=num_ops, history=history, epochs=epochs, steps_per_epoch=steps,
        batch_size=batch_size, learning_rate=float(learning_rate),
        training_images=len(train), train_seconds=train_seconds,
        seconds=time.monotonic() - start, report=inspect_tflite(output_path),
    )


def judge_files(model: Any, images: np.ndarray, labels: np.ndarray | None, post_path: str,
                qat_path: str, num_held_out: int = 0,
                ) -> tuple[AgreementComparison, AgreementComparison | None, np.ndarray]:
    """The post-training (a) and QAT (b) files against `model` on the judge `images` (the
    first `num_held_out` of them held-out), run in LiteRT: their comparison on all of them,
    on the held-out ones alone (None where there are none), and the model's top-1 classes."""
    from keras_mvit2.export.tflite.run import run_tflite

    reference = _keras_classes(model, images)
    post = np.argmax(run_tflite(post_path, images), -1)
    trained = np.argmax(run_tflite(qat_path, images), -1)
    judged = compare_agreement(reference, post, trained, labels)
    held_out = None
    if num_held_out:
        part = slice(0, num_held_out)
        held_out = compare_agreement(reference[part], post[part], trained[part],
                                     None if labels is None else labels[part])
    return judged, held_out, reference


def _calibration_images(representative_data: Any, input_shape: tuple[int, ...],
                        num_samples: int, batch_size: int) -> np.ndarray | None:
    """The calibration images as float32 arrays in [0, 1] (None: drawn later from the
    images QAT trains on)."""
    if representative_data is None:
        return None
    if isinstance(representative_data, np.ndarray):
        images = representative_data
        data = (images, np.zeros(len(images), np.int64))
    else:
        data = representative_data
    x, _, _ = _worker_client.labelled_arrays(
        data, input_shape=input_shape, what="representative_data", batch_size=batch_size,
        split="train", limit=num_samples)
    return x[:num_samples]


# ------------------------------------------------------------------------------ steps


def _converter(model, representative, num_samples, activation_ranges, io_dtype, class_names):
    """`convert(path, edit, qat_facts)`: `to_tflite`'s full-int8 conversion of `model` with
    the caller's `edit` of the calibrated graph; returns the calibrated graph it quantized."""
    from keras_mvit2.export import to_tflite

    def convert(path: str, edit: Callable | None, facts: dict[str, Any]) -> bytes:
        seen: list[bytes] = []

        def capture(calibrated: bytes, images: np.ndarray) -> bytes:
            graph = calibrated if edit is None else edit(calibrated, images)
            seen.append(graph)
            return graph

        metadata = {"quantization_aware_training": facts} if facts else None
        to_tflite(model, path, quantization="int8", representative_data=representative,
                  num_calibration_samples=num_samples, io_dtype=io_dtype,
                  class_names=class_names, activation_ranges=activation_ranges,
                  calibrated_edit=capture, metadata=metadata)
        return seen[-1]

    return convert


def _train(graph, x: np.ndarray, *, epochs: int, steps: int, batch_size: int,
           learning_rate: float, seed: int, log: Callable[[str], None]) -> list[dict[str, float]]:
    """Distils the float graph into its int8-rounded self: `epochs` x `steps` Adam steps
    (cosine decay), each on `batch_size` images of `x` randomly flipped."""
    import keras
    import tensorflow as tf

    logits, beta = graph.logits_tensor()
    weights = list(graph.variables.values())
    optimizer = keras.optimizers.Adam(
        keras.optimizers.schedules.CosineDecay(learning_rate, max(epochs * steps, 1)))

    # autograph=False: the step has no Python control flow on tensors, and autograph's
    # conversion of the graph's per-op Python made tracing about a third slower (the
    # trained file is byte for byte the same).
    @tf.function(reduce_retracing=True, autograph=False)
    def step(images, flips):
        images = tf.where(flips[:, None, None, None], tf.reverse(images, [2]), images)
        teacher = tf.nn.softmax(
            beta * graph(images, quantize=False, trained=False, output=logits))
        with tf.GradientTape() as tape:
            student = tf.nn.log_softmax(beta * graph(images, quantize=True, output=logits))
            # KL(teacher || student): 0 where the int8 graph gives the float answers.
            loss = tf.reduce_mean(tf.reduce_sum(
                tf.math.xlogy(teacher, teacher) - teacher * student, -1))
        optimizer.apply(tape.gradient(loss, weights), weights)
        return loss

    rng = np.random.default_rng(seed)
    history = []
    for epoch in range(epochs):
        order = rng.permutation(len(x))
        losses = []
        for i in range(steps):
            pick = order[(np.arange(batch_size) + i * batch_size) % len(x)]
            flips = rng.random(batch_size) < 0.5
            losses.append(float(step(tf.constant(x[pick]), tf.constant(flips))))
        history.append({"loss": float(np.mean(losses))})
        log(f"epoch {epoch + 1}/{epochs}: distillation loss {history[-1]['loss']:.4f}")
    return history


def _same_graph(post_path: str, qat_path: str) -> int:
    """The number of ops of the two files, which must hold the same ops and tensors."""
    from keras_mvit2.export.tflite.flatbuffer import op_names, read_flatbuffer

    lists = []
    for path in (post_path, qat_path):
        model = read_flatbuffer(path)
        kinds = op_names(model)
        graph = model.subgraphs[0]
        lists.append(([kinds[op.opcodeIndex] for op in graph.operators], len(graph.tensors)))
    if lists[0] != lists[1]:
        raise RuntimeError(
            "The quantization-aware-trained file does not have the post-training file's ops "
            "and tensors; it is not written.")
    return len(lists[0][0])


def _keras_classes(model, images: np.ndarray) -> np.ndarray:
    return np.argmax(np.asarray(model.predict(images, batch_size=64, verbose=0)), -1)


def _copy(source: str, path: str) -> None:
    from keras_mvit2.utils.files import atomic_output

    with open(source, "rb") as f:
        data = f.read()
    with atomic_output(path) as tmp_path, open(tmp_path, "wb") as f:
        f.write(data)


def _logger(verbose: bool) -> Callable[[str], None]:
    def log(message: str) -> None:
        if verbose:
            print(f"[qat] {message}", flush=True)
    return log
