"""Quantization-aware training (TFMOT) of a Keras 3 model, exported as full-integer TFLite.

`qat(model, train_data, ...)` fine-tunes a trained Keras 3 model with simulated
int8 quantization and writes a full-integer TFLite model. TFMOT only handles
tf_keras models and must stay out of the Keras 3 process, so the work runs in a
worker process on a tf_keras twin built from the same layer code
(`keras_mvit2.quantize.tf_keras_twin`); the user only sees Keras 3 objects, the
progress lines and the result.

How the layers are quantized (worker side, `keras_mvit2.quantize.qat_worker`):

* Keras built-in layers at the top level of the model (the stem Conv2D + BN +
  SiLU, pooling, the Dense classifier, ...) get TFMOT's default 8-bit scheme,
  with its Conv/BN folding transforms.
* keras_mvit2's composite layers (`InvertedResidual`, `MobileViTV2Block` with
  its `TransformerLayer`s, the attention layers) are opaque to TFMOT, which only
  wraps top-level layers. Their sublayers are wrapped *inside* them with
  `QuantizeWrapperV2` after `quantize_apply` (the composite calls
  ``self.expand_conv(x)`` by attribute, so the wrapper is picked up without any
  change to the layer code), with these QuantizeConfigs:

  - Conv2D / DepthwiseConv2D: kernel fake-quantized per output channel (TFMOT's
    conv weight quantizer); output quantized unless the conv feeds a
    BatchNormalization (found by tracing one call), so the converter can fold
    the BN into the conv as TFMOT's own Conv+BN transform does.
  - Dense / EinsumDense (attention projections of mha, linformer,
    mobile_attention, rfa): kernel per tensor + output.
  - BatchNormalization, GroupNorm1 (GN1) and other normalizations: output.
  - SeparableSelfAttention: ``out_proj`` as a conv above (kernel + output);
    ``qkv_proj`` is never called (the layer reads its kernel and splits it into
    the query, key and value convolutions), so its kernel is fake-quantized
    per channel by a config on the attention layer itself (the wrapper sets the
    quantized kernel back on ``qkv_proj`` before each call); found generically:
    a traced call shows which sublayers are called. The softmax over tokens,
    the context sum and the ReLU(v) * context product are calibrated by the
    converter.
  - TransformerLayer: output (the residual sum); its norms, attention and FFN
    convs as above. LinformerSelfAttention's E and F matrices: per-tensor
    weight quantization.
  - unfold / fold are space_to_depth / depth_to_space + reshape: they move
    int8 values and need no ranges of their own.

  Activation ops called as functions inside our layers (the SiLUs, the residual sums that
  are not a layer's output, the attention's ``ReLU(v) * context``) are int8 tensors of their
  own in the file: they are fake-quantized too (`keras_mvit2.quantize.function_fake_quant`,
  ``fake_quantize_functions=True``), so the fine-tune sees their rounding and the file keeps
  their trained ranges. Measured on a fine-tuned MobileViTV2-0.5 at 256x256 (1,000 test
  images, the same distilled QAT otherwise): agreement with Keras 81.8 % against 77.5 %
  without, top-1 drop 0.6 against 2.3 points. What remains without a fake-quantizer (the
  attention's scores and normaliser, GroupNorm's statistics) gets its ranges from the
  converter's calibration on the representative images, chosen per tensor as the int8
  export chooses them (``activation_ranges``, default the 99.99 % interval).
* Before training, the activation ranges are calibrated on a few training
  batches (a running mean of the batch min/max instead of TFMOT's EMA from the
  [-6, 6] default, which needs thousands of steps), with BatchNormalization in
  inference mode. BatchNormalization stays frozen (moving statistics and affine
  parameters) during the fine-tune by default, the usual practice for a short
  QAT run of a trained model.
* Export: a fixed-batch-1 concrete function of the QAT model,
  ``Optimize.DEFAULT`` + a representative dataset + ``TFLITE_BUILTINS_INT8``,
  int8 / uint8 / float32 I/O. The parent checks in ``ai_edge_litert`` that no
  float op is left except the I/O quantize/dequantize and measures accuracies.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from keras_mvit2.layers import export_forms
from keras_mvit2.quantize import _worker_client, _worker_common, twin_transfer

__all__ = ["IO_DTYPES", "QATResult", "qat", "qat_installed"]

#: Input/output types of the exported full-integer model.
IO_DTYPES = ("int8", "uint8", "float32")


@dataclasses.dataclass
class QATResult:
    """What `qat` produced and measured.

    Attributes:
        tflite_path: the full-integer TFLite file.
        io_dtype: its input/output type.
        float_accuracy: top-1 accuracy of the float Keras 3 model on the
            validation data (``None`` without validation data).
        qat_accuracy: top-1 accuracy of the fake-quantized tf_keras QAT model.
        int8_accuracy: top-1 accuracy of the int8 TFLite model (``ai_edge_litert``).
        int8_agreement: fraction of validation images where the int8 model's
            top-1 class equals the float model's.
        num_validation: number of validation images.
        float_ops: ops of the TFLite model computing in float besides the input
            QUANTIZE / output DEQUANTIZE (``{}`` for a fully integer model).
        report: the `keras_mvit2.export.TFLiteReport` of the file.
        twin_max_abs_diff: max abs difference between the tf_keras twin and the
            Keras 3 model on the reference images before any change.
        quantized_layers: top-level layer name -> how it was quantized.
        function_ranges: the trained ``(min, max)`` of each fake-quantized function output
            inside the layers, by site (``"stage2_block1.transformer.0/add_0"``; empty with
            ``fake_quantize_functions=False``).
        history: per-epoch training loss / accuracy of the QAT fine-tune.
        epochs: epochs run.
        steps_per_epoch: batches per epoch.
        calibration_steps: batches used to calibrate activation ranges.
        seconds: wall time of the whole call.
        worker_seconds: wall time of the worker process.
    """

    tflite_path: str
    io_dtype: str
    float_accuracy: float | None
    qat_accuracy: float | None
    int8_accuracy: float | None
    int8_agreement: float | None
    num_validation: int
    float_ops: dict[str, int]
    report: Any
    twin_max_abs_diff: float
    quantized_layers: dict[str, str]
    function_ranges: dict[str, tuple[float, float]]
    history: list[dict[str, float]]
    epochs: int
    steps_per_epoch: int
    calibration_steps: int
    seconds: float
    worker_seconds: float

    @property
    def accuracy_drop(self) -> float | None:
        """float_accuracy - int8_accuracy, in points (x100), or ``None``."""
        if self.float_accuracy is None or self.int8_accuracy is None:
            return None
        return 100.0 * (self.float_accuracy - self.int8_accuracy)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serializable dict."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
               if f.name != "report"}
        out["report"] = self.report.to_dict() if hasattr(self.report, "to_dict") else None
        out["accuracy_drop_points"] = self.accuracy_drop
        return out


def _positive_int(name: str, value: Any, allow_none: bool = False) -> int | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int. Received: {name}={value!r}")
    return value


def qat(
    model_or_path: Any,
    train_data: Any,
    *,
    epochs: int = 1,
    steps_per_epoch: int | None = None,
    learning_rate: float = 1e-4,
    output_path: str | os.PathLike = "model_int8.tflite",
    representative_data: Any = None,
    io_dtype: str = "int8",
    validation_data: Any = None,
    batch_size: int = 32,
    calibration_steps: int = 16,
    num_calibration_samples: int = 200,
    freeze_batch_norm: bool = True,
    distill: bool = False,
    fake_quantize_functions: bool = True,
    activation_ranges: str = "p99.99",
    allow_float_ops: bool = False,
    class_names: Sequence[str] | None = None,
    verbose: bool = True,
    timeout: float | None = None,
) -> QATResult:
    """Quantization-aware fine-tuning with TFMOT, exported as a full-integer TFLite model.

    The model stays a Keras 3 model for the user: TFMOT runs in a worker process
    on a tf_keras twin built from the same keras_mvit2 layer code, with the
    weights transferred by variable path and checked on real images (see the
    module docstring for what is quantized and how). Progress is printed as it
    happens; an error in the worker is raised here as
    `keras_mvit2.quantize.QuantizationWorkerError` with the worker's message and
    traceback.

    Args:
        model_or_path: a trained Keras 3 model (Functional or Sequential, one
            image input, class scores out) or the path of a ``.keras`` file.
            Train it first: QAT is a short fine-tune.
        train_data: the fine-tuning data: ``(images, labels)`` numpy arrays
            (images float in [0, 1] or uint8, labels class indices or one-hot),
            a `tf.data.Dataset` of ``(images, labels)`` batches (e.g.
            `keras_mvit2.data.make_train_dataset`), or a folder of class
            sub-folders / ``"fashion_mnist"`` (read with the evaluation transform).
        epochs: fine-tuning epochs.
        steps_per_epoch: batches per epoch. Default: one pass over the arrays, or
            over a finite dataset. A dataset is materialized once (this many
            batches) and replayed each epoch.
        learning_rate: Adam learning rate of the fine-tune (small: 1e-5 to 1e-4).
        output_path: the ``.tflite`` file to write (atomically).
        representative_data: calibration images for the converter (array,
            dataset, folder or ``"fashion_mnist"``, see
            `keras_mvit2.export.calibration_images`); default: images from
            `train_data`.
        io_dtype: ``"int8"`` (default), ``"uint8"`` or ``"float32"`` model
            input/output.
        validation_data: optional labelled data (same forms as `train_data`;
            ``"fashion_mnist"`` means its test split): float, QAT and int8
            accuracies are measured on it.
        batch_size: batch size for array inputs.
        calibration_steps: training batches used to calibrate the activation
            ranges before the fine-tune.
        num_calibration_samples: representative images for the converter.
        freeze_batch_norm: keep BatchNormalization statistics and parameters fixed
            during the fine-tune (recommended for a short QAT run).
        distill: train towards the float model's own probabilities on the training
            images (cross-entropy against them, instead of against the labels): the
            int8 file learns to give the float model's answers, which is what a
            shipped file is judged by, rather than to fit the labels again.
        fake_quantize_functions: also fake-quantize the tensors our layers compute with
            function calls (the SiLUs, the residual sums, the attention's ``ReLU(v) *
            context``), which are int8 tensors of their own in the file: the fine-tune
            then sees their rounding and the file keeps their trained ranges
            (`keras_mvit2.quantize.function_fake_quant`). False: the converter calibrates
            them after training.
        activation_ranges: how the ranges of the tensors without a fake-quantizer (with
            ``fake_quantize_functions=False``, the activations called as functions; else
            the attention's scores and GroupNorm's statistics) are chosen from the
            representative images, as ``to_tflite(activation_ranges=...)`` does:
            ``"p99.99"`` (default, as the int8 export), ``"mse"``, ``"p<percent>"`` or
            ``"minmax"`` (the converter's global min / max). The fake-quantized tensors
            keep their trained ranges.
        allow_float_ops: accept a TFLite model in which some ops stayed float
            (default: that is an error naming the ops).
        class_names: one name per output class, written into the file's metadata (ours
            and the standard one's labels) as `keras_mvit2.export.to_tflite` writes them.
        verbose: stream the worker's progress to stdout.
        timeout: stop the worker after this many seconds (``None``: no limit).

    Returns:
        A `QATResult`.

    Raises:
        ValueError: invalid arguments or data (raised before the worker starts).
        QuantizationWorkerError: the worker failed (message and traceback included).
        RuntimeError: the exported model keeps float ops (unless allowed) or does
            not run in ``ai_edge_litert``.
    """
    start = time.monotonic()
    _positive_int("epochs", epochs)
    _positive_int("steps_per_epoch", steps_per_epoch, allow_none=True)
    _positive_int("batch_size", batch_size)
    from keras_mvit2.export.tflite.activation_ranges import check_range_method

    activation_ranges = check_range_method(activation_ranges)
    _positive_int("calibration_steps", calibration_steps)
    _positive_int("num_calibration_samples", num_calibration_samples)
    if io_dtype not in IO_DTYPES:
        raise ValueError(f"io_dtype must be one of {IO_DTYPES}. Received: io_dtype={io_dtype!r}")
    if not isinstance(learning_rate, int | float) or not learning_rate >= 0:
        raise ValueError(f"learning_rate must be >= 0. Received: learning_rate={learning_rate!r}")
    output_path = os.fspath(output_path)

    model = _worker_client.load_keras_model(model_or_path)
    from keras_mvit2.export.class_names import check_class_names

    class_names = check_class_names(class_names, model)
    input_shape = _worker_client.image_input_shape(model)
    num_classes = int(model.outputs[0].shape[-1])

    with _worker_client.temporary_workdir("qat") as workdir:
        x, y, train, steps = _worker_client.stage_training_data(
            model, train_data, workdir, batch_size=batch_size, steps_per_epoch=steps_per_epoch,
            distill_from_logits=(not twin_transfer.output_is_probabilities(model)) if distill
            else None)

        if representative_data is None:
            rng = np.random.default_rng(0)
            pick = rng.choice(len(x), min(num_calibration_samples, len(x)), replace=False)
            rep_images = x[np.sort(pick)]
        else:
            from keras_mvit2.export.calibration import calibration_images

            rep_images = calibration_images(
                representative_data, image_size=tuple(input_shape[1:3]),
                channels=input_shape[3], num_samples=num_calibration_samples,
            )
        rep = _worker_common.save_arrays(os.path.join(workdir, "representative.npz"), rep_images)

        val = None
        xv = yv = None
        if validation_data is not None:
            xv, yv, _ = _worker_client.labelled_arrays(
                validation_data, input_shape=input_shape, what="validation_data",
                batch_size=batch_size, split="test",
            )
            yv = _worker_client.integer_labels(yv, num_classes, "validation_data")
            val = _worker_common.save_arrays(os.path.join(workdir, "validation.npz"), xv, yv)
        del x, y

        reference = xv[:8] if xv is not None else rep_images[:8]
        job = {"model": twin_transfer.write_model_files(model, workdir, reference)}
        job.update(
            train=train, validation=val, representative=rep, epochs=epochs,
            steps_per_epoch=steps, batch_size=batch_size, learning_rate=float(learning_rate),
            calibration_steps=calibration_steps, io_dtype=io_dtype,
            freeze_batch_norm=bool(freeze_batch_norm), distill=bool(distill),
            fake_quantize_functions=bool(fake_quantize_functions),
            activation_ranges=activation_ranges,
            tflite_path=os.path.join(workdir, "qat_model.tflite"),
            # The twin traces the full-int8 forms of `to_tflite(quantization="int8")`.
            forms=dataclasses.asdict(export_forms.INT8),
        )
        result = _worker_client.run_worker("qat", job, workdir, verbose=verbose, timeout=timeout)
        with open(result["tflite_path"], "rb") as f:
            flatbuffer = f.read()


    return _finish(
        model, flatbuffer, output_path, result=result, io_dtype=io_dtype, xv=xv, yv=yv,
        rep_count=len(rep_images), allow_float_ops=allow_float_ops, epochs=epochs,
        steps=steps, calibration_steps=calibration_steps, start=start, verbose=verbose,
        class_names=class_names, activation_ranges=activation_ranges,
    )


def qat_installed() -> bool:
    """Whether the ``qat`` extra (tf_keras, tensorflow-model-optimization) is installed."""
    import importlib.util

    return all(importlib.util.find_spec(name) is not None
               for name in ("tf_keras", "tensorflow_model_optimization"))


def _finish(model, flatbuffer: bytes, output_path: str, *, result, io_dtype, xv, yv,
            rep_count, allow_float_ops, epochs, steps, calibration_steps, start, verbose,
            class_names=None, activation_ranges=None):
    from keras_mvit2.export.tflite.inspect import inspect_tflite
    from keras_mvit2.export.tflite.run import run_tflite
    from keras_mvit2.utils.files import atomic_output

    flatbuffer = _with_metadata(model, flatbuffer, io_dtype, rep_count, class_names,
                                activation_ranges)
    with atomic_output(output_path) as tmp_path:
        with open(tmp_path, "wb") as f:
            f.write(flatbuffer)
        report = inspect_tflite(tmp_path)
        float_ops = dict(report.float_ops)
        if report.num_xnnpack_partitions is None:
            raise RuntimeError(
                "The QAT TFLite model does not load in ai_edge_litert; not writing it."
            )
        if float_ops and not allow_float_ops:
            raise RuntimeError(
                "The QAT full-integer model still computes these ops in float: "
                f"{float_ops} (besides the input QUANTIZE / output DEQUANTIZE). Pass "
                "allow_float_ops=True to accept a mixed model."
            )
        float_acc = qat_acc = int8_acc = agreement = None
        if xv is not None:
            probe = run_tflite(tmp_path, xv[:1])
            if not np.all(np.isfinite(probe)):
                raise RuntimeError("The QAT TFLite model gives non-finite outputs.")
            if verbose:
                print(f"{_worker_client.OUTPUT_PREFIX}evaluating float Keras 3 and int8 TFLite on "
                      f"{len(xv)} validation images", flush=True)
            float_pred = np.argmax(np.asarray(model.predict(xv, batch_size=256, verbose=0)), -1)
            int8_pred = np.argmax(run_tflite(tmp_path, xv), -1)
            float_acc = float(np.mean(float_pred == yv))
            int8_acc = float(np.mean(int8_pred == yv))
            agreement = float(np.mean(float_pred == int8_pred))
            qat_acc = result.get("qat_accuracy")
    report.path = output_path
    return QATResult(
        tflite_path=output_path,
        io_dtype=io_dtype,
        float_accuracy=float_acc,
        qat_accuracy=qat_acc,
        int8_accuracy=int8_acc,
        int8_agreement=agreement,
        num_validation=0 if xv is None else len(xv),
        float_ops=float_ops,
        report=report,
        twin_max_abs_diff=float(result["twin_max_abs_diff"]),
        quantized_layers=dict(result["quantized_layers"]),
        function_ranges={site: (float(lo), float(hi))
                         for site, (lo, hi) in result.get("function_ranges", {}).items()},
        history=list(result["history"]),
        epochs=epochs,
        steps_per_epoch=steps,
        calibration_steps=calibration_steps,
        seconds=time.monotonic() - start,
        worker_seconds=float(result.get("worker_seconds", 0.0)),
    )


def _with_metadata(model, flatbuffer: bytes, io_dtype: str, rep_count: int,
                   class_names: list[str] | None = None,
                   activation_ranges: str | None = None) -> bytes:
    """Adds keras_mvit2's TFLite metadata (preprocessing, I/O quantization, class names),
    the ``serving_default`` signature and the standard TFLite Model Metadata that
    MediaPipe Tasks reads (with the labels): `serialize_with_metadata`, as `to_tflite`
    does (the flatbuffer parsed once and serialized once)."""
    from keras_mvit2.export.tflite.flatbuffer import parse_flatbuffer
    from keras_mvit2.export.tflite.metadata import serialize_with_metadata, tflite_metadata
    from keras_mvit2.export.tflite.tensors import io_tensors
    converted = parse_flatbuffer(bytes(flatbuffer))
    inputs, outputs = io_tensors(converted)
    info = tflite_metadata(
        model, inputs=inputs, outputs=outputs, quantization="int8",
        batch_size=1, class_names=class_names,
        calibration={"source": "representative images (QAT)", "num_samples": rep_count,
                     "activation_ranges": activation_ranges},
        user={"quantization_aware_training": True, "io_dtype": io_dtype},
        forms=export_forms.INT8,
    )
    return serialize_with_metadata(converted, info, outputs)
