"""Fuse back-to-back 1x1 convolutions of a Core ML program into one (an exact rewrite).

The Core ML counterpart of `keras_mvit2.export.tflite.pointwise_fusion`: coremltools folds
batch norms and biases into convolutions but never merges two convolutions, so the three pairs
of MobileViTv2 (``stage0_block0``'s projection and the ``conv_proj`` of the MobileViT
blocks of ``stage2`` and ``stage3``, each followed by the expansion of the next
inverted residual) stay apart. ``W_b (W_a x + b_a) + b_b = (W_b W_a) x + (W_b b_a + b_b)``.

A graph pass of coremltools' MIL pipeline, run after its batch-norm and bias fusions and
before the float16 cast, so it sees the convolutions that will run. It fuses a pair only
when it cannot change the model's function:

* both are ``conv`` ops with constant weights (and biases), a 1x1 kernel, stride 1,
  one group and no padding;
* the first one's output is read by the second one only, as its input, and neither
  output is an output of the program;
* the fused convolution has fewer multiply-accumulates (`fusion_saves_macs`).

The product is taken in float64 and stored in the weights' type (float32 at this point).
"""

from __future__ import annotations

import contextlib
import contextvars

import numpy as np
from coremltools.converters.mil.mil import Builder as mb  # noqa: N813 (coremltools idiom)
from coremltools.converters.mil.mil.passes.graph_pass import AbstractGraphPass
from coremltools.converters.mil.mil.passes.helper import block_context_manager
from coremltools.converters.mil.mil.passes.pass_pipeline import PassPipeline
from coremltools.converters.mil.mil.passes.pass_registry import register_pass

from keras_mvit2.export.tflite.pointwise_fusion import PointwiseFusion, fusion_saves_macs

__all__ = ["PASS_NAME", "collect_fusions", "pipeline_with_pointwise_fusion"]

PASS_NAME = "keras_mvit2::fuse_pointwise_conv_pairs"
_AFTER = "common::fuse_conv_batchnorm"  # the last conv fusion of coremltools' pipeline

_FUSIONS: contextvars.ContextVar = contextvars.ContextVar("coreml_pointwise_fusions",
                                                          default=None)


@contextlib.contextmanager
def collect_fusions():
    """Yields the list to which the pass appends a `PointwiseFusion` per fused pair."""
    fusions: list[PointwiseFusion] = []
    token = _FUSIONS.set(fusions)
    try:
        yield fusions
    finally:
        _FUSIONS.reset(token)


def pipeline_with_pointwise_fusion() -> PassPipeline:
    """coremltools' default pipeline with the fusion after its last conv fusion."""
    pipeline = PassPipeline.DEFAULT
    passes = list(pipeline.passes)
    last = len(passes) - 1 - passes[::-1].index(_AFTER)
    pipeline.insert_pass(last + 1, PASS_NAME)
    return pipeline


@register_pass(namespace="keras_mvit2")
class fuse_pointwise_conv_pairs(AbstractGraphPass):  # noqa: N801 (coremltools pass naming)
    """Fuses every eligible pair of back-to-back 1x1 `conv` ops (see the module doc)."""

    def apply(self, prog) -> None:
        for function in prog.functions.values():
            while _fuse_one(function):
                pass


def _pointwise(op) -> bool:
    if op.op_type != "conv" or op.weight.val is None:
        return False
    if op.weight.val.ndim != 4 or op.weight.val.shape[2:] != (1, 1):
        return False
    if op.groups.val != 1 or any(s != 1 for s in op.strides.val):
        return False
    if op.pad is not None and np.any(op.pad.val != 0):
        return False
    return op.bias is None or op.bias.val is not None


def _bias(op, channels: int) -> np.ndarray:
    if op.bias is None:
        return np.zeros(channels)
    return op.bias.val.astype(np.float64)


@block_context_manager
def _fuse_one(block) -> bool:
    """Fuses the first eligible pair of `block`; False when there is none left."""
    for first in list(block.operations):
        if not _pointwise(first):
            continue
        middle = first.outputs[0]
        readers = list(middle.child_ops)
        if middle in block.outputs or len(readers) != 1:
            continue
        second = readers[0]
        if not _pointwise(second) or second.x is not middle or second.outputs[0] in block.outputs:
            continue
        w_a = first.weight.val[:, :, 0, 0].astype(np.float64)       # (mid, in)
        w_b = second.weight.val[:, :, 0, 0].astype(np.float64)      # (out, mid)
        (mid, cin), cout = w_a.shape, w_b.shape[0]
        if not fusion_saves_macs(cin, mid, cout):
            continue
        dtype = second.weight.val.dtype
        fused = mb.conv(
            x=first.x,
            weight=(w_b @ w_a).reshape(cout, cin, 1, 1).astype(dtype),
            bias=(w_b @ _bias(first, mid) + _bias(second, cout)).astype(dtype),
            strides=[1, 1], pad_type="valid", dilations=[1, 1], groups=1,
            name=second.outputs[0].name + "_pointwise_fused",
            before_op=second,
        )
        block.replace_uses_of_var_after_op(anchor_op=second, old_var=second.outputs[0],
                                           new_var=fused)
        block.remove_ops([second, first])
        fusions = _FUSIONS.get()
        if fusions is not None:
            shape = fused.shape
            pixels = int(np.prod(shape[2:])) if shape is not None else 0
            fusions.append(PointwiseFusion(
                first=middle.name, second=second.outputs[0].name, channels=(cin, mid, cout),
                macs_saved=pixels * (mid * (cin + cout) - cin * cout)))
        return True
    return False
