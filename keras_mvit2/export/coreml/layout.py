"""The MobileViTv2 transformer written in Core ML's layout, for the Core ML export.

Core ML computes convolutions channels-first, `(B, C, H, W)`. coremltools converts a
channels-last TensorFlow graph by wrapping each convolution in layout transposes and then
cancelling the pairs that meet. In the MobileViTv2 block they cannot all meet: the unfold
ends in a reshape of the channels-last tensor `(B, N, P, d)`, so every 1x1 convolution of
the transformer keeps its transposes (MobileViTV2-0.5: 61 `transpose` ops).

`channels_first_block`, given to `keras_mvit2.layers.export_forms.tracing` as its
`block_call`, traces each `MobileViTV2Block` (separable attention) in the layout that
Core ML runs, with the tokens channels-first, `(B, d, P, N)`: P pixel positions as the
height axis and the N patches as the width axis, like ml-cvnets' own Core ML path. The
function and the weights are the same (checked against the Keras model in TensorFlow):
the math is `keras_mvit2.layers.functional`, called here with `CHANNELS_FIRST` and the
forms `keras_mvit2.layers.export_forms.COREML_CHANNELS_FIRST`:

* unfold: a depthwise 2x2, stride-2 convolution with a 0/1 kernel and P outputs per
  channel (channel `c * P + k` is pixel `k` of the patch) and a reshape, no transpose;
* GN1: mean over `(d, P, N)`, centred variance, per-channel scale and shift;
* separable attention: the softmax over the tokens is a softmax over the last axis, the
  pooled context a product and a sum over it (float, as Core ML computes);
* fold: one transpose `(B, d, P, N) -> (B, P, d, N)`, a reshape and `depth_to_space`.

This module is only the wiring: which blocks are supported, the layers' weights handed to
those functions, and the redirect of the blocks' inference call. The rest of the model
(convolutions, batch norms, inverted residuals) is traced as is. Only inference calls are
redirected; any other attention keeps the usual call.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
from collections.abc import Callable
from typing import Any

from keras_mvit2.layers import export_forms, functional
from keras_mvit2.layers.export_forms import COREML_CHANNELS_FIRST, FLOAT_RUNTIME, ExportForms
from keras_mvit2.layers.functional import CHANNELS_FIRST
from keras_mvit2.layers.group_norm import GroupNorm1
from keras_mvit2.layers.separable_self_attention import SeparableSelfAttention
from keras_mvit2.layers.transformer_layer import TransformerLayer
from keras_mvit2.models.mobilevitv2.mobilevitv2_block import MobileViTV2Block

__all__ = ["channels_first_block", "coreml_forms_entry", "coreml_tracing"]


def coreml_tracing() -> contextlib.AbstractContextManager[ExportForms]:
    """The trace of every Core ML and Core AI file, on both roads: `FLOAT_RUNTIME` (float
    runtimes: the token sum as a product and a mean), and each `MobileViTV2Block` written
    channels-first by `channels_first_block` (`COREML_CHANNELS_FIRST`)."""
    return export_forms.tracing(FLOAT_RUNTIME, block_call=channels_first_block)


def coreml_forms_entry() -> str:
    """The ``keras_mvit2.forms`` metadata of a Core ML file (JSON): the forms of
    `coreml_tracing`, the layers' and the `MobileViTV2Block` transformers' with their layouts."""
    return json.dumps({
        **dataclasses.asdict(FLOAT_RUNTIME), "layout": "channels_last",
        "mobilevitv2_blocks": {**dataclasses.asdict(COREML_CHANNELS_FIRST),
                               "layout": "channels_first"},
    })


def _supported(block: MobileViTV2Block) -> bool:
    return all(
        isinstance(layer, TransformerLayer) and isinstance(layer.attn, SeparableSelfAttention)
        for layer in block.transformer
    )


def channels_first_block(block: MobileViTV2Block, inputs: Any) -> Any | None:
    """`block(inputs, training=False)` with the transformer channels-first; None if unsupported.

    Args:
        block: a built `MobileViTV2Block` whose transformer layers use separable attention.
        inputs: `(B, H, W, C)`, channels-last, as the block's call.

    Returns:
        `(B, H', W', C)` channels-last, the block's output.
    """
    if not _supported(block):
        return None
    forms = COREML_CHANNELS_FIRST
    x = block.resize_input(inputs)
    grid = block.patch_grid(x)
    x = functional.transform_patches(
        block.local_features(x, training=False),                      # (B, H, W, d)
        grid, block.patch_size,
        [_transformer_layer(layer, forms) for layer in block.transformer],
        _group_norm(block.norm, forms), layout=CHANNELS_FIRST, unfold_form=forms.unfold,
    )                                                                 # (B, H, W, d)
    return block.project(x, training=False)


def _pointwise(conv) -> Callable:
    """A Keras 1x1 `Conv2D`'s weights as a function of channels-first tokens."""
    return functools.partial(functional.pointwise_conv, kernel=conv.kernel,
                             bias=conv.bias if conv.use_bias else None, layout=CHANNELS_FIRST)


def _group_norm(norm: GroupNorm1, forms: ExportForms) -> Callable:
    return functools.partial(functional.group_norm1, gamma=norm.gamma, beta=norm.beta,
                             epsilon=norm.epsilon, layout=CHANNELS_FIRST,
                             variance=forms.variance)


def _transformer_layer(layer: TransformerLayer, forms: ExportForms) -> Callable:
    attn: SeparableSelfAttention = layer.attn
    attention = functools.partial(
        functional.separable_attention, qkv_kernel=attn.qkv_proj.kernel,
        qkv_bias=attn.qkv_proj.bias if attn.use_bias else None,
        out_projection=_pointwise(attn.out_proj), layout=CHANNELS_FIRST, forms=forms,
    )
    return functools.partial(
        functional.transformer_layer, norm1=_group_norm(layer.norm1, forms), attention=attention,
        norm2=_group_norm(layer.norm2, forms), fc1=_pointwise(layer.fc1),
        fc2=_pointwise(layer.fc2),
    )
