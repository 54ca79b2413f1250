"""Quantization-aware training on the shipped graph, kept only where it measures better.

`qat(model, train_data, ...)` starts where post-training quantization ends and writes a
full-int8 TFLite file that is never worse than the post-training one:

1. **The post-training file.** `to_tflite(quantization="int8")` converts the model as
   ``mvit2 export`` does (the `export_forms.INT8` forms, 1x1 pairs fused, the 99.99 %
   activation ranges); its calibrated float graph is kept.
2. **Training on that graph.** `keras_mvit2.quantize.tflite_graph.QuantizedGraph` runs the
   calibrated graph in TensorFlow with every tensor rounded as the post-training file rounds
   it (its scales and zero points; weights per channel as the converter will quantize them).
   Its convolution and dense weights are trained towards the float graph's own answers
   (distillation: the KL divergence from the float graph's class probabilities, on the
   training images with random horizontal flips); the activation ranges stay the
   post-training ones (learning them, LSQ / PACT style, measured no better and 11x slower:
   ``docs/int8.md``).
3. **The QAT file.** The same conversion again, with the trained weights written into the
   calibrated graph before the same quantizer call: the same ops and
   tensors as the post-training file (checked); at learning rate 0 the same file.
4. **The choice.** Both files run in LiteRT on every image at hand (the held-out
   `validation_data`, then the training images shifted by 1/16 of their size, an
   augmentation the training did not use) and are compared by their agreement with the Keras
   model, pair-wise with a 95 % interval (`keras_mvit2.quantize.agreement`): the QAT file is
   written to `output_path` only where it agrees more often and the interval says so; else the
   post-training file is.

No TFMOT, no tf_keras and no worker process: the training runs on the TensorFlow backend in
this process.
"""

from __future__ import annotations

import dataclasses
import math
import os
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from keras_mvit2.quantize import _worker_client
from keras_mvit2.quantize.agreement import AgreementComparison, compare_agreement
from keras_mvit2.utils.arguments import validate_positive_ints

__all__ = ["IO_DTYPES", "QATResult", "qat"]

#: Input/output types of the full-integer file.
IO_DTYPES = ("int8", "uint8", "float32")
#: The shift (a fraction of the image size) of the training images the choice is judged on.
JUDGE_SHIFT = 1 / 16


