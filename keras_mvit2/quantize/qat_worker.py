"""The worker side of quantization-aware training: TFMOT QuantizeConfigs for keras_mvit2's
layers, the QAT model's construction, calibration, fine-tune and full-int8 conversion.

Runs in the tf_keras worker process (`keras_mvit2.quantize._worker`, task ``"qat"``), which
imports TFMOT; the parent side (`keras_mvit2.quantize.qat.qat`) writes the job and reads the
result. How each layer is quantized: the docstring of `keras_mvit2.quantize.qat`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np

from keras_mvit2.quantize import _worker_common


@dataclasses.dataclass
class _Plan:
    """What one traced call of a composite layer showed (attribute paths from the layer).

    Attributes:
        bn_fed: convs whose output goes straight into a BatchNormalization.
        output_from: the sublayer that produced the layer's output (None: an op did).
        called: every sublayer that was called.
    """

    bn_fed: set[str]
    output_from: str | None
    called: set[str]


class _Quantizer:
    """TFMOT QuantizeConfigs for keras_mvit2 layers and the QAT model construction."""

    def __init__(self):
        import tensorflow as tf
        import tensorflow_model_optimization as tfmot
        import tf_keras
        from tensorflow_model_optimization.python.core.quantization.keras import quant_ops
        from tensorflow_model_optimization.python.core.quantization.keras.default_8bit import (
            default_8bit_quantize_configs as configs,
        )
        from tensorflow_model_optimization.python.core.quantization.keras.default_8bit import (
            default_8bit_quantize_registry as registry,
        )
        from tensorflow_model_optimization.python.core.quantization.keras.default_8bit import (
            default_8bit_quantizers as quantizers,
        )

        self.tf, self.tfmot, self.tf_keras = tf, tfmot, tf_keras
        self.registry = registry.Default8BitQuantizeRegistry()
        qk = tfmot.quantization.keras
        last_value = qk.quantizers.LastValueQuantizer
        moving_average = qk.quantizers.MovingAverageQuantizer
        conv_weights = quantizers.Default8BitConvWeightsQuantizer

        class KernelQuantizeConfig(qk.QuantizeConfig):
            """Fake-quantizes weight attributes (and optionally the output) of a layer."""

            def __init__(self, weight_attrs, per_axis=False, quantize_output=True,
                         shared_attrs=None):
                self.weight_attrs = list(weight_attrs)
                self.per_axis = bool(per_axis)
                self.quantize_output = bool(quantize_output)
                self.shared_attrs = dict(shared_attrs or {})

            def _weight_quantizer(self):
                if self.per_axis:
                    return conv_weights()
                return last_value(num_bits=8, per_axis=False, symmetric=True, narrow_range=True)

            def get_weights_and_quantizers(self, layer):
                return [(_worker_common.path_get(layer, a), self._weight_quantizer())
                        for a in self.weight_attrs]

            def get_activations_and_quantizers(self, layer):
                return []

            def set_quantize_weights(self, layer, quantize_weights):
                for attr, weight in zip(self.weight_attrs, quantize_weights, strict=True):
                    _worker_common.path_set(layer, attr, weight)
                for alias, attr in self.shared_attrs.items():
                    _worker_common.path_set(layer, alias, _worker_common.path_get(layer, attr))

            def set_quantize_activations(self, layer, quantize_activations):
                pass

            def get_output_quantizers(self, layer):
                if not self.quantize_output:
                    return []
                return [moving_average(num_bits=8, per_axis=False, symmetric=False,
                                       narrow_range=False)]

            def get_config(self):
                return {"weight_attrs": self.weight_attrs, "per_axis": self.per_axis,
                        "quantize_output": self.quantize_output,
                        "shared_attrs": self.shared_attrs}

        self.KernelQuantizeConfig = KernelQuantizeConfig
        self.OutputQuantizeConfig = configs.Default8BitOutputQuantizeConfig
        self.NoOpQuantizeConfig = configs.NoOpQuantizeConfig
        self.wrapper = qk.QuantizeWrapperV2
        self.summary: dict[str, list[str]] = {}

        # A settable EMA decay for the activation ranges: a running mean during the
        # calibration steps, TFMOT's 0.999 during the fine-tune.
        self.ema_decay = tf.Variable(0.999, trainable=False, dtype=tf.float32)
        original = getattr(quant_ops.MovingAvgQuantize, "_keras_mvit2_original",
                           quant_ops.MovingAvgQuantize)
        decay = self.ema_decay

        def moving_avg_quantize(*args, ema_decay=0.999, **kwargs):
            return original(*args, ema_decay=decay, **kwargs)

        moving_avg_quantize._keras_mvit2_original = original
        quant_ops.MovingAvgQuantize = moving_avg_quantize

    # -------------------------------------------------------------- structure

    @staticmethod
    def is_ours(layer) -> bool:
        return type(layer).__module__.startswith("keras_mvit2.")

    def children(self, layer):
        """`(attribute, index or None, child layer)` of a composite layer, in order."""
        base = self.tf_keras.layers.Layer
        for name, value in list(vars(layer).items()):
            if name.startswith("_"):
                continue
            if isinstance(value, base):
                yield name, None, value
            elif isinstance(value, list | tuple) or type(value).__name__ == "ListWrapper":
                for i, item in enumerate(value):
                    if isinstance(item, base):
                        yield name, i, item

    def trace(self, layer, input_shape):
        """One eager call of a composite layer; returns its `_Plan`.

        Paths are attribute paths from `layer` (``"transformer.0.fc1"``), valid for
        any instance with the same structure (e.g. after TFMOT's clone).
        """
        records = []
        patched = []

        def patch(parent, prefix):
            for name, index, child in self.children(parent):
                path = f"{prefix}{name}" + ("" if index is None else f".{index}")
                original = child.call

                def call(*args, _original=original, _path=path, **kwargs):
                    out = _original(*args, **kwargs)
                    records.append((_path, args[0] if args else None, out))
                    return out

                object.__setattr__(child, "call", call)
                patched.append(child)
                patch(child, path + ".")

        patch(layer, "")
        try:
            shape = (1, *[int(d) for d in input_shape[1:]])
            output = layer(self.tf.zeros(shape), training=False)
        finally:
            for child in patched:
                object.__delattr__(child, "call")
        producer = {id(out): path for path, _, out in records}
        bn_fed = set()
        for path, inputs, _ in records:
            child = self.resolve(layer, path)
            is_bn = isinstance(child, self.tf_keras.layers.BatchNormalization)
            if is_bn and id(inputs) in producer:
                bn_fed.add(producer[id(inputs)])
        return _Plan(bn_fed, producer.get(id(output)), {path for path, _, _ in records})

    @staticmethod
    def resolve(layer, path: str):
        return _worker_common.path_get(layer, path)

    def child_config(self, child, path: str, bn_fed: set[str]):
        """The QuantizeConfig of a sublayer, or None (not wrapped)."""
        layers = self.tf_keras.layers
        if isinstance(child, layers.DepthwiseConv2D):
            return self.KernelQuantizeConfig(["depthwise_kernel"], True, path not in bn_fed)
        if isinstance(child, layers.Conv2D):
            return self.KernelQuantizeConfig(["kernel"], True, path not in bn_fed)
        if isinstance(child, layers.Dense | layers.EinsumDense):
            return self.KernelQuantizeConfig(["kernel"], False, True)
        if isinstance(child, layers.BatchNormalization | layers.LayerNormalization
                      | layers.GroupNormalization) or type(child).__name__ == "GroupNorm1":
            return self.OutputQuantizeConfig()
        return None

    def describe(self, config) -> str:
        if isinstance(config, self.KernelQuantizeConfig):
            axis = "per-channel" if config.per_axis else "per-tensor"
            out = " + output" if config.quantize_output else ""
            return f"{'/'.join(config.weight_attrs)} {axis}{out}"
        if isinstance(config, self.OutputQuantizeConfig):
            return "output"
        return "no quantization"

    def uncalled_kernels(self, layer, plan: _Plan, prefix: str) -> list[str]:
        """Kernel paths (relative to `layer`) of direct sublayers whose kernel `layer` reads
        itself instead of calling the sublayer (the separable attention's ``qkv_proj``)."""
        found = []
        layers = self.tf_keras.layers
        for name, index, child in self.children(layer):
            path = f"{prefix}{name}" + ("" if index is None else f".{index}")
            if path in plan.called:
                continue
            rel = name + ("" if index is None else f".{index}")
            if isinstance(child, layers.DepthwiseConv2D):
                found.append(f"{rel}.depthwise_kernel")
            elif isinstance(child, layers.Conv2D | layers.Dense | layers.EinsumDense):
                found.append(f"{rel}.kernel")
        return found

    def wrap_nested(self, layer, plan: _Plan, prefix: str = "",
                    notes: list[str] | None = None) -> list[str]:
        """Wraps the called sublayers of a (built) composite layer in QuantizeWrapperV2,
        recursively; kernels of sublayers that are read but not called are quantized by
        the parent's wrapper (see `composite_config`)."""
        notes = [] if notes is None else notes
        for name, index, child in list(self.children(layer)):
            path = f"{prefix}{name}" + ("" if index is None else f".{index}")
            if path not in plan.called:
                continue
            config = self.child_config(child, path, plan.bn_fed)
            if config is None and self.is_ours(child):
                self.wrap_nested(child, plan, path + ".", notes)
                config = self.composite_config(child, path, plan)
            if config is None:
                continue
            notes.append(f"{path}: {self.describe(config)}")
            wrapped = self.wrapper(child, config)
            if index is None:
                setattr(layer, name, wrapped)
            else:
                getattr(layer, name)[index] = wrapped
        return notes

    def composite_config(self, child, path: str, plan: _Plan):
        """Config of a nested keras_mvit2 layer after its own sublayers were wrapped."""
        weight_attrs = self.uncalled_kernels(child, plan, path + ".")
        per_axis = bool(weight_attrs)
        shared = {}
        for attr in ("e", "f"):     # LinformerSelfAttention's token projections
            value = getattr(child, attr, None)
            if isinstance(value, self.tf.Variable):
                per_axis = False
                if attr == "f" and value is getattr(child, "e", None):
                    shared["f"] = "e"
                else:
                    weight_attrs.append(attr)
        is_attention = hasattr(child, "mix") or type(child).__name__ == "SeparableSelfAttention"
        needs_output = not is_attention and type(child).__name__ == "TransformerLayer"
        if weight_attrs:
            return self.KernelQuantizeConfig(weight_attrs, per_axis, needs_output, shared)
        if needs_output:
            return self.OutputQuantizeConfig()
        return None

    # -------------------------------------------------------------- the model

    def quantize(self, twin):
        """`quantize_apply` on the twin plus nested wrapping; returns the QAT model."""
        qk = self.tfmot.quantization.keras
        plans = {}
        for layer in twin.layers:
            if self.is_ours(layer):
                plans[layer.name] = self.trace(layer, layer.input_shape)

        def annotate(layer):
            if self.is_ours(layer):
                plan = plans[layer.name]
                producer = self.resolve(layer, plan.output_from) if plan.output_from else None
                quantized_out = producer is not None and self.child_config(
                    producer, plan.output_from, plan.bn_fed
                ) is not None and plan.output_from not in plan.bn_fed
                kernels = self.uncalled_kernels(layer, plan, "")
                if kernels:
                    config = self.KernelQuantizeConfig(kernels, True, not quantized_out)
                elif quantized_out:
                    config = self.NoOpQuantizeConfig()
                else:
                    config = self.OutputQuantizeConfig()
                self.summary[layer.name] = [f"(layer: {self.describe(config)})"]
                return qk.quantize_annotate_layer(layer, quantize_config=config)
            if self.registry.supports(layer):
                self.summary[layer.name] = ["TFMOT default 8-bit scheme"]
                return qk.quantize_annotate_layer(layer)
            if isinstance(layer, self.tf_keras.layers.InputLayer):
                return layer
            config = self.OutputQuantizeConfig()
            self.summary[layer.name] = ["output"]
            return qk.quantize_annotate_layer(layer, quantize_config=config)

        scope = {
            "KernelQuantizeConfig": self.KernelQuantizeConfig,
            "Default8BitOutputQuantizeConfig": self.OutputQuantizeConfig,
            "NoOpQuantizeConfig": self.NoOpQuantizeConfig,
        }
        with qk.quantize_scope(scope):
            annotated = self.tf_keras.models.clone_model(twin, clone_function=annotate)
            annotated.set_weights(twin.get_weights())
            qat_model = qk.quantize_apply(annotated)
        for layer in qat_model.layers:
            inner = getattr(layer, "layer", None)
            if inner is not None and self.is_ours(inner):
                self.summary[inner.name] += self.wrap_nested(inner, plans[inner.name])
        qat_model(self.tf.zeros((1, *twin.input_shape[1:])), training=False)  # build nested
        return qat_model

    def fake_quantize_functions(self, qat_model, input_shape):
        """Fake-quantizes the SiLUs, residual sums and attention products our layers compute
        with function calls (`keras_mvit2.quantize.function_fake_quant`); returns it."""
        import keras  # the worker's tf_keras shim
        from tensorflow_model_optimization.python.core.keras import utils
        from tensorflow_model_optimization.python.core.quantization.keras import quant_ops

        from keras_mvit2.quantize.function_fake_quant import FunctionFakeQuant

        layers, output_quantized = [], []

        def visit(layer, wrapper, path):
            if wrapper is not None and wrapper.quantize_config.get_output_quantizers(layer):
                output_quantized.append(path)
            layers.append((path, layer))
            for name, index, child in self.children(layer):
                inner = getattr(child, "layer", None) if isinstance(child, self.wrapper) else None
                target = child if inner is None else inner
                if self.is_ours(target):
                    visit(target, None if inner is None else child,
                          f"{path}.{name}" + ("" if index is None else f".{index}"))

        for layer in qat_model.layers:
            inner = getattr(layer, "layer", None)
            if inner is not None and self.is_ours(inner):
                visit(inner, layer, inner.name)
        hooks = FunctionFakeQuant(self.tf, keras.ops, lambda: quant_ops.MovingAvgQuantize,
                                  utils.smart_cond)
        hooks.install(qat_model, layers, output_quantized, input_shape)
        for path, sites in hooks.summary().items():
            top = path.split(".", 1)[0]
            self.summary.setdefault(top, []).append(
                f"{path}: fake-quantized {', '.join(sites)}")
        return hooks

    def batch_norms(self, model):
        return [m for m in model.submodules
                if isinstance(m, self.tf_keras.layers.BatchNormalization)]

    def calibrate(self, model, dataset, steps: int, log) -> None:
        """Activation ranges from `steps` batches (running mean of batch min/max), BN frozen."""
        norms = self.batch_norms(model)
        trainable = [bn.trainable for bn in norms]
        for bn in norms:
            bn.trainable = False

        @self.tf.function
        def forward(x):
            model(x, training=True)

        try:
            for i, (x, _) in enumerate(dataset.take(steps)):
                self.ema_decay.assign(i / (i + 1.0))
                forward(x)
        finally:
            self.ema_decay.assign(0.999)
            for bn, flag in zip(norms, trainable, strict=True):
                bn.trainable = flag
        log(f"calibrated activation ranges on {steps} batches")

    def convert(self, model, input_shape, representative: np.ndarray, io_dtype: str,
                activation_ranges: str | None = None) -> bytes:
        """The full-int8 flatbuffer of the QAT `model`. The fake-quantized tensors keep the
        ranges trained; the others (activations called as functions: SiLU, residual sums,
        the attention's products) are calibrated on `representative`, and with
        `activation_ranges` (``"p99.99"``, ...) re-ranged as `to_tflite` does
        (`keras_mvit2.export.tflite.activation_ranges`) instead of the global min / max."""
        tf = self.tf
        spec = tf.TensorSpec((1, *[int(d) for d in input_shape[1:]]), tf.float32)
        function = tf.function(lambda x: model(x, training=False))
        concrete = function.get_concrete_function(spec)
        converter = tf.lite.TFLiteConverter.from_concrete_functions([concrete], model)
        converter.optimizations = [tf.lite.Optimize.DEFAULT]

        def representative_dataset():
            for i in range(len(representative)):
                yield [representative[i : i + 1]]

        converter.representative_dataset = representative_dataset
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
        if io_dtype != "float32":
            dtype = {"int8": tf.int8, "uint8": tf.uint8}[io_dtype]
            converter.inference_input_type = dtype
            converter.inference_output_type = dtype
        if activation_ranges not in (None, "minmax"):
            from keras_mvit2.export.tflite.activation_ranges import select_ranges
            from keras_mvit2.export.tflite.calibrated_quantize import (
                quantize_after_calibration,
                representative_images,
            )

            def edit(calibrated: bytes) -> bytes:
                return select_ranges(calibrated, representative_images(converter),
                                     activation_ranges)

            quantize_after_calibration(converter, edit=edit)
        return converter.convert()


def worker_qat(ctx) -> dict[str, Any]:
    """The ``"qat"`` task of the worker process (see `_worker.main`)."""
    job: Mapping[str, Any] = ctx.job
    twin, _, diff = ctx.load_twin()
    quantizer = _Quantizer()
    qat_model = quantizer.quantize(twin)
    wrapped = sum(1 for m in qat_model.submodules if isinstance(m, quantizer.wrapper))
    ctx.log(f"QAT model: {wrapped} QuantizeWrapperV2 layers (top-level and nested)")
    hooks = None
    if job.get("fake_quantize_functions", True):
        hooks = quantizer.fake_quantize_functions(qat_model, twin.input_shape)
        ctx.log(f"fake-quantized {len(hooks.sites)} function outputs inside the layers "
                f"(SiLU, residual sums, attention products; {len(hooks.skipped)} left to the "
                "layers' output quantizers)")

    dataset, _ = ctx.dataset(job["train"], batch_size=job["batch_size"], shuffle=True)
    steps = int(job["steps_per_epoch"])
    quantizer.calibrate(qat_model, dataset, int(job["calibration_steps"]), ctx.log)

    if job["freeze_batch_norm"]:
        for bn in quantizer.batch_norms(qat_model):
            bn.trainable = False
    distill = bool(job.get("distill"))
    ctx.compile(qat_model, job["learning_rate"], soft_targets=distill)
    epochs = int(job["epochs"])
    ctx.log(f"QAT fine-tune: {epochs} epoch(s) x {steps} steps, lr={job['learning_rate']:g}"
            + (", towards the float model's probabilities" if distill else ""))
    history = qat_model.fit(
        dataset, epochs=epochs, steps_per_epoch=steps, verbose=0,
        callbacks=[ctx.progress_callback("qat", epochs, steps)],
    )
    per_epoch = [
        {k: float(v[i]) for k, v in history.history.items()} for i in range(epochs)
    ]
    qat_accuracy = ctx.evaluate(qat_model, job.get("validation"))
    if qat_accuracy is not None:
        ctx.log(f"QAT model (fake-quantized) validation accuracy {qat_accuracy:.4f}")

    representative, _, _ = _worker_common.load_arrays(job["representative"])
    ctx.log(f"converting to full-integer TFLite ({job['io_dtype']} I/O, "
            f"{len(representative)} representative images)")
    flatbuffer = quantizer.convert(qat_model, twin.input_shape, representative, job["io_dtype"],
                                   job.get("activation_ranges"))
    with open(job["tflite_path"], "wb") as f:
        f.write(flatbuffer)

    ctx.log(f"wrote {len(flatbuffer):,} bytes")
    return {
        "tflite_path": job["tflite_path"],
        "twin_max_abs_diff": diff,
        "qat_accuracy": qat_accuracy,
        "history": per_epoch,
        "quantized_layers": {k: "; ".join(v) for k, v in quantizer.summary.items()},
        "function_ranges": {} if hooks is None else {
            site: [float(lo.numpy()), float(hi.numpy())] for site, (lo, hi) in hooks.sites.items()},
    }
