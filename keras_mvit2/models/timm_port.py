"""Porting timm checkpoints of MobileViT v1 (`mobilevit_xxs/xs/s`) and ViT / DeiT
(`deit_*_patch16_224`, `vit_*_patch16_*` with class token) into keras_mvit2 models.

The expected tensors are found by walking the Keras model's layers (any number
of classes, any depth or width; the input size only matters for ViT's position
embedding), keyed by timm's names:

MobileViT v1 (`keras_mvit2.models.MobileViT`):
- `stem.{conv,bn}` <- `stem_conv`, `stem_bn`
- `stages.{i}.{j}.{conv1_1x1,conv2_kxk,conv3_1x1}.{conv,bn}` <- `stage{i}_block{j}`
  (`InvertedResidual`: `expand_*`, `depthwise_*`, `project_*`)
- `stages.{i}.1.conv_kxk.{conv,bn}`, `.conv_1x1`, `.transformer.{k}.{norm1, attn.qkv,
  attn.proj, norm2, mlp.fc1, mlp.fc2}`, `.norm`, `.conv_proj.{conv,bn}`,
  `.conv_fusion.{conv,bn}` <- `stage{i}_block1` (`MobileViTBlock`)
- `final_conv.{conv,bn}` <- `final_conv`, `final_bn`; `head.fc` <- `predictions`

ViT / DeiT (`keras_mvit2.models.ViT`):
- `patch_embed.proj`, `cls_token`, `pos_embed`, `blocks.{l}.{norm1, attn.qkv,
  attn.proj, norm2, mlp.fc1, mlp.fc2}`, `norm`, `head` <- `predictions`

Layout transforms (torch -> Keras): Conv2D kernel `transpose(2, 3, 1, 0)`,
DepthwiseConv2D kernel `transpose(2, 3, 0, 1)`, Linear weight -> `EinsumDense` /
`Dense` kernel `transpose(1, 0)`, everything else copied (BN weight / bias /
running_mean / running_var -> gamma / beta / moving_mean / moving_variance,
LayerNorm weight / bias -> gamma / beta).
"""

import os
from collections.abc import Mapping
from typing import Any

import keras
import numpy as np

from keras_mvit2.layers.inverted_residual import InvertedResidual
from keras_mvit2.layers.multi_head_attention import MultiHeadSelfAttention
from keras_mvit2.models.mobilevit.mobilevit_block import MobileViTBlock
from keras_mvit2.models.vit.vit_layers import ClassTokenPositionEmbedding, PatchEmbedding, ViTBlock
from keras_mvit2.weights.port import (
    PortTarget,
    add_batch_norm,
    add_conv,
    add_inverted_residual,
    add_linear,
    add_norm,
    find_network,
    port_state,
    source_name,
    sublayer,
)
from keras_mvit2.weights.torch_checkpoint import read_torch_state_dict

_LAYER = keras.layers.Layer


def _add_vit_block(targets: dict, key: str, block: ViTBlock, family: str) -> None:
    add_norm(targets, f"{key}.norm1", sublayer(block, "norm1", _LAYER, family))
    attn = sublayer(block, "attn", _LAYER, family)
    if type(attn) is not MultiHeadSelfAttention:
        raise ValueError(
            f"timm {family} checkpoints hold multi-head attention weights (attn.qkv, attn.proj), "
            f"but layer {block.name!r} uses {type(attn).__name__}. Build the model with "
            "attention='mha' to load them."
        )
    add_linear(targets, f"{key}.attn.qkv", attn.qkv)
    add_linear(targets, f"{key}.attn.proj", attn.proj)
    add_norm(targets, f"{key}.norm2", sublayer(block, "norm2", _LAYER, family))
    add_linear(targets, f"{key}.mlp.fc1", sublayer(block, "fc1", _LAYER, family))
    add_linear(targets, f"{key}.mlp.fc2", sublayer(block, "fc2", _LAYER, family))


