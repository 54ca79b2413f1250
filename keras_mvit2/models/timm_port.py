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
from keras_mvit2.weights.port import PortTarget, assign_values, listing, match_state
from keras_mvit2.weights.torch_checkpoint import (
    read_torch_state_dict,
)


def _layer(owner, attribute: str, kind: type, family: str):
    layer = getattr(owner, attribute, None)
    if not isinstance(layer, kind):
        raise ValueError(
            f"Layer {owner.name!r} has no {kind.__name__} {attribute!r} (is it built?); it is "
            f"not a {family} layer of keras_mvit2."
        )
    return layer


def _add_conv(targets: dict, key: str, layer) -> None:
    if isinstance(layer, keras.layers.DepthwiseConv2D):
        if layer.depth_multiplier != 1:
            raise ValueError(f"Layer {layer.name!r}: depth_multiplier must be 1 to port.")
        targets[f"{key}.weight"] = PortTarget(layer.kernel, "depthwise")
    elif isinstance(layer, keras.layers.Conv2D) and getattr(layer, "groups", 1) == 1:
        targets[f"{key}.weight"] = PortTarget(layer.kernel, "conv")
    else:
        raise ValueError(f"Layer {layer.name!r} should be an ungrouped Conv2D or a depthwise conv.")
    if layer.use_bias:
        targets[f"{key}.bias"] = PortTarget(layer.bias, "copy")


def _add_bn(targets: dict, key: str, layer) -> None:
    if not isinstance(layer, keras.layers.BatchNormalization) or not (layer.scale and layer.center):
        raise ValueError(f"Layer {layer.name!r} should be a BatchNormalization with scale/center.")
    targets[f"{key}.weight"] = PortTarget(layer.gamma, "copy")
    targets[f"{key}.bias"] = PortTarget(layer.beta, "copy")
    targets[f"{key}.running_mean"] = PortTarget(layer.moving_mean, "copy")
    targets[f"{key}.running_var"] = PortTarget(layer.moving_variance, "copy")


def _add_layer_norm(targets: dict, key: str, layer) -> None:
    if not isinstance(layer, keras.layers.LayerNormalization) or not (layer.scale and layer.center):
        raise ValueError(f"Layer {layer.name!r} should be a LayerNormalization with scale/center.")
    targets[f"{key}.weight"] = PortTarget(layer.gamma, "copy")
    targets[f"{key}.bias"] = PortTarget(layer.beta, "copy")


def _add_linear(targets: dict, key: str, layer) -> None:
    """`Dense` or `EinsumDense` with a `(in, out)` kernel <- torch `Linear` `(out, in)`."""
    if not isinstance(layer, keras.layers.Dense | keras.layers.EinsumDense) or len(
        layer.kernel.shape
    ) != 2:
        raise ValueError(f"Layer {layer.name!r} should be a Dense/EinsumDense with a 2-D kernel.")
    targets[f"{key}.weight"] = PortTarget(layer.kernel, "dense")
    bias = getattr(layer, "bias", None)
    if bias is not None:
        targets[f"{key}.bias"] = PortTarget(bias, "copy")


def _add_vit_block(targets: dict, key: str, block: ViTBlock, family: str) -> None:
    _add_layer_norm(targets, f"{key}.norm1", _layer(block, "norm1", keras.layers.Layer, family))
    attn = _layer(block, "attn", keras.layers.Layer, family)
    if type(attn) is not MultiHeadSelfAttention:
        raise ValueError(
            f"timm {family} checkpoints hold multi-head attention weights (attn.qkv, attn.proj), "
            f"but layer {block.name!r} uses {type(attn).__name__}. Build the model with "
            "attention='mha' to load them."
        )
    _add_linear(targets, f"{key}.attn.qkv", attn.qkv)
    _add_linear(targets, f"{key}.attn.proj", attn.proj)
    _add_layer_norm(targets, f"{key}.norm2", _layer(block, "norm2", keras.layers.Layer, family))
    _add_linear(targets, f"{key}.mlp.fc1", _layer(block, "fc1", keras.layers.Layer, family))
    _add_linear(targets, f"{key}.mlp.fc2", _layer(block, "fc2", keras.layers.Layer, family))


def _add_inverted_residual(targets: dict, key: str, block: InvertedResidual) -> None:
    family = "MobileViT"
    for conv, bn, part in (
        ("expand_conv", "expand_bn", "conv1_1x1"),
        ("depthwise_conv", "depthwise_bn", "conv2_kxk"),
        ("project_conv", "project_bn", "conv3_1x1"),
    ):
        _add_conv(targets, f"{key}.{part}.conv", _layer(block, conv, keras.layers.Layer, family))
        _add_bn(targets, f"{key}.{part}.bn", _layer(block, bn, keras.layers.Layer, family))


