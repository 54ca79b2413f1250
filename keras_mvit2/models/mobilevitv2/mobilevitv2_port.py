"""Porting PyTorch MobileViTv2 checkpoints (Apple ml-cvnets, timm, HF transformers) to Keras.

The expected tensors are found by walking the Keras model's layers, so a model
of any width, input size or number of classes gets its own mapping. Every
checkpoint key is renamed to timm's naming first (ml-cvnets -> timm, L = 1..5):

- stem: `conv_1.block.{conv,norm}` -> `stem.{conv,bn}`
- inverted residual: `layer_L.j.block.{exp_1x1,conv_3x3,red_1x1}.block.{conv,norm}`
  -> `stages.{L-1}.j.{conv1_1x1,conv2_kxk,conv3_1x1}.{conv,bn}`
- MobileViTv2 block, local part: `layer_L.1.local_rep.0.block.{conv,norm}` ->
  `stages.{L-1}.1.conv_kxk.{conv,bn}`; `layer_L.1.local_rep.1.block.conv` -> `...conv_1x1`
- transformer layer k: `layer_L.1.global_rep.k.pre_norm_attn.0` -> `...transformer.k.norm1`;
  `...pre_norm_attn.1.{qkv_proj,out_proj}.block.conv` -> `...transformer.k.attn.{qkv,out}_proj`;
  `...pre_norm_ffn.0` -> `...norm2`; `...pre_norm_ffn.{1,3}.block.conv` -> `...mlp.{fc1,fc2}`
- final GroupNorm: `layer_L.1.global_rep.{num_layers}` -> `stages.{L-1}.1.norm`
- projection: `layer_L.1.conv_proj.block.{conv,norm}` -> `stages.{L-1}.1.conv_proj.{conv,bn}`
- head: `classifier.1` -> `head.fc`

HF transformers keys (`mobilevitv2.encoder.layer.{i}...`) are renamed the same way.

Layout transforms (torch -> Keras channels-last): Conv2D kernel
`transpose(2, 3, 1, 0)`, DepthwiseConv2D kernel `transpose(2, 3, 0, 1)`, Dense
kernel `transpose(1, 0)`, everything else copied (BN weight / bias /
running_mean / running_var -> gamma / beta / moving_mean / moving_variance).
"""

import functools
import os
import re
from collections.abc import Callable, Mapping
from typing import Any

import keras
import numpy as np

from keras_mvit2.layers.group_norm import GroupNorm1
from keras_mvit2.layers.inverted_residual import InvertedResidual
from keras_mvit2.models.mobilevitv2.mobilevitv2_block import MobileViTV2Block
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

# --------------------------------------------------------------------------------------
# Key renaming: ml-cvnets / HF transformers -> timm
# --------------------------------------------------------------------------------------

_IR_PARTS_CVNETS = {"exp_1x1": "conv1_1x1", "conv_3x3": "conv2_kxk", "red_1x1": "conv3_1x1"}
_IR_PARTS_HF = {"expand_1x1": "conv1_1x1", "conv_3x3": "conv2_kxk", "reduce_1x1": "conv3_1x1"}
_NORM_CVNETS = {"conv": "conv", "norm": "bn"}
_NORM_HF = {"convolution": "conv", "normalization": "bn"}
_FFN_CVNETS = {"1": "fc1", "3": "fc2"}
_FFN_HF = {"conv1": "fc1", "conv2": "fc2"}

_Rule = tuple[re.Pattern[str], Callable[[re.Match[str]], str]]


def _stage(layer: str) -> int:
    """ml-cvnets' `layer_L` (L = 1..5) is timm's `stages.{L-1}`."""
    return int(layer) - 1