def _add_mobilevit_block(targets: dict, key: str, block: MobileViTBlock) -> None:
    def part(name):
        return sublayer(block, name, _LAYER, "MobileViT")

    add_conv(targets, f"{key}.conv_kxk.conv", part("conv_kxk"))
    add_batch_norm(targets, f"{key}.conv_kxk.bn", part("conv_kxk_bn"))
    add_conv(targets, f"{key}.conv_1x1", part("conv_1x1"))
    transformer = getattr(block, "transformer", None)
    if not isinstance(transformer, list) or not transformer:
        raise ValueError(f"Layer {block.name!r} has no transformer blocks (is it built?).")
    for k, vit_block in enumerate(transformer):
        _add_vit_block(targets, f"{key}.transformer.{k}", vit_block, "MobileViT")
    add_norm(targets, f"{key}.norm", part("norm"))
    for name in ("conv_proj", "conv_fusion") if block.fusion else ("conv_proj",):
        add_conv(targets, f"{key}.{name}.conv", part(name))
        add_batch_norm(targets, f"{key}.{name}.bn", part(f"{name}_bn"))


def _named(net: keras.Model, name: str):
    try:
        return net.get_layer(name)
    except ValueError:
        return None


def _mobilevit_targets(net: keras.Model) -> dict[str, PortTarget]:
    targets: dict[str, PortTarget] = {}
    for name in ("stem_conv", "stem_bn", "final_conv", "final_bn"):
        if _named(net, name) is None:
            raise ValueError(
                f"Model {net.name!r} is not a keras_mvit2 MobileViT: no layer {name!r}."
            )
    add_conv(targets, "stem.conv", net.get_layer("stem_conv"))
    add_batch_norm(targets, "stem.bn", net.get_layer("stem_bn"))
    for layer in net.layers:
        parts = layer.name.removeprefix("stage").split("_block")
        if len(parts) != 2 or not all(p.isdigit() for p in parts):
            continue
        key = f"stages.{int(parts[0])}.{int(parts[1])}"
        if isinstance(layer, InvertedResidual):
            add_inverted_residual(targets, key, layer, "MobileViT")
        elif isinstance(layer, MobileViTBlock):
            _add_mobilevit_block(targets, key, layer)
        else:
            raise ValueError(
                f"Model {net.name!r}: layer {layer.name!r} is a {type(layer).__name__}, not an "
                "InvertedResidual or a MobileViTBlock."
            )
    add_conv(targets, "final_conv.conv", net.get_layer("final_conv"))
    add_batch_norm(targets, "final_conv.bn", net.get_layer("final_bn"))
    head = _named(net, "predictions")
    if head is not None:
        add_linear(targets, "head.fc", head)
    return targets


def _vit_targets(net: keras.Model) -> dict[str, PortTarget]:
    targets: dict[str, PortTarget] = {}
    embeds = [layer for layer in net.layers if isinstance(layer, PatchEmbedding)]
    if len(embeds) != 1:
        raise ValueError(f"Model {net.name!r} should have one PatchEmbedding.")
    embed = embeds[0]
    add_conv(targets, "patch_embed.proj", sublayer(embed, "proj", _LAYER, "ViT"))
    cls_pos = [layer for layer in net.layers if isinstance(layer, ClassTokenPositionEmbedding)]
    if len(cls_pos) != 1:
        raise ValueError(f"Model {net.name!r} should have one ClassTokenPositionEmbedding.")
    targets["cls_token"] = PortTarget(cls_pos[0].cls_token, "copy")
    targets["pos_embed"] = PortTarget(cls_pos[0].pos_embed, "copy")
    blocks = [layer for layer in net.layers if isinstance(layer, ViTBlock)]
    for i, block in enumerate(blocks):
        _add_vit_block(targets, f"blocks.{i}", block, "ViT")
    norm = _named(net, "norm")
    if norm is None:
        raise ValueError(f"Model {net.name!r} is not a keras_mvit2 ViT: no layer 'norm'.")
    add_norm(targets, "norm", norm)
    head = _named(net, "predictions")
    if head is not None:
        add_linear(targets, "head", head)
    return targets