def _add_mobilevit_block(targets: dict, key: str, block: MobileViTBlock) -> None:
    family = "MobileViT"
    layer = keras.layers.Layer
    _add_conv(targets, f"{key}.conv_kxk.conv", _layer(block, "conv_kxk", layer, family))
    _add_bn(targets, f"{key}.conv_kxk.bn", _layer(block, "conv_kxk_bn", layer, family))
    _add_conv(targets, f"{key}.conv_1x1", _layer(block, "conv_1x1", layer, family))
    transformer = getattr(block, "transformer", None)
    if not isinstance(transformer, list) or not transformer:
        raise ValueError(f"Layer {block.name!r} has no transformer blocks (is it built?).")
    for k, vit_block in enumerate(transformer):
        _add_vit_block(targets, f"{key}.transformer.{k}", vit_block, family)
    _add_layer_norm(targets, f"{key}.norm", _layer(block, "norm", layer, family))
    _add_conv(targets, f"{key}.conv_proj.conv", _layer(block, "conv_proj", layer, family))
    _add_bn(targets, f"{key}.conv_proj.bn", _layer(block, "conv_proj_bn", layer, family))
    if block.fusion:
        _add_conv(targets, f"{key}.conv_fusion.conv", _layer(block, "conv_fusion", layer, family))
        _add_bn(targets, f"{key}.conv_fusion.bn", _layer(block, "conv_fusion_bn", layer, family))


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
    _add_conv(targets, "stem.conv", net.get_layer("stem_conv"))
    _add_bn(targets, "stem.bn", net.get_layer("stem_bn"))
    for layer in net.layers:
        parts = layer.name.removeprefix("stage").split("_block")
        if len(parts) != 2 or not all(p.isdigit() for p in parts):
            continue
        key = f"stages.{int(parts[0])}.{int(parts[1])}"
        if isinstance(layer, InvertedResidual):
            _add_inverted_residual(targets, key, layer)
        elif isinstance(layer, MobileViTBlock):
            _add_mobilevit_block(targets, key, layer)
        else:
            raise ValueError(
                f"Model {net.name!r}: layer {layer.name!r} is a {type(layer).__name__}, not an "
                "InvertedResidual or a MobileViTBlock."
            )
    _add_conv(targets, "final_conv.conv", net.get_layer("final_conv"))
    _add_bn(targets, "final_conv.bn", net.get_layer("final_bn"))
    head = _named(net, "predictions")
    if head is not None:
        _add_linear(targets, "head.fc", head)
    return targets


def _vit_targets(net: keras.Model) -> dict[str, PortTarget]:
    targets: dict[str, PortTarget] = {}
    embeds = [layer for layer in net.layers if isinstance(layer, PatchEmbedding)]
    if len(embeds) != 1:
        raise ValueError(f"Model {net.name!r} should have one PatchEmbedding.")
    embed = embeds[0]
    _add_conv(targets, "patch_embed.proj", _layer(embed, "proj", keras.layers.Layer, "ViT"))
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
    _add_layer_norm(targets, "norm", norm)
    head = _named(net, "predictions")
    if head is not None:
        _add_linear(targets, "head", head)
    return targets


def _find_network(model: keras.Model) -> tuple[keras.Model, str]:
    """`(network, family)`: `model` itself or the one model nested in it."""
    if not isinstance(model, keras.Model):
        raise TypeError(
            "load_timm_weights expects a keras.Model built by keras_mvit2 (MobileViT or ViT). "
            f"Received: {type(model).__name__}"
        )

    def family(net: keras.Model) -> str | None:
        if any(isinstance(layer, PatchEmbedding) for layer in net.layers):
            return "vit"
        if any(isinstance(layer, MobileViTBlock) for layer in net.layers):
            return "mobilevit"
        return None

    found = family(model)
    if found:
        return model, found
    nested = [
        (layer, family(layer)) for layer in model.layers
        if isinstance(layer, keras.Model) and family(layer)
    ]
    if len(nested) == 1:
        return nested[0]
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
    source = (
        "the given state dict" if isinstance(path_or_state_dict, Mapping)
        else repr(os.fspath(path_or_state_dict))
    )
    has_head = any(k.startswith("head.") for k in targets)

    unexpected = [
        k for k in state if k not in targets and not (not has_head and k.startswith("head."))
    ]
    missing, mismatched, values = match_state(state, targets)

    if missing or unexpected or mismatched:
        parts = [f"Cannot load {source} into model {model.name!r} (timm {family}); "
                 "nothing was loaded."]
        if mismatched:
            parts.append(f"- {len(mismatched)} tensor(s) with a wrong shape:\n"
                         + listing(mismatched) + _hints(state, targets, family))
        if missing:
            parts.append(f"- {len(missing)} tensor(s) the model needs are missing from the "
                         "checkpoint:\n" + listing(missing))
        if unexpected:
            parts.append(f"- {len(unexpected)} unexpected tensor(s) in the checkpoint (not in "
                         "this model):\n" + listing(unexpected))
        raise ValueError("\n".join(parts))

    assign_values(values)