_CVNETS_RULES: list[_Rule] = [
    (re.compile(r"conv_1\.block\.(conv|norm)\.(\w+)"),
     lambda m: f"stem.{_NORM_CVNETS[m[1]]}.{m[2]}"),
    (re.compile(r"layer_([1-9]\d*)\.(\d+)\.block\.(exp_1x1|conv_3x3|red_1x1)\.block\."
                r"(conv|norm)\.(\w+)"),
     lambda m: f"stages.{_stage(m[1])}.{m[2]}.{_IR_PARTS_CVNETS[m[3]]}."
               f"{_NORM_CVNETS[m[4]]}.{m[5]}"),
    (re.compile(r"layer_([1-9]\d*)\.(\d+)\.local_rep\.0\.block\.(conv|norm)\.(\w+)"),
     lambda m: f"stages.{_stage(m[1])}.{m[2]}.conv_kxk.{_NORM_CVNETS[m[3]]}.{m[4]}"),
    (re.compile(r"layer_([1-9]\d*)\.(\d+)\.local_rep\.1\.block\.conv\.(\w+)"),
     lambda m: f"stages.{_stage(m[1])}.{m[2]}.conv_1x1.{m[3]}"),
    (re.compile(r"layer_([1-9]\d*)\.(\d+)\.global_rep\.(\d+)\.pre_norm_attn\.0\.(\w+)"),
     lambda m: f"stages.{_stage(m[1])}.{m[2]}.transformer.{m[3]}.norm1.{m[4]}"),
    (re.compile(r"layer_([1-9]\d*)\.(\d+)\.global_rep\.(\d+)\.pre_norm_attn\.1\."
                r"(qkv_proj|out_proj)\.block\.conv\.(\w+)"),
     lambda m: f"stages.{_stage(m[1])}.{m[2]}.transformer.{m[3]}.attn.{m[4]}.{m[5]}"),
    (re.compile(r"layer_([1-9]\d*)\.(\d+)\.global_rep\.(\d+)\.pre_norm_ffn\.0\.(\w+)"),
     lambda m: f"stages.{_stage(m[1])}.{m[2]}.transformer.{m[3]}.norm2.{m[4]}"),
    (re.compile(r"layer_([1-9]\d*)\.(\d+)\.global_rep\.(\d+)\.pre_norm_ffn\.([13])\."
                r"block\.conv\.(\w+)"),
     lambda m: f"stages.{_stage(m[1])}.{m[2]}.transformer.{m[3]}.mlp."
               f"{_FFN_CVNETS[m[4]]}.{m[5]}"),
    # The final GroupNorm is the last element of global_rep (index = number of layers).
    (re.compile(r"layer_([1-9]\d*)\.(\d+)\.global_rep\.(\d+)\.(weight|bias)"),
     lambda m: f"stages.{_stage(m[1])}.{m[2]}.norm.{m[4]}"),
    (re.compile(r"layer_([1-9]\d*)\.(\d+)\.conv_proj\.block\.(conv|norm)\.(\w+)"),
     lambda m: f"stages.{_stage(m[1])}.{m[2]}.conv_proj.{_NORM_CVNETS[m[3]]}.{m[4]}"),
    (re.compile(r"classifier\.1\.(weight|bias)"), lambda m: f"head.fc.{m[1]}"),
]

_HF_STAGE = r"mobilevitv2\.encoder\.layer\.(\d+)\."
_HF_RULES: list[_Rule] = [
    (re.compile(r"mobilevitv2\.conv_stem\.(convolution|normalization)\.(\w+)"),
     lambda m: f"stem.{_NORM_HF[m[1]]}.{m[2]}"),
    (re.compile(_HF_STAGE + r"layer\.(\d+)\.(expand_1x1|conv_3x3|reduce_1x1)\."
                r"(convolution|normalization)\.(\w+)"),
     lambda m: f"stages.{m[1]}.{m[2]}.{_IR_PARTS_HF[m[3]]}.{_NORM_HF[m[4]]}.{m[5]}"),
    (re.compile(_HF_STAGE + r"downsampling_layer\.(expand_1x1|conv_3x3|reduce_1x1)\."
                r"(convolution|normalization)\.(\w+)"),
     lambda m: f"stages.{m[1]}.0.{_IR_PARTS_HF[m[2]]}.{_NORM_HF[m[3]]}.{m[4]}"),
    (re.compile(_HF_STAGE + r"conv_kxk\.(convolution|normalization)\.(\w+)"),
     lambda m: f"stages.{m[1]}.1.conv_kxk.{_NORM_HF[m[2]]}.{m[3]}"),
    (re.compile(_HF_STAGE + r"conv_1x1\.convolution\.(\w+)"),
     lambda m: f"stages.{m[1]}.1.conv_1x1.{m[2]}"),
    (re.compile(_HF_STAGE + r"transformer\.layer\.(\d+)\.layernorm_before\.(\w+)"),
     lambda m: f"stages.{m[1]}.1.transformer.{m[2]}.norm1.{m[3]}"),
    (re.compile(_HF_STAGE + r"transformer\.layer\.(\d+)\.attention\.(qkv_proj|out_proj)\."
                r"convolution\.(\w+)"),
     lambda m: f"stages.{m[1]}.1.transformer.{m[2]}.attn.{m[3]}.{m[4]}"),
    (re.compile(_HF_STAGE + r"transformer\.layer\.(\d+)\.layernorm_after\.(\w+)"),
     lambda m: f"stages.{m[1]}.1.transformer.{m[2]}.norm2.{m[3]}"),
    (re.compile(_HF_STAGE + r"transformer\.layer\.(\d+)\.ffn\.(conv1|conv2)\."
                r"convolution\.(\w+)"),
     lambda m: f"stages.{m[1]}.1.transformer.{m[2]}.mlp.{_FFN_HF[m[3]]}.{m[4]}"),
    (re.compile(_HF_STAGE + r"layernorm\.(\w+)"),
     lambda m: f"stages.{m[1]}.1.norm.{m[2]}"),
    (re.compile(_HF_STAGE + r"conv_projection\.(convolution|normalization)\.(\w+)"),
     lambda m: f"stages.{m[1]}.1.conv_proj.{_NORM_HF[m[2]]}.{m[3]}"),
    (re.compile(r"classifier\.(weight|bias)"), lambda m: f"head.fc.{m[1]}"),
]

