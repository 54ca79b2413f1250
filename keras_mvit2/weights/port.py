"""Porting a PyTorch checkpoint into a Keras model, the part every family shares: a Keras
variable and the layout transform of its torch tensor (`PortTarget`), the expected tensors
of the common layers (`add_conv`, `add_batch_norm`, ...), the check of a whole state dict
against them before anything is assigned (`match_state`), and the assignment
(`assign_values`, or `port_state` for both). Each family's port lists its own tensors
under timm's names (see `keras_mvit2.models.torch_weights`).
"""

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import keras
import numpy as np

__all__ = ["TRANSFORMS", "PortTarget", "assign_values", "listing", "match_state"]

#: torch -> Keras permutations, by kind of tensor.
TRANSFORMS: dict[str, tuple[int, ...] | None] = {
    "conv": (2, 3, 1, 0),       # (O, I, kh, kw) -> (kh, kw, I, O)
    "depthwise": (2, 3, 0, 1),  # (C, 1, kh, kw) -> (kh, kw, C, 1)
    "dense": (1, 0),            # (out, in) -> (in, out)
    "copy": None,
}

_MAX_LISTED = 10


@dataclass(frozen=True)
class PortTarget:
    """One Keras variable and how a torch tensor is turned into it."""

    variable: Any  # keras.Variable
    transform: str  # a key of TRANSFORMS

    @property
    def keras_shape(self) -> tuple[int, ...]:
        return tuple(int(s) for s in self.variable.shape)

    @property
    def torch_shape(self) -> tuple[int, ...]:
        """The torch shape that transforms into `keras_shape`."""
        perm = TRANSFORMS[self.transform]
        if perm is None:
            return self.keras_shape
        shape = [0] * len(perm)
        for keras_axis, torch_axis in enumerate(perm):
            shape[torch_axis] = self.keras_shape[keras_axis]
        return tuple(shape)

    def to_keras(self, array: np.ndarray) -> np.ndarray:
        perm = TRANSFORMS[self.transform]
        if perm is None:
            return array
        if array.ndim != len(perm):
            raise ValueError(f"expected a rank-{len(perm)} tensor")
        return np.transpose(array, perm)


def find_network(model, kind_of: Callable[[Any], Any], expects: str) -> tuple[Any, Any]:
    """`(network, kind)`: `model` itself or the one model nested in it that `kind_of` gives
    a kind for, else `(None, None)`; a TypeError saying what `expects` for a non-model."""
    if not isinstance(model, keras.Model):
        raise TypeError(f"{expects}. Received: {type(model).__name__}")
    kind = kind_of(model)
    if kind:
        return model, kind
    nested = [(layer, kind_of(layer)) for layer in model.layers
              if isinstance(layer, keras.Model) and kind_of(layer)]
    return nested[0] if len(nested) == 1 else (None, None)


def sublayer(owner, attribute: str, kind: type, family: str) -> Any:
    """`owner.<attribute>`, which must be a `kind` (else a ValueError naming `family`)."""
    layer = getattr(owner, attribute, None)
    if not isinstance(layer, kind):
        raise ValueError(
            f"Layer {owner.name!r} has no {kind.__name__} {attribute!r} (is it built?); it is "
            f"not a {family} layer of keras_mvit2."
        )
    return layer


def add_conv(targets: dict, key: str, layer) -> None:
    """`{key}.weight` (and `.bias`) of an ungrouped Conv2D or a DepthwiseConv2D."""
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


def add_batch_norm(targets: dict, key: str, layer) -> None:
    """`{key}.{weight,bias,running_mean,running_var}` of a BatchNormalization."""
    add_norm(targets, key, layer, keras.layers.BatchNormalization)
    targets[f"{key}.running_mean"] = PortTarget(layer.moving_mean, "copy")
    targets[f"{key}.running_var"] = PortTarget(layer.moving_variance, "copy")


def add_norm(targets: dict, key: str, layer, kind: type = keras.layers.LayerNormalization) -> None:
    """`{key}.weight` / `{key}.bias` (gamma / beta) of a `kind` normalization layer."""
    if not isinstance(layer, kind) or not (getattr(layer, "scale", True)
                                           and getattr(layer, "center", True)):
        raise ValueError(f"Layer {layer.name!r} should be a {kind.__name__} with scale/center.")
    targets[f"{key}.weight"] = PortTarget(layer.gamma, "copy")
    targets[f"{key}.bias"] = PortTarget(layer.beta, "copy")


def add_linear(targets: dict, key: str, layer) -> None:
    """`Dense` or `EinsumDense` with a `(in, out)` kernel <- torch `Linear` `(out, in)`."""
    if not isinstance(layer, keras.layers.Dense | keras.layers.EinsumDense) or len(
        layer.kernel.shape
    ) != 2:
        raise ValueError(f"Layer {layer.name!r} should be a Dense/EinsumDense with a 2-D kernel.")
    targets[f"{key}.weight"] = PortTarget(layer.kernel, "dense")
    bias = getattr(layer, "bias", None)
    if bias is not None:
        targets[f"{key}.bias"] = PortTarget(bias, "copy")


