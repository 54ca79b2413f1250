"""A Core ML package's own weights, decompressed and run on any OS (Core ML needs macOS).

Core ML cannot run predictions on Linux, yet the accuracy of a compressed package
(palettized, int8 weights) is decided by the weights it ships. This module measures it
without macOS by running **the package's own MIL program** in TensorFlow:

* `package_weights` reads the `.mlpackage`'s MIL program with coremltools and returns
  every weight dense: plain `const` tensors as stored, and each `constexpr_*` op
  (`constexpr_lut_to_dense`, `constexpr_affine_dequantize`,
  `constexpr_blockwise_shift_scale`, `constexpr_sparse_to_dense`, ...) evaluated by
  coremltools' own decompression (`materialized_val_inference`): the look-up tables and
  scales applied back, exactly the values Core ML computes with.
* `predict_with_package_weights` runs that program op by op with TensorFlow
  (`keras_mvit2.export.coreml.mil_ops`), in float32, on images in [0, 1].

The program, not the Keras model with weights mapped back, because the program is what
ships: its weights are folded, fused and laid out channels-first, and running it uses
each where Core ML does, by construction. An op the interpreter does not know is an error
naming it, never skipped. For weight-only compression the result is exact (up to float32
rounding order).

What is measured, per numeric format:

* float32 programs: Core ML's function with exactly its weights (`exact`).
* float16 programs (`to_coreml`'s default, what the Neural Engine runs): the float16
  weights exactly, but activations in float32, where Core ML rounds them to float16: an
  approximation (`approximate: float16 activations`), the same for every float16
  candidate.
* activation quantization (W8A8, `quantize` / `dequantize` ops): simulated in float32
  with the program's scales; Core ML's int8 kernels are not reproduced: not measurable
  here (`simulated`).
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Any

import numpy as np

__all__ = [
    "PackageProgram",
    "activation_ranges",
    "load_package_program",
    "measurement_kind",
    "package_weights",
    "predict_with_package_weights",
    "program_of",
    "run_program",
]


@dataclasses.dataclass(frozen=True)
class PackageProgram:
    """The main function of a `.mlpackage`'s MIL program, with its weights dense.

    Attributes:
        path: the package.
        function: the coremltools MIL `Function` (``main``).
        weights: MIL variable name -> dense weight (see `package_weights`).
        input_name: the program's input (``"image"``).
        image_input: the input is a Core ML image (pixels 0-255, channels-first in the
            program), else a float tensor `(1, H, W, 3)`.
        input_size: `(height, width)`.
        compute_precision: ``"float16"`` or ``"float32"`` (the program's activations).
        activation_quantization: the program quantizes activations (W8A8).
    """

    path: str
    function: Any
    weights: dict[str, np.ndarray]
    input_name: str
    image_input: bool
    input_size: tuple[int, int]
    compute_precision: str
    activation_quantization: bool


def _load_program(mlmodel: Any, path: str):
    from coremltools.converters.mil.frontend.milproto import load as milproto

    spec = mlmodel.get_spec()
    if spec.WhichOneof("Type") != "mlProgram":
        raise ValueError(
            f"{path!r} is not an ML Program (it is a {spec.WhichOneof('Type')!r} model): "
            "running its weights needs a classifier or feature model from to_coreml."
        )
    program = milproto.load(spec, spec.specificationVersion, mlmodel.weights_dir)
    return spec, program.functions["main"]


def _decompressed_weights(function) -> dict[str, np.ndarray]:
    consumed: set[str] = set()   # the look-up tables, indices, scales of constexpr ops
    weights: dict[str, np.ndarray] = {}
    for op in function.operations:
        if op.blocks:
            raise NotImplementedError(
                f"MIL op {op.name!r} ({op.op_type}) has nested blocks (control flow): "
                "not supported by package_weights."
            )
        if op.op_type.startswith("constexpr_"):
            if not hasattr(op, "materialized_val_inference"):
                raise NotImplementedError(
                    f"coremltools cannot decompress {op.op_type} ({op.name!r})")
            weights[op.outputs[0].name] = np.asarray(op.materialized_val_inference())
            for var in op.inputs.values():
                consumed.add(var.name)
        elif op.op_type == "const":
            value = op.outputs[0].val
            if isinstance(value, np.ndarray) and value.ndim and np.issubdtype(
                    value.dtype, np.floating):
                weights[op.outputs[0].name] = value
    return {name: value for name, value in weights.items() if name not in consumed}


def package_weights(package: str | os.PathLike) -> dict[str, np.ndarray]:
    """Every weight of a Core ML ML Program, dense, as Core ML computes with it.

    Args:
        package: a `.mlpackage` (any compression: none, palettized, int8, pruned).

    Returns:
        MIL variable name -> array in the program's layout (convolutions
        `(C_out, C_in / groups, kH, kW)`): each float constant tensor as stored
        (float16 or float32), and each `constexpr_*` op's output decompressed by
        coremltools (`materialized_val_inference`); the compressed pieces themselves
        (indices, look-up tables, scales) are not listed.
    """
    return load_package_program(package).weights


def program_of(mlmodel: Any, path: str = "<in memory>") -> PackageProgram:
    """The MIL program of a coremltools `MLModel` (saved or not) with its dense weights."""
    spec, function = _load_program(mlmodel, path)
    feature = spec.description.input[0]
    (input_name, input_var), = function.inputs.items()
    shape = tuple(int(d) for d in input_var.shape)
    image_input = feature.type.WhichOneof("Type") == "imageType"
    size = shape[2:4] if image_input else shape[1:3]
    op_types = {op.op_type for op in function.operations}
    return PackageProgram(
        path=path, function=function, weights=_decompressed_weights(function),
        input_name=input_name, image_input=image_input, input_size=(size[0], size[1]),
        compute_precision="float16" if _has_fp16(function) else "float32",
        activation_quantization="quantize" in op_types,
    )


@functools.lru_cache(maxsize=8)
def _cached_program(path: str, mtime: float) -> PackageProgram:
    import coremltools as ct

    return program_of(ct.models.MLModel(path, skip_model_load=True), path)


def _has_fp16(function) -> bool:
    return any(op.op_type == "cast" and str(op.dtype.val) == "fp16" for op in function.operations)


def load_package_program(package: str | os.PathLike) -> PackageProgram:
    """The package's MIL program and its dense weights (cached per path and mtime)."""
    path = os.path.abspath(os.fspath(package))
    if not os.path.exists(path):
        raise FileNotFoundError(f"No Core ML package at {path!r}")
    return _cached_program(path, os.path.getmtime(path))