_TIMM_KEY = re.compile(r"(stem|stages|head)\.[\w.]+")

_RULES_BY_NAMING = {"cvnets": _CVNETS_RULES, "hf": _HF_RULES}


def _rename(key: str, rules: list[_Rule]) -> str | None:
    for pattern, replace in rules:
        match = pattern.fullmatch(key)
        if match:
            return replace(match)
    return None


def _naming_of(key: str) -> str | None:
    if key.startswith("mobilevitv2."):
        return "hf"
    if key.startswith(("conv_1.", "layer_", "classifier.1.")):
        return "cvnets"
    if key.startswith(("stem.", "stages.", "head.")):
        return "timm"
    return None


def cvnets_to_timm_key(key: str) -> str:
    """Renames an Apple ml-cvnets MobileViTv2 state-dict key to timm's name.

    HF transformers keys (`mobilevitv2.encoder.layer...`, `classifier.weight`)
    are renamed too, and keys that already follow timm's naming come back
    unchanged. The rules are the same for every width multiplier.

    Args:
        key: a checkpoint key such as `"layer_3.1.global_rep.0.pre_norm_attn.0.weight"`.

    Returns:
        The timm key, e.g. `"stages.2.1.transformer.0.norm1.weight"`.

    Raises:
        ValueError: the key belongs to none of these namings.

    Example:
    >>> cvnets_to_timm_key("layer_5.1.conv_proj.block.norm.running_var")
    'stages.4.1.conv_proj.bn.running_var'
    """
    for naming in ("cvnets", "hf"):
        renamed = _rename(key, _RULES_BY_NAMING[naming])
        if renamed is not None:
            return renamed
    if _TIMM_KEY.fullmatch(key):
        return key
    raise ValueError(
        f"{key!r} is not a MobileViTv2 checkpoint key of ml-cvnets, timm or HF transformers."
    )


def _detect_naming(keys: list[str]) -> str:
    """The naming of most keys: "cvnets", "timm" or "hf"."""
    votes: dict[str, int] = {}
    for key in keys:
        naming = _naming_of(key)
        if naming is not None:
            votes[naming] = votes.get(naming, 0) + 1
    if not votes:
        shown = ", ".join(repr(k) for k in keys[:5])
        raise ValueError(
            "The checkpoint does not look like a MobileViTv2 state dict of ml-cvnets, timm or "
            f"HF transformers. First keys: [{shown}]"
        )
    return max(votes, key=votes.__getitem__)


# --------------------------------------------------------------------------------------
# The Keras side: expected tensors from the model's layers
# --------------------------------------------------------------------------------------


def _not_a_mobilevitv2(model: keras.Model, why: str) -> ValueError:
    return ValueError(
        "load_torch_weights expects a MobileViTv2 built by keras_mvit2 "
        "(`keras_mvit2.MobileViTV2(...)` or `keras_mvit2.create_model('mobilevitv2_100')`); "
        f"model {model.name!r} {why}."
    )