@dataclasses.dataclass
class QATResult:
    """What `qat` built, measured and chose.

    Attributes:
        tflite_path: the file written (the chosen one).
        shipped: ``"qat"`` or ``"post_training"``: which file `tflite_path` holds.
        post_training_path: where the post-training file was also written, or None.
        qat_path: where the quantization-aware-trained file was also written, or None.
        io_dtype: the file's input/output type.
        choice: the two files' agreement with the Keras model on the judged images
            (`AgreementComparison`: a = post-training, b = QAT).
        judged_on: the images of the choice, in words.
        float_accuracy: the Keras model's top-1 on `validation_data`'s labels (or None).
        int8_accuracy: the written file's top-1 on them (or None).
        num_validation: held-out images.
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
    post_training_path: str | None
    qat_path: str | None
    io_dtype: str
    choice: AgreementComparison
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
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
               if f.name not in ("report", "choice")}
        out["choice"] = self.choice.to_dict()
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
    class_names: Sequence[str] | None = None,
    seed: int = 0,
    verbose: bool = True,
) -> QATResult:
    """Quantization-aware training of the post-training int8 file; writes the better file.

    See the module docstring for the steps. The file at `output_path` is the QAT file where it
    agrees with the Keras model measurably more often than the post-training file, else the
    post-training file (`QATResult.shipped` says which, `QATResult.choice` by how much).

    Args:
        model_or_path: a trained Keras 3 model (one image input, class scores out) or the
            path of a ``.keras`` file.
        train_data: the training images: ``(images, labels)`` arrays (float in [0, 1] or
            uint8), a `tf.data.Dataset` of ``(images, labels)`` batches, or a folder of class
            sub-folders / ``"fashion_mnist"``. The labels are not trained on (the targets are
            the model's own answers).
        epochs: passes over the training images.
        steps_per_epoch: batches per pass (default: one pass over the images; a dataset is
            read once, this many batches).
        learning_rate: Adam's learning rate (cosine decay to 0 over the steps). The default
            1e-6 is the measured one: Adam moves every weight by about the rate each step,
            and from 1e-5 up the steps flip weights across their rounding and raise the
            distillation loss (``docs/int8.md``). 0 gives the post-training file.
        batch_size: images per step.
        output_path: the file to write (atomically).
        post_training_path: also write the post-training file here (optional).
        qat_path: also write the quantization-aware-trained file here (optional).
        representative_data: calibration images (as `to_tflite`'s); default: images from
            `train_data`.
        num_calibration_samples: calibration images.
        activation_ranges: the post-training range method (`to_tflite`'s, default
            ``"p99.99"``).
        io_dtype: ``"int8"`` (default), ``"uint8"`` or ``"float32"`` input / output.
        validation_data: held-out labelled images (the same forms as `train_data`;
            ``"fashion_mnist"`` means its test split): judged on first, and the top-1 of the
            model and the file measured on them.
        class_names: one name per class, written into the file's metadata.
        seed: seed of the batch order and flips.
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
    x, _, _ = _worker_client.labelled_arrays(
        train_data, input_shape=input_shape, what="train_data", batch_size=batch_size,
        max_batches=steps_per_epoch, split="train", limit=limit)
    xv = yv = None
    if validation_data is not None:
        xv, yv, _ = _worker_client.labelled_arrays(
            validation_data, input_shape=input_shape, what="validation_data",
            batch_size=batch_size, split="test")
        yv = _worker_client.integer_labels(yv, num_classes, "validation_data")
    if representative_data is None:
        pick = np.random.default_rng(seed).choice(
            len(x), min(num_calibration_samples, len(x)), replace=False)
        representative_data = x[np.sort(pick)]
    steps = steps_per_epoch or math.ceil(len(x) / batch_size)

    with tempfile.TemporaryDirectory(prefix="keras_mvit2_qat_") as tmp:
        convert = _converter(model, representative_data, num_calibration_samples,
                             activation_ranges, io_dtype, class_names)
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
        history = _train(graph, x, epochs=epochs, steps=steps, batch_size=batch_size,
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

        judge, judged_on = _judged_images(x, xv)
        log(f"judging both files against the Keras model on {judged_on}")
        choice = _compare(model, judge, post_path, trained_path)
        shipped = "qat" if choice.b_is_better else "post_training"
        log(f"agreement with Keras: post-training {100 * choice.agreement_a:.1f} %, QAT "
            f"{100 * choice.agreement_b:.1f} % (difference {100 * choice.difference:+.1f}, "
            f"95 % interval {100 * choice.difference_interval[0]:+.1f} to "
            f"{100 * choice.difference_interval[1]:+.1f} points): writing the "
            f"{'QAT' if shipped == 'qat' else 'post-training'} file")
        _copy(trained_path if shipped == "qat" else post_path, output_path)
        if post_training_path is not None:
            post_training_path = os.fspath(post_training_path)
            _copy(post_path, post_training_path)
        if qat_path is not None:
            qat_path = os.fspath(qat_path)
            _copy(trained_path, qat_path)

    from keras_mvit2.export.tflite.inspect import inspect_tflite
    from keras_mvit2.export.tflite.run import run_tflite

    float_acc = int8_acc = None
    if xv is not None:
        float_acc = float(np.mean(_keras_classes(model, xv) == yv))
        int8_acc = float(np.mean(np.argmax(run_tflite(output_path, xv), -1) == yv))
    return QATResult(
        tflite_path=output_path, shipped=shipped, post_training_path=post_training_path,
        qat_path=qat_path,
        io_dtype=io_dtype, choice=choice, judged_on=judged_on, float_accuracy=float_acc,
        int8_accuracy=int8_acc, num_validation=0 if xv is None else len(xv), num_ops=num_ops,
        history=history, epochs=epochs, steps_per_epoch=steps, batch_size=batch_size,
        learning_rate=float(learning_rate),
        training_images=len(x), train_seconds=train_seconds,
        seconds=time.monotonic() - start, report=inspect_tflite(output_path),
    )


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

    @tf.function(reduce_retracing=True)
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
    from keras_mvit2.export.tflite.flatbuffer import op_names, parse_flatbuffer

    lists = []
    for path in (post_path, qat_path):
        model = parse_flatbuffer(path)
        kinds = op_names(model)
        graph = model.subgraphs[0]
        lists.append(([kinds[op.opcodeIndex] for op in graph.operators], len(graph.tensors)))
    if lists[0] != lists[1]:
        raise RuntimeError(
            "The quantization-aware-trained file does not have the post-training file's ops "
            "and tensors; it is not written.")
    return len(lists[0][0])


def _judged_images(x: np.ndarray, held_out: np.ndarray | None) -> tuple[np.ndarray, str]:
    """The images the choice is judged on: the held-out ones, then the training ones shifted
    by `JUDGE_SHIFT` of their size (edge pixels repeated), and their description."""
    dy, dx = (max(1, round(JUDGE_SHIFT * d)) for d in x.shape[1:3])
    padded = np.pad(x, ((0, 0), (dy, 0), (dx, 0), (0, 0)), mode="edge")
    shifted = padded[:, :x.shape[1], :x.shape[2]]
    parts = [f"{len(x)} training images shifted by {dy}x{dx} pixels"]
    if held_out is not None:
        parts.insert(0, f"{len(held_out)} held-out images")
        shifted = np.concatenate([held_out, shifted])
    return shifted, " and ".join(parts)


def _keras_classes(model, images: np.ndarray) -> np.ndarray:
    return np.argmax(np.asarray(model.predict(images, batch_size=64, verbose=0)), -1)


def _compare(model, images: np.ndarray, post_path: str, qat_path: str) -> AgreementComparison:
    """The post-training (a) and QAT (b) files' agreement with `model` on `images`."""
    from keras_mvit2.export.tflite.run import run_tflite

    reference = _keras_classes(model, images)
    post = np.argmax(run_tflite(post_path, images), -1)
    trained = np.argmax(run_tflite(qat_path, images), -1)
    return compare_agreement(reference, post, trained)


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