def add_inverted_residual(targets: dict, key: str, block, family: str) -> None:
    """timm's `{key}.{conv1_1x1,conv2_kxk,conv3_1x1}.{conv,bn}` of an `InvertedResidual`."""
    for conv, bn, part in (
        ("expand_conv", "expand_bn", "conv1_1x1"),
        ("depthwise_conv", "depthwise_bn", "conv2_kxk"),
        ("project_conv", "project_bn", "conv3_1x1"),
    ):
        kind = keras.layers.DepthwiseConv2D if conv == "depthwise_conv" else keras.layers.Conv2D
        add_conv(targets, f"{key}.{part}.conv", sublayer(block, conv, kind, family))
        add_batch_norm(targets, f"{key}.{part}.bn",
                       sublayer(block, bn, keras.layers.BatchNormalization, family))


def source_name(path_or_state_dict: Any) -> str:
    """How error messages name a checkpoint: its path, or "the given state dict"."""
    if isinstance(path_or_state_dict, Mapping):
        return "the given state dict"
    return repr(os.fspath(path_or_state_dict))


def match_state(
    state: Mapping[str, Any], targets: Mapping[str, PortTarget], label=repr
) -> tuple[list[str], list[str], list[tuple[PortTarget, np.ndarray]]]:
    """Checks every target tensor of `state` before anything is assigned.

    Returns `(missing, mismatched, values)`: the target keys absent from `state`, one
    message per tensor whose shape does not convert to its variable's (named with
    `label(key)`), and the `(target, converted array)` pairs ready to assign.
    """
    missing = [k for k in targets if k not in state]
    mismatched: list[str] = []
    values: list[tuple[PortTarget, np.ndarray]] = []
    for key, target in targets.items():
        if key not in state:
            continue
        array = np.asarray(state[key])
        try:
            converted = target.to_keras(array)
        except ValueError:
            converted = None
        if converted is None or tuple(converted.shape) != target.keras_shape:
            mismatched.append(
                f"{label(key)}: torch shape {tuple(array.shape)}, but Keras variable "
                f"{target.variable.path!r} has shape {target.keras_shape} "
                f"(expects torch shape {target.torch_shape}, {target.transform} transform)"
            )
            continue
        values.append((target, converted))
    return missing, mismatched, values


def assign_values(values: list[tuple[PortTarget, np.ndarray]]) -> None:
    """Assigns each converted array to its variable (after `match_state` found no problem)."""
    for target, converted in values:
        target.variable.assign(converted.astype(target.variable.dtype, copy=False))


def port_state(
    state: Mapping[str, Any],
    targets: Mapping[str, PortTarget],
    *,
    has_head: bool,
    what: str,
    label: Callable[[str], str] = repr,
    original: Mapping[str, str] | None = None,
    unexpected: list[str] | None = None,
    shape_hint: str = "",
    missing_names: str = "",
) -> None:
    """Checks every tensor of `state` against `targets`, then assigns them all.

    Raises a ValueError that starts with `what` ("Cannot load X into model Y (...)") and
    lists the tensors with a wrong shape (then `shape_hint`), the missing ones and the
    unexpected ones (`unexpected` plus the keys of `state` the model does not have, named
    as `original` maps them); nothing is assigned then. Without a head (`has_head`
    False) the checkpoint's `head.*` tensors are ignored.
    """
    original = original or {}
    unexpected = list(unexpected or []) + [
        original.get(k, k) for k in state
        if k not in targets and (has_head or not k.startswith("head."))
    ]
    missing, mismatched, values = match_state(state, targets, label)
    if missing or unexpected or mismatched:
        parts = [f"{what}; nothing was loaded."]
        if mismatched:
            parts.append(f"- {len(mismatched)} tensor(s) with a wrong shape:\n"
                         + listing(mismatched) + shape_hint)
        if missing:
            hint = ""
            if has_head and all(k.startswith("head.") for k in missing):
                hint = ("\n  The checkpoint has no classifier: build the model with "
                        "include_top=False to load the backbone only.")
            parts.append(f"- {len(missing)} tensor(s) the model needs are missing from the "
                         f"checkpoint{missing_names}:\n" + listing(missing) + hint)
        if unexpected:
            parts.append(f"- {len(unexpected)} unexpected tensor(s) in the checkpoint "
                         "(not in this model):\n" + listing(unexpected))
        raise ValueError("\n".join(parts))
    assign_values(values)


def listing(items: list[str]) -> str:
    """`items` one per indented line, the first ten, then how many more."""
    shown = "\n".join(f"    {item}" for item in items[:_MAX_LISTED])
    if len(items) > _MAX_LISTED:
        shown += f"\n    ... and {len(items) - _MAX_LISTED} more"
    return shown