def _find_network(model: keras.Model) -> keras.Model:
    """The MobileViTv2 functional model: `model` itself, or the one model nested in it."""
    net, _ = find_network(model, lambda m: any(s.name == "stem_conv" for s in m.layers),
                          "load_torch_weights expects a keras.Model built by "
                          "keras_mvit2.MobileViTV2")
    if net is None:
        raise _not_a_mobilevitv2(model, "has no layer named 'stem_conv'")
    return net


_FAMILY = "MobileViTv2"
_sublayer = functools.partial(sublayer, family=_FAMILY)


def _add_mobilevitv2_block(targets: dict, key: str, block: MobileViTV2Block) -> None:
    bn, conv = keras.layers.BatchNormalization, keras.layers.Conv2D
    add_conv(targets, f"{key}.conv_kxk.conv",
             _sublayer(block, "local_conv", keras.layers.DepthwiseConv2D))
    add_batch_norm(targets, f"{key}.conv_kxk.bn", _sublayer(block, "local_bn", bn))
    add_conv(targets, f"{key}.conv_1x1", _sublayer(block, "local_proj", conv))
    transformer = getattr(block, "transformer", None)
    if not isinstance(transformer, list) or not transformer:
        raise ValueError(f"Layer {block.name!r} has no transformer layers (is it built?).")
    for k, layer in enumerate(transformer):
        prefix = f"{key}.transformer.{k}"
        attn = _sublayer(layer, "attn", keras.layers.Layer)
        add_norm(targets, f"{prefix}.norm1", _sublayer(layer, "norm1", GroupNorm1), GroupNorm1)
        add_conv(targets, f"{prefix}.attn.qkv_proj", _sublayer(attn, "qkv_proj", conv))
        add_conv(targets, f"{prefix}.attn.out_proj", _sublayer(attn, "out_proj", conv))
        add_norm(targets, f"{prefix}.norm2", _sublayer(layer, "norm2", GroupNorm1), GroupNorm1)
        add_conv(targets, f"{prefix}.mlp.fc1", _sublayer(layer, "fc1", conv))
        add_conv(targets, f"{prefix}.mlp.fc2", _sublayer(layer, "fc2", conv))
    add_norm(targets, f"{key}.norm", _sublayer(block, "norm", GroupNorm1), GroupNorm1)
    add_conv(targets, f"{key}.conv_proj.conv", _sublayer(block, "conv_proj", conv))
    add_batch_norm(targets, f"{key}.conv_proj.bn", _sublayer(block, "proj_bn", bn))


_BLOCK_NAME = re.compile(r"stage(\d+)_block(\d+)")


def model_port_targets(model: keras.Model) -> tuple[dict[str, PortTarget], bool]:
    """The timm-named tensors a keras_mvit2 MobileViTv2 expects, in model order.

    Args:
        model: a model built by `keras_mvit2.MobileViTV2` (or a model that nests
            exactly one such model).

    Returns:
        `(targets, has_head)`: `targets` maps each timm key to its `PortTarget`;
        `has_head` is False for `include_top=False` models.
    """
    net = _find_network(model)
    targets: dict[str, PortTarget] = {}
    add_conv(targets, "stem.conv", net.get_layer("stem_conv"))
    try:
        stem_bn = net.get_layer("stem_bn")
    except ValueError:
        raise _not_a_mobilevitv2(net, "has no layer named 'stem_bn'") from None
    add_batch_norm(targets, "stem.bn", stem_bn)
    num_attention_blocks = 0
    has_head = False
    for layer in net.layers:
        match = _BLOCK_NAME.fullmatch(layer.name)
        if match:
            key = f"stages.{int(match[1])}.{int(match[2])}"
            if isinstance(layer, InvertedResidual):
                add_inverted_residual(targets, key, layer, _FAMILY)
            elif isinstance(layer, MobileViTV2Block):
                _add_mobilevitv2_block(targets, key, layer)
                num_attention_blocks += 1
            else:
                raise _not_a_mobilevitv2(
                    net, f"has a layer {layer.name!r} of type {type(layer).__name__}"
                )
        elif layer.name == "predictions":
            if not isinstance(layer, keras.layers.Dense):
                raise _not_a_mobilevitv2(net, "has a 'predictions' layer that is not Dense")
            add_linear(targets, "head.fc", layer)
            has_head = True
    if num_attention_blocks == 0:
        raise _not_a_mobilevitv2(net, "has no MobileViTV2Block layers named 'stage{i}_block{j}'")
    return targets, has_head


