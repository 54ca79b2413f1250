"""TFMOT magnitude pruning and weight clustering of a Keras 3 model's conv / dense kernels.

`prune` and `cluster` fine-tune a trained Keras 3 model with TFMOT's
`prune_low_magnitude` / `cluster_weights` in the tf_keras worker process (see
`keras_mvit2.quantize` for why), copy the resulting weights back into a copy
of the Keras 3 model and, when asked, export it with
`keras_mvit2.export.to_tflite` and check the exported kernels.

What is pruned / clustered: the kernels of every ``Conv2D`` (1x1 and 3x3, with
or without bias) and ``Dense`` / ``EinsumDense`` layer, wherever it sits:

* at the top level of the model (the stem conv, the classifier) through TFMOT's
  registry;
* inside keras_mvit2's composite layers (`InvertedResidual`'s expand/project
  convs, `MobileViTV2Block`'s local/projection convs, the FFN convs and the
  attention projections of every `TransformerLayer`): TFMOT wraps only top-level
  layers, so the twin's composite layers expose their nested kernels
  (``get_prunable_weights()``; for clustering, attribute-path weight names such as
  ``"transformer.0.fc1.kernel"`` that a `ClusterWeights` subclass resolves).

Not pruned or clustered: depthwise kernels (TFMOT's registries leave
``DepthwiseConv2D`` out as well: 9 weights per channel), biases, normalization
parameters, Linformer's E/F and RFA's random features. The exported TFLite model
keeps the zeros / the shared values: BatchNormalization is folded into the
preceding conv by the converter, which scales each output channel, so a
clustered conv has at most `num_clusters` distinct values *per output channel*
(exactly the clustered kernel's values times that channel's BN scale), and a
pruned kernel keeps its zeros (also after int8 quantization, where zero maps
to zero).
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from keras_mvit2.quantize import _worker_client, _worker_common, twin_transfer

__all__ = [
    "SparsityResult",
    "cluster",
    "exported_kernel_stats",
    "prune",
]

#: TFLite ops whose second input is the kernel checked in the exported model.
_KERNEL_OPS = ("CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED")


@dataclasses.dataclass
class SparsityResult:
    """What `prune` / `cluster` produced.

    Attributes:
        model: a Keras 3 copy of the input model with the pruned / clustered
            weights (the input model is not modified).
        method: ``"prune"`` or ``"cluster"``.
        target: the target sparsity (prune) or number of clusters (cluster).
        kernels: Keras 3 weight path -> sparsity (prune: fraction of zeros) or
            number of distinct values (cluster), for every pruned / clustered kernel.
        float_accuracy_before: validation accuracy of the input model.
        float_accuracy_after: validation accuracy of the returned model.
        tflite_path: the exported file (``None`` without `output_path`).
        tflite_report: its `keras_mvit2.export.TFLiteReport`.
        exported_kernels: one entry per CONV_2D / DEPTHWISE_CONV_2D /
            FULLY_CONNECTED op of the exported file, see `exported_kernel_stats`.
        twin_max_abs_diff: tf_keras twin vs Keras 3 on the reference images.
        history: per-epoch loss / accuracy of the fine-tune.
        schedule: the pruning schedule used (prune only).
        seconds: wall time of the call.
    """

    model: Any
    method: str
    target: float
    kernels: dict[str, float]
    float_accuracy_before: float | None
    float_accuracy_after: float | None
    tflite_path: str | None
    tflite_report: Any
    exported_kernels: list[dict[str, Any]]
    twin_max_abs_diff: float
    history: list[dict[str, float]]
    schedule: dict[str, Any] | None
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serializable dict (without the model)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
               if f.name not in ("model", "tflite_report")}
        out["model"] = self.model.name
        out["tflite_report"] = (
            self.tflite_report.to_dict() if self.tflite_report is not None else None
        )
        return out


def prune(
    model_or_path: Any,
    train_data: Any,
    *,
    target_sparsity: float = 0.5,
    epochs: int = 1,
    steps_per_epoch: int | None = None,
    learning_rate: float = 1e-4,
    batch_size: int = 32,
    initial_sparsity: float = 0.0,
    frequency: int | None = None,
    output_path: str | os.PathLike | None = None,
    quantization: str = "float32",
    representative_data: Any = None,
    validation_data: Any = None,
    verbose: bool = True,
    timeout: float | None = None,
) -> SparsityResult:
    """Magnitude pruning (TFMOT ``prune_low_magnitude``) of the conv / dense kernels.

    A polynomial-decay schedule raises the sparsity of every pruned kernel from
    `initial_sparsity` to `target_sparsity` over the first 80 % of the training
    steps, updating the masks every `frequency` steps (default: a tenth of that
    span, so even a 30-step run prunes; TFMOT's default of 100 does nothing in
    short runs); the remaining steps fine-tune with fixed masks. Then the masks
    are applied for good (``strip_pruning``) and the weights copied into a Keras
    3 copy of the model. See the module docstring for which kernels are pruned.

    Args:
        model_or_path: a trained Keras 3 model or ``.keras`` path.
        train_data: fine-tuning data: ``(images, labels)`` arrays, a `tf.data.Dataset` of
            ``(images, labels)`` batches, or a folder of class sub-folders /
            ``"fashion_mnist"``.
        target_sparsity: final fraction of zeros in each pruned kernel, in (0, 1).
        epochs: fine-tuning epochs (Adam).
        steps_per_epoch: batches per epoch (default: the whole data).
        learning_rate: Adam learning rate.
        batch_size: fine-tuning batch size.
        initial_sparsity: sparsity at the first mask update.
        frequency: steps between mask updates.
        output_path: also export the pruned model to this ``.tflite`` file with
            `keras_mvit2.export.to_tflite` and check its kernels.
        quantization: the export's quantization (``"float32"``, ``"int8"``, ...).
        representative_data: calibration images for an int8 export (default:
            images from `train_data`).
        validation_data: labelled data for the before/after accuracies.
        verbose: stream the worker's progress.
        timeout: worker time limit in seconds.

    Returns:
        A `SparsityResult` whose `model` is the pruned Keras 3 model.
    """
    if not isinstance(target_sparsity, int | float) or not 0.0 < target_sparsity < 1.0:
        raise ValueError(
            f"target_sparsity must be in (0, 1). Received: target_sparsity={target_sparsity!r}"
        )
    if not isinstance(initial_sparsity, int | float) or not (
        0.0 <= initial_sparsity <= target_sparsity
    ):
        raise ValueError(
            "initial_sparsity must be in [0, target_sparsity]. Received: "
            f"initial_sparsity={initial_sparsity!r}"
        )
    if frequency is not None and (
        isinstance(frequency, bool) or not isinstance(frequency, int) or frequency < 1
    ):
        raise ValueError(f"frequency must be a positive int. Received: frequency={frequency!r}")
    options = {"target_sparsity": float(target_sparsity),
               "initial_sparsity": float(initial_sparsity), "frequency": frequency}
    return _run(
        "prune", model_or_path, train_data, options, epochs=epochs,
        steps_per_epoch=steps_per_epoch, learning_rate=learning_rate, batch_size=batch_size,
        output_path=output_path, quantization=quantization,
        representative_data=representative_data, validation_data=validation_data,
        verbose=verbose, timeout=timeout,
    )


def cluster(
    model_or_path: Any,
    train_data: Any,
    *,
    num_clusters: int = 16,
    epochs: int = 1,
    steps_per_epoch: int | None = None,
    learning_rate: float = 1e-5,
    batch_size: int = 32,
    output_path: str | os.PathLike | None = None,
    quantization: str = "float32",
    representative_data: Any = None,
    validation_data: Any = None,
    verbose: bool = True,
    timeout: float | None = None,
) -> SparsityResult:
    """Weight clustering (TFMOT ``cluster_weights``, k-means++ init) of the conv / dense kernels.

    Each clustered kernel is replaced by `num_clusters` shared values (its
    centroids, fine-tuned with the rest of the model), then ``strip_clustering``
    leaves plain kernels whose values are the centroids; they are copied into a
    Keras 3 copy of the model. See the module docstring for which kernels are
    clustered and what the export keeps.

    Args:
        num_clusters: distinct values per kernel (> 1).

    The other arguments are as `prune` (the default learning rate is lower: the
    centroids move all weights of a cluster at once).

    Returns:
        A `SparsityResult` whose `model` is the clustered Keras 3 model.
    """
    if isinstance(num_clusters, bool) or not isinstance(num_clusters, int) or num_clusters < 2:
        raise ValueError(f"num_clusters must be an int >= 2. Received: {num_clusters!r}")
    return _run(
        "cluster", model_or_path, train_data, {"num_clusters": num_clusters}, epochs=epochs,
        steps_per_epoch=steps_per_epoch, learning_rate=learning_rate, batch_size=batch_size,
        output_path=output_path, quantization=quantization,
        representative_data=representative_data, validation_data=validation_data,
        verbose=verbose, timeout=timeout,
    )


def _run(task, model_or_path, train_data, options, *, epochs, steps_per_epoch, learning_rate,
         batch_size, output_path, quantization, representative_data, validation_data, verbose,
         timeout) -> SparsityResult:
    import keras

    from keras_mvit2.utils.arguments import validate_positive_ints

    start = time.monotonic()
    validate_positive_ints(epochs=epochs, batch_size=batch_size)
    if steps_per_epoch is not None:
        validate_positive_ints(steps_per_epoch=steps_per_epoch)
    if not isinstance(learning_rate, int | float) or not learning_rate >= 0:
        raise ValueError(f"learning_rate must be >= 0. Received: learning_rate={learning_rate!r}")
    model = _worker_client.load_keras_model(model_or_path)
    input_shape = _worker_client.image_input_shape(model)
    num_classes = int(model.outputs[0].shape[-1])

    with _worker_client.temporary_workdir(task) as workdir:
        x, _, train, steps = _worker_client.stage_training_data(
            model, train_data, workdir, batch_size=batch_size, steps_per_epoch=steps_per_epoch)
        if task == "prune" and epochs * steps < 2:
            raise ValueError(
                "Pruning needs at least 2 training steps (the masks are updated on a "
                f"schedule). Received: epochs={epochs}, steps_per_epoch={steps}"
            )
        calibration = x[:200] if representative_data is None else representative_data
        xv = yv = None
        if validation_data is not None:
            xv, yv, _ = _worker_client.labelled_arrays(
                validation_data, input_shape=input_shape, what="validation_data",
                batch_size=batch_size, split="test",
            )
            yv = _worker_client.integer_labels(yv, num_classes, "validation_data")
        reference = xv[:8] if xv is not None else x[:8]
        job = {"model": twin_transfer.write_model_files(model, workdir, reference)}
        job.update(train=train, epochs=epochs, steps_per_epoch=steps, batch_size=batch_size,
                   learning_rate=float(learning_rate), weights_out=os.path.join(
                       workdir, "result_weights.npz"), **options)
        result = _worker_client.run_worker(task, job, workdir, verbose=verbose, timeout=timeout)
        new_weights = _worker_common.read_weights(result["weights_out"])

    copy = keras.models.clone_model(model)
    copy.set_weights(model.get_weights())
    twin_transfer.assign_keras3_weights(copy, new_weights)
    kernels = {}
    for path in result["kernels"]:
        value = new_weights[path]
        kernels[path] = (
            float(np.mean(value == 0)) if task == "prune" else int(np.unique(value).size)
        )

    before = after = None
    if xv is not None:
        before = _accuracy(model, xv, yv)
        after = _accuracy(copy, xv, yv)

    report = None
    exported: list[dict[str, Any]] = []
    tflite_path = None
    if output_path is not None:
        from keras_mvit2.export.tflite.convert import to_tflite

        tflite_path = os.fspath(output_path)
        kwargs = {}
        if quantization in ("int8", "int16x8"):
            kwargs["representative_data"] = calibration
        # No 1x1 pair fusion: the product of two pruned / clustered kernels is neither
        # sparse nor clustered, and the exported file must keep what was trained.
        report = to_tflite(copy, tflite_path, quantization=quantization,
                           fuse_pointwise=False, **kwargs)
        exported = exported_kernel_stats(tflite_path)
    target = options.get("target_sparsity", options.get("num_clusters"))
    return SparsityResult(
        model=copy, method=task, target=target, kernels=kernels,
        float_accuracy_before=before, float_accuracy_after=after, tflite_path=tflite_path,
        tflite_report=report, exported_kernels=exported,
        twin_max_abs_diff=float(result["twin_max_abs_diff"]), history=list(result["history"]),
        schedule=result.get("schedule"), seconds=time.monotonic() - start,
    )


def _accuracy(model, x, y) -> float:
    pred = np.argmax(np.asarray(model.predict(x, batch_size=256, verbose=0)), -1)
    return float(np.mean(pred == y))


def exported_kernel_stats(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Sparsity and distinct values of every conv / fully-connected kernel in a ``.tflite``.

    Returns one dict per CONV_2D, DEPTHWISE_CONV_2D and FULLY_CONNECTED op:
    ``op``, ``tensor`` (the kernel tensor's name), ``shape``, ``dtype``,
    ``sparsity`` (fraction of exact zeros), ``unique`` (distinct values in the
    whole kernel) and ``max_unique_per_channel`` (the most distinct values in one
    output channel: axis 0 for CONV_2D / FULLY_CONNECTED, the last axis for
    DEPTHWISE_CONV_2D). Kernels that are not constant buffers are skipped.
    """
    from keras_mvit2.export.tflite.flatbuffer import (
        constant_array,
        decode_name,
        op_names,
        read_flatbuffer,
    )

    model = read_flatbuffer(os.fspath(path))
    names = op_names(model)
    out = []
    for subgraph in model.subgraphs or []:
        for op in subgraph.operators or []:
            name = names[op.opcodeIndex]
            if name not in _KERNEL_OPS or op.inputs is None or len(op.inputs) < 2:
                continue
            tensor = subgraph.tensors[int(op.inputs[1])]
            values = constant_array(model, tensor)
            if values is None or values.dtype == np.int32:
                continue
            channels = np.moveaxis(values, -1, 0) if name == "DEPTHWISE_CONV_2D" else values
            per_channel = max(np.unique(c).size for c in channels.reshape(len(channels), -1))
            out.append({
                "op": name, "tensor": decode_name(tensor.name), "shape": list(values.shape),
                "dtype": values.dtype.name, "sparsity": float(np.mean(values == 0)),
                "unique": int(np.unique(values).size), "max_unique_per_channel": int(per_channel),
            })
    return out