def _find_network(model: keras.Model) -> tuple[keras.Model, str]:
    """`(network, family)`: `model` itself or the one model nested in it."""

    def family(net: keras.Model) -> str | None:
        if any(isinstance(layer, PatchEmbedding) for layer in net.layers):
            return "vit"
        if any(isinstance(layer, MobileViTBlock) for layer in net.layers):
            return "mobilevit"
        return None

    net, found = find_network(model, family, "load_timm_weights expects a keras.Model built "
                              "by keras_mvit2 (MobileViT or ViT)")
    if net is not None:
        return net, found
    raise ValueError(
        f"load_timm_weights ports MobileViT v1 and ViT / DeiT models of keras_mvit2; model "
        f"{model.name!r} is neither (for MobileViTv2 use keras_mvit2.load_torch_weights)."
    )


def timm_port_targets(model: keras.Model) -> tuple[dict[str, PortTarget], str]:
    """The timm-named tensors a keras_mvit2 MobileViT v1 or ViT expects.

    Returns:
        `(targets, family)`: `targets` maps each timm key to its `PortTarget`;
        `family` is `"mobilevit"` or `"vit"`.
    """
    net, family = _find_network(model)
    if family == "vit":
        return _vit_targets(net), family
    return _mobilevit_targets(net), family


def _hints(state: dict[str, np.ndarray], targets: dict[str, PortTarget], family: str) -> str:
    hints = []
    head_key = "head.weight" if family == "vit" else "head.fc.weight"
    if head_key in state and head_key in targets and state[head_key].ndim == 2:
        ckpt, ours = int(state[head_key].shape[0]), targets[head_key].keras_shape[1]
        if ckpt != ours:
            hints.append(
                f"The checkpoint's classifier has {ckpt} classes and the model's has {ours}: "
                f"build the model with classes={ckpt}, or include_top=False for the backbone."
            )
    pos = state.get("pos_embed")
    if family == "vit" and pos is not None and pos.ndim == 3 and "pos_embed" in targets:
        ckpt, ours = int(pos.shape[1]), targets["pos_embed"].keras_shape[1]
        if ckpt != ours:
            hints.append(
                f"The checkpoint's position embedding has {ckpt} tokens (class token included) "
                f"and the model's has {ours}: build the model with the checkpoint's input size "
                "(e.g. input_shape=(224, 224, 3) for 197 tokens at patch 16)."
            )
    return "".join(f"\n  {h}" for h in hints)


def load_timm_weights(
    model: keras.Model,
    path_or_state_dict: str | os.PathLike | Mapping[str, Any],
) -> None:
    """Loads a timm MobileViT v1 or ViT / DeiT checkpoint into a keras_mvit2 model, in place.

    Every tensor is checked (names and shapes) before any variable is assigned,
    so a failed load leaves the model unchanged. With `include_top=False` the
    classifier tensors of the checkpoint are ignored.

    Args:
        model: a model built by `keras_mvit2.models.MobileViT` (timm
            `mobilevit_xxs/xs/s`) or `keras_mvit2.models.ViT` (timm
            `deit_*_patch16_224`, `vit_*` with a class token, no distillation
            token), with `attention="mha"`. For ViT the input size must give the
            checkpoint's number of patches.
        path_or_state_dict: a `.pth` / `.pt` / `.bin` / `.safetensors` path, or
            a dict of torch tensors or numpy arrays (see `read_torch_state_dict`).

    Raises:
        ValueError: the model is not a keras_mvit2 MobileViT v1 / ViT, or the
            checkpoint has missing or unexpected tensors or tensors of the wrong
            shape (each is named, with its torch shape and the Keras shape).
        FileNotFoundError, ImportError: see `read_torch_state_dict`.

    Example:
        ```python
        model = keras_mvit2.create_model("deit_tiny", classifier_activation=None)
        load_timm_weights(model, "deit_tiny_patch16_224.safetensors")
        ```
    """
    targets, family = timm_port_targets(model)  # checks the model before reading a file
    state = read_torch_state_dict(path_or_state_dict)
    port_state(
        state, targets, has_head=any(k.startswith("head.") for k in targets),
        what=(f"Cannot load {source_name(path_or_state_dict)} into model {model.name!r} "
              f"(timm {family})"),
        shape_hint=_hints(state, targets, family),
    )