# --------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------


def _width_hint(state: dict[str, np.ndarray], targets: dict[str, PortTarget]) -> str:
    key = "stages.4.0.conv3_1x1.conv.weight"
    if key not in state or key not in targets or state[key].ndim != 4:
        return ""
    ckpt, ours = int(state[key].shape[0]), targets[key].torch_shape[0]
    if ckpt == ours:
        return ""
    return (
        f"\n  The checkpoint's last stage has {ckpt} channels (width_multiplier="
        f"{ckpt / 512:g} by ml-cvnets' rule); this model's has {ours}. Build the model "
        f"with MobileViTV2(width_multiplier={ckpt / 512:g}, ...)."
    )


def _head_hint(state: dict[str, np.ndarray], targets: dict[str, PortTarget]) -> str:
    weight = state.get("head.fc.weight")
    if weight is None or weight.ndim != 2 or "head.fc.weight" not in targets:
        return ""
    ckpt_classes = int(weight.shape[0])
    model_classes = targets["head.fc.weight"].keras_shape[1]
    if ckpt_classes == model_classes:
        return ""
    return (
        f"\n  The checkpoint's classifier has {ckpt_classes} classes and the model's has "
        f"{model_classes}. Build the model with classes={ckpt_classes} to load the classifier "
        "too, or with include_top=False to load only the backbone (then add your own head)."
    )


def load_torch_weights(
    model: keras.Model,
    path_or_state_dict: str | os.PathLike | Mapping[str, Any],
) -> None:
    """Loads a PyTorch MobileViTv2 checkpoint into a keras_mvit2 MobileViTv2, in place.

    Accepts Apple ml-cvnets checkpoints (`.pt`), timm ones (`.pth` / `.bin` /
    `.safetensors`) and HF transformers ones; the naming is detected from the
    keys. Every tensor is checked (names and shapes) before any variable is
    assigned, so a failed load leaves the model unchanged. With
    `include_top=False` the classifier tensors are ignored.

    Args:
        model: a model built by `keras_mvit2.MobileViTV2` / `create_model`, of
            the checkpoint's width; any input size works.
        path_or_state_dict: a checkpoint path, or a dict of torch tensors or
            numpy arrays (see `read_torch_state_dict`).

    Raises:
        ValueError: the model is not a keras_mvit2 MobileViTv2, or the
            checkpoint has missing or unexpected tensors or tensors of the wrong
            shape (each is named, with the torch shape and the Keras shape).
        FileNotFoundError, ImportError: see `read_torch_state_dict`.

    Example:
        ```python
        model = keras_mvit2.MobileViTV2(1.0, classifier_activation=None)
        load_torch_weights(model, "mobilevitv2-1.0.pt")  # Apple ml-cvnets checkpoint
        ```
    """
    targets, has_head = model_port_targets(model)  # checks the model before reading a file
    raw = read_torch_state_dict(path_or_state_dict)
    source = source_name(path_or_state_dict)
    naming = _detect_naming(list(raw))
    rules = _RULES_BY_NAMING.get(naming)

    state: dict[str, np.ndarray] = {}
    original: dict[str, str] = {}
    unexpected: list[str] = []
    for key, value in raw.items():
        timm_key = key if rules is None else _rename(key, rules)
        if timm_key is None or (rules is None and not _TIMM_KEY.fullmatch(key)):
            unexpected.append(key)
            continue
        if timm_key in state:
            raise ValueError(
                f"{source}: the tensors {original[timm_key]!r} and {key!r} both map to "
                f"{timm_key!r}."
            )
        state[timm_key] = value
        original[timm_key] = key

    def label(timm_key: str) -> str:
        if original.get(timm_key, timm_key) == timm_key:
            return repr(timm_key)
        return f"{original[timm_key]!r} (timm: {timm_key!r})"

    port_state(
        state, targets, has_head=has_head, label=label, original=original,
        unexpected=unexpected, missing_names=" (timm names)",
        what=f"Cannot load {source} into model {model.name!r} ({naming} naming)",
        shape_hint=_head_hint(state, targets) + _width_hint(state, targets),
    )