# --------------------------------------------------------------------------------------
# Worker side


def _nested_kernels(tf_keras, layer, prefix: str = ""):
    """`(attribute path, variable)` of the Conv2D / Dense / EinsumDense kernels inside `layer`."""
    base = tf_keras.layers.Layer
    found = []
    for name, value in list(vars(layer).items()):
        if name.startswith("_"):
            continue
        items = []
        if isinstance(value, base):
            items = [(name, value)]
        elif isinstance(value, list | tuple) or type(value).__name__ == "ListWrapper":
            items = [(f"{name}.{i}", v) for i, v in enumerate(value) if isinstance(v, base)]
        for path, child in items:
            full = prefix + path
            if isinstance(child, tf_keras.layers.DepthwiseConv2D):
                continue
            if isinstance(child, tf_keras.layers.Conv2D | tf_keras.layers.Dense
                          | tf_keras.layers.EinsumDense):
                found.append((f"{full}.kernel", child.kernel))
            else:
                found.extend(_nested_kernels(tf_keras, child, full + "."))
    return found


def _is_ours(layer) -> bool:
    return type(layer).__module__.startswith("keras_mvit2.")


def _top_level_kernel_layer(tf_keras, layer) -> bool:
    return type(layer) in (tf_keras.layers.Conv2D, tf_keras.layers.Dense)