def measurement_kind(package: str | os.PathLike) -> str:
    """What `predict_with_package_weights` measures for `package`: ``"exact"`` (float32
    program, weight-only compression), ``"approximate: float16 activations"`` (float16
    program: exact weights, float32 activations) or ``"simulated: activation
    quantization"`` (W8A8: Core ML's int8 activations are not measurable here)."""
    program = load_package_program(package)
    if program.activation_quantization:
        return "simulated: activation quantization"
    if program.compute_precision == "float16":
        return "approximate: float16 activations"
    return "exact"


def _interpreter(program: PackageProgram, ranges: bool):
    """A `tf.function`: images `(B, H, W, 3)` in [0, 1] -> the program's scores `(B, K)`,
    or (`ranges`) each activation's `[min, max]` per image, `(B, A, 2)`, in the order of
    the returned names. The program runs once per image (`tf.map_fn`), at the batch of 1
    it was written for: its shapes (reshapes) are kept as they are."""
    import tensorflow as tf

    from keras_mvit2.export.coreml.mil_ops import MIL_OPS

    function, weights = program.function, program.weights
    outputs = {var.name for var in function.outputs}
    names: list[str] = []   # (ranges) the activations, in the order of the returned rows

    def value(var, env):
        if isinstance(var, (tuple, list)):
            return tuple(value(v, env) for v in var)
        if var.name in env:
            return env[var.name]
        if var.name in weights:
            return weights[var.name]
        if var.val is not None:
            return var.val
        raise ValueError(f"MIL variable {var.name!r} has no value (program not in order?)")

    def run_one(x):                                   # x: the program's input, batch 1
        env = {program.input_name: x}
        scores, activations = None, {program.input_name: x}
        for op in function.operations:
            if op.op_type == "const" or op.op_type.startswith("constexpr_"):
                continue
            fn = MIL_OPS.get(op.op_type)
            if fn is None:
                raise NotImplementedError(
                    f"MIL op {op.op_type!r} ({op.name!r}) of {program.path!r} has no "
                    "TensorFlow implementation in keras_mvit2.export.coreml.mil_ops: add one "
                    "there (the package's accuracy cannot be measured without it)."
                )
            out = fn(op, **{k: value(v, env) for k, v in op.inputs.items()})
            for var, tensor in zip(op.outputs, out if isinstance(out, tuple) else (out,),
                                   strict=True):
                env[var.name] = tensor
                if op.op_type != "classify" and var.name not in outputs:
                    activations[var.name] = tensor
            if op.op_type == "classify":
                scores = env[op.outputs[1].name]
        if ranges:
            floats = {name: t for name, t in activations.items() if t.dtype.is_floating}
            names[:] = list(floats)
            return tf.stack([tf.stack([tf.reduce_min(t), tf.reduce_max(t)])
                             for t in floats.values()])
        return (env[function.outputs[0].name] if scores is None else scores)[0]

    @tf.function(reduce_retracing=True, autograph=False)
    def run(images):
        x = tf.cast(images, tf.float32)
        if program.image_input:
            x = tf.transpose(x * 255.0, (0, 3, 1, 2))  # Core ML's pixels, channels-first
        return tf.map_fn(lambda one: run_one(one[None]), x, parallel_iterations=8,
                         fn_output_signature=tf.float32)

    return run, names


def _checked_images(program: PackageProgram, images: np.ndarray, batch_size: int) -> np.ndarray:
    images = np.asarray(images)
    if images.ndim != 4 or images.shape[-1] != 3:
        raise ValueError(f"images must be (N, H, W, 3) RGB in [0, 1]. Received: {images.shape}")
    if tuple(images.shape[1:3]) != program.input_size:
        raise ValueError(
            f"{program.path!r} takes {program.input_size} images. Received: "
            f"{images.shape[1:3]}; resize them (keras_mvit2.preprocess_images) first."
        )
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1. Received: {batch_size}")
    return images.astype(np.float32)


def run_program(program: PackageProgram, images: np.ndarray, *, batch_size: int = 64
                ) -> np.ndarray:
    """`program`'s scores `(N, K)` float32 on `images` `(N, H, W, 3)` in [0, 1], computed
    with TensorFlow in float32 (see `predict_with_package_weights`)."""
    images = _checked_images(program, images, batch_size)
    run, _ = _interpreter(program, ranges=False)
    return np.concatenate([np.asarray(run(images[i:i + batch_size]))
                           for i in range(0, len(images), batch_size)]).astype(np.float32)


def activation_ranges(program: PackageProgram, images: np.ndarray, *, batch_size: int = 64
                      ) -> dict[str, tuple[float, float]]:
    """The `(min, max)` over `images` of the program's input and of every float activation
    (each non-constant op's output, the program's outputs excepted): the calibration
    statistics of activation quantization."""
    images = _checked_images(program, images, batch_size)
    run, names = _interpreter(program, ranges=True)
    ranges: dict[str, tuple[float, float]] = {}
    for i in range(0, len(images), batch_size):
        rows = np.asarray(run(images[i:i + batch_size]))            # (B, A, 2)
        for name, low, high in zip(names, rows[:, :, 0].min(0), rows[:, :, 1].max(0),
                                   strict=True):
            old = ranges.get(name, (float(low), float(high)))
            ranges[name] = (min(old[0], float(low)), max(old[1], float(high)))
    return ranges


def predict_with_package_weights(model: Any, package: str | os.PathLike, images: np.ndarray,
                                 *, batch_size: int = 64) -> np.ndarray:
    """The scores of `package`'s program on `images`, computed here with its own weights.

    Args:
        model: the Keras model the package was exported from (its input size must be the
            package's; a model built with a dynamic size is not checked).
        package: a `.mlpackage` written by `to_coreml` (any weight compression).
        images: `(N, H, W, 3)` RGB in [0, 1], as the Keras model takes them (an image
            input gets `images * 255`, unrounded).
        batch_size: images per TensorFlow call.

    Returns:
        `(N, K)` float32: the program's output; for a classifier package the class
        probabilities (a logits model gets the softmax the package appended), so compare
        top-1 with the Keras model's argmax. `measurement_kind(package)` says whether it
        is exact (float32), approximate (float16 activations) or simulated (W8A8).
    """
    program = load_package_program(package)
    input_shape = tuple(getattr(model, "input_shape", (None, None, None))[1:3])
    if None not in input_shape and input_shape != program.input_size:
        raise ValueError(
            f"The model takes {input_shape} images but {package!r} was exported at "
            f"{program.input_size}: pass the model the package was exported from."
        )
    return run_program(program, images, batch_size=batch_size)