def _kernel_paths(weight_map: Mapping[str, Any], variables) -> list[str]:
    ids = {id(v) for v in variables}
    return [p for p, v in weight_map.items() if id(v) in ids]


def _fit(ctx, model, task: str, callbacks=()):
    """Fine-tunes the wrapped twin on the job's data; the Keras `History`."""
    job = ctx.job
    epochs, steps = int(job["epochs"]), int(job["steps_per_epoch"])
    dataset, _ = ctx.dataset(job["train"], batch_size=job["batch_size"], shuffle=True)
    ctx.compile(model, job["learning_rate"])
    return model.fit(dataset, epochs=epochs, steps_per_epoch=steps, verbose=0,
                     callbacks=[*callbacks, ctx.progress_callback(task, epochs, steps)])


def _strip_clustering(layer) -> None:
    """Writes a `ClusterWeights` wrapper's clustered values into its original kernels."""
    for name, original in layer.original_clusterable_weights.items():
        original.assign(layer.get_weight_from_layer(name))
        layer.set_weight_to_layer(name, original)


def _finish_worker(ctx, weight_map, variables, history, extra):
    from keras_mvit2.quantize._worker_common import write_twin_weights

    write_twin_weights(weight_map, ctx.job["weights_out"])
    per_epoch = [{k: float(v[i]) for k, v in history.history.items()}
                 for i in range(int(ctx.job["epochs"]))]
    return {"weights_out": ctx.job["weights_out"], "kernels": _kernel_paths(weight_map, variables),
            "history": per_epoch, **extra}


def worker_prune(ctx) -> dict[str, Any]:
    """The ``"prune"`` task of the worker process."""
    import tensorflow_model_optimization as tfmot
    import tf_keras

    job = ctx.job
    twin, weight_map, diff = ctx.load_twin()
    sparsity = tfmot.sparsity.keras
    epochs, steps = int(job["epochs"]), int(job["steps_per_epoch"])
    last = epochs * steps - 1
    frequency = job["frequency"] or max(1, last // 10)
    end_step = max(frequency, (int(0.8 * last) // frequency) * frequency)
    if end_step > last:
        raise ValueError(
            f"The pruning schedule needs more training steps: mask updates every {frequency} "
            f"steps end at step {end_step}, but the run has {last + 1} steps. Lower frequency "
            "or train longer."
        )
    schedule = sparsity.PolynomialDecay(
        initial_sparsity=job["initial_sparsity"], final_sparsity=job["target_sparsity"],
        begin_step=0, end_step=end_step, frequency=frequency,
    )
    pruned_vars = []

    def wrap(layer):
        if _is_ours(layer):
            kernels = _nested_kernels(tf_keras, layer)
            if not kernels:
                return layer
            variables = [v for _, v in kernels]
            object.__setattr__(layer, "get_prunable_weights", lambda v=variables: list(v))
            pruned_vars.extend(variables)
            return sparsity.prune_low_magnitude(layer, pruning_schedule=schedule)
        if _top_level_kernel_layer(tf_keras, layer):
            pruned_vars.append(layer.kernel)
            return sparsity.prune_low_magnitude(layer, pruning_schedule=schedule)
        return layer

    model = tf_keras.models.clone_model(twin, clone_function=wrap)
    ctx.log(f"pruning {len(pruned_vars)} kernels to {job['target_sparsity']:.0%} sparsity "
            f"(polynomial decay, masks updated every {frequency} steps until step {end_step})")
    history = _fit(ctx, model, "prune", [sparsity.UpdatePruningStep()])
    sparsity.strip_pruning(model)   # applies the final masks to the twin's variables
    achieved = [float(np.mean(v.numpy() == 0)) for v in pruned_vars]
    ctx.log(f"sparsity of the pruned kernels: min {min(achieved):.3f}, "
            f"mean {np.mean(achieved):.3f}")
    return _finish_worker(ctx, weight_map, pruned_vars, history, {
        "twin_max_abs_diff": diff,
        "schedule": {"kind": "PolynomialDecay", "initial_sparsity": job["initial_sparsity"],
                     "final_sparsity": job["target_sparsity"], "begin_step": 0,
                     "end_step": end_step, "frequency": frequency, "total_steps": last + 1},
    })


def worker_cluster(ctx) -> dict[str, Any]:
    """The ``"cluster"`` task of the worker process."""
    import tensorflow_model_optimization as tfmot
    import tf_keras
    from tensorflow_model_optimization.python.core.clustering.keras import (
        cluster_wrapper,
        clusterable_layer,
    )

    job = ctx.job
    k = int(job["num_clusters"])
    clustering = tfmot.clustering.keras
    init = clustering.CentroidInitialization.KMEANS_PLUS_PLUS

    class NestedClusterWeights(cluster_wrapper.ClusterWeightsMHA):
        """ClusterWeights for kernels reached by attribute paths (``"fc1.kernel"``)."""

        def get_weight_from_layer(self, weight_name):
            return _worker_common.path_get(self.layer, weight_name)

        def set_weight_to_layer(self, weight_name, new_weight):
            _worker_common.path_set(self.layer, weight_name, new_weight)

    def clusterable(cls):
        if not cls.__module__.startswith("keras_mvit2."):
            return None

        def get_clusterable_weights(self):
            return _nested_kernels(tf_keras, self)

        return type(cls.__name__, (cls, clusterable_layer.ClusterableLayer), {
            "__module__": cls.__module__,
            "get_clusterable_weights": get_clusterable_weights,
        })

    twin, weight_map, diff = ctx.load_twin(class_override=clusterable)
    clustered_vars = []

    def wrap(layer):
        if _is_ours(layer):
            kernels = layer.get_clusterable_weights()
            if not kernels:
                return layer
            clustered_vars.extend(v for _, v in kernels)
            return NestedClusterWeights(layer, number_of_clusters=k,
                                        cluster_centroids_init=init)
        if _top_level_kernel_layer(tf_keras, layer):
            clustered_vars.append(layer.kernel)
            return clustering.cluster_weights(layer, number_of_clusters=k,
                                              cluster_centroids_init=init)
        return layer

    model = tf_keras.models.clone_model(twin, clone_function=wrap)
    ctx.log(f"clustering {len(clustered_vars)} kernels into {k} shared values each")
    history = _fit(ctx, model, "cluster")
    for layer in model.layers:
        if isinstance(layer, cluster_wrapper.ClusterWeights):
            layer.update_clustered_weights_associations()
            _strip_clustering(layer)
    counts = [int(np.unique(v.numpy()).size) for v in clustered_vars]
    ctx.log(f"distinct values per clustered kernel: max {max(counts)} (target <= {k})")
    return _finish_worker(ctx, weight_map, clustered_vars, history, {"twin_max_abs_diff": diff})
